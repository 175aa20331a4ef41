"""``leakgym eval``: every attacker against every defender, as an empirical payoff table.

Each (attacker, defender) pair plays ``episodes`` full episodes of the PettingZoo parallel
environment (both agents act each round; adaptive agents get ``observe`` after each round and
keep what they learnt across the pair's episodes; each pair gets fresh agent instances). Episode
``e`` of every pair is reset with the same seed ``seed + e`` (common random numbers: the same
private batches, client splits and model initialisation), so differences between pairs come from
the agents, not from the draw.

Per episode the harness records the mean over rounds of the leakage metrics in the round infos
(``leakage_ssim``, ``leakage_psnr``, ``leakage_lpips`` when the environment reports it — only when
the pretrained LPIPS weights are installed — and ``label_accuracy``), the global model's test
``accuracy`` after the last round, and both agents' returns (sums of rewards). Per pair it reports
each quantity's mean over episodes and a 95% Student-t confidence interval
``mean ± t_{0.975, n-1} s / sqrt(n)`` (``s`` the sample standard deviation; undefined for n = 1).

Files written to ``OUT``:

``payoff.csv``
    one row per pair: ``attacker, defender, episodes, rounds`` then, for each metric in
    :data:`METRICS`, ``<metric>_mean, <metric>_ci95_low, <metric>_ci95_high`` (empty when undefined).
``payoff.json``
    the same rows (``null`` for undefined values) plus the settings, the best responses and the
    pure-strategy equilibria of the empirical game (see :func:`best_responses`).
``payoff.png``
    heatmap attacker x defender of mean leakage SSIM, annotated with mean ± CI half-width.
``gallery.png``
    for each pair, the last round's private images and their matched reconstructions.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .base import Agent
from .cli_common import add_env_arguments, apply_threads, parse_overrides, resolve_env, split_agent_list
from .factory import make_agent

#: metrics reported per pair (each as mean and 95% CI)
METRICS = (
    "leakage_ssim",
    "leakage_psnr",
    "leakage_lpips",
    "label_accuracy",
    "accuracy",
    "attacker_return",
    "defender_return",
)
#: metrics averaged over the rounds of an episode (the others are per-episode totals / final values)
ROUND_METRICS = ("leakage_ssim", "leakage_psnr", "leakage_lpips", "label_accuracy")
CSV_COLUMNS = ["attacker", "defender", "episodes", "rounds"] + [
    f"{m}_{s}" for m in METRICS for s in ("mean", "ci95_low", "ci95_high")
]


def t_interval(values: np.ndarray | list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the Student-t interval; low/high are NaN for fewer than 2 values."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x)):
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


@dataclass
class EpisodeStats:
    """One episode of one pair."""

    metrics: dict[str, float]
    rounds: int


@dataclass
class PairResult:
    attacker: str
    defender: str
    episodes: list[EpisodeStats]
    #: the last round of the last episode: originals, reconstructions (unit images), ReconstructionScores
    last_round: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "attacker": self.attacker,
            "defender": self.defender,
            "episodes": len(self.episodes),
            "rounds": int(sum(e.rounds for e in self.episodes)),
        }
        for m in METRICS:
            mean, low, high = t_interval([e.metrics[m] for e in self.episodes])
            row[f"{m}_mean"], row[f"{m}_ci95_low"], row[f"{m}_ci95_high"] = mean, low, high
        return row


def play_episode(env, attacker: Agent, defender: Agent, seed: int) -> EpisodeStats:
    """One episode of the parallel env; agents act with generators derived from ``seed``."""
    obs, _ = env.reset(seed=seed)
    agents = {"attacker": attacker, "defender": defender}
    rngs = {role: np.random.default_rng([seed, i]) for i, role in enumerate(agents)}
    for i, agent in enumerate(agents.values()):
        agent.reset(seed + 1000 * (i + 1))
    per_round: dict[str, list[float]] = {m: [] for m in ROUND_METRICS}
    returns = {"attacker": 0.0, "defender": 0.0}
    accuracy = float("nan")
    rounds = 0
    while env.agents:
        actions = {r: a.act(obs[r], env.action_space(r), rngs[r]) for r, a in agents.items()}
        obs, rewards, _, _, infos = env.step(actions)
        for role, agent in agents.items():
            agent.observe(rewards[role], infos[role])
            returns[role] += float(rewards[role])
        info = infos["attacker"]
        for m in ROUND_METRICS:
            per_round[m].append(float(info.get(m, float("nan"))))
        accuracy = float(info["accuracy"])
        rounds += 1
    metrics = {m: float(np.mean(v)) if v else float("nan") for m, v in per_round.items()}
    metrics.update(accuracy=accuracy, attacker_return=returns["attacker"], defender_return=returns["defender"])
    return EpisodeStats(metrics=metrics, rounds=rounds)


def _label(spec: Any) -> str:
    return spec.name if isinstance(spec, Agent) else str(spec)


@dataclass
class PayoffTable:
    """The result of :func:`evaluate`: one :class:`PairResult` per (attacker, defender)."""

    env_id: str
    scenario: str
    attackers: list[str]
    defenders: list[str]
    pairs: list[PairResult]
    seed: int
    overrides: dict[str, Any]

    def rows(self) -> list[dict[str, Any]]:
        return [p.summary() for p in self.pairs]

    def matrix(self, column: str) -> np.ndarray:
        """``column`` (e.g. ``"leakage_ssim_mean"``) as an attackers x defenders array."""
        by_pair = {(r["attacker"], r["defender"]): r[column] for r in self.rows()}
        return np.array([[by_pair[(a, d)] for d in self.defenders] for a in self.attackers], dtype=np.float64)


def evaluate(
    env: str,
    attackers: list[Any],
    defenders: list[Any],
    *,
    episodes: int = 3,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
) -> PayoffTable:
    """Play every attacker against every defender for ``episodes`` episodes (see module docstring)."""
    from leakgym.envs.leakgym_env import parallel_env
    from tqdm.auto import tqdm

    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    if not attackers or not defenders:
        raise ValueError(f"need at least one attacker and one defender; got {attackers} and {defenders}")
    gym_id, scenario_name = resolve_env(env)
    overrides = dict(overrides or {})
    penv = parallel_env(scenario_name, **overrides)
    scenario = penv.scenario
    # Build every agent once up front so that a bad spec fails before any episode runs.
    for spec in attackers:
        make_agent(spec, role="attacker", scenario=scenario)
    for spec in defenders:
        make_agent(spec, role="defender", scenario=scenario)
    a_labels, d_labels = [_label(s) for s in attackers], [_label(s) for s in defenders]
    for labels, role in ((a_labels, "attacker"), (d_labels, "defender")):
        if len(set(labels)) != len(labels):
            raise ValueError(f"{role} list {labels} names an agent twice")

    pairs: list[PairResult] = []
    bar = tqdm(total=len(attackers) * len(defenders) * episodes, desc="eval", unit="episode", disable=not progress)
    for a_spec, a_label in zip(attackers, a_labels):
        for d_spec, d_label in zip(defenders, d_labels):
            attacker = make_agent(a_spec, role="attacker", scenario=scenario)
            defender = make_agent(d_spec, role="defender", scenario=scenario)
            stats = []
            for e in range(episodes):
                bar.set_postfix_str(f"{a_label} vs {d_label}")
                stats.append(play_episode(penv, attacker, defender, seed + e))
                bar.update(1)
            last = penv.game.last
            pairs.append(
                PairResult(
                    attacker=a_label,
                    defender=d_label,
                    episodes=stats,
                    last_round={k: last[k] for k in ("originals", "reconstructions", "scores") if k in last},
                )
            )
    bar.close()
    penv.close()
    return PayoffTable(
        env_id=gym_id,
        scenario=scenario_name,
        attackers=a_labels,
        defenders=d_labels,
        pairs=pairs,
        seed=seed,
        overrides=overrides,
    )


# ------------------------------------------------------------------------------- analysis
def best_responses(table: PayoffTable) -> dict[str, Any]:
    """Best responses by mean return, and the pure-strategy equilibria of the empirical game.

    ``against_defender[d]``: the attacker with the highest mean attacker return against ``d``;
    ``against_attacker[a]``: the defender with the highest mean defender return against ``a``;
    ``pure_equilibria``: pairs that are mutual best responses (pure Nash equilibria of the table).
    """
    ra = table.matrix("attacker_return_mean")
    rd = table.matrix("defender_return_mean")
    ssim = table.matrix("leakage_ssim_mean")
    best_a = np.nanargmax(ra, axis=0)  # per defender
    best_d = np.nanargmax(rd, axis=1)  # per attacker
    against_defender = {
        d: {"attacker": table.attackers[best_a[j]], "attacker_return": ra[best_a[j], j], "leakage_ssim": ssim[best_a[j], j]}
        for j, d in enumerate(table.defenders)
    }
    against_attacker = {
        a: {"defender": table.defenders[best_d[i]], "defender_return": rd[i, best_d[i]], "leakage_ssim": ssim[i, best_d[i]]}
        for i, a in enumerate(table.attackers)
    }
    equilibria = [
        {"attacker": table.attackers[i], "defender": table.defenders[j]}
        for i in range(len(table.attackers))
        for j in range(len(table.defenders))
        if best_a[j] == i and best_d[i] == j
    ]
    return {"against_defender": against_defender, "against_attacker": against_attacker, "pure_equilibria": equilibria}


def who_beats_whom(table: PayoffTable) -> str:
    """A plain-text table of the best responses (printed by ``leakgym eval``)."""
    br = best_responses(table)
    wa = max(12, *(len(a) for a in table.attackers))
    wd = max(12, *(len(d) for d in table.defenders))
    lines = ["best attacker against each defender (highest attacker return):",
             f"  {'defender':<{wd}}  {'best attacker':<{wa}}  {'return':>8}  {'SSIM':>6}"]
    for d, r in br["against_defender"].items():
        lines.append(f"  {d:<{wd}}  {r['attacker']:<{wa}}  {r['attacker_return']:8.3f}  {r['leakage_ssim']:6.3f}")
    lines += ["best defender against each attacker (highest defender return):",
              f"  {'attacker':<{wa}}  {'best defender':<{wd}}  {'return':>8}  {'SSIM':>6}"]
    for a, r in br["against_attacker"].items():
        lines.append(f"  {a:<{wa}}  {r['defender']:<{wd}}  {r['defender_return']:8.3f}  {r['leakage_ssim']:6.3f}")
    eq = ", ".join(f"({e['attacker']}, {e['defender']})" for e in br["pure_equilibria"]) or "none"
    lines.append(f"pure-strategy equilibria of this table: {eq}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- output files
def json_safe(v: Any) -> Any:
    """JSON-safe copy: NumPy scalars -> Python, non-finite floats -> None."""
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    return v


def write_csv(table: PayoffTable, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in table.rows():
            writer.writerow({k: ("" if v is None else v) for k, v in json_safe(row).items()})


def write_json(table: PayoffTable, path: Path) -> None:
    payload = {
        "env_id": table.env_id,
        "scenario": table.scenario,
        "seed": table.seed,
        "overrides": table.overrides,
        "attackers": table.attackers,
        "defenders": table.defenders,
        "metrics": list(METRICS),
        "confidence": 0.95,
        "pairs": table.rows(),
        "best_responses": best_responses(table),
    }
    path.write_text(json.dumps(json_safe(payload), indent=2))


def _figure(**kwargs):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def write_heatmap(table: PayoffTable, path: Path) -> None:
    """Mean leakage SSIM per pair, annotated with mean ± 95% CI half-width."""
    mean = table.matrix("leakage_ssim_mean")
    half = table.matrix("leakage_ssim_ci95_high") - mean
    na, nd = mean.shape
    fig = _figure(figsize=(1.6 * nd + 3.0, 0.7 * na + 2.0), dpi=100)
    ax = fig.subplots()
    im = ax.imshow(mean, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(na):
        for j in range(nd):
            text = f"{mean[i, j]:.3f}" + (f"\n±{half[i, j]:.3f}" if np.isfinite(half[i, j]) else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=8,
                    color="black" if np.isfinite(mean[i, j]) and mean[i, j] > 0.6 else "white")
    ax.set_xticks(range(nd), table.defenders, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(na), table.attackers, fontsize=8)
    ax.set_xlabel("defender")
    ax.set_ylabel("attacker")
    ax.set_title(f"{table.env_id}: mean leakage SSIM ({len(table.pairs[0].episodes)} episodes)", fontsize=9)
    fig.colorbar(im, ax=ax, label="SSIM (higher = more leakage)")
    fig.tight_layout()
    fig.savefig(path)


def write_gallery(table: PayoffTable, path: Path, max_images: int = 4) -> None:
    """A grid like the payoff table: one block per (attacker row, defender column) holding the
    last round's private images (top) over their matched reconstructions (bottom, with SSIM)."""
    by_pair = {(p.attacker, p.defender): p for p in table.pairs if "originals" in p.last_round}
    if not by_pair:
        raise ValueError("no pair has a finished round to show")
    n = min(max_images, min(len(p.last_round["originals"]) for p in by_pair.values()))
    na, nd = len(table.attackers), len(table.defenders)
    fig = _figure(figsize=(1.0 * n * nd + 1.6, 2.1 * na + 0.8), dpi=100)
    axes = fig.subplots(2 * na, n * nd, squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
    for i, a in enumerate(table.attackers):
        axes[2 * i][0].set_ylabel(f"{a}\noriginal", fontsize=6)
        axes[2 * i + 1][0].set_ylabel(f"{a}\nreconstruction", fontsize=6)
        for j, d in enumerate(table.defenders):
            if i == 0:
                axes[0][j * n].set_title(d, fontsize=7, loc="left")
            pair = by_pair.get((a, d))
            if pair is None:
                continue
            orig, recon, scores = (pair.last_round[k] for k in ("originals", "reconstructions", "scores"))
            for k in range(n):
                shown = (orig[k], recon[int(scores.assignment[k])])
                for r, img in enumerate(shown):
                    ax = axes[2 * i + r][j * n + k]
                    arr = img.detach().cpu().clamp(0, 1).numpy()
                    ax.imshow(arr[0] if arr.shape[0] == 1 else np.transpose(arr, (1, 2, 0)), cmap="gray",
                              vmin=0, vmax=1)
                ax.set_xlabel(f"SSIM {scores.per_image['ssim'][k]:.2f}", fontsize=6)
    fig.suptitle(f"{table.env_id}: last round of each pair (rows: attackers, columns: defenders)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def write_outputs(table: PayoffTable, out: Path) -> dict[str, Path]:
    """Write payoff.csv, payoff.json, payoff.png and gallery.png to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("payoff.csv", "payoff.json", "payoff.png", "gallery.png")}
    write_csv(table, paths["payoff.csv"])
    write_json(table, paths["payoff.json"])
    write_heatmap(table, paths["payoff.png"])
    write_gallery(table, paths["gallery.png"])
    return paths


# ------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``leakgym eval``."""
    add_env_arguments(parser)
    parser.add_argument(
        "--attackers", default="random", help="comma-separated attacker specs: names, presets, fixed:a,b,c, policy .zip paths"
    )
    parser.add_argument("--defenders", default="none,random", help="comma-separated defender specs")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per pair")
    parser.add_argument("--out", type=Path, default=Path("runs/eval"), help="output folder")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    """Run ``leakgym eval``: play all pairs, write the four files, print who beats whom."""
    apply_threads(args.threads)
    table = evaluate(
        args.env,
        split_agent_list(args.attackers),
        split_agent_list(args.defenders),
        episodes=args.episodes,
        seed=args.seed,
        overrides=parse_overrides(args.overrides),
        progress=not args.no_progress,
    )
    paths = write_outputs(table, args.out)
    print(who_beats_whom(table))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


__all__ = [
    "CSV_COLUMNS",
    "METRICS",
    "EpisodeStats",
    "PairResult",
    "PayoffTable",
    "add_arguments",
    "best_responses",
    "evaluate",
    "main",
    "play_episode",
    "t_interval",
    "who_beats_whom",
    "write_outputs",
]

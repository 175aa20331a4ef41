"""What a PSRO run says: the defense report card and the figures of ``leakgym metagame``.

**Report card** (:func:`report_card`): for every defender of the final population (the scripted presets
it started from and the learned best responses) and every other scripted defense preset the environment
allows (simulated against the final attacker population for the card), against the final attacker
population:

* ``worst_case_leakage`` -- the highest mean leakage SSIM any attacker of the population reaches;
* ``equilibrium_leakage`` -- the mean leakage SSIM against the attackers' final meta-strategy
  (``sum_i sigma_A[i] SSIM[i, d]``): what the defense leaks against attackers that adapted to the
  whole defender population;
* ``accuracy`` and ``accuracy_cost`` -- the global model's test accuracy at the end of the episodes
  (mean over every attacker's cells) and its drop from the undefended baseline (the ``none`` preset;
  NaN when the population has none);
* ``defender_meta`` -- the defender's weight in the final meta-strategy; ``pareto`` -- whether no other
  defender is at least as good in both equilibrium leakage and accuracy cost and better in one (weak
  dominance).

**Figures**: ``exploitability.png`` (per iteration and per million env steps, with 95% intervals),
``meta_strategies.png`` (each side's meta-strategy weights per iteration), ``payoff.png`` (the final table's
attacker return and leakage SSIM, the meta-strategies on the margins and their support outlined) and
``report_card.png`` (equilibrium leakage vs accuracy cost, the Pareto front drawn).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.files import replacing, write_atomically

from .psro import Member, MetagameState

BASELINE_DEFENDER = "none"
REPORT_COLUMNS = ("defender", "kind", "defender_meta", "equilibrium_leakage", "worst_case_leakage", "worst_attacker",
                  "accuracy", "accuracy_cost", "pareto")


def _pareto(points: list[tuple[float, float]]) -> list[bool]:
    """Which points no other point beats in both coordinates (lower is better in both)."""
    out = []
    for i, (x, y) in enumerate(points):
        if not (math.isfinite(x) and math.isfinite(y)):
            out.append(False)
            continue
        dominated = any(j != i and math.isfinite(u) and math.isfinite(v) and u <= x and v <= y and (u < x or v < y)
                        for j, (u, v) in enumerate(points))
        out.append(not dominated)
    return out


def report_card(state: MetagameState, extra: list[Member] | None = None) -> list[dict[str, Any]]:
    """One row per defender of the final population (see the module docstring), then one per ``extra``
    defender (scripted presets outside the population, whose cells against the final attacker population
    were simulated for the card; meta-strategy weight 0)."""
    atts = [m.name for m in state.populations["attacker"]]
    extra = list(extra or [])
    dfns = [*state.populations["defender"], *extra]
    names = [m.name for m in dfns]
    sigma_a = np.asarray(state.final["attacker_meta"], float)
    sigma_d = np.concatenate([np.asarray(state.final["defender_meta"], float), np.zeros(len(extra))])
    ssim = state.game.means(atts, names, "leakage_ssim")
    acc = state.game.means(atts, names, "accuracy").mean(axis=0)
    baseline = acc[names.index(BASELINE_DEFENDER)] if BASELINE_DEFENDER in names else float("nan")
    rows = []
    for j, m in enumerate(dfns):
        worst = int(np.nanargmax(ssim[:, j])) if np.isfinite(ssim[:, j]).any() else 0
        kind = "preset" if m.iteration == 0 else f"learned (iteration {m.iteration})"
        if j >= len(dfns) - len(extra):
            kind = "preset (outside the population)"
        rows.append({"defender": m.name, "kind": kind,
                     "defender_meta": float(sigma_d[j]), "equilibrium_leakage": float(sigma_a @ ssim[:, j]),
                     "worst_case_leakage": float(ssim[worst, j]), "worst_attacker": atts[worst],
                     "accuracy": float(acc[j]), "accuracy_cost": float(baseline - acc[j])})
    cost = [r["accuracy_cost"] if math.isfinite(r["accuracy_cost"]) else 0.0 for r in rows]
    for r, front in zip(rows, _pareto([(r["equilibrium_leakage"], c) for r, c in zip(rows, cost)])):
        r["pareto"] = front
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return "nan" if not math.isfinite(v) else f"{v:.3f}"
    return str(v)


def report_markdown(rows: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(REPORT_COLUMNS) + " |\n| " + " | ".join("---" for _ in REPORT_COLUMNS) + " |\n"
    return head + "".join("| " + " | ".join(_fmt(r[c]) for c in REPORT_COLUMNS) + " |\n" for r in rows)


def report_csv(rows: list[dict[str, Any]]) -> str:
    """``report_card.csv``'s text."""
    buffer = io.StringIO()
    w = csv.DictWriter(buffer, fieldnames=list(REPORT_COLUMNS))
    w.writeheader()
    w.writerows(rows)
    return buffer.getvalue()


def write_report_card(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """``report_card.csv`` and ``report_card.md`` in ``out``, each replaced atomically
    (:func:`leakgym.files.write_atomically`)."""
    out = Path(out)
    write_atomically(out / "report_card.csv", report_csv(rows))
    write_atomically(out / "report_card.md", report_markdown(rows))
    return [out / "report_card.csv", out / "report_card.md"]


def _interval_md(d: dict[str, float]) -> str:
    return f"{d['mean']:.3f} [{d['ci95_low']:.3f}, {d['ci95_high']:.3f}]"


def summary_markdown(state: MetagameState, rows: list[dict[str, Any]], *, device: str | None = None) -> str:
    """``metagame.md``: the run's settings, exploitability per iteration, final meta-strategies and the
    report card, as markdown (what docs/results/metagame_digits.md is)."""
    from .psro import halved

    st = state.settings
    lines = [f"# PSRO on {st.get('env_id')}", "",
             (f"`leakgym metagame`, {st.get('meta_solver')} meta-solver, {len(state.iterations)} iterations; "
             f"{st.get('timesteps')} {str(st.get('algo', '')).upper()} steps per best response, "
             f"{st.get('episodes')} evaluation episodes per cell (seed {st.get('seed')}); initial populations: the "
             f"attackers {', '.join(st.get('initial', {}).get('attacker', []))}; the defenders "
             f"{', '.join(st.get('initial', {}).get('defender', []))}."), "",
             (f"Scenario overrides: `{json.dumps(st.get('overrides', {}))}`; hyperparameters: "
             f"`{json.dumps(st.get('hyperparams', {}))}`."), "",
             f"Status: {state.status}; {state.env_steps:,} environment steps (training and evaluation); wall time "
             f"{state.wall_time_s / 60:.1f} min" + (f" on {device}" if device else "") + ".", "",
             "## Exploitability per iteration", "",
             ("Each side's best-response gain against the meta-strategy solved at the start of the iteration, and their "
             "sum (NashConv); mean and 95% interval over the evaluation episodes (paired: common random numbers)."), "",
             ("| iteration | exploitability | attacker gain | defender gain | best attacker deviation | "
             "best defender deviation | env steps (total) | wall time (s) |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in state.iterations:
        lines.append(f"| {r['iteration']} | {_interval_md(r['exploitability'])} | {_interval_md(r['attacker_gain'])} | "
                     f"{_interval_md(r['defender_gain'])} | {r['attacker_best_deviation']} | "
                     f"{r['defender_best_deviation']} | {r['env_steps_total']:,} | {r['wall_time_s']:.0f} |")
    verdict = halved(state)
    if verdict is not None:
        lines += ["", "Target (last exploitability below half of the first, 95% intervals apart): "
                  + ("**met**." if verdict else "**not met**.")]
    lines += ["", "## Meta-strategies", "", "| iteration | attackers | defenders |", "| --- | --- | --- |"]
    records = [*state.iterations, {"iteration": "final", **state.final}] if state.final else state.iterations
    for r in records:
        names_a = r.get("attackers", [m.name for m in state.populations["attacker"]])
        names_d = r.get("defenders", [m.name for m in state.populations["defender"]])
        mix = lambda names, p: ", ".join(f"{n} {v:.2f}" for n, v in zip(names, p) if v > 1e-6)
        lines.append(f"| {r['iteration']} | {mix(names_a, r['attacker_meta'])} | {mix(names_d, r['defender_meta'])} |")
    lines += ["", "## Defense report card", "",
              ("Against the final attacker population: leakage SSIM against the attackers' final meta-strategy "
              "(equilibrium) and against the worst attacker; accuracy at the end of the episodes (mean over every "
              "attacker's cells) and its drop from `none`; Pareto: no other defense is at least as good in both "
              "equilibrium leakage and accuracy cost and better in one."), "", report_markdown(rows)]
    return "\n".join(lines) + "\n"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def exploitability_figure(state: MetagameState):
    plt = _plt()
    its = state.iterations
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    k = np.array([r["iteration"] for r in its])
    steps = np.array([r["env_steps_total"] for r in its]) / 1e6
    for key, label, colour in (("exploitability", "exploitability (NashConv)", "k"),
                               ("attacker_gain", "attacker's gain", "tab:red"),
                               ("defender_gain", "defender's gain", "tab:blue")):
        mean = np.array([r[key]["mean"] for r in its])
        low = np.array([r[key]["ci95_low"] for r in its], dtype=float)
        high = np.array([r[key]["ci95_high"] for r in its], dtype=float)
        for ax, x in ((axes[0], k), (axes[1], steps)):
            ax.plot(x, mean, "o-", color=colour, label=label, lw=2 if key == "exploitability" else 1)
            if np.isfinite(low).any():
                ax.fill_between(x, low, high, color=colour, alpha=0.15, lw=0)
    axes[0].set_xlabel("PSRO iteration")
    axes[1].set_xlabel("environment steps used (millions)")
    for ax in axes:
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylabel("gain in return against the meta-strategy")
        ax.grid(alpha=0.3)
    axes[0].set_xticks(k)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{state.settings.get('env_id', '')}: exploitability per iteration (95% intervals over "
                 f"{state.settings.get('episodes', '?')} evaluation episodes)", fontsize=10)
    return fig


def meta_strategy_figure(state: MetagameState):
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    records = [*state.iterations, {"iteration": "final", **state.final}] if state.final else state.iterations
    for ax, role in zip(axes, ("attacker", "defender")):
        names = [m.name for m in state.populations[role]]
        cmap = plt.get_cmap("tab20")
        bottom = np.zeros(len(records))
        for idx, name in enumerate(names):
            w = np.array([r[f"{role}_meta"][idx] if idx < len(r[f"{role}_meta"]) else 0.0 for r in records])
            ax.bar(range(len(records)), w, bottom=bottom, color=cmap(idx % 20), label=name, edgecolor="white", lw=0.5)
            bottom += w
        ax.set_xticks(range(len(records)), [str(r["iteration"]) for r in records])
        ax.set_xlabel("PSRO iteration (meta-strategy solved at its start)")
        ax.set_ylabel("probability")
        ax.set_ylim(0, 1)
        ax.set_title(f"{role} meta-strategy")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def payoff_figure(state: MetagameState):
    """The final table: attacker return (left) and leakage SSIM (right), meta-strategies on the margins,
    the cells of the equilibrium support outlined."""
    plt = _plt()
    from matplotlib.patches import Rectangle

    atts = [m.name for m in state.populations["attacker"]]
    dfns = [m.name for m in state.populations["defender"]]
    sigma_a = np.asarray(state.final["attacker_meta"], float)
    sigma_d = np.asarray(state.final["defender_meta"], float)
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.5 * len(dfns), 1.5 + 0.55 * len(atts)), constrained_layout=True)
    for ax, metric, title, cmap in ((axes[0], "attacker_return", "attacker return", "RdBu_r"),
                                    (axes[1], "leakage_ssim", "leakage SSIM (higher = more leakage)", "magma")):
        M = state.game.means(atts, dfns, metric)
        im = ax.imshow(M, cmap=cmap, aspect="auto")
        fig.colorbar(im, ax=ax, shrink=0.8)
        for i in range(len(atts)):
            for j in range(len(dfns)):
                ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if im.norm(M[i, j]) < 0.5 else "black")
                if sigma_a[i] > 1e-6 and sigma_d[j] > 1e-6:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="lime", lw=2.5))
        ax.set_xticks(range(len(dfns)), [f"{d}\n{sigma_d[j]:.2f}" for j, d in enumerate(dfns)], rotation=45,
                      ha="right", fontsize=8)
        ax.set_yticks(range(len(atts)), [f"{a}  {sigma_a[i]:.2f}" for i, a in enumerate(atts)], fontsize=8)
        ax.set_xlabel("defender (meta-strategy weight)")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("attacker (meta-strategy weight)")
    fig.suptitle(f"final payoff table, {state.settings.get('meta_solver')} meta-strategy support outlined",
                 fontsize=10)
    return fig


def report_card_figure(rows: list[dict[str, Any]]):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    x = np.array([r["accuracy_cost"] for r in rows], float)
    y = np.array([r["equilibrium_leakage"] for r in rows], float)
    worst = np.array([r["worst_case_leakage"] for r in rows], float)
    x = np.where(np.isfinite(x), x, 0.0)
    learned = np.array([r["kind"].startswith("learned") for r in rows])
    ax.vlines(x, y, worst, color="grey", lw=1, alpha=0.6, label="equilibrium -> worst-case leakage")
    ax.scatter(x[~learned], y[~learned], s=50, c="tab:blue", label="scripted preset", zorder=3)
    ax.scatter(x[learned], y[learned], s=50, c="tab:orange", marker="s", label="PSRO best response", zorder=3)
    front = sorted((xi, yi) for xi, yi, r in zip(x, y, rows) if r["pareto"])
    if front:
        ax.step(*zip(*front), where="post", color="tab:green", lw=1.5, label="Pareto front")
    for xi, yi, r in zip(x, y, rows):
        ax.annotate(r["defender"], (xi, yi), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("accuracy cost (undefended accuracy minus defended, fraction)")
    ax.set_ylabel("leakage SSIM against the attackers' meta-strategy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("defense report card (lower-left is better)", fontsize=10)
    return fig


#: every figure :func:`write_figures` can write (a state without iterations or final meta-strategies has fewer)
FIGURE_FILES = ("exploitability.png", "meta_strategies.png", "payoff.png", "report_card.png")


def figure_makers(state: MetagameState, rows: list[dict[str, Any]] | None = None
                  ) -> list[tuple[str, Callable[[], Any]]]:
    """``(file name, function drawing its figure)`` of each figure ``state`` has, in :data:`FIGURE_FILES`'
    order; drawn one at a time by :func:`save_figure`."""
    makers: list[tuple[str, Callable[[], Any]]] = []
    if state.iterations:
        makers.append(("exploitability.png", lambda: exploitability_figure(state)))
    if state.final:
        makers += [("meta_strategies.png", lambda: meta_strategy_figure(state)),
                   ("payoff.png", lambda: payoff_figure(state)),
                   ("report_card.png", lambda: report_card_figure(rows if rows is not None else report_card(state)))]
    return makers


def save_figure(make: Callable[[], Any], path: Path) -> None:
    """Draw a figure with ``make`` and save it to ``path`` (format from its suffix), closing it however
    that ends."""
    plt = _plt()
    fig = make()
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def write_figures(state: MetagameState, out: Path, rows: list[dict[str, Any]] | None = None) -> list[Path]:
    """The figures of ``state`` in ``out``, each replaced atomically (:func:`leakgym.files.replacing`);
    ``leakgym metagame`` writes them with its other final files as one set instead
    (:func:`~leakgym.agents.experiments.metagame.cli.write_final_outputs`)."""
    out = Path(out)
    paths = []
    for name, make in figure_makers(state, rows):
        with replacing(out / name) as partial:
            save_figure(make, partial)
        paths.append(out / name)
    return paths


__all__ = [
    "FIGURE_FILES",
    "REPORT_COLUMNS",
    "exploitability_figure",
    "figure_makers",
    "meta_strategy_figure",
    "payoff_figure",
    "report_card",
    "report_card_figure",
    "report_csv",
    "report_markdown",
    "save_figure",
    "summary_markdown",
    "write_figures",
    "write_report_card",
]

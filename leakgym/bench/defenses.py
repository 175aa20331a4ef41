"""``leakgym bench defenses``: utility, leakage and cost of every defense next to no defense.

For each defense the same federated model is trained from the same initialisation with plain FedSGD
(:class:`leakgym.fl.server.Server`, example-weighted mean of the clients' gradients, server
learning rate ``--lr``) on the digits dataset split over ``--clients`` IID shards
(:func:`leakgym.data.federated_split`, which also holds out a public split). Every round each client
draws a fresh batch from its shard; client 0 is the **victim**: it draws ``--victim-batch`` examples
and shares its update through :func:`leakgym.defenses.apply_defense`. By default **only the victim
defends** (the game's setting: one defended client among honest ones); ``--all-clients`` makes every
client apply the defense, which shows the defense's full cost in accuracy.

Measured per defense:

* ``accuracy`` / ``test_loss``: the global model on the held-out test split after the last round
  (and ``accuracy_curve`` every ``--eval-every`` rounds);
* leakage: the reference attack (Inverting Gradients, ``--attack-iterations`` iterations, one
  restart, labels known to the attacker) on the victim's shared update at ``--attack-rounds``
  evenly spaced rounds (first and last included); ``ssim`` / ``psnr`` are the means over those
  rounds and the victim's images (:func:`leakgym.metrics.score_reconstruction`). All attacks of a
  run are batched into one engine call at the end;
* ``fidelity``: the victim's mean cosine between shared and clean update (the DefenseReport's);
* ``overhead_ms``: the victim's mean extra wall time per update over the clean computation, and
  ``wall_s`` the training wall time of the whole run.

PRECODE is a model option, so ``precode`` and the ``PPP-*`` rows train a PRECODE LeNet (same seed)
and attack it with the same reference attack. The defense settings are the named presets of
:data:`leakgym.defenses.config.PRESETS`, except for DCS² and LODA whose per-update optimisation (1000
resp. 500 steps) is too slow to run every round on a CPU: the bench uses ``BENCH_OVERRIDES`` (fewer
steps) and says so in the table. DCS² is not in the default list at all: its synthesis measured about
2 s per step for LeNet with a batch of 4 on the 2-core CI machine, i.e. minutes per round even with
20 steps; run it with ``--defenses none,dcs2 --rounds 10``.

Output: a JSON file (``--json``) with the settings and one record per defense, and a markdown table
next to it (``--markdown``, default: the JSON path with ``.md``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

#: Rows of the default run, in table order.
DEFAULT_DEFENSES = (
    "none", "gaussian", "laplace", "clip+gaussian", "prune", "topk", "soteria", "dcs2", "censor", "oasis",
    "mixup", "instahide", "loda", "precode", "PPP-NG1", "PPP-GC90",
)
#: Bench-only changes to a preset (documented in the table): per-update optimisations kept short.
BENCH_OVERRIDES: dict[str, dict] = {
    "dcs2": {"dcs2_steps": 20},
    "loda": {"loda_steps": 20},
}
#: Rows that train a PRECODE model.
PRECODE_ROWS = ("precode", "PPP-NG3", "PPP-NG2", "PPP-NG1", "PPP-NG05", "PPP-GC90", "PPP-GC99")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``leakgym bench defenses``."""
    parser.add_argument("--json", type=Path, default=Path("runs/bench/bench_defenses.json"),
                        help="where to write the JSON results (default: %(default)s; the committed "
                        "docs/results/bench_defenses.json is rewritten only when named here)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="where to write the markdown table (default: the JSON path with .md)")
    parser.add_argument("--defenses", type=str, default=",".join(DEFAULT_DEFENSES),
                        help="comma-separated preset names (see leakgym.defenses.PRESETS, plus 'precode')")
    parser.add_argument("--rounds", type=int, default=100, help="FedSGD rounds (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="number of clients K (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size of the honest clients")
    parser.add_argument("--victim-batch", type=int, default=4, help="batch size of the victim (client 0)")
    parser.add_argument("--lr", type=float, default=0.5, help="server learning rate (default: %(default)s)")
    parser.add_argument("--model", type=str, default="lenet", help="architecture (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=16, help="digits image size (default: %(default)s)")
    parser.add_argument("--attack-rounds", type=int, default=3,
                        help="number of evenly spaced rounds at which the victim is attacked")
    parser.add_argument("--attack-iterations", type=int, default=200, help="Inverting Gradients iterations")
    parser.add_argument("--eval-every", type=int, default=10, help="rounds between accuracy evaluations")
    parser.add_argument("--eval-size", type=int, default=None, help="test images used (default: all)")
    parser.add_argument("--all-clients", action="store_true", help="every client applies the defense")
    parser.add_argument("--seed", type=int, default=0, help="seed of split, model, batches and defenses")
    parser.add_argument("--no-progress", action="store_true", help="disable the tqdm progress bars")


def _check(args: argparse.Namespace) -> list[str]:
    from leakgym.defenses import PRESETS

    for name in ("rounds", "clients", "batch_size", "victim_batch", "attack_rounds", "attack_iterations",
                 "eval_every", "image_size"):
        value = getattr(args, name)
        if not isinstance(value, int) or value < (0 if name == "attack_rounds" else 1):
            raise ValueError(f"--{name.replace('_', '-')}={value!r}; allowed: integers >= "
                             f"{0 if name == 'attack_rounds' else 1}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise ValueError(f"--lr={args.lr!r}; allowed range (0, inf)")
    names = [n.strip() for n in args.defenses.split(",") if n.strip()]
    known = {k.lower(): k for k in PRESETS} | {"precode": "precode"}
    unknown = [n for n in names if n.lower() not in known]
    if unknown or not names:
        raise ValueError(f"--defenses: unknown name(s) {unknown}; allowed: {sorted(known.values())}")
    return [known[n.lower()] for n in names]


def _row_config(name: str):
    from leakgym.defenses import PRESETS, DefenseConfig

    cfg = DefenseConfig() if name == "precode" else PRESETS[name]
    if name in BENCH_OVERRIDES:
        cfg = cfg.replace(**BENCH_OVERRIDES[name])
    return cfg


def _setting(cfg) -> str:
    """The non-default fields of a config, e.g. ``noise_sigma=0.01``."""
    from leakgym.defenses import DefenseConfig

    default = DefenseConfig()
    base = default.to_dict()
    parts = [f"{name}={value}" for name, value in cfg.to_dict().items() if value != base[name]]
    return ", ".join(parts) if parts else "-"


def attack_rounds(rounds: int, count: int) -> list[int]:
    """``count`` evenly spaced rounds in ``[0, rounds - 1]``, first and last included."""
    if count <= 0:
        return []
    if count == 1 or rounds == 1:
        return [0]
    return sorted({round(i * (rounds - 1) / (count - 1)) for i in range(count)})


def run_defense(name: str, args: argparse.Namespace, split, progress: bool) -> tuple[dict, list]:
    """Train under one defense; returns (record without leakage, attack problems)."""
    from tqdm import tqdm

    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.defenses import apply_defense
    from leakgym.fl.client import compute_update
    from leakgym.fl.server import Server
    from leakgym.models import build_model

    spec = split.spec
    cfg = _row_config(name)
    model = build_model(args.model, spec, precode=name in PRECODE_ROWS, seed=args.seed)
    test_x, test_y = split.test_x, split.test_y
    if args.eval_size is not None:
        test_x, test_y = test_x[: args.eval_size], test_y[: args.eval_size]
    server = Server(model, lr=args.lr, eval_x=spec.normalize(test_x), eval_y=test_y)
    gen = torch.Generator().manual_seed(args.seed)
    probe_rounds = set(attack_rounds(args.rounds, args.attack_rounds))
    overheads, fidelities, curve, problems = [], [], [], []
    start = time.perf_counter()
    for rnd in tqdm(range(args.rounds), desc=f"{name:>14s}", disable=not progress, leave=False):
        updates = []
        for k, (cx, cy) in enumerate(split.clients):
            size = args.victim_batch if k == 0 else args.batch_size
            idx = torch.randperm(len(cx), generator=gen)[: min(size, len(cx))]
            x, y = spec.normalize(cx[idx]), cy[idx]
            seed = args.seed * 100_003 + rnd * 101 + k
            if k == 0 or args.all_clients:
                upd, rep = apply_defense(model, x, y, cfg, seed=seed, public_x=split.public_x,
                                         public_y=split.public_y)
                if k == 0:
                    overheads.append(rep.overhead_s)
                    fidelities.append(rep.fidelity)
            else:
                upd = compute_update(model, x, y)
            if k == 0 and rnd in probe_rounds:
                knowledge = AttackerKnowledge(model=copy.deepcopy(model), spec=spec, batch_size=upd.batch_size,
                                              labels=y.clone())
                problems.append((rnd, upd.detached(), knowledge, cx[idx].clone()))
            updates.append(upd)
        server.aggregate(updates)
        if (rnd + 1) % args.eval_every == 0 or rnd + 1 == args.rounds:
            acc, _ = server.evaluate()
            curve.append([rnd + 1, acc])
    wall = time.perf_counter() - start
    accuracy, loss = server.evaluate()
    record = {
        "defense": name,
        "setting": _setting(cfg),
        "bench_override": BENCH_OVERRIDES.get(name, {}),
        "precode": name in PRECODE_ROWS,
        "applied": cfg.active(),
        "accuracy": accuracy,
        "test_loss": loss,
        "accuracy_curve": curve,
        "fidelity": sum(fidelities) / len(fidelities),
        "overhead_ms": 1000 * sum(overheads) / len(overheads),
        "wall_s": wall,
    }
    return record, problems


def attack_all(problems: list, args: argparse.Namespace, spec) -> list[dict]:
    """Inverting Gradients on every collected victim update (one batched call); per-problem scores."""
    from leakgym.attacks.inverting_gradients import InvertingGradients
    from leakgym.metrics import score_reconstruction

    if not problems:
        return []
    attack = InvertingGradients(iterations=args.attack_iterations)
    results = attack.reconstruct_batch([p[2] for p in problems], [p[3] for p in problems], seed=args.seed)
    scores = []
    for (_, rnd, _, _, orig), res in zip(problems, results):
        s = score_reconstruction(spec.denormalize(res.images), orig)
        scores.append({"round": rnd, "ssim": s.mean["ssim"], "psnr": s.mean["psnr"],
                       "attack_s": res.cost.wall_time_s})
    return scores


def markdown_table(records: list[dict], settings: dict) -> str:
    """The results as a markdown table (accuracy and leakage next to no defense)."""
    ref = next((r for r in records if r["defense"] == "none" and "error" not in r), None)
    who = "every client" if settings["all_clients"] else "the victim (client 0) only"
    lines = [
        (f"Digits {settings['image_size']}x{settings['image_size']}, {settings['model']}, FedSGD "
        f"{settings['rounds']} rounds, {settings['clients']} clients (batch {settings['batch_size']}, "
        f"victim batch {settings['victim_batch']}), server lr {settings['lr']}; defense applied by {who}. "
        f"Leakage: Inverting Gradients ({settings['attack_iterations']} iterations, labels known) on the "
        f"victim's update at rounds {settings['attack_rounds']}; SSIM/PSNR lower = less leakage."),
        "",
        "| defense | setting | accuracy | Δ acc | SSIM ↓ | PSNR ↓ | fidelity | overhead ms/update |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['defense']} | error: {r['error']} | | | | | | |")
            continue
        delta = "" if ref is None else f"{100 * (r['accuracy'] - ref['accuracy']):+.1f}"
        setting = r["setting"] + (" (bench: fewer steps)" if r["bench_override"] else "")
        setting += " [PRECODE model]" if r["precode"] else ""
        lines.append(
            f"| {r['defense']} | {setting} | {100 * r['accuracy']:.1f}% | {delta} | {r['ssim']:.3f} | "
            f"{r['psnr']:.2f} | {r['fidelity']:.3f} | {r['overhead_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    """Run the benchmark; returns 0, or 1 if any defense failed (its row then holds the error)."""
    from leakgym.data import federated_split, load_dataset

    names = _check(args)
    torch.manual_seed(args.seed)
    progress = not args.no_progress
    dataset = load_dataset("digits", image_size=args.image_size)
    split = federated_split(dataset, num_clients=args.clients, seed=args.seed)
    settings = {
        "dataset": "digits", "image_size": args.image_size, "model": args.model, "rounds": args.rounds,
        "clients": args.clients, "batch_size": args.batch_size, "victim_batch": args.victim_batch,
        "lr": args.lr, "all_clients": bool(args.all_clients), "seed": args.seed,
        "attack": "inverting-gradients", "attack_iterations": args.attack_iterations,
        "attack_rounds": attack_rounds(args.rounds, args.attack_rounds), "bench_overrides": BENCH_OVERRIDES,
    }
    records, problems, failed = [], [], False
    for name in names:
        try:
            record, probs = run_defense(name, args, split, progress)
        except Exception as err:  # noqa: BLE001 - keep the other rows; the failure is in the table and exit code
            failed = True
            print(f"defense {name!r} failed: {type(err).__name__}: {err}", file=sys.stderr)
            records.append({"defense": name, "error": f"{type(err).__name__}: {err}"})
            continue
        records.append(record)
        problems.extend((len(records) - 1, rnd, upd, kn, orig) for rnd, upd, kn, orig in probs)
        print(f"{name:>14s}: accuracy {100 * record['accuracy']:.1f}%  wall {record['wall_s']:.1f}s", file=sys.stderr)
    start = time.perf_counter()
    scores = attack_all(problems, args, split.spec)
    print(f"attacks: {len(problems)} updates in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    per_row: dict[int, list[dict]] = {}
    for (row, *_), score in zip(problems, scores):
        per_row.setdefault(row, []).append(score)
    for i, record in enumerate(records):
        if "error" in record:
            continue
        rows = per_row.get(i, [])
        record["leakage"] = rows
        record["ssim"] = sum(s["ssim"] for s in rows) / len(rows) if rows else math.nan
        record["psnr"] = sum(s["psnr"] for s in rows) / len(rows) if rows else math.nan
    result = {"benchmark": "defenses", "settings": settings, "results": records}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")
    md_path = args.markdown if args.markdown is not None else args.json.with_suffix(".md")
    md = markdown_table(records, settings)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(md)
    print(md)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover - the CLI entry is `leakgym bench defenses`
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    raise SystemExit(main(p.parse_args()))

"""``leakgym bench eval``: an evaluation's games in lockstep beside the same evaluation one game at a time.

Plays one ``leakgym eval`` tournament (default: ``make demo``'s, LeakGym-Digits-v0, 3 attackers x 4
defenders, 2 episodes of 4 rounds) twice in one process, one run after the other after a short
warm-up: with ``--lockstep N`` (the pairs' rounds as one :func:`~leakgym.game.round.play_round` per
round, :func:`leakgym.envs.step_together`; a pair of episodic agents plays its episodes at once) and with
``--lockstep 1`` (one game at a time, the reference).
Each row reports both wall times, their ratio, and how far the lockstep table is from the reference
one: the largest absolute difference of a pair's mean leakage SSIM, PSNR and returns (the rounding of
batched attack kernels), and whether every final accuracy is equal (the federated rounds do not
depend on the attacks, so they should be). Results go to ``--json`` and a markdown table beside it once
the row is finished; a progress bar on stderr counts the three runs (warm-up, lockstep, one at a time),
and Ctrl-C stops with exit status 130 (the row is unfinished: nothing is written).
"""

from __future__ import annotations

import argparse
import time

from leakgym.bench import (
    check_output,
    interrupted,
    machine_label,
    markdown_table,
    progress_bar,
    write_results,
)
from leakgym.cli import DEMO_ATTACKERS, DEMO_DEFENDERS
from leakgym.devices import device_argument

COMPARED = ("leakage_ssim", "leakage_psnr", "attacker_return", "defender_return")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="runs/bench/bench_eval.json",
                        help="output JSON path, a .md table is written beside it (default: %(default)s)")
    parser.add_argument("--env", default="LeakGym-Digits-v0", help="Gymnasium id or scenario (default: %(default)s)")
    parser.add_argument("--attackers", default=DEMO_ATTACKERS, help="attacker specs (default: make demo's)")
    parser.add_argument("--defenders", default=DEMO_DEFENDERS, help="defender specs (default: make demo's)")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per pair (default: 2)")
    parser.add_argument("--lockstep", type=int, default=16, help="games played together (default: 16)")
    parser.add_argument("--overrides", nargs="*", default=["rounds=4"], metavar="KEY=VALUE",
                        help="scenario overrides (default: rounds=4, as make demo)")
    from leakgym.agents.experiments.cli_common import add_allow_large_argument

    add_allow_large_argument(parser)
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device (default: cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar (runs done / 3)")


def measure(env: str, attackers: list[str], defenders: list[str], *, episodes: int, lockstep: int,
            overrides: dict, device: str = "cpu", progress: bool = False) -> dict:
    """Time the evaluation with ``lockstep`` and with 1, one after the other; compare their tables.
    ``progress``: a bar on stderr counting the warm-up and the two timed runs."""
    import numpy as np

    from leakgym.agents.experiments.evaluation.play import evaluate

    kwargs = {"episodes": episodes, "overrides": overrides, "progress": False, "device": device}
    with progress_bar(3, "bench eval", progress) as bar:
        bar.unit = "run"
        bar.set_postfix_str("warm-up")
        evaluate(env, attackers[:1], defenders[:1], episodes=1, overrides={**overrides, "rounds": 1}, progress=False,
                 device=device)  # warm-up: imports, dataset, first kernels
        bar.update()
        bar.set_postfix_str(f"lockstep {lockstep}")
        t0 = time.perf_counter()
        together = evaluate(env, attackers, defenders, lockstep=lockstep, **kwargs)
        t1 = time.perf_counter()
        bar.update()
        bar.set_postfix_str("one at a time")
        alone = evaluate(env, attackers, defenders, lockstep=1, **kwargs)
        t2 = time.perf_counter()
        bar.update()
    diffs = {m: float(np.nanmax(np.abs(together.matrix(f"{m}_mean") - alone.matrix(f"{m}_mean")))) for m in COMPARED}
    return {
        "env": together.env_id, "pairs": len(attackers) * len(defenders), "episodes": episodes, "lockstep": lockstep,
        "overrides": overrides, "seconds": t1 - t0, "baseline_seconds": t2 - t1, "speedup": (t2 - t1) / (t1 - t0),
        **{f"max_diff_{m}": v for m, v in diffs.items()},
        "accuracy_equal": bool(np.array_equal(together.matrix("accuracy_mean"), alone.matrix("accuracy_mean"))),
        "device": device,
    }


def to_markdown(rows: list[dict], machine: str) -> str:
    columns = [
        ("env", lambda r: r["env"]),
        ("pairs x episodes", lambda r: f"{r['pairs']} x {r['episodes']}"),
        ("lockstep", lambda r: str(r["lockstep"])),
        ("seconds", lambda r: f"{r['seconds']:.1f}"),
        ("one at a time (s)", lambda r: f"{r['baseline_seconds']:.1f}"),
        ("ratio", lambda r: f"{r['speedup']:.2f}x"),
        ("max diff SSIM", lambda r: f"{r['max_diff_leakage_ssim']:.1e}"),
        ("max diff PSNR (dB)", lambda r: f"{r['max_diff_leakage_psnr']:.2f}"),
        ("max diff returns", lambda r: f"{max(r['max_diff_attacker_return'], r['max_diff_defender_return']):.1e}"),
        ("accuracies equal", lambda r: "yes" if r["accuracy_equal"] else "no"),
    ]
    title = f"`leakgym eval` with games in lockstep vs one game at a time, one run after the other ({machine})"
    return markdown_table(title, columns, rows, key=["env"])


def main(args: argparse.Namespace) -> int:
    import torch

    from leakgym.agents.experiments.cli_common import resolve_env, scenario_overrides, split_agent_list

    for flag, value in (("--episodes", args.episodes), ("--lockstep", args.lockstep), ("--threads", args.threads)):
        if value < 1:
            raise ValueError(f"{flag}={value}; allowed: integers >= 1")
    try:
        resolve_env(args.env)
    except ValueError as exc:
        raise ValueError(f"--env: {exc}") from None
    attackers, defenders = split_agent_list(args.attackers), split_agent_list(args.defenders)
    overrides = scenario_overrides(args)
    from leakgym.agents.policies.factory import make_agent
    from leakgym.envs import load_scenario

    _, scenario_name = resolve_env(args.env)
    scenario = load_scenario(scenario_name, **overrides)  # bad overrides and agent specs: refused before playing
    for role, specs in (("attacker", attackers), ("defender", defenders)):
        for spec in specs:
            make_agent(spec, role=role, scenario=scenario)
    out = check_output(args.json)
    torch.set_num_threads(args.threads)
    try:
        row = measure(args.env, attackers, defenders, episodes=args.episodes, lockstep=args.lockstep,
                      overrides=overrides, device=args.device, progress=not getattr(args, "no_progress", False))
    except KeyboardInterrupt:
        return interrupted(0, 1)
    machine = machine_label(args.threads, args.device)
    write_results(out, machine, [row], to_markdown([row], machine))
    return 0


__all__ = ["add_arguments", "main", "measure", "to_markdown"]

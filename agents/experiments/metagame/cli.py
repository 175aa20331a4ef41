"""``leakgym metagame``: PSRO over attacker and defender populations on a LeakGym environment.

    leakgym metagame --env LeakGym-Digits-v0 --iterations 5 --out runs/metagame \\
        --timesteps 20000 --episodes 16 --meta-solver nash [--resume] [--ray]

Files written to ``OUT`` as the run goes (see :mod:`.psro`): ``metagame.json`` (settings, populations,
every cell's per-episode samples, each iteration's meta-strategies, gains and exploitability, env steps
and wall time), ``policies/<member>/policy.zip`` (+ ``policy.json``), ``cells/<block>/`` (each block's
``episodes.csv``); at the end ``payoff.csv`` (the final table), ``report_card.{csv,md,png}``,
``exploitability.png``, ``meta_strategies.png`` and ``payoff.png``. Ctrl-C keeps everything finished
(exit 130); ``--resume`` continues.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from leakgym.agents.policies.learned import ALGORITHMS
from leakgym.devices import device_argument
from leakgym.files import folder_argument

from ..cli_common import (
    INTERRUPTED,
    add_env_arguments,
    add_hyperparams_argument,
    apply_threads,
    parse_overrides,
    readable_warnings,
    resolve_env,
    split_agent_list,
    split_hyperparams,
)
from .psro import CELL_METRICS, Member, MetagameInterrupted, MetagameState, halved, run_psro
from .solvers import META_SOLVERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser)
    parser.add_argument("--iterations", type=int, default=5, help="PSRO iterations (default: 5)")
    parser.add_argument("--out", type=folder_argument, default=Path("runs/metagame"), help="output folder (default: runs/metagame)")
    parser.add_argument("--meta-solver", default="nash",
                        help=f"meta-solver: {', '.join(META_SOLVERS)} (default: nash)")
    parser.add_argument("--attackers", default=None,
                        help="initial attacker population, comma-separated specs (default: the env's attacker presets)")
    parser.add_argument("--defenders", default=None,
                        help="initial defender population (default: the env's defender presets)")
    parser.add_argument("--episodes", type=int, default=16, help="evaluation episodes per payoff cell (default: 16)")
    parser.add_argument("--timesteps", type=int, default=20_000,
                        help="environment steps per best-response training (default: 20000)")
    parser.add_argument("--algo", choices=ALGORITHMS, default="ppo",
                        help="Stable-Baselines3 algorithm of the oracle (default: ppo)")
    add_hyperparams_argument(parser)
    parser.add_argument("--lockstep", type=int, default=16, help="games played together in a cell block (default: 16)")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device (default: cpu)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out (same settings; --iterations may grow)")
    parser.add_argument("--ray", action="store_true", help="simulate payoff cells as Ray tasks (pip install leakgym[ray])")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def initial_populations(env_id: str, overrides: dict, attackers: str | None, defenders: str | None
                        ) -> dict[str, list[Member]]:
    """The members given, or the env's presets of each role (``leakgym list presets --env ID``)."""
    from leakgym.agents.policies.factory import make_agent
    from leakgym.agents.policies.presets import valid_presets
    from leakgym.game.scenario import load_scenario

    scenario = load_scenario(resolve_env(env_id)[1], **overrides)
    out = {}
    for role, text in (("attacker", attackers), ("defender", defenders)):
        specs = split_agent_list(text) if text is not None else valid_presets(scenario, role)
        if not specs:
            raise ValueError(f"the initial {role} population is empty ({env_id} allows no {role} preset); "
                             f"name members with --{role}s")
        for spec in specs:
            if spec.endswith(".zip"):
                raise ValueError(f"--{role}s {spec!r}: initial populations take scripted agents and presets; a "
                                 "policy joins through the oracle")
            make_agent(spec, role=role, scenario=scenario)  # a bad spec fails before anything is written
        out[role] = [Member(spec, spec, 0) for spec in specs]
    return out


def write_payoff_csv(state: MetagameState, path: Path) -> Path:
    from ..evaluation.payoff import t_interval

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["attacker", "defender", "episodes"] + [f"{m}_{s}" for m in CELL_METRICS
                                                           for s in ("mean", "ci95_low", "ci95_high")])
        for a in state.populations["attacker"]:
            for d in state.populations["defender"]:
                cell = state.game.cells[(a.name, d.name)]
                row = [a.name, d.name, cell.episodes]
                for m in CELL_METRICS:
                    row += [f"{v:.6g}" for v in t_interval(cell.values[m])]
                w.writerow(row)
    return path


def summary_text(state: MetagameState) -> str:
    lines = [(f"PSRO on {state.settings['env_id']} ({state.settings['meta_solver']} meta-solver): "
             f"{len(state.iterations)} iterations, {state.env_steps} env steps, {state.wall_time_s:.0f} s")]
    lines.append("  iter  exploitability [95% CI]        attacker gain   defender gain   new members")
    for r in state.iterations:
        e = r["exploitability"]
        lines.append(f"  {r['iteration']:>4}  {e['mean']:8.3f} [{e['ci95_low']:7.3f}, {e['ci95_high']:7.3f}]"
                     f"   {r['attacker_gain']['mean']:12.3f}   {r['defender_gain']['mean']:13.3f}   "
                     f"{r['new_attacker']}, {r['new_defender']}")
    verdict = halved(state)
    if verdict is not None:
        lines.append("  last exploitability below half of the first, intervals apart: " + ("yes" if verdict else "no"))
    for role in ("attacker", "defender"):
        meta = state.final.get(f"{role}_meta", [])
        mix = ", ".join(f"{m.name} {p:.2f}" for m, p in zip(state.populations[role], meta) if p > 1e-6)
        lines.append(f"final {role} meta-strategy: {mix}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from .report import report_card, write_figures, write_report_card
    from .simulation import LeakGymSimulator, SB3Oracle

    apply_threads(args.threads)
    if args.meta_solver not in META_SOLVERS:
        from .solvers import meta_solver

        meta_solver(args.meta_solver)  # raises the one-line error with the allowed names
    gym_id, scenario_name = resolve_env(args.env)
    overrides = parse_overrides(args.overrides)
    hyper_file, hyper = split_hyperparams(args.hyperparams)
    for name in ("iterations", "timesteps", "lockstep"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} {getattr(args, name)}; allowed: integers >= 1")
    initial = initial_populations(gym_id, overrides, args.attackers, args.defenders)
    progress = not args.no_progress
    simulator = LeakGymSimulator(gym_id, episodes=args.episodes, seed=args.seed, overrides=overrides, out=args.out,
                                 device=args.device, lockstep=args.lockstep, progress=progress, use_ray=args.ray,
                                 threads=args.threads)
    oracle = SB3Oracle(gym_id, timesteps=args.timesteps, seed=args.seed, overrides=overrides, out=args.out,
                       algo=args.algo, hyperparams=hyper, hyperparams_file=hyper_file, device=args.device,
                       progress=progress)
    settings = {"env_id": gym_id, "scenario": scenario_name, "overrides": overrides, "seed": args.seed,
                "episodes": args.episodes, "timesteps": args.timesteps, "algo": args.algo, "hyperparams": hyper,
                "hyperparams_file": None if hyper_file is None else str(hyper_file), "lockstep": args.lockstep,
                "device": str(args.device), "threads": args.threads, "ray": bool(args.ray),
                "initial": {r: [m.spec for m in ms] for r, ms in initial.items()}}
    try:
        with readable_warnings():
            state = run_psro(args.out, settings=settings, initial=initial, simulator=simulator, oracle=oracle,
                             iterations=args.iterations, meta_solver_name=args.meta_solver, resume=args.resume,
                             progress=progress)
    except MetagameInterrupted as exc:
        print(f"interrupted: {exc}; run the same command with --resume to continue", file=sys.stderr)
        return INTERRUPTED
    # every scripted defense preset the env allows is on the card: those outside the population are played
    # against the final attacker population now (their cells are kept in metagame.json)
    from leakgym.agents.policies.presets import valid_presets
    from leakgym.game.scenario import load_scenario

    from .psro import fill_cells

    in_population = {m.name for m in state.populations["defender"]}
    extra = [Member(p, p, 0) for p in valid_presets(load_scenario(scenario_name, **overrides), "defender")
             if p not in in_population]
    if extra:
        try:
            fill_cells(state, simulator, state.populations["attacker"], extra, "report_card", args.out)
        except KeyboardInterrupt:
            print(f"interrupted while simulating the report card's presets; every finished cell is in "
                  f"{Path(args.out) / 'metagame.json'}; run the same command with --resume to finish", file=sys.stderr)
            return INTERRUPTED
    rows = report_card(state, extra)
    from .report import summary_markdown

    summary_md = Path(args.out) / "metagame.md"
    from leakgym.bench import machine_label

    summary_md.write_text(summary_markdown(state, rows, device=machine_label(args.threads, args.device)))
    paths = [write_payoff_csv(state, Path(args.out) / "payoff.csv"), *write_report_card(rows, args.out), summary_md]
    paths += write_figures(state, args.out, rows)
    print(summary_text(state))
    print("wrote " + ", ".join(str(p) for p in [Path(args.out) / "metagame.json", *paths]))
    return 0


__all__ = ["add_arguments", "initial_populations", "main", "summary_text", "write_payoff_csv"]

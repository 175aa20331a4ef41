"""``leakgym metagame``: PSRO over attacker and defender populations on a LeakGym environment.

    leakgym metagame --env LeakGym-Digits-v0 --iterations 5 --out runs/metagame \\
        --timesteps 20000 --episodes 16 --meta-solver nash [--resume] [--ray]

Files written to ``OUT`` as the run goes (see :mod:`.psro`): ``metagame.json`` (settings, populations,
every cell's per-episode samples, each iteration's meta-strategies, gains and exploitability, env steps
and wall time), ``policies/<member>/policy.zip`` (+ ``policy.json``), ``cells/<block>/`` (each block's
``episodes.csv``); at the end ``payoff.csv`` (the final table), ``report_card.{csv,md,png}``,
``exploitability.png``, ``meta_strategies.png`` and ``payoff.png``, as one set (:func:`write_final_outputs`:
never a file of this run beside an earlier one). Ctrl-C keeps everything finished and says what (exit 130);
``--resume`` continues, or writes the final files of a finished run.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from contextlib import ExitStack
from pathlib import Path

from leakgym.agents.policies.learned import ALGORITHMS
from leakgym.devices import device_argument
from leakgym.files import folder_argument, replacing, write_atomically

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
from .psro import CELL_METRICS, STATE_FILE, Member, MetagameInterrupted, MetagameState, halved, run_psro
from .report import FIGURE_FILES
from .solvers import META_SOLVERS

#: the files written at the end of a run, as one set (:func:`write_final_outputs`)
FINAL_FILES = ("payoff.csv", "report_card.csv", "report_card.md", "metagame.md", *FIGURE_FILES)


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


def payoff_csv(state: MetagameState) -> str:
    """``payoff.csv``'s text: the final table, each cell's metrics with their 95% intervals."""
    from ..evaluation.payoff import t_interval

    buffer = io.StringIO()
    w = csv.writer(buffer)
    w.writerow(["attacker", "defender", "episodes"] + [f"{m}_{s}" for m in CELL_METRICS
                                                       for s in ("mean", "ci95_low", "ci95_high")])
    for a in state.populations["attacker"]:
        for d in state.populations["defender"]:
            cell = state.game.cells[(a.name, d.name)]
            row = [a.name, d.name, cell.episodes]
            for m in CELL_METRICS:
                row += [f"{v:.6g}" for v in t_interval(cell.values[m])]
            w.writerow(row)
    return buffer.getvalue()


def write_payoff_csv(state: MetagameState, path: Path) -> Path:
    """:func:`payoff_csv` to ``path``, replaced atomically (:func:`leakgym.files.write_atomically`)."""
    write_atomically(path, payoff_csv(state))
    return path


class FinalFilesInterrupted(KeyboardInterrupt):
    """Ctrl-C while :func:`write_final_outputs` wrote the final files. ``written``: the files of this run now
    in the folder; ``earlier``: those an earlier command wrote that are still there (never both at once)."""

    def __init__(self, written: list[str], earlier: list[str]) -> None:
        super().__init__(f"written {written}, earlier {earlier}")
        self.written, self.earlier = written, earlier


def _write_synced(path: Path, text: str) -> None:
    with open(path, "wb") as fh:
        fh.write(text.encode())
        fh.flush()
        os.fsync(fh.fileno())


def write_final_outputs(state: MetagameState, rows: list[dict], out: Path, *, device: str | None = None
                        ) -> list[Path]:
    """The final files (:data:`FINAL_FILES`) of a finished ``state`` with its report card ``rows``, as one
    set: each is written to a hidden partial file beside its name (:func:`leakgym.files.replacing`); once
    all are written, the earlier run's final files are removed, then the new ones renamed in. An interruption
    or a failing figure before that leaves the earlier set as it was (and no partial file), one during the
    renames some of the new files and none of the earlier ones: never a file of this run beside one of an
    earlier run (found in an audit: a Ctrl-C left a 2-iteration run's figures beside a 3-iteration run's
    tables). A Ctrl-C raises :class:`FinalFilesInterrupted`, naming what is there. Returns the paths written."""
    from .report import figure_makers, report_csv, report_markdown, save_figure, summary_markdown

    out = Path(out)
    names: list[str] = []
    renaming = False
    try:
        with ExitStack() as stack:
            texts = {"payoff.csv": payoff_csv(state), "report_card.csv": report_csv(rows),
                     "report_card.md": report_markdown(rows), "metagame.md": summary_markdown(state, rows, device=device)}
            for name, text in texts.items():
                _write_synced(stack.enter_context(replacing(out / name)), text)
                names.append(name)
            for name, make in figure_makers(state, rows):
                save_figure(make, stack.enter_context(replacing(out / name)))
                names.append(name)
            for name in FINAL_FILES:  # every new file is written: the earlier set goes ...
                (out / name).unlink(missing_ok=True)
            renaming = True  # ... and the new one is renamed in as the blocks end
        paths = [out / name for name in names]
    except KeyboardInterrupt:
        there = [name for name in FINAL_FILES if (out / name).is_file()]
        raise FinalFilesInterrupted(there if renaming else [], [] if renaming else there) from None
    return paths


def final_files_interrupted(exc: KeyboardInterrupt, out: Path) -> str:
    """What ``leakgym metagame`` says on a Ctrl-C while it writes the final files: what is in ``out`` and that
    ``--resume`` finishes it."""
    out = Path(out)
    if isinstance(exc, FinalFilesInterrupted):
        written, earlier = exc.written, exc.earlier
    else:  # before write_final_outputs began: nothing of this run's final files was written
        written, earlier = [], [name for name in FINAL_FILES if (out / name).is_file()]
    if written:
        missing = [name for name in FINAL_FILES if name not in written]
        kept = f"its final files written: {', '.join(written)}" + (f"; not yet: {', '.join(missing)}" if missing else "")
    else:
        kept = "none of its final files was written" + (
            f" (those in {out}, {', '.join(earlier)}, are an earlier command's)" if earlier else "")
    return (f"interrupted while writing the final files; every cell and iteration is in {out / STATE_FILE}; {kept}; "
            "run the same command with --resume to finish")


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
    from .report import report_card
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
    try:
        from leakgym.bench import machine_label

        rows = report_card(state, extra)
        paths = write_final_outputs(state, rows, args.out, device=machine_label(args.threads, args.device))
    except KeyboardInterrupt as exc:  # (found in an audit: only "leakgym metagame: interrupted" was said)
        print(final_files_interrupted(exc, args.out), file=sys.stderr)
        return INTERRUPTED
    try:
        print(summary_text(state))
        print("wrote " + ", ".join(str(p) for p in [Path(args.out) / "metagame.json", *paths]))
    except KeyboardInterrupt:
        print(f"interrupted after every final file was written; the run in {args.out} is complete", file=sys.stderr)
        return INTERRUPTED
    return 0


__all__ = ["FINAL_FILES", "FinalFilesInterrupted", "add_arguments", "final_files_interrupted", "initial_populations",
           "main", "payoff_csv", "summary_text", "write_final_outputs", "write_payoff_csv"]

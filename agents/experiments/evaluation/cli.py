"""``leakgym eval``: every attacker against every defender, as an empirical payoff table.

How pairs are played (fresh agents per pair, common random numbers ``seed + e`` for episode ``e``,
``--lockstep`` games at a time as one batched computation) is described in
:mod:`leakgym.agents.experiments.evaluation.play`; the per-pair statistics (mean over episodes and a
95% Student-t confidence interval) in :mod:`leakgym.agents.experiments.evaluation.payoff`; best
responses and pure-strategy equilibria in :mod:`leakgym.agents.experiments.evaluation.analysis`; the
payoff files in :mod:`leakgym.agents.experiments.evaluation.reporting`.

Files written to ``OUT``:

``payoff.csv``
    one row per pair: ``attacker, defender, episodes, total_rounds`` (rounds played over all the
    pair's episodes) then, for each metric in :data:`METRICS`, ``<metric>_mean, <metric>_ci95_low,
    <metric>_ci95_high`` (the interval clipped to the metric's range; empty when undefined).
``payoff.json``
    the same rows (``null`` for undefined values) plus the settings, the best responses and the
    pure-strategy equilibria of the empirical game (see :func:`best_responses`).
``payoff.png``
    heatmap attacker x defender of mean leakage SSIM, annotated with the 95% t-interval, with the
    best responses and pure-strategy equilibria marked (see :func:`heatmap_figure`); it warns when
    pairs have fewer than 5 episodes.
``gallery.png``
    one panel per pair, laid out as the payoff table: the private images of the last round of the pair's
    episode ``(row + column) mod episodes`` (so neighbouring pairs show different originals), each beside
    the attacker's matched reconstruction, with SSIM and PSNR (see :func:`gallery_figure`); not
    written, with a warning, when no pair's last round could be read back (a resumed run whose
    ``last_round/`` files are gone or damaged).
``episodes.csv``, ``run.json``, ``last_round/``
    written while the run goes: every finished pair's per-episode values, the run's settings and
    each pair's kept round (see :mod:`leakgym.agents.experiments.evaluation.episode_log`). After an
    interrupt (Ctrl-C), the same command with ``--resume`` plays only the groups of games of pairs that had not finished.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from leakgym.devices import device_argument
from leakgym.files import folder_argument, json_safe

from ..cli_common import (
    INTERRUPTED,
    add_env_arguments,
    apply_threads,
    readable_warnings,
    scenario_overrides,
    split_agent_list,
)
from .analysis import best_responses, mixed_equilibria, mixed_equilibria_text, who_beats_whom
from .episode_log import EPISODES_FILE
from .payoff import METRICS, EpisodeStats, LastRound, PairResult, PayoffTable, t_interval
from .play import DEFAULT_LOCKSTEP, evaluate, play_episode, play_episodes
from .reporting import CSV_COLUMNS, gallery_figure, heatmap_figure, payoff_text, write_outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``leakgym eval``."""
    add_env_arguments(parser)
    parser.add_argument(
        "--attackers", default="random", help="comma-separated attacker specs: names, presets, fixed:a,b,c, policy .zip paths"
    )
    parser.add_argument("--defenders", default="none,random", help="comma-separated defender specs")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per pair")
    parser.add_argument("--out", type=folder_argument, default=Path("runs/eval"), help="output folder")
    parser.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the interrupted run in --out: keep the pairs already in {EPISODES_FILE} and play the rest "
        "(the other settings must be the same)",
    )
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device of the games (default: cpu)")
    parser.add_argument(
        "--lockstep", type=int, default=DEFAULT_LOCKSTEP,
        help=f"games played together, their rounds one batched computation (a pair of episodic agents plays its "
        f"episodes at once; default: {DEFAULT_LOCKSTEP}; 1: one game at a time, each number exactly as played alone; "
        "otherwise equal to the rounding of batched kernels)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    """Run ``leakgym eval``: play all pairs, write the payoff files, print the table and who beats whom."""
    apply_threads(args.threads)
    started = time.time() - 2  # slack for file systems that keep modification times in whole seconds
    try:
        table = evaluate(
            args.env,
            split_agent_list(args.attackers),
            split_agent_list(args.defenders),
            episodes=args.episodes,
            seed=args.seed,
            overrides=scenario_overrides(args),
            progress=not args.no_progress,
            out=args.out,
            resume=args.resume,
            device=args.device,
            lockstep=args.lockstep,
        )
    except KeyboardInterrupt:
        log = Path(args.out) / EPISODES_FILE
        # this run's log: opened (rewritten) by this call; an earlier run's file there cannot be resumed as this one
        if log.is_file() and log.stat().st_mtime >= started:
            print(f"interrupted: every finished pair is in {log}; run the same command with --resume to play the rest",
                  file=sys.stderr)
        else:  # interrupted while the games were being built: no log to resume yet
            print("interrupted before any pair was recorded; nothing was written", file=sys.stderr)
        return INTERRUPTED
    try:
        with readable_warnings():
            paths = write_outputs(table, args.out)
    except KeyboardInterrupt:
        print(f"interrupted while writing the tables: every pair is in {Path(args.out) / EPISODES_FILE}; run the "
              "same command with --resume to write them", file=sys.stderr)
        return INTERRUPTED
    print(payoff_text(table))
    print(who_beats_whom(table))
    print(mixed_equilibria_text(mixed_equilibria(table)))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


__all__ = [
    "CSV_COLUMNS",
    "INTERRUPTED",
    "METRICS",
    "EpisodeStats",
    "LastRound",
    "PairResult",
    "PayoffTable",
    "add_arguments",
    "best_responses",
    "evaluate",
    "gallery_figure",
    "heatmap_figure",
    "json_safe",
    "main",
    "payoff_text",
    "play_episode",
    "play_episodes",
    "t_interval",
    "who_beats_whom",
    "write_outputs",
]

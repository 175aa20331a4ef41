"""``leakgym selfplay``: alternating best responses between a learned attacker and defender.

Iteration ``k`` (1-based) of ``K``:

1. train an attacker against the frozen defender ``D_{k-1}`` (``D_0`` is ``--initial-defender``,
   a scripted agent or preset; ``random`` by default) -> ``A_k``;
2. train a defender against the frozen new attacker ``A_k`` -> ``D_k``;
3. evaluate ``A_k`` vs ``D_{k-1}`` (what the attacker learnt) and ``A_k`` vs ``D_k`` (what the
   defender's response recovered) on the parallel environment for ``--eval-episodes`` episodes.

This is iterated best response (fictitious-play style with only the latest opponent); it need not
converge in general-sum games, so the summary records every iteration for inspection.

Output::

    OUT/iter_01/attacker/policy.zip (+ policy.json, checkpoints/, tb/)
    OUT/iter_01/defender/policy.zip ...
    OUT/summary.json   settings, per-iteration policy paths and evaluation numbers

The evaluation numbers are each pair's means of ``leakage_ssim``, ``leakage_psnr``, ``accuracy`` and the
returns, and ``leakage_lpips`` where the user's LPIPS backbone weights are on disk (``lpips`` in the
summary names the backbone; without the weights it is ``null``, ``lpips_note`` says why once, and the
pairs carry no ``leakage_lpips``).

An earlier run's ``iter_NN`` folders and ``summary.json`` in ``OUT`` are removed when a run starts, and
``summary.json`` is written then (the settings, no iterations yet) and rewritten after every iteration. A
policy the run reads (``--initial-defender``) may not lie in ``OUT``. Ctrl-C (``KeyboardInterrupt``) saves the policy
being trained (see :mod:`leakgym.agents.experiments.training`), records the unfinished iteration in the summary
(its ``interrupted`` entry names the stage: attacker training, defender training or evaluation)
and raises :class:`SelfPlayInterrupted`; ``leakgym selfplay`` then exits with status 130.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from leakgym.agents.policies.learned import ALGORITHMS
from leakgym.checks import is_integer
from leakgym.devices import device_argument
from leakgym.files import folder_argument, json_safe, write_atomically

from .cli_common import (
    INTERRUPTED,
    add_env_arguments,
    add_hyperparams_argument,
    apply_threads,
    readable_warnings,
    resolve_env,
    scenario_overrides,
    split_hyperparams,
)
from .evaluation.play import evaluate
from .training import MAX_TRAIN_SEED, TrainConfig, TrainingInterrupted, check_config, train
from .training.checks import check_outside


class SelfPlayInterrupted(KeyboardInterrupt):
    """Ctrl-C during self-play, after the summary (and the policy being trained) were saved."""

    def __init__(self, summary: dict[str, Any]) -> None:
        stop = summary["interrupted"]
        super().__init__(f"self-play interrupted in iteration {stop['iteration']} ({stop['stage']})")
        self.summary = summary


def _eval_pairs(env_id: str, attacker: str, defenders: list[str], episodes: int, seed: int, overrides: dict,
                device: str = "cpu", lpips: bool = False) -> list[dict[str, Any]]:
    """``attacker`` against each of ``defenders`` (one evaluation: the pairs play in lockstep); ``lpips``:
    keep ``leakage_lpips`` too (the games report it where the LPIPS weights are present)."""
    table = evaluate(env_id, [attacker], defenders, episodes=episodes, seed=seed, overrides=overrides, progress=False,
                     device=device)
    keep = ("leakage_ssim", "leakage_psnr", *(("leakage_lpips",) if lpips else ()), "accuracy", "attacker_return",
            "defender_return")
    return [{m: row[f"{m}_mean"] for m in keep} for row in table.rows()]


def _clear_previous_run(out: Path) -> None:
    """Remove what an earlier self-play run in ``out`` wrote (its ``iter_NN`` folders and ``summary.json``):
    a shorter run would leave the earlier run's later iterations beside its own, and a crash its summary."""
    for folder in out.glob("iter_[0-9][0-9]"):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
    if (out / "summary.json").is_file():
        (out / "summary.json").unlink()


def selfplay(
    env_id: str,
    *,
    iterations: int,
    timesteps: int | None,
    out: Path,
    seed: int = 0,
    algo: str = "ppo",
    initial_defender: str = "random",
    overrides: dict[str, Any] | None = None,
    hyperparams: dict[str, Any] | None = None,
    hyperparams_file: Path | None = None,
    eval_episodes: int = 2,
    progress: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Run ``iterations`` rounds of alternating best responses; returns (and writes) the summary."""
    # integers before anything else (bools are not): iterations=2.5 passed this check, cleared the folder of an
    # earlier run and then failed; seed=True trained with seeds 3, 4, ...
    if not (is_integer(iterations) and iterations >= 1):
        raise ValueError(f"iterations={iterations!r}; allowed: integers >= 1")
    if not (is_integer(eval_episodes) and eval_episodes >= 0):
        raise ValueError(f"eval_episodes={eval_episodes!r}; allowed: integers >= 0 (0: no evaluations)")
    if not (is_integer(seed) and seed >= 0):
        raise ValueError(f"seed={seed!r}; allowed: integers >= 0 (iteration k trains with seed + 2k and seed + 2k + 1)")
    last = int(seed) + 2 * int(iterations) + 1
    if last > MAX_TRAIN_SEED:
        raise ValueError(f"seed={seed} with iterations={iterations}: iteration k trains with seed + 2k + 1, up to {last}; "
                         f"allowed: seed <= {MAX_TRAIN_SEED - 2 * iterations - 1} (training seeds are at most 2**32 - 1)")
    gym_id, _ = resolve_env(env_id)
    overrides = dict(overrides or {})
    check_outside(initial_defender, out, "initial_defender")
    # The first training run's settings (hyperparameters, scenario, the initial defender, steps) are checked
    # before the folder or its summary.json is touched; a later run's opponent is a policy trained here.
    check_config(TrainConfig(env_id=gym_id, role="attacker", algo=algo, timesteps=timesteps, opponent=initial_defender,
                             out=Path(out), seed=seed + 2, overrides=overrides, hyperparams=dict(hyperparams or {}),
                             hyperparams_file=hyperparams_file, device=device))
    from leakgym.metrics import lpips_available, lpips_status

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _clear_previous_run(out)
    with_lpips = lpips_available()
    summary: dict[str, Any] = {
        "env_id": gym_id,
        "algo": algo,
        "iterations": iterations,
        "timesteps": timesteps,
        "seed": seed,
        "initial_defender": initial_defender,
        "overrides": overrides,
        "hyperparams": dict(hyperparams or {}),
        "hyperparams_file": None if hyperparams_file is None else str(hyperparams_file),
        # LPIPS beside SSIM/PSNR where the user's backbone weights are on disk, else null with the reason once
        "lpips": "alex" if with_lpips else None,
        "lpips_note": lpips_status(),
        "history": [],
    }
    defender: str = initial_defender
    t0 = time.perf_counter()

    def write_summary() -> None:
        summary["wall_time_s"] = round(time.perf_counter() - t0, 3)
        write_atomically(out / "summary.json", json.dumps(json_safe(summary), indent=2, default=str))

    write_summary()  # this run's settings from the start: a crash leaves no earlier run's summary
    for k in range(1, iterations + 1):
        folder = out / f"iter_{k:02d}"
        common = {"env_id": gym_id, "algo": algo, "timesteps": timesteps, "overrides": overrides,
                  "hyperparams": dict(hyperparams or {}), "hyperparams_file": hyperparams_file, "progress": progress, "device": device}
        entry: dict[str, Any] = {"iteration": k}
        stage = "attacker"
        try:
            att = train(TrainConfig(role="attacker", opponent=defender, out=folder / "attacker", seed=seed + 2 * k, **common))
            attacker = entry["attacker"] = str(att.policy_path)
            stage = "defender"
            dfd = train(TrainConfig(role="defender", opponent=attacker, out=folder / "defender", seed=seed + 2 * k + 1, **common))
            entry["defender"] = str(dfd.policy_path)
            entry["attacker_opponent"] = defender
            stage = "evaluation"
            if eval_episodes:
                # The scenario the policies trained in: the overrides of both the command line and the
                # hyperparameter file's env_kwargs, without the view's settings (device, flat actions, ...).
                trained = dfd.metadata["overrides"]
                entry["attacker_vs_previous_defender"], entry["attacker_vs_new_defender"] = _eval_pairs(
                    gym_id, attacker, [defender, str(dfd.policy_path)], eval_episodes, seed, trained, device,
                    lpips=with_lpips)
        except KeyboardInterrupt as stop:
            if isinstance(stop, TrainingInterrupted):  # the policy reached so far was saved
                entry[stage] = str(stop.result.policy_path)
            entry.setdefault("attacker_opponent", defender)
            where = {"attacker": "attacker training", "defender": "defender training"}.get(stage, stage)
            entry["interrupted"] = where
            summary["history"].append(entry)
            summary["interrupted"] = {"iteration": k, "stage": where}
            write_summary()
            raise SelfPlayInterrupted(summary) from None
        except Exception as exc:
            # what was reached is on disk: the summary says so and where it failed
            entry["failed"] = f"{stage}: {type(exc).__name__}: {exc}"
            summary["history"].append(entry)
            write_summary()
            raise
        summary["history"].append(entry)
        defender = entry["defender"]
        write_summary()  # after every iteration
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``leakgym selfplay``."""
    add_env_arguments(parser)
    parser.add_argument("--iterations", type=int, default=3, help="best-response iterations K")
    parser.add_argument("--timesteps", type=int, default=None, help="steps per training run (default: the YAML's)")
    parser.add_argument("--algo", choices=ALGORITHMS, default="ppo",
                        help="Stable-Baselines3 algorithm (dqn plays with flat_actions=True)")
    parser.add_argument("--initial-defender", default="random", help="frozen defender D_0 for the first attacker")
    parser.add_argument("--eval-episodes", type=int, default=2, help="evaluation episodes per matchup (0 = none)")
    add_hyperparams_argument(parser)
    parser.add_argument("--out", type=folder_argument, default=Path("runs/selfplay"), help="output folder")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device of the policies and the games")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def main(args: argparse.Namespace) -> int:
    apply_threads(args.threads)
    hyperparams_file, hyperparams = split_hyperparams(args.hyperparams)
    try:
        with readable_warnings():
            summary = selfplay(
                args.env,
                iterations=args.iterations,
                timesteps=args.timesteps,
                out=args.out,
                seed=args.seed,
                algo=args.algo,
                initial_defender=args.initial_defender,
                overrides=scenario_overrides(args),
                hyperparams=hyperparams,
                hyperparams_file=hyperparams_file,
                eval_episodes=args.eval_episodes,
                progress=not args.no_progress,
                device=args.device,
            )
    except SelfPlayInterrupted as stop:
        where = stop.summary["interrupted"]
        print(f"interrupted in iteration {where['iteration']} ({where['stage']}); the policies reached so far and "
              f"{Path(args.out) / 'summary.json'} are saved", file=sys.stderr)
        return INTERRUPTED
    for entry in summary["history"]:
        line = f"iteration {entry['iteration']}: {entry['attacker']} / {entry['defender']}"
        if "attacker_vs_new_defender" in entry:
            before = entry["attacker_vs_previous_defender"]["leakage_ssim"]
            after = entry["attacker_vs_new_defender"]["leakage_ssim"]
            line += f"  SSIM vs previous defender {before:.3f}, vs new defender {after:.3f}"
        print(line)
    print(f"summary: {Path(args.out) / 'summary.json'}")
    return 0


__all__ = ["SelfPlayInterrupted", "add_arguments", "main", "selfplay"]

"""``leakgym train``: its arguments and ``main``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from leakgym.agents.policies.learned import ALGORITHMS
from leakgym.agents.policies.scripted import ROLES
from leakgym.devices import device_argument
from leakgym.files import folder_argument

from ..cli_common import (
    INTERRUPTED,
    add_env_arguments,
    add_hyperparams_argument,
    apply_threads,
    readable_warnings,
    scenario_overrides,
    split_hyperparams,
)
from .config import TrainConfig, TrainingInterrupted
from .loop import train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``leakgym train``."""
    add_env_arguments(parser)
    parser.add_argument("--role", choices=ROLES, default=None,
                        help="which side learns (default: the hyperparameter file's env_kwargs role, attacker)")
    parser.add_argument("--algo", choices=ALGORITHMS, default="ppo",
                        help="Stable-Baselines3 algorithm (dqn plays with flat_actions=True)")
    parser.add_argument("--timesteps", type=int, default=None,
                        help="environment steps (default: the file's n_timesteps; PPO/A2C round up to whole rollouts)")
    parser.add_argument(
        "--opponent", default=None,
        help="frozen opponent: random, round-robin, bandit, a preset, fixed:..., or a policy .zip "
        "(default: the file's env_kwargs opponent, random)",
    )
    parser.add_argument("--out", type=folder_argument, default=Path("runs/train"), help="output folder")
    add_hyperparams_argument(parser)
    parser.add_argument("--checkpoint-freq", type=int, default=None,
                        help="checkpoint every N steps (default: a quarter of the run; 0: no checkpoints)")
    parser.add_argument("--eval-freq", type=int, default=0,
                        help="evaluate against the opponent every N steps, to TensorBoard and OUT/eval.csv (0: never)")
    parser.add_argument("--eval-episodes", type=int, default=2, help="episodes per evaluation (default: 2)")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device of the policy and of the games")
    parser.add_argument("--n-envs", type=int, default=None,
                        help="games per step (default: the file's n_envs); N > 1 trains on the batched vector env "
                        "(one batched round per step for all N games)")
    parser.add_argument("--batch-clients", action=argparse.BooleanOptionalAction, default=None,
                        help="with N > 1 games: batch the victims' clean updates and defenses, benign clients, "
                        "aggregation and evaluation over the games (equal to rounding; default: on whenever "
                        "N > 1; pays off on GPUs and, on a CPU, for the digits LeNet: pass --no-batch-clients "
                        "for the CIFAR ConvNet on a CPU)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    path, hyperparams = split_hyperparams(args.hyperparams)
    if args.n_envs is not None:
        if args.n_envs < 1:
            raise ValueError(f"--n-envs={args.n_envs}; allowed: integers >= 1")
        hyperparams["n_envs"] = args.n_envs
    return TrainConfig(
        env_id=args.env,
        role=args.role,
        algo=args.algo,
        timesteps=args.timesteps,
        opponent=args.opponent,
        out=args.out,
        seed=args.seed,
        overrides=scenario_overrides(args),
        hyperparams=hyperparams,
        hyperparams_file=path,
        checkpoint_freq=args.checkpoint_freq,
        eval_freq=args.eval_freq,
        eval_episodes=args.eval_episodes,
        progress=not args.no_progress,
        device=args.device,
        batch_clients=args.batch_clients,
    )


def main(args: argparse.Namespace) -> int:
    """Run ``leakgym train``; prints where the policy went."""
    apply_threads(args.threads)
    config = config_from_args(args)
    try:
        with readable_warnings():
            result = train(config)
    except TrainingInterrupted as stop:
        meta = stop.result.metadata
        print(f"interrupted after {meta['timesteps']} steps; saved the policy reached so far to "
              f"{stop.result.policy_path} (policy.json says \"interrupted\": true)", file=sys.stderr)
        return INTERRUPTED
    print(f"saved {result.policy_path} ({result.metadata['timesteps']} steps, {result.metadata['wall_time_s']:.1f} s)")
    print(f"TensorBoard: tensorboard --logdir {result.out / 'tb'}")
    if config.eval_freq:
        print(f"evaluations: {result.out / 'eval.csv'}")
    return 0

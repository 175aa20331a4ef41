"""Both LeakGym roles learn at once with Ray RLlib's PPO: one policy per agent, several env runners.

    pip install "leakgym[rllib]"
    python examples/rllib_selfplay.py --iterations 50 --env-runners 2 --out runs/rllib

Every env runner plays the PettingZoo parallel environment (``leakgym_v0.parallel_env``) through
RLlib's ``ParallelPettingZooEnv``; agent ``"attacker"`` is played by the RLModule ``"attacker"``
and agent ``"defender"`` by ``"defender"``, and both are updated from the same episodes
(simultaneous self-play: each learns against the other's current policy). RLlib's default
models handle the ``MultiDiscrete`` action menus directly.

After every iteration one line is appended to ``OUT/iterations.csv``: the iteration, environment
steps so far, both agents' mean episode returns and the mean leakage SSIM and final test accuracy
of the iteration's episodes (from the round infos, logged by :class:`LeakGymMetrics`). The last
iteration's checkpoint goes to ``OUT/checkpoint`` (RLlib's format; restore with
``Algorithm.from_checkpoint``). ``--tiny`` shrinks the game (2 rounds, 1-2 attack iterations, one
benign client) for a smoke run.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

#: scenario overrides of --tiny: two cheap rounds per episode
TINY = {"max_cycles": 2, "num_clients": 1, "eval_size": 32, "iterations": [1, 2], "restarts": [1]}
COLUMNS = ["iteration", "env_steps", "attacker_return", "defender_return", "leakage_ssim", "accuracy", "wall_time_s"]


def make_env(config: dict[str, Any]):
    """RLlib's env creator: the LeakGym parallel env (``config``: scenario and overrides) wrapped for RLlib."""
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    from leakgym.envs import leakgym_v0

    return ParallelPettingZooEnv(leakgym_v0.parallel_env(**config))


def metrics_callback():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class LeakGymMetrics(RLlibCallback):
        """Per finished episode: the mean leakage SSIM over its rounds and the final test accuracy."""

        def on_episode_end(self, *, episode, metrics_logger=None, **kwargs) -> None:
            # the reset infos have the same keys, with round 0 (no round played: zeros, matching_loss -1)
            infos = [i for i in episode.get_infos().get("attacker", []) if i.get("round", 0) > 0]
            if infos and metrics_logger is not None:
                metrics_logger.log_value("leakage_ssim", sum(i["leakage_ssim"] for i in infos) / len(infos))
                metrics_logger.log_value("accuracy", infos[-1]["accuracy"])

    return LeakGymMetrics


def build_config(args: argparse.Namespace, env_config: dict[str, Any]):
    """The PPOConfig: one RLModule per agent, ``args.env_runners`` runners, whole episodes per batch."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    from leakgym.game.scenario import load_scenario

    register_env("leakgym_v0", make_env)
    rounds = env_config.get("max_cycles") or load_scenario(env_config.get("scenario", "digits")).rounds
    # Each runner collects whole episodes; one training batch holds --episodes episodes per runner.
    fragment = rounds * args.episodes
    batch = fragment * max(args.env_runners, 1)
    roles = ("attacker", "defender")
    return (
        PPOConfig()
        .environment("leakgym_v0", env_config=env_config)
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=1, rollout_fragment_length=fragment)
        .training(train_batch_size_per_learner=batch, minibatch_size=min(batch, 64), num_epochs=args.epochs,
                  lr=args.lr, gamma=0.9)
        .multi_agent(policies=set(roles), policy_mapping_fn=lambda agent_id, *a, **k: agent_id)
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={r: RLModuleSpec() for r in roles}))
        .callbacks(metrics_callback())
        .debugging(seed=args.seed)
    )


def _value(results: dict, *path: str) -> float:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return math.nan
        node = node[key]
    return float(node)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Train for ``args.iterations`` iterations; returns (and writes, row by row) the per-iteration rows."""
    import time

    import ray
    from tqdm.auto import tqdm

    env_config: dict[str, Any] = {"scenario": args.scenario, **(TINY if args.tiny else {})}
    if args.rounds is not None:
        env_config["max_cycles"] = args.rounds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=args.env_runners + 1, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        algo = build_config(args, env_config).build_algo()
        t0 = time.perf_counter()
        with open(out / "iterations.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            for i in tqdm(range(1, args.iterations + 1), desc="rllib", unit="iteration", disable=args.no_progress):
                results = algo.train()
                row = {
                    "iteration": i,
                    "env_steps": int(_value(results, "env_runners", "num_env_steps_sampled_lifetime")),
                    "attacker_return": _value(results, "env_runners", "agent_episode_returns_mean", "attacker"),
                    "defender_return": _value(results, "env_runners", "agent_episode_returns_mean", "defender"),
                    "leakage_ssim": _value(results, "env_runners", "leakage_ssim"),
                    "accuracy": _value(results, "env_runners", "accuracy"),
                    "wall_time_s": round(time.perf_counter() - t0, 3),
                }
                writer.writerow(row)
                fh.flush()
                rows.append(row)
        algo.save_to_path(str((out / "checkpoint").resolve()))
        algo.stop()
    finally:
        ray.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20, help="PPO training iterations (default: 20)")
    parser.add_argument("--env-runners", type=int, default=2, help="RLlib env runners, one process each (default: 2)")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per runner per iteration (default: 2)")
    parser.add_argument("--epochs", type=int, default=4, help="PPO epochs per iteration (default: 4)")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default: 1e-3)")
    parser.add_argument("--scenario", default="digits", help="LeakGym scenario (default: digits)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per episode (default: the scenario's)")
    parser.add_argument("--tiny", action="store_true", help="a cheap 2-round game for a smoke run")
    parser.add_argument("--seed", type=int, default=0, help="RLlib seed (default: 0)")
    parser.add_argument("--out", default="runs/rllib", help="output folder (default: runs/rllib)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    for name in ("iterations", "env_runners", "episodes", "epochs"):
        if getattr(args, name) < (0 if name == "env_runners" else 1):
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}; must be >= "
                         f"{0 if name == 'env_runners' else 1}")
    try:  # (RLlib itself: plain Ray comes with the dev extra, without RLlib's own dependencies)
        from ray.rllib.algorithms.ppo import PPOConfig  # noqa: F401
    except ImportError:
        print('this example needs Ray RLlib: pip install "leakgym[rllib]"', file=sys.stderr)
        return 2
    rows = run(args)
    last = rows[-1]
    print(f"{last['iteration']} iterations, {last['env_steps']} env steps: attacker return {last['attacker_return']:.3f}, "
          f"defender return {last['defender_return']:.3f}, leakage SSIM {last['leakage_ssim']:.3f}")
    print(f"wrote {Path(args.out) / 'iterations.csv'} and {Path(args.out) / 'checkpoint'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

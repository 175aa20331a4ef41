"""``leakgym train``: a Stable-Baselines3 PPO or A2C policy for one role against a fixed opponent.

The learner plays the Gymnasium single-agent view ``gym.make(env_id, role=..., opponent=...)``
(see :mod:`leakgym.envs.single_agent`); the opponent is anything :func:`leakgym.agents.make_agent`
accepts (a scripted name, a preset, or a saved policy — which is how self-play freezes a player).

Hyperparameters come from ``agents/hyperparams/<env id>_<role>.yml`` in rl-baselines3-zoo's layout:
one section per algorithm (``ppo:``, ``a2c:``) holding ``n_timesteps``, ``n_envs``, ``policy``,
``policy_kwargs`` and the algorithm's constructor arguments (``n_steps``, ``batch_size``,
``learning_rate``, ``gamma``, ``ent_coef``, ...). Environments without their own file use
``default_<role>.yml``. Individual values can be overridden (``--hyperparams n_steps=16``).

A run writes, under ``OUT``::

    policy.zip          the final policy (SB3 format; load with make_agent("OUT/policy.zip", ...))
    policy.json         spaces and network architecture (what loading it needs, see
                        :mod:`leakgym.agents.learned`), algorithm, env id, role, opponent, overrides,
                        hyperparameters, steps, wall time, ``interrupted``
    checkpoints/        policy_<steps>_steps.zip (+ .json) every ``checkpoint_freq`` environment steps
    tb/                 TensorBoard logs (``tensorboard --logdir OUT/tb``)

Ctrl-C (``KeyboardInterrupt``) during learning saves the policy as it is then to ``policy.zip`` /
``policy.json`` (with ``"interrupted": true`` and the steps done) and raises
:class:`TrainingInterrupted`, itself a ``KeyboardInterrupt`` carrying the :class:`TrainResult`;
``leakgym train`` then says where the policy went and exits with status 130.

The progress bar is a small tqdm callback (SB3's own needs ``rich``, which LeakGym does not require).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cli_common import INTERRUPTED, add_env_arguments, apply_threads, parse_overrides, resolve_env
from .learned import ALGORITHMS, algorithm_class, policy_spec, save_policy
from .scripted import ROLES, check_role

HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
#: keys of a hyperparameter section that are not algorithm constructor arguments
RUN_KEYS = ("n_timesteps", "n_envs", "policy")


def hyperparams_file(env_id: str, role: str) -> Path:
    """The YAML file for ``env_id`` and ``role`` (``default_<role>.yml`` when there is no specific one)."""
    check_role(role)
    specific = HYPERPARAMS_DIR / f"{env_id}_{role}.yml"
    return specific if specific.exists() else HYPERPARAMS_DIR / f"default_{role}.yml"


def load_hyperparams(env_id: str, role: str, algo: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``algo`` section of the role's hyperparameter file, with ``overrides`` applied and checked."""
    cls = algorithm_class(algo)
    path = hyperparams_file(env_id, role)
    data = yaml.safe_load(path.read_text()) or {}
    if algo not in data:
        raise ValueError(f"{path} has no {algo!r} section; it has {sorted(data)}")
    params = dict(data[algo])
    params.update(overrides or {})
    allowed = set(inspect.signature(cls.__init__).parameters) - {"self", "policy", "env"} | set(RUN_KEYS)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"hyperparameter(s) {unknown} are not {cls.__name__} arguments; allowed: {sorted(allowed)}")
    return params


@dataclass
class TrainConfig:
    """One training run."""

    env_id: str = "LeakGym-Digits-v0"
    """Gymnasium id (or scenario name) of the environment."""
    role: str = "attacker"
    """Which side learns: attacker or defender."""
    algo: str = "ppo"
    """ppo or a2c."""
    timesteps: int | None = None
    """Environment steps (rounds) to train for; None = the file's n_timesteps."""
    opponent: Any = "random"
    """The frozen opponent: a make_agent spec (name, preset, policy path) or an Agent."""
    out: Path = Path("runs/train")
    """Output folder (policy.zip, policy.json, checkpoints/, tb/)."""
    seed: int = 0
    """Seed of SB3 (network init, sampling) and of the environments."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Scenario overrides passed to the environment (e.g. rounds=2)."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Overrides of the hyperparameter file's values."""
    checkpoint_freq: int | None = None
    """Save a checkpoint every this many environment steps; None = a quarter of the run."""
    progress: bool = True
    """Show a tqdm progress bar."""
    device: str = "cpu"
    """Torch device of the policy network."""
    callback: Any = None
    """Extra Stable-Baselines3 callback (or list of callbacks) run during learning."""


@dataclass
class TrainResult:
    policy_path: Path
    out: Path
    metadata: dict[str, Any]
    interrupted: bool = False
    """True when learning was stopped by Ctrl-C (the policy is the one reached by then)."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during learning, after the current policy was saved; ``result`` says where."""

    def __init__(self, result: TrainResult) -> None:
        super().__init__(f"training interrupted after {result.metadata['timesteps']} steps; saved {result.policy_path}")
        self.result = result


def _progress_callback(total: int):
    from stable_baselines3.common.callbacks import BaseCallback
    from tqdm.auto import tqdm

    class TqdmCallback(BaseCallback):
        """A tqdm bar over environment steps (SB3's ``progress_bar=True`` needs ``rich``)."""

        def _on_training_start(self) -> None:
            self.bar = tqdm(total=total, desc="train", unit="step")

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return TqdmCallback()


def _checkpoint_callback(save_freq: int, folder: Path, metadata: dict[str, Any]):
    from stable_baselines3.common.callbacks import BaseCallback

    class PolicyCheckpoints(BaseCallback):
        """``folder/policy_<steps>_steps.zip`` and its JSON file every ``save_freq`` calls."""

        def _init_callback(self) -> None:
            folder.mkdir(parents=True, exist_ok=True)

        def _on_step(self) -> bool:
            if self.n_calls % save_freq == 0:
                path = folder / f"policy_{self.num_timesteps}_steps.zip"
                save_policy(self.model, path, {**metadata, "timesteps": int(self.num_timesteps)})
            return True

    return PolicyCheckpoints()


def make_training_env(config: TrainConfig, n_envs: int):
    """A monitored ``DummyVecEnv`` of ``n_envs`` single-agent views, seeded from ``config.seed``."""
    from stable_baselines3.common.env_util import make_vec_env

    gym_id, _ = resolve_env(config.env_id)
    env_kwargs = {"role": config.role, "opponent": config.opponent, **config.overrides}
    return make_vec_env(gym_id, n_envs=n_envs, seed=config.seed, env_kwargs=env_kwargs)


def train(config: TrainConfig) -> TrainResult:
    """Train one policy; see the module docstring for what is written to ``config.out``.

    Raises :class:`TrainingInterrupted` (a ``KeyboardInterrupt``) after saving the current policy
    when learning is interrupted.
    """
    import stable_baselines3
    from stable_baselines3.common.callbacks import CallbackList

    check_role(config.role)
    if config.algo not in ALGORITHMS:
        raise ValueError(f"algo={config.algo!r}; allowed: {ALGORITHMS}")
    gym_id, scenario_name = resolve_env(config.env_id)
    params = load_hyperparams(gym_id, config.role, config.algo, config.hyperparams)
    timesteps = int(config.timesteps if config.timesteps is not None else params.get("n_timesteps", 10_000))
    if timesteps < 1:
        raise ValueError(f"timesteps={timesteps}; must be >= 1")
    n_envs = int(params.pop("n_envs", 1))
    policy = params.pop("policy", "MlpPolicy")
    params.pop("n_timesteps", None)
    freq = config.checkpoint_freq or max(timesteps // 4, 1)
    if freq < 1:
        raise ValueError(f"checkpoint_freq={freq}; must be >= 1")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    env = make_training_env(config, n_envs)
    model = algorithm_class(config.algo)(
        policy, env, seed=config.seed, tensorboard_log=str(out / "tb"), device=config.device, verbose=0, **params
    )
    try:
        policy_spec(model)  # fails now, not after training, if the policy could not be saved safely
    except ValueError:
        env.close()
        raise
    metadata: dict[str, Any] = {
        "algo": config.algo,
        "env_id": gym_id,
        "scenario": scenario_name,
        "role": config.role,
        "opponent": config.opponent if isinstance(config.opponent, str) else repr(config.opponent),
        "seed": config.seed,
        "overrides": config.overrides,
        "hyperparams": {"policy": policy, "n_envs": n_envs, **params},
        "stable_baselines3": stable_baselines3.__version__,
    }
    callbacks = [_checkpoint_callback(max(freq // n_envs, 1), out / "checkpoints", metadata)]
    if config.progress:
        callbacks.append(_progress_callback(timesteps))
    if isinstance(config.callback, list):
        callbacks += config.callback
    elif config.callback is not None:
        callbacks.append(config.callback)
    t0 = time.perf_counter()
    interrupted = False
    try:
        model.learn(total_timesteps=timesteps, callback=CallbackList(callbacks), tb_log_name=f"{config.algo}_{config.role}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for callback in callbacks:
            if hasattr(callback, "bar"):
                callback.bar.close()
        env.close()
    metadata.update(timesteps=int(model.num_timesteps), wall_time_s=round(time.perf_counter() - t0, 3),
                    interrupted=interrupted)
    policy_path = out / "policy.zip"
    save_policy(model, policy_path, metadata)
    result = TrainResult(policy_path=policy_path, out=out, metadata=metadata, interrupted=interrupted)
    if interrupted:
        raise TrainingInterrupted(result)
    return result


# ---------------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``leakgym train``."""
    add_env_arguments(parser)
    parser.add_argument("--role", choices=ROLES, default="attacker", help="which side learns")
    parser.add_argument("--algo", choices=ALGORITHMS, default="ppo", help="Stable-Baselines3 algorithm")
    parser.add_argument("--timesteps", type=int, default=None, help="environment steps (default: the YAML's n_timesteps)")
    parser.add_argument(
        "--opponent", default="random", help="frozen opponent: random, round-robin, bandit, a preset, fixed:..., or a policy .zip"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/train"), help="output folder")
    parser.add_argument(
        "--hyperparams", nargs="*", default=[], metavar="KEY=VALUE", help="override hyperparameters, e.g. n_steps=16"
    )
    parser.add_argument("--checkpoint-freq", type=int, default=None, help="checkpoint every N steps (default: 1/4 run)")
    parser.add_argument("--device", default="cpu", help="torch device of the policy")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        env_id=args.env,
        role=args.role,
        algo=args.algo,
        timesteps=args.timesteps,
        opponent=args.opponent,
        out=args.out,
        seed=args.seed,
        overrides=parse_overrides(args.overrides),
        hyperparams=parse_overrides(args.hyperparams, "hyperparameter"),
        checkpoint_freq=args.checkpoint_freq,
        progress=not args.no_progress,
        device=args.device,
    )


def main(args: argparse.Namespace) -> int:
    """Run ``leakgym train``; prints where the policy went."""
    apply_threads(args.threads)
    config = config_from_args(args)
    try:
        result = train(config)
    except TrainingInterrupted as stop:
        meta = stop.result.metadata
        print(f"interrupted after {meta['timesteps']} steps; saved the policy reached so far to "
              f"{stop.result.policy_path} (policy.json says \"interrupted\": true)", file=sys.stderr)
        return INTERRUPTED
    print(f"saved {result.policy_path} ({result.metadata['timesteps']} steps, {result.metadata['wall_time_s']:.1f} s)")
    print(f"TensorBoard: tensorboard --logdir {result.out / 'tb'}")
    return 0


__all__ = [
    "TrainConfig",
    "TrainResult",
    "TrainingInterrupted",
    "add_arguments",
    "hyperparams_file",
    "load_hyperparams",
    "main",
    "train",
]


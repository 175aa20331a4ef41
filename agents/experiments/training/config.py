"""One training run's settings (:class:`TrainConfig`) and its outcome (:class:`TrainResult`, or
:class:`TrainingInterrupted` after Ctrl-C)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: largest seed of a run: Stable-Baselines3 seeds numpy's legacy generator, which takes [0, 2**32 - 1]
MAX_TRAIN_SEED = 2**32 - 1


@dataclass
class TrainConfig:
    """One training run."""

    env_id: str = "LeakGym-Digits-v0"
    """Gymnasium id (or scenario name) of the environment."""
    role: str | None = None
    """Which side learns: attacker or defender; None = the file's env_kwargs (attacker)."""
    algo: str = "ppo"
    """ppo, a2c or dqn."""
    timesteps: int | None = None
    """Environment steps (rounds) to train for; None = the file's n_timesteps."""
    opponent: Any = None
    """The frozen opponent: a make_agent spec (name, preset, policy path) or an Agent; None = the file's."""
    out: Path = Path("runs/train")
    """Output folder (policy.zip, policy.json, checkpoints/, tb/, eval.csv)."""
    seed: int = 0
    """Seed of SB3 (network init, sampling) and of the environments."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Scenario overrides passed to the environment (e.g. rounds=2), over the file's env_kwargs."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Overrides of the hyperparameter file's values."""
    hyperparams_file: Path | None = None
    """The rl-zoo hyperparameter file; None = agents/experiments/hyperparams/<algo>.yml."""
    checkpoint_freq: int | None = None
    """Save a checkpoint every this many steps; None = a quarter of the run; 0 = no checkpoints."""
    eval_freq: int = 0
    """Evaluate the policy against the opponent every this many steps (0 = never)."""
    eval_episodes: int = 2
    """Episodes per evaluation (the same seeds every time)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    device: str = "cpu"
    """Torch device of the policy network and of the games it plays."""
    batch_clients: bool | None = None
    """With ``n_envs > 1``: the vector env's ``batch_clients`` (the victims' clean updates and defenses,
    benign clients, aggregation and evaluation batched over the games; equal to the game-by-game
    rounds to float32 rounding). None: on whenever ``n_envs > 1``; True with one env is refused."""
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

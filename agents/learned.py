"""A saved Stable-Baselines3 policy playing as a LeakGym agent.

``leakgym train`` writes ``OUT/policy.zip`` (SB3's own format) and, beside it, ``OUT/policy.json``
with the algorithm, environment id, role and scenario overrides it was trained with. The agent
reads the algorithm from that file when it exists and otherwise from the zip itself (only PPO
stores a ``clip_range``), loads the model with ``PPO.load`` / ``A2C.load`` and acts with
``model.predict(observation, deterministic=True)`` by default.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .base import Agent

ALGORITHMS = ("ppo", "a2c")


def algorithm_class(algo: str):
    """The SB3 class of ``algo`` ("ppo" or "a2c")."""
    from stable_baselines3 import A2C, PPO

    classes = {"ppo": PPO, "a2c": A2C}
    if algo not in classes:
        raise ValueError(f"algo={algo!r}; allowed: {ALGORITHMS}")
    return classes[algo]


def metadata_path(policy_path: str | Path) -> Path:
    return Path(policy_path).with_suffix(".json")


def read_metadata(policy_path: str | Path) -> dict[str, Any]:
    """The training metadata saved beside a policy (empty when there is none)."""
    meta = metadata_path(policy_path)
    if meta.exists():
        return json.loads(meta.read_text())
    return {}


def detect_algorithm(policy_path: str | Path) -> str:
    """"ppo" or "a2c" for a saved SB3 policy zip (from its metadata file, else from the zip)."""
    meta = read_metadata(policy_path)
    if meta.get("algo") in ALGORITHMS:
        return meta["algo"]
    try:
        with zipfile.ZipFile(policy_path) as zf:
            data = json.loads(zf.read("data"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"{policy_path} is not a Stable-Baselines3 policy zip ({exc})") from None
    return "ppo" if "clip_range" in data else "a2c"


class LearnedAgent(Agent):
    """Acts with a saved SB3 policy. ``deterministic=False`` samples from the policy instead."""

    def __init__(self, path: str | Path, *, deterministic: bool = True, device: str = "cpu") -> None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"policy file {str(path)!r} does not exist")
        self.path = path
        self.algo = detect_algorithm(path)
        self.metadata = read_metadata(path)
        self.model = algorithm_class(self.algo).load(path, device=device)
        self.deterministic = deterministic
        self.name = f"{self.algo}:{path}"

    def check_spaces(self, observation: np.ndarray, action_space) -> None:
        """Raise ``ValueError`` when the policy was trained on different spaces than it is given."""
        want_obs = self.model.observation_space.shape
        if tuple(np.shape(observation)) != tuple(want_obs):
            raise ValueError(
                f"policy {str(self.path)!r} expects observations of shape {want_obs}, got "
                f"{tuple(np.shape(observation))}: it was trained on another scenario or role "
                f"({self.metadata or 'no metadata'})"
            )
        want_nvec = getattr(self.model.action_space, "nvec", None)
        if want_nvec is None or not np.array_equal(np.asarray(want_nvec), np.asarray(action_space.nvec)):
            raise ValueError(
                f"policy {str(self.path)!r} acts in {self.model.action_space}, but this role's action space "
                f"is {action_space}: it was trained on another scenario or role ({self.metadata or 'no metadata'})"
            )

    def act(self, observation, action_space, rng):
        self.check_spaces(observation, action_space)
        action, _ = self.model.predict(np.asarray(observation, dtype=np.float32), deterministic=self.deterministic)
        return np.asarray(action, dtype=np.int64)


__all__ = ["ALGORITHMS", "LearnedAgent", "algorithm_class", "detect_algorithm", "read_metadata"]

"""Step planning: how many steps a run really plays (whole rollouts; see
:mod:`leakgym.agents.experiments.training`, "Steps").
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

from leakgym.agents.policies.learned import algorithm_class

from .hyperparams import ON_POLICY, _check_value, _is_int


class TrainingBudgetWarning(UserWarning):
    """The steps played differ from the steps requested (whole rollouts), or ``n_steps`` was shrunk."""


@dataclass
class StepPlan:
    """How many steps a run really plays (see :mod:`leakgym.agents.experiments.training`, "Steps")."""

    requested: int
    actual: int
    rollout: int
    """Steps per rollout (on-policy: n_steps x n_envs; off-policy: train_freq x n_envs when train_freq
    counts steps, else 1)."""
    kwargs: dict[str, Any]
    """The constructor arguments, with ``n_steps`` / ``batch_size`` shrunk where needed."""
    notes: list[str]


def plan_steps(algo: str, requested: int, n_envs: int, kwargs: dict[str, Any]) -> StepPlan:
    """Fit an on-policy rollout to ``requested`` steps; say how many steps an off-policy algorithm plays
    (it collects ``train_freq`` vector steps of ``n_envs`` games between updates, and SB3 checks the
    budget only between collections; a ``train_freq`` counted in episodes plays whole episodes)."""
    if requested < 1:
        raise ValueError(f"timesteps={requested}; must be >= 1")
    if not (_is_int(n_envs) and n_envs >= 1):
        raise ValueError(f"n_envs={n_envs!r}; allowed: integers >= 1")
    kwargs = dict(kwargs)
    defaults = inspect.signature(algorithm_class(algo).__init__).parameters
    for key in ("n_steps", "batch_size", "train_freq"):
        if key in kwargs and key in defaults:
            _check_value(key, kwargs[key], "hyperparameters", algo)
    if algo not in ON_POLICY:
        freq = kwargs.get("train_freq", defaults["train_freq"].default)
        every, unit = (freq if isinstance(freq, (list, tuple)) else (freq, "step"))
        starts = int(kwargs.get("learning_starts", defaults["learning_starts"].default))
        if unit != "step":
            if n_envs > 1:  # SB3 asserts this once learning starts, after the run's folder and games were made
                raise ValueError(f"train_freq={list(freq)!r} counts episodes, which Stable-Baselines3 trains on one "
                                 f"env only; got n_envs={n_envs}: count train_freq in steps or set n_envs=1")
            notes = [(f"{algo.upper()} with train_freq counted in episodes plays whole episodes: it may train for "
                      f"more than the {requested} steps requested")]
            actual, rollout = requested, 1
        else:
            rollout = int(every) * n_envs
            actual = math.ceil(requested / rollout) * rollout
            note = (f"{algo.upper()} collects train_freq x n_envs = {int(every)} x {n_envs} steps between updates: "
                    f"training for {actual} steps, not the {requested} requested")
            notes = [] if actual == requested else [note]
        if actual <= starts:
            notes.append(f"{algo.upper()} makes no gradient update in {actual} steps (learning_starts={starts}): the "
                         "saved policy is the untrained network; train for more steps or lower learning_starts")
        return StepPlan(requested, actual, rollout, kwargs, notes)
    n_steps = int(kwargs.get("n_steps", defaults["n_steps"].default))
    notes = []
    if requested < n_steps * n_envs:
        # PPO normalises advantages over a rollout, which needs at least 2 steps: n_steps x n_envs >= 2 (the
        # bound was on n_steps, which doubled a budget of one step per env, e.g. 8 steps over 8 envs)
        shrunk = max(math.ceil(requested / n_envs), math.ceil(2 / n_envs) if algo == "ppo" else 1)
        notes.append(f"n_steps {n_steps} -> {shrunk}: one rollout of {n_steps} x {n_envs} env(s) would play "
                     f"{n_steps * n_envs} steps, more than the {requested} requested")
        n_steps = kwargs["n_steps"] = shrunk
    rollout = n_steps * n_envs
    if algo == "ppo" and rollout < 2:
        raise ValueError(f"n_steps={n_steps} with n_envs={n_envs}; allowed: n_steps x n_envs >= 2 "
                         "(PPO normalises advantages over a rollout)")
    if algo == "ppo":
        batch_size = int(kwargs.get("batch_size", defaults["batch_size"].default))
        if batch_size > rollout:
            notes.append(f"batch_size {batch_size} -> {rollout} (one rollout)")
            kwargs["batch_size"] = rollout
    actual = math.ceil(requested / rollout) * rollout
    if actual != requested:
        notes.append(f"{algo.upper()} plays whole rollouts of n_steps x n_envs = {rollout} steps: training for "
                     f"{actual} steps, not the {requested} requested")
    return StepPlan(requested, actual, rollout, kwargs, notes)

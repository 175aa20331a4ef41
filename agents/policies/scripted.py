"""Scripted agents: a fixed action, uniform random play and round-robin over actions.

These are the non-learning baselines of every LeakGym experiment. They act on the role's
``MultiDiscrete`` action space (see :mod:`leakgym.game.scenario` for what each dimension means);
a readable settings dict is turned into an action by ``scenario.encode_attacker`` /
``scenario.encode_defender`` (or by :func:`fixed_from_settings` here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from .base import Agent, UniformRandomAgent

ROLES = ("attacker", "defender")


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role={role!r}; allowed: {ROLES}")
    return role


def as_action(action: Any, what: str = "action") -> np.ndarray:
    """A 1-D int64 action vector; non-integer entries raise ``ValueError``."""
    arr = np.asarray(action)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what} {action!r} must be a non-empty 1-D sequence of integers")
    integral = np.issubdtype(arr.dtype, np.integer) or (
        np.issubdtype(arr.dtype, np.number) and bool(np.all(np.mod(arr, 1) == 0))
    )
    if not integral:
        raise ValueError(f"{what} {action!r} must contain integers only")
    return arr.astype(np.int64)


def check_in_space(action: np.ndarray, action_space: spaces.MultiDiscrete, who: str) -> np.ndarray:
    """Raise ``ValueError`` naming the entry when ``action`` is not in ``action_space``."""
    nvec = np.asarray(action_space.nvec)
    if action.shape != nvec.shape:
        raise ValueError(f"{who}: action {action.tolist()} has {action.size} entries; the space has {nvec.size}")
    for i, (a, n) in enumerate(zip(action, nvec)):
        if not 0 <= a < n:
            raise ValueError(f"{who}: action[{i}] = {int(a)}; allowed range 0..{int(n) - 1}")
    return action


class FixedAgent(Agent):
    """Plays the same action every round (a pure strategy).

    ``FixedAgent([2, 0, 1, 1])`` or, from readable settings,
    ``FixedAgent(scenario.encode_attacker({"strategy": "dlg", "iterations": 60}))``.
    """

    episodic = True

    def __init__(self, action: Sequence[int] | np.ndarray, name: str | None = None) -> None:
        self.action = as_action(action, "fixed action")
        self.name = name or "fixed:" + ",".join(str(int(a)) for a in self.action)

    def act(self, observation, action_space, rng):
        return check_in_space(self.action, action_space, self.name).copy()

    def check_spaces(self, observation_space, action_space) -> None:
        check_in_space(self.action, action_space, self.name)

    def get_state(self) -> None:
        """Nothing: ``reset``, ``act`` and ``observe`` change nothing (a vector step takes every opponent's
        state before the round, and a fixed opponent's deep copy was a measurable share of it)."""

    def set_state(self, state: None) -> None:
        """Nothing to restore (:meth:`get_state`)."""


class RoundRobinAgent(Agent):
    """Cycles deterministically through actions, one per round; restarts the cycle on ``reset``.

    With ``actions`` it plays them in order. Without, round ``t`` plays ``t mod n_d`` in every
    dimension ``d``, so after ``max(nvec)`` rounds every value of every dimension has been played
    (a cheap sweep; it does not enumerate the joint action space, which is exponentially large).
    """

    name = "round-robin"
    episodic = True  # the cycle restarts at every reset

    def __init__(self, actions: Sequence[Sequence[int]] | None = None) -> None:
        if actions is not None:
            if len(actions) == 0:
                raise ValueError("RoundRobinAgent(actions=[]): give at least one action, or None to sweep")
            self.actions: list[np.ndarray] | None = [as_action(a, "round-robin action") for a in actions]
        else:
            self.actions = None
        self.t = 0

    def reset(self, seed: int | None = None) -> None:
        self.t = 0

    def check_spaces(self, observation_space, action_space) -> None:
        for k, action in enumerate(self.actions or []):
            check_in_space(action, action_space, f"{self.name} action {k}")

    def act(self, observation, action_space, rng):
        if self.actions is not None:
            action = self.actions[self.t % len(self.actions)].copy()
            check_in_space(action, action_space, self.name)
        else:
            action = (self.t % np.asarray(action_space.nvec)).astype(np.int64)
        self.t += 1
        return action


def fixed_from_settings(scenario, role: str, settings: dict[str, Any], name: str | None = None) -> FixedAgent:
    """A :class:`FixedAgent` playing ``settings`` mapped to the scenario's menu (nearest values)."""
    check_role(role)
    encode = scenario.encode_attacker if role == "attacker" else scenario.encode_defender
    return FixedAgent(encode(settings), name=name)


__all__ = [
    "ROLES",
    "FixedAgent",
    "RoundRobinAgent",
    "UniformRandomAgent",
    "as_action",
    "check_in_space",
    "check_role",
    "fixed_from_settings",
]

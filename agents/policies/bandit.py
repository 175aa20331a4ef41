"""An ε-greedy bandit agent that adapts to its opponent across rounds and episodes.

The agent treats a short list of actions ("arms") as a multi-armed bandit and ignores the
observation (Sutton & Barto, *Reinforcement Learning: An Introduction*, 2nd ed., §2.2-2.4):

1. every arm is played once, in list order (so each has an estimate);
2. afterwards, with probability ε a uniformly random arm is played (exploration), otherwise the arm
   with the highest mean reward so far (exploitation; ties go to the lowest index);
3. ``observe(reward, info)`` updates the played arm's incremental sample mean
   ``Q_{n+1} = Q_n + (R_n - Q_n) / n`` (Eq. 2.3).

Against a fixed (or slowly changing) opponent the greedy arm converges to the best arm in the list;
the statistics persist across ``reset`` (episodes), since adapting to the opponent is the point.
:meth:`EpsilonGreedyBandit.forget` clears them.

Default arms (:func:`default_arms`): the role's presets that the scenario can play, then
``num_random_arms`` distinct random actions drawn from a generator seeded by ``seed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import Agent
from .presets import preset_action, valid_presets
from .scripted import as_action, check_in_space, check_role


def default_arms(scenario, role: str, *, num_random_arms: int = 4, seed: int = 0) -> list[np.ndarray]:
    """The role's playable presets plus ``num_random_arms`` distinct seeded random actions."""
    check_role(role)
    if num_random_arms < 0:
        raise ValueError(f"num_random_arms={num_random_arms}; must be >= 0")
    arms: list[np.ndarray] = []
    seen: set[tuple[int, ...]] = set()

    def add(action: np.ndarray) -> None:
        key = tuple(int(a) for a in action)
        if key not in seen:
            seen.add(key)
            arms.append(np.asarray(action, dtype=np.int64))

    for name in valid_presets(scenario, role):
        add(preset_action(name, scenario, role))
    nvec = scenario.attacker_nvec if role == "attacker" else scenario.defender_nvec
    space_size = int(np.prod(nvec.astype(np.float64)))
    target = len(arms) + min(num_random_arms, max(space_size - len(arms), 0))
    rng = np.random.default_rng(seed)
    while len(arms) < target:
        add(rng.integers(0, nvec).astype(np.int64))
    return arms


class EpsilonGreedyBandit(Agent):
    """ε-greedy over a list of actions, on the mean reward received through :meth:`observe`.

    Parameters
    ----------
    arms:
        The actions to choose from. ``None``: :func:`default_arms` of ``scenario`` and ``role``.
    epsilon:
        Exploration probability in [0, 1] after the initial sweep over all arms.
    scenario, role, num_random_arms, seed:
        Only used to build the default arms.
    """

    name = "bandit"

    def __init__(
        self,
        arms: Sequence[Sequence[int]] | None = None,
        *,
        epsilon: float = 0.1,
        scenario=None,
        role: str | None = None,
        num_random_arms: int = 4,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon={epsilon}; allowed range [0, 1]")
        if arms is None:
            if scenario is None or role is None:
                raise ValueError("EpsilonGreedyBandit needs arms, or a scenario and a role for the default arms")
            arms = default_arms(scenario, role, num_random_arms=num_random_arms, seed=seed)
        if len(arms) == 0:
            raise ValueError("EpsilonGreedyBandit(arms=[]): give at least one arm")
        self.arms = [as_action(a, "bandit arm") for a in arms]
        self.epsilon = float(epsilon)
        self.counts = np.zeros(len(self.arms), dtype=np.int64)
        self.means = np.zeros(len(self.arms), dtype=np.float64)
        self._last: int | None = None

    @property
    def best_arm(self) -> int:
        """Index of the arm with the highest mean reward among those played (0 if none was)."""
        if not self.counts.any():
            return 0
        return int(np.argmax(np.where(self.counts > 0, self.means, -np.inf)))

    def forget(self) -> None:
        """Drop all reward statistics (start learning from scratch)."""
        self.counts[:] = 0
        self.means[:] = 0.0
        self._last = None

    def check_spaces(self, observation_space, action_space) -> None:
        for k, arm in enumerate(self.arms):
            check_in_space(arm, action_space, f"bandit arm {k}")

    def act(self, observation, action_space, rng):
        untried = np.flatnonzero(self.counts == 0)
        if len(untried):
            arm = int(untried[0])
        elif rng.random() < self.epsilon:
            arm = int(rng.integers(len(self.arms)))
        else:
            arm = self.best_arm
        self._last = arm
        return check_in_space(self.arms[arm], action_space, f"bandit arm {arm}").copy()

    def observe(self, reward, info):
        if self._last is None:
            raise RuntimeError("EpsilonGreedyBandit.observe() called before act()")
        arm = self._last
        self.counts[arm] += 1
        self.means[arm] += (float(reward) - self.means[arm]) / self.counts[arm]
        self._last = None


__all__ = ["EpsilonGreedyBandit", "default_arms"]

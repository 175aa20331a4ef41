"""A mixed strategy over a population, as an opponent: one member drawn per episode.

PSRO's oracle trains a best response against the other side's *meta-strategy* (Lanctot et al. 2017,
Algorithm 1, line 7: the opponent policy is sampled from the meta-strategy at the start of each
episode). :class:`MixtureAgent` is that opponent: at every ``reset`` it draws one member with the
mixture's probabilities from a generator seeded by the episode's opponent seed (so the same episode seed
meets the same member), then delegates ``act``/``observe`` to it for the whole episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from leakgym.agents.policies.base import Agent


class MixtureAgent(Agent):
    """Plays ``members[k]`` for a whole episode, ``k`` drawn with probability ``probabilities[k]`` at each reset.

    ``members`` are :class:`~leakgym.agents.policies.base.Agent` objects of one role (members of
    probability 0 are dropped); ``probabilities`` must be finite, non-negative and sum to 1 (within 1e-6; renormalised).
    """

    def __init__(self, members: Sequence[Agent], probabilities: Sequence[float], name: str = "mixture") -> None:
        p = np.asarray(probabilities, dtype=np.float64)
        if len(members) == 0:
            raise ValueError("a mixture needs at least one member (the population is empty)")
        if p.shape != (len(members),):
            raise ValueError(f"got {p.size} probabilities for {len(members)} members")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-6:
            raise ValueError(f"probabilities {p.tolist()}: allowed: finite, >= 0, summing to 1")
        keep = np.flatnonzero(p > 0)
        self.members = [members[k] for k in keep]
        self.probabilities = p[keep] / p[keep].sum()
        self.name = name
        #: a member that learns across episodes would be shared by every episode of a vector env's copies
        self.episodic = all(m.episodic for m in self.members)
        self.current = 0
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int | None = None) -> None:
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        self.current = int(rng.choice(len(self.members), p=self.probabilities))
        self.members[self.current].reset(seed)

    def act(self, observation, action_space, rng):
        return self.members[self.current].act(observation, action_space, rng)

    def observe(self, reward: float, info: dict[str, Any]) -> None:
        self.members[self.current].observe(reward, info)

    def check_spaces(self, observation_space, action_space) -> None:
        for member in self.members:
            member.check_spaces(observation_space, action_space)

    def get_state(self) -> Any:
        """The drawn member and that member's own state (a loaded policy is not copied)."""
        return self.current, self.members[self.current].get_state(), self._rng.bit_generator.state

    def set_state(self, state: Any) -> None:
        self.current, member_state, rng_state = state
        self.members[self.current].set_state(member_state)
        self._rng.bit_generator.state = rng_state

    def __repr__(self) -> str:
        parts = ", ".join(f"{m.name}: {p:.3f}" for m, p in zip(self.members, self.probabilities))
        return f"MixtureAgent({parts})"


__all__ = ["MixtureAgent"]

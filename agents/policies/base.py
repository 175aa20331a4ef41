"""The agent interface shared by scripted, adaptive and learned LeakGym agents."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from gymnasium import spaces


class Agent(ABC):
    """Chooses one role's action each round.

    ``act`` gets the role's observation, its ``MultiDiscrete`` action space and a NumPy generator
    owned by the caller (the environment seeds it, so a seeded rollout is reproducible).
    ``observe`` receives the role's reward and info after the round, for agents that adapt.
    """

    name: str = "agent"
    #: True when the agent carries nothing from one episode to the next (it does not learn across
    #: episodes; ``reset`` starts each one afresh). ``leakgym eval`` then plays a pair's episodes at
    #: once, each with its own copy of the agent
    #: (:func:`leakgym.agents.experiments.evaluation.play.evaluate`). False, the safe default, for agents
    #: that learn across episodes (the bandit).
    episodic: bool = False

    def reset(self, seed: int | None = None) -> None:
        """Start of an episode (adaptive agents may keep what they learnt across episodes)."""

    @abstractmethod
    def act(self, observation: np.ndarray, action_space: spaces.MultiDiscrete, rng: np.random.Generator) -> np.ndarray:
        """The action for this round."""

    def observe(self, reward: float, info: dict[str, Any]) -> None:
        """Feedback after the round (ignored by non-adaptive agents)."""

    def check_spaces(self, observation_space: spaces.Box, action_space: spaces.Space) -> None:
        """Raise ``ValueError`` when this agent cannot play a role with these spaces (a fixed action
        outside the menu, a policy trained on other observations). The environments call it when they
        are built with the agent as an opponent, so a misfit fails then rather than rounds into a
        rollout. Default: nothing to check (agents that read the space at ``act`` time)."""

    def get_state(self) -> Any:
        """A copy of what ``reset``/``act``/``observe`` may change; the environments take it before a
        step and give it back (:meth:`set_state`) if the step fails, so a failed step changes nothing.
        Default: a deep copy of the agent's attributes; agents whose ``act`` changes nothing and that
        hold large objects (a loaded policy) override it. The state is taken once the learner's action
        is valid and restored only when the opponent's own action or the round fails; then attributes
        come back as copies, so an agent sharing an object with the caller (a policy trained elsewhere)
        overrides both methods to keep it."""
        return copy.deepcopy(vars(self))

    def set_state(self, state: Any) -> None:
        """Restore a :meth:`get_state` copy."""
        vars(self).clear()
        vars(self).update(copy.deepcopy(state))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class UniformRandomAgent(Agent):
    """Every action dimension uniformly at random (the randomised scripted opponent)."""

    name = "random"
    episodic = True

    def act(self, observation, action_space, rng):
        return rng.integers(0, action_space.nvec).astype(np.int64)

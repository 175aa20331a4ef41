"""Gymnasium single-agent views of the LeakGym game: play one role against a fixed opponent.

``gym.make("LeakGym-Digits-v0", role="attacker", opponent="random")`` returns the attacker's view
against a uniformly randomised scripted defender (the default). ``opponent`` is anything
:func:`leakgym.agents.make_agent` accepts: an :class:`~leakgym.agents.base.Agent`, a scripted
agent or preset name, or the path of a saved Stable-Baselines3 policy. The opponent's randomness is
drawn from a generator seeded by ``reset(seed=...)``, so the view is deterministic for SB3's and
Gymnasium's ``check_env``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from .game import PendingRound, run_attacks
from .leakgym_env import LeakGymParallelEnv, RoundError
from .scenario import Scenario

ROLES = ("attacker", "defender")
DEFAULT_OPPONENT = {"attacker": "random", "defender": "random"}


class LeakGymSingleAgentEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array", "png"], "render_fps": 2}

    def __init__(
        self,
        scenario: str | Scenario = "digits",
        role: str = "attacker",
        opponent: Any = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role={role!r}; allowed: {ROLES}")
        self.parallel = LeakGymParallelEnv(scenario, render_mode=render_mode, **overrides)
        self.scenario = self.parallel.scenario
        self.role = role
        self.other = "defender" if role == "attacker" else "attacker"
        self.render_mode = render_mode
        self.observation_space = self.parallel.observation_space(role)
        self.action_space = self.parallel.action_space(role)
        from leakgym.agents import make_agent

        self.opponent = make_agent(
            DEFAULT_OPPONENT[role] if opponent is None else opponent, role=self.other, scenario=self.scenario
        )
        self._other_obs: np.ndarray | None = None
        self._opponent_rng = np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        # ``options`` is accepted for API compatibility (PettingZoo's checker passes some); LeakGym
        # has no reset options: a game is configured by its scenario.
        episode_seed, opponent_seed = (int(s) for s in self.np_random.integers(2**31 - 1, size=2))
        obs, infos = self.parallel.reset(seed=episode_seed)
        self._opponent_rng = np.random.default_rng(opponent_seed)
        self.opponent.reset(opponent_seed)
        self._other_obs = obs[self.other]
        return obs[self.role], infos[self.role]

    # The two phases let LeakGymVectorEnv batch the attacks of many environments.
    def begin_step(self, action: Any) -> PendingRound:
        if self._other_obs is None:
            raise RuntimeError("step() called before reset()")
        other_action = self.opponent.act(self._other_obs, self.parallel.action_space(self.other), self._opponent_rng)
        return self.parallel.begin_round({self.role: np.asarray(action), self.other: np.asarray(other_action)})

    def end_step(self, pending: PendingRound, result):
        obs, rewards, terms, truncs, infos = self.parallel.end_round(pending, result)
        self.opponent.observe(rewards[self.other], infos[self.other])
        self._other_obs = obs[self.other]
        if self.render_mode == "png":
            self.parallel.render()
        return obs[self.role], rewards[self.role], terms[self.role], truncs[self.role], infos[self.role]

    def step(self, action: Any):
        pending = self.begin_step(action)
        try:
            (result,) = run_attacks([pending])
            return self.end_step(pending, result)
        except Exception as exc:
            raise RoundError(
                f"round {self.parallel.game.round + 1} of {self.scenario.name!r} ({self.role} view) failed: "
                f"{exc!r}; completed rounds are kept in env.unwrapped.parallel.history"
            ) from exc

    def render(self):
        return self.parallel.render()

    def close(self) -> None:
        self.parallel.close()

"""N LeakGym games in lockstep, with every round's attacks batched into one engine call per config.

``gym.make_vec("LeakGym-Digits-v0", num_envs=16)`` builds this (it is the ids' vector entry point).
Each step runs phase 1 (defend) of all N games, then :func:`leakgym.envs.game.run_attacks` on the N
pending rounds — rounds whose attacks share a configuration become one batched
``Attack.reconstruct_batch`` call — then phase 3 of all games. Sub-environments reset
automatically on the step after their episode ends (Gymnasium's ``NEXT_STEP`` autoreset mode).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from .game import run_attacks
from .single_agent import LeakGymSingleAgentEnv


class LeakGymVectorEnv(VectorEnv):
    metadata = {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, render_mode: str | None = None, **kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs}; must be >= 1")
        self.envs = [LeakGymSingleAgentEnv(render_mode=render_mode, **kwargs) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._obs = create_empty_array(self.single_observation_space, num_envs)

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            if len(seed) != self.num_envs:
                raise ValueError(f"got {len(seed)} seeds for {self.num_envs} environments")
            seeds = list(seed)
        obs, infos = [], {}
        for i, (env, s) in enumerate(zip(self.envs, seeds)):
            o, info = env.reset(seed=s, options=options)
            obs.append(o)
            infos = self._add_info(infos, info, i)
        self._autoreset[:] = False
        self._obs = concatenate(self.single_observation_space, obs, self._obs)
        return self._obs.copy(), infos

    def step(self, actions):
        actions = np.asarray(actions)
        if actions.shape != self.action_space.shape:
            raise ValueError(f"actions have shape {actions.shape}; expected {self.action_space.shape}")
        rewards = np.zeros(self.num_envs)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        obs: list[np.ndarray] = [None] * self.num_envs  # type: ignore[list-item]
        infos: dict = {}
        pending, active = [], []
        for i, env in enumerate(self.envs):
            if self._autoreset[i]:
                obs[i], info = env.reset()
                infos = self._add_info(infos, info, i)
            else:
                pending.append(env.begin_step(actions[i]))
                active.append(i)
        results = run_attacks(pending)
        for i, p, r in zip(active, pending, results):
            obs[i], rewards[i], terminations[i], truncations[i], info = self.envs[i].end_step(p, r)
            infos = self._add_info(infos, info, i)
        self._autoreset = np.logical_or(terminations, truncations)
        self._obs = concatenate(self.single_observation_space, obs, self._obs)
        return self._obs.copy(), rewards, terminations, truncations, infos

    def render(self):
        return [env.render() for env in self.envs]

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

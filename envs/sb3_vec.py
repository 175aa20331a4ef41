"""Stable-Baselines3 ``VecEnv`` over the batched vector env: ``PPO("MlpPolicy", LeakGymSB3VecEnv(...))``.

SB3 steps its environments through its own ``VecEnv`` API (``reset() -> obs``, ``step_async`` /
``step_wait`` returning per-env info dicts, finished environments reset in the same step with the final
observation under ``info["terminal_observation"]``). Its ``DummyVecEnv`` steps N single-agent views one
after the other; :class:`LeakGymSB3VecEnv` instead plays each SB3 step as one step of
:class:`~leakgym.envs.vector.LeakGymVectorEnv`, i.e. one :func:`~leakgym.game.round.play_round` over the N
games (batched attacks, and batched benign clients where the round does so)::

    from stable_baselines3 import PPO
    from leakgym.envs import make_sb3_vec

    venv = make_sb3_vec("LeakGym-Digits-v0", 16, seed=0, opponent="random")  # VecMonitor'd, seeded
    PPO("MlpPolicy", venv, n_steps=8).learn(1_000)

:func:`make_sb3_vec` is the public constructor (``leakgym.envs.make_sb3_vec``); it is
``VecMonitor(LeakGymSB3VecEnv(gym.make_vec(env_id, num_envs=N, **kwargs)))`` plus ``seed``.

Game ``i`` follows the trajectory of env ``i`` of ``make_vec_env(id, n_envs=N, seed=s)`` (same seeds,
same opponent draws), up to the floating-point rounding of batched attacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from .checks import check_seed
from .vector import LeakGymVectorEnv


def unbatch_infos(infos: dict[str, Any], index: int) -> dict[str, Any]:
    """Environment ``index``'s info dict out of a Gymnasium vector env's batched infos."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos.get(f"_{key}", np.ones(index + 1, bool))[index]:
            continue
        if isinstance(value, dict):
            out[key] = unbatch_infos(value, index)
        else:
            item = value[index]
            out[key] = item.item() if isinstance(item, np.generic) else item
    return out


class LeakGymSB3VecEnv(VecEnv):
    """SB3's ``VecEnv`` interface over a :class:`~leakgym.envs.vector.LeakGymVectorEnv`.

    Args:
        venv: the vector env (``gym.make_vec("LeakGym-...", num_envs=N, ...)``); this adapter owns it
            (``close()`` closes it).

    Finished games are reset in the step that finished them (SB3's convention; the vector env itself
    resets on the next step): the returned observation is the new episode's, the final one is in
    ``infos[i]["terminal_observation"]``, and ``infos[i]["TimeLimit.truncated"]`` marks a truncated
    episode so that SB3 bootstraps its value.
    """

    def __init__(self, venv: LeakGymVectorEnv) -> None:
        if not isinstance(getattr(venv, "unwrapped", venv), LeakGymVectorEnv):
            raise ValueError(  # noqa: TRY004 -- bad input is a ValueError (docs/architecture.md)
                f"venv={venv!r}; expected a LeakGymVectorEnv (gym.make_vec('LeakGym-...', num_envs=N))")
        if venv is not venv.unwrapped:
            # The adapter resets finished games itself (SB3's convention), past any Gymnasium vector wrapper,
            # which would then see only part of the steps: it used to be dropped silently.
            raise ValueError(f"venv is wrapped ({type(venv).__name__}); LeakGymSB3VecEnv steps the games itself and "
                             "would bypass it: pass the bare vector env and wrap the SB3 VecEnv instead (VecMonitor, "
                             "VecNormalize, ...)")
        if venv.autoreset_mode != gym.vector.AutoresetMode.NEXT_STEP:
            raise ValueError(f"venv.autoreset_mode={venv.autoreset_mode}; LeakGymSB3VecEnv resets finished games "
                             "itself (SB3's convention) and needs the default NEXT_STEP")
        self.venv = venv
        self.envs = venv.envs
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None

    # -- SB3 VecEnv API ------------------------------------------------------------------------------
    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """SB3's ``seed``: game ``i`` is seeded ``seed + i`` at the next reset. ``seed`` is checked here, as
        every view checks it (SB3's own took ``True`` for 1 and failed on ``"0"`` with its own TypeError)."""
        return super().seed(check_seed(seed))

    def reset(self) -> VecEnvObs:
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        obs, infos = self.venv.reset(seed=seeds)
        self.reset_infos = [unbatch_infos(infos, i) for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async()")
        obs, rewards, terminated, truncated, infos = self.venv.step(self._actions)
        self._actions = None
        obs = np.array(obs, copy=True)
        dones = np.logical_or(terminated, truncated)
        out = [unbatch_infos(infos, i) for i in range(self.num_envs)]
        for i in np.flatnonzero(dones):
            out[i]["terminal_observation"] = obs[i].copy()
            out[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            obs[i], self.reset_infos[i] = self.envs[i].reset()
            # Reset here, so the vector env must not reset this game again on its next step.
            self.venv._autoreset[i] = False
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self.envs[i], attr_name) for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for i in self._get_indices(indices):
            setattr(self.envs[i], attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return [getattr(self.envs[i], method_name)(*method_args, **method_kwargs) for i in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return [isinstance(self.envs[i], wrapper_class) for i in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [env.render() for env in self.envs]


def make_sb3_vec(env_id: str = "LeakGym-Digits-v0", num_envs: int = 1, *, seed: int | None = None,
                 monitor: bool = True, **kwargs: Any) -> VecEnv:
    """An SB3 ``VecEnv`` whose every step is one batched step of ``num_envs`` LeakGym games.

    SB3 refuses a Gymnasium vector env (``PPO("MlpPolicy", gym.make_vec(...))``); this is the
    constructor to hand it instead, as ``make_vec_env`` is for single-agent envs::

        PPO("MlpPolicy", make_sb3_vec("LeakGym-Digits-v0", 8, seed=0, role="defender")).learn(10_000)

    Args:
        env_id: a LeakGym Gymnasium id (``leakgym.envs.registered_ids()``).
        num_envs: number of games played in lockstep.
        seed: game ``i`` is seeded ``seed + i`` on the first reset (as ``make_vec_env(..., seed=seed)``);
            ``None``: unseeded.
        monitor: wrap in SB3's ``VecMonitor`` (episode returns and lengths in SB3's logs), as
            ``make_vec_env`` wraps each env in ``Monitor``.
        **kwargs: passed to ``gym.make_vec``: ``role``, ``opponent``, ``batch_attacks``,
            ``max_episode_steps``, and any scenario field (``rounds=4``, ...).
    """
    if not isinstance(env_id, str):
        raise ValueError(f"env_id={env_id!r}; expected a LeakGym Gymnasium id such as 'LeakGym-Digits-v0'")  # noqa: TRY004
    check_seed(seed)  # (before the games are built)
    from .registration import registered_ids

    if env_id not in registered_ids():
        from leakgym.suggest import did_you_mean

        raise ValueError(f"env_id={env_id!r} is not a LeakGym id{did_you_mean(env_id, registered_ids())}; "
                         f"available: {sorted(registered_ids())}")
    venv: VecEnv = LeakGymSB3VecEnv(gym.make_vec(env_id, num_envs=num_envs, **kwargs))
    if monitor:
        from stable_baselines3.common.vec_env import VecMonitor

        venv = VecMonitor(venv)
    if seed is not None:
        venv.seed(seed)
    return venv


__all__ = ["LeakGymSB3VecEnv", "make_sb3_vec", "unbatch_infos"]

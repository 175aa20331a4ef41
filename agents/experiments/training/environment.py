"""The Stable-Baselines3 training env: one monitored single-agent view, or the batched vector env."""

from __future__ import annotations

from typing import Any


def make_training_env(gym_id: str, env_kwargs: dict[str, Any], n_envs: int, seed: int, batch_clients: bool = False):
    """The SB3 training env: one game a ``DummyVecEnv`` of a monitored single-agent view; ``n_envs > 1``
    games the batched vector env (``gym.make_vec``: one batched round per step for all games, ``batch_clients``
    as given) through :class:`~leakgym.envs.sb3_vec.LeakGymSB3VecEnv`, monitored."""
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecMonitor

    if n_envs == 1:
        if batch_clients:
            raise ValueError("batch_clients=True needs n_envs > 1 (it batches the games of a vector env)")
        return make_vec_env(gym_id, n_envs=1, seed=seed, env_kwargs=env_kwargs)
    from leakgym.envs.sb3_vec import LeakGymSB3VecEnv

    venv = VecMonitor(LeakGymSB3VecEnv(gym.make_vec(gym_id, num_envs=n_envs, batch_clients=batch_clients,
                                                    **env_kwargs)))
    venv.seed(seed)
    return venv

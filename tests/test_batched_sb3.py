"""SB3 on the batched vector env: LeakGymSB3VecEnv steps like DummyVecEnv, and PPO trains on it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecMonitor

import leakgym  # noqa: F401  (registers the ids)
from leakgym.envs.sb3_vec import LeakGymSB3VecEnv


def test_steps_like_dummy_vec_env_across_episode_ends(cheap_overrides):
    """Same seeds, same actions: the same observations, rewards, dones and terminal observations as
    SB3's DummyVecEnv of single-agent views (bit for bit with batch_attacks=False)."""
    kwargs = dict(cheap_overrides, opponent="random")
    ours = LeakGymSB3VecEnv(gym.make_vec("LeakGym-Digits-v0", num_envs=3, batch_attacks=False, **kwargs))
    ref = make_vec_env("LeakGym-Digits-v0", n_envs=3, env_kwargs=kwargs)
    ours.seed(4)
    ref.seed(4)
    np.testing.assert_array_equal(ours.reset(), ref.reset())
    rng = np.random.default_rng(0)
    dones_seen = 0
    for _ in range(2 * cheap_overrides["rounds"] + 1):
        actions = rng.integers(0, ours.action_space.nvec, size=(3, 4))
        o1, r1, d1, i1 = ours.step(actions)
        o2, r2, d2, i2 = ref.step(actions)
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(d1, d2)
        for a, b, done in zip(i1, i2, d1):
            assert a["leakage"] == b["leakage"]
            if done:
                dones_seen += 1
                np.testing.assert_array_equal(a["terminal_observation"], b["terminal_observation"])
                assert a["TimeLimit.truncated"] == b["TimeLimit.truncated"] is False  # terminal: no bootstrap
    assert dones_seen == 6
    assert ours.get_attr("role") == ["attacker"] * 3 and ours.env_is_wrapped(gym.Wrapper) == [False] * 3
    ours.close()
    ref.close()


def test_ppo_trains_on_the_batched_env(cheap_overrides):
    venv = VecMonitor(LeakGymSB3VecEnv(gym.make_vec("LeakGym-Digits-v0", num_envs=4, opponent="random",
                                                    **cheap_overrides)))
    venv.seed(0)
    model = PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=256)
    assert model.num_timesteps == 256
    assert len(model.ep_info_buffer) > 0  # VecMonitor saw whole episodes (rounds=3)
    action, _ = model.predict(venv.reset(), deterministic=True)
    assert action.shape == (4, 4)
    venv.close()


def test_rejects_other_environments_and_gymnasium_wrappers_it_would_bypass():
    with pytest.raises(ValueError, match="expected a LeakGymVectorEnv"):
        LeakGymSB3VecEnv(gym.make_vec("CartPole-v1", num_envs=2))
    from gymnasium.wrappers.vector import TransformReward

    wrapped = TransformReward(gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none"), lambda r: r * 1000)
    with pytest.raises(ValueError, match=r"venv is wrapped \(TransformReward\).*wrap the SB3 VecEnv instead"):
        LeakGymSB3VecEnv(wrapped)


def test_only_a_step_limit_asks_sb3_to_bootstrap(cheap_overrides):
    """The last round is terminal (``TimeLimit.truncated`` False: no value is added after it; the game's end
    was reported as a truncation, so SB3 added gamma * V(final observation) of a round fraction no policy acts
    in); a ``max_episode_steps`` cut before it is a truncation SB3 bootstraps from."""
    for limit, truncated in ((None, False), (2, True)):
        kwargs = dict(cheap_overrides, rounds=3, **({} if limit is None else {"max_episode_steps": limit}))
        venv = LeakGymSB3VecEnv(gym.make_vec("LeakGym-Digits-v0", num_envs=2, **kwargs))
        venv.reset()
        for _ in range(limit or 3):
            _, _, dones, infos = venv.step(np.zeros((2, 4), dtype=np.int64))
        assert dones.all() and [i["TimeLimit.truncated"] for i in infos] == [truncated] * 2
        venv.close()

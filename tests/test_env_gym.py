"""Gymnasium single-agent views and the vector env: checkers, determinism, batching."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import leakgym  # noqa: F401


@pytest.mark.parametrize("role", ["attacker", "defender"])
def test_gymnasium_check_env(role, cheap_overrides):
    e = gym.make("LeakGym-Digits-v0", role=role, **cheap_overrides)
    gym_check_env(e.unwrapped)


MALICIOUS_CHEAP = {"rounds": 3, "num_clients": 1, "eval_size": 32, "attack_defaults": {"num_neurons": 64}}


@pytest.mark.parametrize("role", ["attacker", "defender"])
@pytest.mark.parametrize("flat", [False, True])
def test_every_offline_scenario_passes_both_checkers(role, flat, cheap_overrides):
    """Digits and the malicious-server scenario (analytic attacks: no matching loss) in both roles."""
    for gym_id, overrides in (("LeakGym-Digits-v0", cheap_overrides), ("LeakGym-Digits-Malicious-v0", MALICIOUS_CHEAP)):
        e = gym.make(gym_id, role=role, flat_actions=flat, **overrides)
        gym_check_env(e.unwrapped)
        sb3_check_env(e.unwrapped, warn=True)


@pytest.mark.parametrize("role", ["attacker", "defender"])
def test_sb3_check_env(role, cheap_overrides):
    e = gym.make("LeakGym-Digits-v0", role=role, **cheap_overrides)
    sb3_check_env(e.unwrapped, warn=True)


def test_same_seed_same_trajectory(cheap_overrides):
    def rollout(seed):
        e = gym.make("LeakGym-Digits-v0", **cheap_overrides)
        obs, _ = e.reset(seed=seed)
        e.action_space.seed(seed)
        out = [obs]
        done = False
        while not done:
            obs, r, term, trunc, info = e.step(e.action_space.sample())
            out += [obs, np.array([r, info["leakage_ssim"]])]
            done = term or trunc
        return np.concatenate([np.ravel(o) for o in out])

    np.testing.assert_array_equal(rollout(3), rollout(3))
    assert not np.array_equal(rollout(3), rollout(4))


def test_unknown_option_and_role_are_clear_errors(cheap_overrides):
    with pytest.raises(ValueError, match="role='server'"):
        gym.make("LeakGym-Digits-v0", role="server")
    with pytest.raises(ValueError, match="unknown scenario option"):
        gym.make("LeakGym-Digits-v0", bogus=1)


def test_make_vec_runs_lockstep_and_batches_attacks(cheap_overrides, monkeypatch):
    from leakgym.attacks.engine import optimization

    calls = []
    original = optimization.run_joint_matching

    def spy(problems, parts, **kwargs):
        calls.append(problems.n)
        return original(problems, parts, **kwargs)

    monkeypatch.setattr(optimization, "run_joint_matching", spy)
    venv = gym.make_vec("LeakGym-Digits-v0", num_envs=3, **cheap_overrides)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (3,) + venv.single_observation_space.shape
    actions = np.zeros((3, 4), dtype=np.int64)  # same strategy and budget everywhere
    obs, rewards, _, truncs, _ = venv.step(actions)
    assert calls == [3], "three rounds with one attack configuration must be one engine call"
    assert rewards.shape == (3,) and np.all(np.isfinite(rewards))
    # episodes end together and auto-reset on the next step
    for _ in range(cheap_overrides["rounds"] - 1):
        obs, rewards, _, truncs, _ = venv.step(actions)
    assert truncs.all()
    obs, *_ = venv.step(actions)
    assert np.all(obs[:, 0] == 0.0)  # round fraction restarted
    venv.close()

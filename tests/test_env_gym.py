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
        obs, rewards, terms, truncs, _ = venv.step(actions)
    assert terms.all() and not truncs.any()  # the last round is terminal (docs/game.md, "Episodes end")
    obs, *_ = venv.step(actions)
    assert np.all(obs[:, 0] == 0.0)  # round fraction restarted
    venv.close()


def _episode(env, seed, actions):
    """Observations, rewards and end flags of one episode of a single-agent view (or of game 0 of
    a vector env) under a fixed action sequence; stops at the first end."""
    vector = hasattr(env, "num_envs")
    obs, _ = env.reset(seed=seed)
    rows = [np.ravel(obs[0] if vector else obs)]
    for a in actions:
        obs, r, term, trunc, _ = env.step(np.stack([a] * env.num_envs) if vector else np.asarray(a))
        if vector:
            obs, r, term, trunc = obs[0], r[0], term[0], trunc[0]
        rows.append(np.concatenate([np.ravel(obs), [r, term, trunc]]))
        if term or trunc:
            break
    return rows


def test_overriding_rounds_sets_the_horizon_in_both_views(cheap_overrides, recwarn):
    """The ids register no TimeLimit: the horizon is the scenario's ``rounds``, so an override plays
    that many rounds in gym.make and gym.make_vec alike, without a warning (the registered TimeLimit
    used to truncate gym.make at the TOML's rounds, and make_vec's view disagreed with it)."""
    cheap_overrides["rounds"] = 9  # the TOML says 8
    assert gym.spec("LeakGym-Digits-v0").max_episode_steps is None
    actions = [np.zeros(4, dtype=np.int64)] * 12
    single = _episode(gym.make("LeakGym-Digits-v0", **cheap_overrides), 0, actions)
    vector = _episode(gym.make_vec("LeakGym-Digits-v0", num_envs=1, batch_attacks=False, **cheap_overrides), 0,
                      actions)
    assert len(single) == len(vector) == 10  # reset + 9 rounds, the last one terminal
    for a, b in zip(single, vector):
        np.testing.assert_array_equal(a, b)
    assert single[-1][-2:].tolist() == [1, 0] and not any(row[-2] or row[-1] for row in single[1:-1])
    assert not [w for w in recwarn if "horizon" in str(w.message)]


def test_max_episode_steps_truncates_the_vector_env_as_time_limit_does(cheap_overrides):
    """``max_episode_steps=K`` < rounds: gym.make's TimeLimit and the vector env's own count end the
    episode after K steps with the same observations (the round fraction still counts to ``rounds``;
    make_vec used to shrink ``rounds`` to K instead); the game restarts on the next step."""
    cheap_overrides["rounds"] = 4
    actions = [np.zeros(4, dtype=np.int64)] * 5
    single = _episode(gym.make("LeakGym-Digits-v0", max_episode_steps=2, **cheap_overrides), 0, actions)
    venv = gym.make_vec("LeakGym-Digits-v0", num_envs=2, max_episode_steps=2, batch_attacks=False,
                        **cheap_overrides)
    vector = _episode(venv, 0, actions)
    assert len(single) == len(vector) == 3
    for a, b in zip(single, vector):
        np.testing.assert_array_equal(a, b)
    assert vector[-1][0] == 0.5  # round 2 of 4, cut by the limit: truncated, not terminated
    assert single[-1][-2:].tolist() == vector[-1][-2:].tolist() == [0, 1]
    obs, *_ = venv.step(np.zeros((2, 4), dtype=np.int64))  # autoreset
    obs, _, _, truncs, _ = venv.step(np.zeros((2, 4), dtype=np.int64))
    assert not truncs.any() and np.all(obs[:, 0] == 0.25)  # the count restarted with the episode
    unlimited = gym.make_vec("LeakGym-Digits-v0", num_envs=1, max_episode_steps=-1, **cheap_overrides)
    assert unlimited.max_episode_steps is None


@pytest.mark.parametrize("bad", [0, -2, 2.5, "3", True])
def test_vector_env_rejects_a_bad_max_episode_steps(bad, cheap_overrides):
    with pytest.raises(ValueError, match=rf"max_episode_steps={bad!r}; allowed: an integer >= 1"):
        gym.make_vec("LeakGym-Digits-v0", num_envs=1, max_episode_steps=bad, **cheap_overrides)


def test_vector_env_refuses_bool_actions_as_the_single_agent_view_does(cheap_overrides):
    """np.asarray turned a list row [True, 0, ...] into integers and game 0 played it; each row is
    now checked as given (and a bool array by its dtype), and nothing changes."""
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, **cheap_overrides)
    vec.reset(seed=0)
    zero = [0] * len(vec.single_action_space.nvec)
    rounds = [e.parallel.round for e in vec.unwrapped.envs]
    with pytest.raises(ValueError, match=r"sub-environment 0: attacker action \[True, .*has bool entries"):
        vec.step([[True, *zero[1:]], zero])
    with pytest.raises(ValueError, match="sub-environment 0: .*has dtype bool"):
        vec.step(np.zeros((2, len(zero)), dtype=bool))
    assert [e.parallel.round for e in vec.unwrapped.envs] == rounds
    vec.step([zero, np.array(zero)])
    assert [e.parallel.round for e in vec.unwrapped.envs] == [r + 1 for r in rounds]


def test_vector_env_rejects_render_modes_it_does_not_have(cheap_overrides):
    with pytest.raises(ValueError, match=r"render_mode='human'; allowed: None or \['rgb_array'\]"):
        gym.make_vec("LeakGym-Digits-v0", num_envs=1, render_mode="human", **cheap_overrides)

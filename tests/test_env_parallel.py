"""The PettingZoo environment: official API/seed checkers, rendering, errors, history."""

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test

from leakgym.envs import RoundError, env, parallel_env

#: the flags and counters: the only infos that are not floats (leakgym.game.feedback)
NON_FLOAT_INFOS = {"round", "model_diverged", "update_skipped", "diverged_round", "strategy_index"}


def test_parallel_api(cheap_overrides):
    parallel_api_test(parallel_env("digits", **cheap_overrides), num_cycles=4)


def test_aec_api(cheap_overrides):
    api_test(env("digits", **cheap_overrides), num_cycles=4)


@pytest.mark.parametrize("form", ["env", "raw_env"])
def test_aec_rejects_a_bad_action_when_it_is_given(cheap_overrides, form):
    """The AEC adapter stored a bad attacker action (PettingZoo's bounds wrapper raised a bare
    AssertionError, and nothing under python -O) and the round failed at the defender's turn, the
    attacker's turn already passed: the AEC form now checks each action as it is given."""
    from leakgym.envs import raw_env

    e = (env if form == "env" else raw_env)("digits", **cheap_overrides)
    e.reset(seed=0)
    first = e.agent_selection
    before = e.observe(first).copy()
    with pytest.raises(ValueError, match=r"action\[1\] \(iterations\) = 9; allowed range 0..1"
                       if first == "attacker" else r"allowed range"):
        e.step(np.array([0, 9, 0, 0]) if first == "attacker" else np.full(len(e.action_space(first).nvec), 99))
    assert e.agent_selection == first and np.array_equal(e.observe(first), before)
    for _ in e.possible_agents:  # the round then plays normally
        e.step(e.action_space(e.agent_selection).sample())
    assert e.unwrapped.round == 1


def test_parallel_seed(cheap_overrides):
    parallel_seed_test(lambda: parallel_env("digits", **cheap_overrides), num_cycles=3)


def test_episode_runs_to_termination_with_documented_infos(cheap_overrides):
    e = parallel_env("digits", **cheap_overrides)
    obs, infos = e.reset(seed=1)
    assert set(obs) == {"attacker", "defender"}
    steps = 0
    while e.agents:
        actions = {a: e.action_space(a).sample() for a in e.agents}
        obs, rewards, terms, truncs, infos = e.step(actions)
        steps += 1
        for a in ("attacker", "defender"):
            assert e.observation_space(a).contains(obs[a])
            floats = {k: v for k, v in infos[a].items() if k not in NON_FLOAT_INFOS}
            assert all(isinstance(v, float) for v in floats.values())
        # rewards are the documented sums of their components
        ia, idf = infos["attacker"], infos["defender"]
        assert rewards["attacker"] == pytest.approx(ia["reward_leakage"] + ia["reward_cost"])
        assert rewards["defender"] == pytest.approx(
            idf["reward_leakage"] + idf["reward_fidelity"] + idf["reward_accuracy"] + idf["reward_overhead"]
        )
        assert 0.0 <= ia["leakage"] <= 1.0
    assert steps == cheap_overrides["rounds"]
    assert all(terms.values()) and not any(truncs.values())  # the last round is a terminal state
    assert len(e.history) == steps


def test_invalid_action_raises_before_state_changes(cheap_overrides):
    e = parallel_env("digits", **cheap_overrides)
    e.reset(seed=0)
    bad = {"attacker": np.array([0, 9, 0, 0]), "defender": e.action_space("defender").sample()}
    with pytest.raises(ValueError, match=r"attacker action\[1\] \(iterations\) = 9; allowed range 0..1"):
        e.step(bad)
    assert e.round == 0
    with pytest.raises(ValueError, match="missing"):
        e.step({"attacker": e.action_space("attacker").sample()})


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_a_bad_reset_seed_is_named_and_changes_nothing(cheap_overrides, seed):
    e = parallel_env("digits", **cheap_overrides)
    first, _ = e.reset(seed=0)
    e.step({a: e.action_space(a).sample() for a in e.agents})
    with pytest.raises(ValueError, match=rf"seed={seed!r}; allowed: None or an integer >= 0"):
        e.reset(seed=seed)
    assert e.round == 1
    again, _ = e.reset(seed=0)
    for a in e.agents:
        np.testing.assert_array_equal(first[a], again[a])


def test_a_refused_aec_reset_leaves_the_env_unreset(cheap_overrides):
    """Found in an audit: PettingZoo's order-enforcing wrapper counted a reset refused for its seed, and the
    next step failed inside the adapter (AttributeError) instead of asking for a reset."""
    a = env("digits", **cheap_overrides)
    with pytest.raises(ValueError, match="seed=-1"):
        a.reset(seed=-1)
    with pytest.raises(AssertionError, match="reset\\(\\) needs to be called before step"):
        a.step(np.zeros(4, np.int64))
    a.reset(seed=0)
    with pytest.raises(ValueError, match="seed=-1"):
        a.reset(seed=-1)
    a.step(a.action_space(a.agent_selection).sample())  # the env reset before stays reset


def test_round_failure_is_reported_with_context_and_history_kept(cheap_overrides, monkeypatch):
    e = parallel_env("digits", **cheap_overrides)
    e.reset(seed=0)
    e.step({a: e.action_space(a).sample() for a in e.agents})

    def boom(*args, **kwargs):
        raise RuntimeError("engine exploded")

    from leakgym.game import round as round_module

    monkeypatch.setattr(round_module, "_aggregate_alone", boom)
    with pytest.raises(RoundError, match="round 2 .*engine exploded.*left as it was before the round"):
        e.step({a: e.action_space(a).sample() for a in e.agents})
    assert len(e.history) == 1


def test_render_rgb_array_and_png(cheap_overrides, tmp_path):
    e = parallel_env("digits", render_mode="rgb_array", **cheap_overrides)
    e.reset(seed=0)
    assert e.render().ndim == 3  # a labelled placeholder before the first round
    e.step({a: e.action_space(a).sample() for a in e.agents})
    frame = e.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
    assert frame.std() > 0
    e.close()
    e.close()  # idempotent

    p = parallel_env("digits", render_mode="png", render_dir=tmp_path, **cheap_overrides)
    p.reset(seed=0)
    p.step({a: p.action_space(a).sample() for a in p.agents})
    assert (tmp_path / "episode_0001_round_0001.png").stat().st_size > 0
    with pytest.raises(ValueError, match="render_mode='ansi'"):
        parallel_env("digits", render_mode="ansi", **cheap_overrides)


def test_png_frames_of_each_episode_are_kept_and_gym_make_takes_the_folder(cheap_overrides, tmp_path):
    """A second episode overwrote the first one's frames (round_0001.png), and gym.make refused render_dir."""
    p = parallel_env("digits", render_mode="png", render_dir=tmp_path, **cheap_overrides)
    for seed in (0, 1):
        p.reset(seed=seed)
        p.step({a: np.zeros(len(p.action_space(a).nvec), np.int64) for a in p.agents})
    assert sorted(f.name for f in tmp_path.iterdir()) == ["episode_0001_round_0001.png", "episode_0002_round_0001.png"]
    env = gym.make("LeakGym-Digits-v0", opponent="none", render_mode="png", render_dir=tmp_path / "gym", **cheap_overrides)
    env.reset(seed=0)
    env.step(np.zeros(4, np.int64))
    assert (tmp_path / "gym" / "episode_0001_round_0001.png").is_file()


def test_a_lost_frame_does_not_lose_the_played_round(cheap_overrides, tmp_path, monkeypatch):
    """Writing a png frame happens after the round is played and recorded: a disk error there warns and
    the step still returns (it raised after the round had advanced, and the caller lost the step)."""
    p = parallel_env("digits", render_mode="png", render_dir=tmp_path, **cheap_overrides)
    p.reset(seed=0)
    monkeypatch.setattr(type(p), "render", lambda self: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.warns(UserWarning, match="frame of round 1 was not written"):
        _, rewards, *_ = p.step({a: np.zeros(len(p.action_space(a).nvec), np.int64) for a in p.agents})
    assert p.round == 1 and len(p.history) == 1 and set(rewards) == {"attacker", "defender"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"render_dir": 123}, r"render_dir=123; allowed: a folder path"),
    ({"render_dir": None}, r"render_dir=None; allowed: a folder path"),
    ({"max_cycles": 3, "rounds": 2}, r"max_cycles=3 and rounds=2 both set the episode length"),
    ({"max_cycles": 0}, r"max_cycles=0; allowed: an integer >= 1"),
])
def test_view_arguments_are_refused_by_name_when_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        parallel_env("digits", **kwargs)


def test_a_render_dir_that_is_a_file_is_refused_when_built(tmp_path):
    (tmp_path / "frames").write_text("not a folder")
    with pytest.raises(ValueError, match=r"render_dir='.*frames' is a file"):
        parallel_env("digits", render_mode="png", render_dir=tmp_path / "frames")


def test_close_closes_the_human_window(cheap_overrides, monkeypatch):
    import matplotlib.pyplot as plt

    from leakgym.envs.rendering import WINDOW_TITLE

    e = parallel_env("digits", render_mode="human", **cheap_overrides)
    plt.figure(WINDOW_TITLE)  # as show_figure opens it where there is a display
    e.close()
    assert WINDOW_TITLE not in plt.get_figlabels()

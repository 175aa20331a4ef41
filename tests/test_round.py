"""The round (leakgym.game.round.play_round): one owner for a round, per-game seeds, atomic failures,
validate-then-act."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import leakgym  # noqa: F401  (registers the ids)
from leakgym.agents.policies.base import UniformRandomAgent
from leakgym.agents.policies.scripted import FixedAgent
from leakgym.envs import RoundError, parallel_env
from leakgym.envs.leakgym_env import share_batch
from leakgym.game import round as round_module
from leakgym.game.round import play_round


def _scrub(info):
    """Infos minus wall-clock values (the only entries allowed to differ between identical rounds)."""
    return {k: v for k, v in info.items() if not k.endswith("_s")}


def _assert_same_step(a, b):
    obs_a, r_a, te_a, tr_a, info_a = a
    obs_b, r_b, te_b, tr_b, info_b = b
    np.testing.assert_array_equal(obs_a, obs_b)
    assert r_a == r_b and te_a == te_b and tr_a == tr_b
    assert _scrub(info_a) == _scrub(info_b)


def _vector_info(infos, i):
    """Game ``i``'s info out of a vector env's batched infos (nested dicts included)."""
    out = {}
    for k, v in infos.items():
        if k.startswith("_") or not infos[f"_{k}"][i]:
            continue
        out[k] = _vector_info(v, i) if isinstance(v, dict) else v[i].item() if hasattr(v[i], "item") else v[i]
    return out


def _assert_close_step(a, b, tol):
    """Attack-derived numbers within ``tol``; everything the attack cannot touch bit-identical."""
    obs_a, r_a, te_a, tr_a, info_a = a
    obs_b, r_b, te_b, tr_b, info_b = b
    np.testing.assert_allclose(obs_a, obs_b, atol=tol, rtol=0)
    assert r_a == pytest.approx(r_b, abs=tol) and te_a == te_b and tr_a == tr_b
    for key in ("round", "accuracy", "test_loss", "strategy_index", "attack_units"):
        assert info_a[key] == info_b[key], key
    for key in ("leakage", "leakage_ssim", "leakage_psnr", "leakage_mse"):
        assert info_a[key] == pytest.approx(info_b[key], abs=tol * (100 if key == "leakage_psnr" else 1)), key


@pytest.mark.parametrize("batch_attacks", [False, True])
def test_a_game_plays_the_same_alone_or_beside_any_neighbours(cheap_overrides, batch_attacks):
    """Game 0's trajectory is identical alone, in a vector of 2 and of 64, whatever the neighbours do.

    With ``batch_attacks=False`` exactly. With batching (the default), the game's own draws, model,
    private batch, defended update and everything derived from them stay bit-identical; only the
    attack's optimisation may differ by floating-point rounding of the vectorised kernels (measured
    here: < 1e-6 in SSIM), so attack-derived numbers are compared within 1e-4.
    """
    overrides = dict(cheap_overrides, rounds=2)
    seed, rounds = 11, overrides["rounds"]
    mine = [np.array([1, 0, 0, 1]), np.array([0, 1, 0, 0])]  # IG then DLG, different budgets

    single = gym.make("LeakGym-Digits-v0", opponent=FixedAgent([1, 2, 1, 0, 1, 0]), **overrides)
    single.reset(seed=seed)
    alone = [single.step(a) for a in mine]

    for n in (2, 64):
        vec = gym.make_vec("LeakGym-Digits-v0", num_envs=n, opponent=FixedAgent([1, 2, 1, 0, 1, 0]),
                           batch_attacks=batch_attacks, **overrides)
        neighbour_seeds = list(range(100, 100 + n - 1))
        vec.reset(seed=[seed, *neighbour_seeds])
        rng = np.random.default_rng(n)
        for t in range(rounds):
            actions = vec.action_space.sample()
            actions[1:] = rng.integers(0, vec.single_action_space.nvec, size=(n - 1, 4))
            actions[0] = mine[t]
            # half the neighbours play exactly game 0's action: they share its attack group
            actions[1 : n // 2] = mine[t]
            obs, rew, te, tr, infos = vec.step(actions)
            step = (obs[0], rew[0], te[0], tr[0], _vector_info(infos, 0))
            if batch_attacks:
                _assert_close_step(alone[t], step, tol=1e-4)
            else:
                _assert_same_step(alone[t], step)
        vec.close()


def test_each_game_of_a_vector_meets_its_own_copy_of_an_opponent_object(cheap_overrides):
    """An Agent object given as ``opponent`` is a template: every game plays a copy. A shared instance
    advanced one game's round-robin position in its neighbour's rounds, so two games with one seed
    diverged (and a bandit would credit one game's reward to another game's arm)."""
    from leakgym.agents.policies.scripted import RoundRobinAgent

    template = RoundRobinAgent()
    single = gym.make("LeakGym-Digits-v0", opponent=RoundRobinAgent(), **cheap_overrides)
    single.reset(seed=5)
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, opponent=template, batch_attacks=False, **cheap_overrides)
    vec.reset(seed=[5, 5, 5])
    for a in ([0, 0, 0, 0], [1, 1, 0, 1]):
        alone = single.step(np.array(a))
        obs, rew, te, tr, infos = vec.step(np.array([a] * 3))
        for i in range(3):
            _assert_same_step(alone, (obs[i], rew[i], te[i], tr[i], _vector_info(infos, i)))
    assert template.t == 0, "the template itself is not stepped"
    vec.close()


def test_games_of_a_vector_with_different_seeds_differ(cheap_overrides):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, opponent=FixedAgent([0] * 6), **cheap_overrides)
    obs, _ = vec.reset(seed=[1, 2, 1])
    obs, rew, _, _, infos = vec.step(np.array([[0, 1, 0, 0]] * 3))
    ssim = infos["leakage_ssim"]
    assert rew[0] == rew[2] and ssim[0] == ssim[2]
    assert rew[0] != rew[1] and ssim[0] != ssim[1]
    np.testing.assert_array_equal(obs[0], obs[2])
    assert not np.array_equal(obs[0], obs[1])


def _state(e):
    g, r = e.games, e.row
    return (
        {k: v.clone() for k, v in g.model(r).state_dict().items()},
        copy.deepcopy(g.rngs[r].bit_generator.state),
        int(g.round[r]), float(g.accuracy[r]), float(g.test_loss[r]), g.last[r], list(e.history), e.agents,
    )


def _assert_state_equal(s1, s2):
    m1, r1, *rest1 = s1
    m2, r2, *rest2 = s2
    assert m1.keys() == m2.keys() and all(torch.equal(m1[k], m2[k]) for k in m1)
    assert r1 == r2
    assert rest1 == rest2


@pytest.mark.parametrize("phase", ["defend", "attack", "score", "aggregate", "reward"])
def test_a_failing_round_leaves_the_game_exactly_as_it_was(cheap_overrides, monkeypatch, phase):
    e = parallel_env("digits", **cheap_overrides)
    e.reset(seed=3)
    first = {"attacker": np.array([0, 1, 0, 1]), "defender": np.array([1, 1, 1, 1, 1, 0])}
    second = {"attacker": np.array([1, 0, 0, 0]), "defender": np.array([2, 0, 0, 0, 0, 1])}
    e.step(first)
    before = _state(e)
    original = getattr(round_module, phase)

    def late_failure(*args, **kwargs):
        original(*args, **kwargs)  # the phase runs (and changes state) ... then fails
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(round_module, phase, late_failure)
    with pytest.raises(RoundError, match=r"round 2 of scenario 'digits' with actions attacker=\[1, 0, 0, 0\].*disk on fire"):
        e.step(second)
    _assert_state_equal(before, _state(e))
    monkeypatch.setattr(round_module, phase, original)

    # ... and the game goes on exactly as if the failed round had never been tried
    after_failure = e.step(second)
    ref = parallel_env("digits", **cheap_overrides)
    ref.reset(seed=3)
    ref.step(first)
    expected = ref.step(second)
    for a in ("attacker", "defender"):
        np.testing.assert_array_equal(after_failure[0][a], expected[0][a])
        assert after_failure[1][a] == expected[1][a]


def test_a_failing_game_restores_every_game_of_the_round(cheap_overrides, monkeypatch):
    envs = [parallel_env("digits", **cheap_overrides) for _ in range(3)]
    games = share_batch(envs)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    before = [_state(e) for e in envs]
    calls = {"n": 0}
    original = round_module._aggregate_alone

    def third_fails(*args, **kwargs):
        calls["n"] += 1
        original(*args, **kwargs)
        if calls["n"] == 3:
            raise RuntimeError("third game failed")

    monkeypatch.setattr(round_module, "_aggregate_alone", third_fails)
    actions = [(np.zeros(6, np.int64), np.zeros(4, np.int64))] * 3
    with pytest.raises(RoundError, match="game 2: round 1.*third game failed"):
        play_round(games, [0, 1, 2], actions)
    for e, b in zip(envs, before):
        _assert_state_equal(b, _state(e))


def test_a_round_times_each_of_its_phases(cheap_overrides):
    """Each game's timings after a round: one entry per timed phase (what `leakgym bench env` splits), the
    reward phase (summaries, rewards, records, observations) included."""
    envs = [parallel_env("digits", **cheap_overrides) for _ in range(2)]
    games = share_batch(envs)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    play_round(games, [0, 1], [(np.zeros(6, np.int64), np.zeros(4, np.int64))] * 2)
    for row in (0, 1):
        assert set(games.timings[row]) == {"defense_s", "attack_s", "fl_s", "score_s", "reward_s"}
        assert all(v > 0 for v in games.timings[row].values()), games.timings[row]


BAD_ACTIONS = [
    np.array([0, 9, 0, 0]),  # out of range
    np.array([0, 0, 0]),  # wrong shape
    np.array([0.5, 0, 0, 0]),  # not whole
    np.array([np.nan, 0, 0, 0]),  # not finite
    np.array([True, False, False, False]),  # booleans
    np.array(["0", "0", "0", "0"]),  # strings
    np.array([1 + 0j, 0, 0, 0]),  # complex
    [0, True, 0, 0],  # a bool entry, which numpy would turn into an integer
    # found in review: numpy files timedelta64 under the integers (accepted, or a TypeError), a 0-d bool
    # tensor in a list became 1, and a masked array played the hidden value of its masked entry
    np.array([0, 1, 0, 0], dtype="timedelta64[s]"),
    np.array([0, 1, 0, 0], dtype="timedelta64"),
    [0, 0, 0, torch.tensor(True)],
    np.ma.masked_array([0, 0, 0, 1], mask=[0, 0, 0, 1]),
]


@pytest.mark.parametrize("bad", BAD_ACTIONS, ids=lambda a: str(a.dtype) + str(a.shape) if hasattr(a, "dtype") else repr(a))
def test_a_rejected_action_changes_nothing_single_view(cheap_overrides, bad):
    def run(with_bad):
        e = gym.make("LeakGym-Digits-v0", opponent=UniformRandomAgent(), **cheap_overrides)
        e.reset(seed=5)
        out = [e.step(np.array([0, 1, 0, 1]))]
        if with_bad:
            with pytest.raises(ValueError, match="attacker action"):
                e.step(bad)
        out.append(e.step(np.array([1, 0, 0, 0])))
        return out

    for a, b in zip(run(False), run(True)):
        _assert_same_step(a, b)


def test_a_rejected_action_changes_nothing_parallel_and_vector(cheap_overrides):
    def parallel(with_bad):
        e = parallel_env("digits", **cheap_overrides)
        e.reset(seed=5)
        good = {"attacker": np.array([1, 1, 0, 1]), "defender": np.array([1, 0, 1, 0, 1, 0])}
        if with_bad:
            with pytest.raises(ValueError, match="defender action"):
                e.step({"attacker": good["attacker"], "defender": np.array([1, 0, 1, 0, 1, 7])})
        return e.step(good)

    a, b = parallel(False), parallel(True)
    for agent in ("attacker", "defender"):
        np.testing.assert_array_equal(a[0][agent], b[0][agent])
        assert a[1][agent] == b[1][agent]

    def vector(with_bad):
        v = gym.make_vec("LeakGym-Digits-v0", num_envs=3, opponent="random", **cheap_overrides)
        v.reset(seed=9)
        good = np.array([[0, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1]])
        if with_bad:
            bad = good.copy()
            bad[2, 1] = 5  # the last game's action is bad: the first two must not have played
            with pytest.raises(ValueError, match=r"sub-environment 2: attacker action\[1\]"):
                v.step(bad)
        return v.step(good)

    a, b = vector(False), vector(True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("flat", [False, True], ids=["multidiscrete", "flat"])
def test_the_vector_env_refuses_what_the_single_view_refuses(cheap_overrides, flat):
    """Found in an audit: np.asarray dropped a masked array's mask, so the vector env played the value hidden
    under it (the single-agent view refuses masked entries); ragged rows and a tensor that requires grad gave
    numpy's and torch's own errors. Every one is a ValueError now, and no game moves."""
    def vector():
        v = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="random", flat_actions=flat, **cheap_overrides)
        v.reset(seed=9)
        return v

    good = np.array([3, 5]) if flat else np.array([[0, 1, 0, 1], [1, 0, 0, 0]])
    masked = np.ma.masked_array(good, mask=np.zeros_like(good, dtype=bool))
    masked.mask[(0,) if flat else (0, 1)] = True
    ragged = [3, [5, 1]] if flat else [[0, 1, 0, 1], [1, 0]]
    expected = vector().step(good)
    v = vector()
    for bad in (masked, ragged, torch.zeros(good.shape, requires_grad=True)):
        with pytest.raises(ValueError, match="masked|not an array"):
            v.step(bad)
    got = v.step(good)
    np.testing.assert_array_equal(expected[0], got[0])
    np.testing.assert_array_equal(expected[1], got[1])


@pytest.mark.parametrize("bad", [[[1], [2, 3]], torch.tensor(3.0, requires_grad=True)], ids=["ragged", "grad-tensor"])
def test_a_flat_action_numpy_cannot_read_is_a_named_value_error(cheap_overrides, bad):
    env = gym.make("LeakGym-Digits-v0", opponent="none", flat_actions=True, **cheap_overrides)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"flat action .*expected one integer in 0\.\.\d+"):
        env.step(bad)


def test_the_round_details_carry_the_decoded_actions(cheap_overrides):
    """The infos are numbers (leakgym.game.feedback: strategy_index); the full record is round_details()."""
    e = parallel_env("digits", **cheap_overrides)
    e.reset(seed=0)
    _, _, _, _, numbers = e.step({"attacker": np.array([1, 1, 0, 1]), "defender": np.array([2, 0, 0, 0, 1, 0])})
    assert e.scenario.strategies[numbers["attacker"]["strategy_index"]] == "dlg"
    infos = {agent: e.round_details(agent) for agent in e.possible_agents}
    assert infos["attacker"]["strategy"] == "dlg"
    assert infos["attacker"]["attack_settings"] == {"strategy": "dlg", "iterations": 4, "restarts": 1, "tv": 1e-2}
    assert infos["defender"]["defense_settings"]["noise_sigma"] == 0.1
    assert infos["defender"]["defense_settings"]["oasis"] == ["major_rotation"]
    assert infos["defender"]["defenses"] == ["oasis", "noise"]
    assert e.last_round.strategy == "dlg" and e.last_round.round == 1


def test_a_skipped_update_is_not_attacked_and_leaks_nothing(cheap_overrides):
    """CENSOR's ``skip`` fallback sends no update: the attack does not run, leakage is 0, cost 0."""
    e = parallel_env("digits", **dict(cheap_overrides, defender_menu={"censor_trials": [0, 1]},
                                      defense_defaults={"censor_fallback": "skip", "censor_step": 50.0}),
                     oasis_bits=[])
    e.reset(seed=0)
    skipped = 0
    for _ in range(3):
        _, _, _, _, infos = e.step({"attacker": np.array([0, 0, 0, 0]), "defender": np.array([1])})
        if infos["defender"]["update_skipped"]:
            skipped += 1
            assert infos["attacker"]["leakage"] == 0.0 and infos["attacker"]["attack_units"] == 0.0
            # the other scores are the uninformed guess's (docs/game.md): grey images, label 0
            record = e.last_round
            assert (record.reconstructions == 0.5).all()
            assert infos["attacker"]["label_accuracy"] == float((np.asarray(record.labels) == 0).mean())
    assert skipped >= 1  # a huge trial step never lowers the loss: every round falls back to skip


def test_the_single_agent_view_takes_a_plain_callable_opponent(cheap_overrides):
    """``envs`` takes opponent objects or callables; resolving names is the agents package's job."""
    from leakgym.envs.single_agent import LeakGymSingleAgentEnv

    calls = []

    def no_defense(observation, action_space, rng):
        calls.append(observation.shape)
        return np.zeros(len(action_space.nvec), np.int64)

    env = LeakGymSingleAgentEnv("digits", role="attacker", opponent=no_defense, **cheap_overrides)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([0, 0, 0, 0]))
    assert calls and info["leakage"] >= 0.0
    with pytest.raises(ValueError, match="opponent=.*expected an object with act"):
        LeakGymSingleAgentEnv("digits", opponent="random", **cheap_overrides)


def test_a_failing_round_restores_the_divergence_flag(cheap_overrides, monkeypatch):
    e = parallel_env("digits", **cheap_overrides)
    e.reset(seed=3)
    original = round_module._aggregate_alone

    def diverge_then_fail(games, row, *args, **kwargs):
        original(games, row, *args, **kwargs)
        games.diverged_at[row] = int(games.round[row])  # as GameBatch.advance does for a non-finite test loss
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(round_module, "_aggregate_alone", diverge_then_fail)
    with pytest.raises(RoundError):
        e.step({"attacker": np.array([0, 0, 0, 0]), "defender": np.zeros(6, dtype=np.int64)})
    assert e.games.diverged_at[e.row] is None


@pytest.mark.parametrize(("failure", "raised"), [(RuntimeError("disk on fire"), RoundError),
                                                (KeyboardInterrupt(), KeyboardInterrupt)])
@pytest.mark.parametrize("vector", [False, True])
def test_a_failing_step_leaves_a_stateful_opponent_as_it_was(cheap_overrides, monkeypatch, vector, failure, raised):
    """The opponent acts before the round is played; when the round fails, the opponent's own state
    (here a round-robin position) is put back with its generator, so the retried step plays what a
    fresh env plays. Ctrl-C mid-round too (it left the round half played: model, round counter and
    generators moved on)."""
    from leakgym.agents.policies.scripted import RoundRobinAgent

    def make():
        if vector:
            return gym.make_vec("LeakGym-Digits-v0", num_envs=2, role="defender", opponent=RoundRobinAgent(),
                                batch_attacks=False, **cheap_overrides)
        return gym.make("LeakGym-Digits-v0", role="defender", opponent=RoundRobinAgent(), **cheap_overrides)

    action = np.zeros((2, 6) if vector else 6, dtype=np.int64)
    env, ref = make(), make()
    env.reset(seed=4)
    ref.reset(seed=4)
    original = round_module._conclude
    # a fresh exception each time: the parametrized instance, once raised, would keep the round's frames
    # (and its games) alive through its traceback for the rest of the session
    monkeypatch.setattr(round_module, "_conclude", lambda *a, **k: (_ for _ in ()).throw(type(failure)(*failure.args)))
    with pytest.raises(raised):
        env.step(action)
    monkeypatch.setattr(round_module, "_conclude", original)
    for _ in range(2):
        got, want = env.step(action), ref.step(action)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[4]["leakage_ssim"], want[4]["leakage_ssim"])


def test_a_rejected_vector_reset_changes_no_game(cheap_overrides):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none", **cheap_overrides)
    ref = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none", **cheap_overrides)
    action = np.zeros((2, 4), dtype=np.int64)
    for v in (vec, ref):
        v.reset(seed=[0, 1])
        v.step(action)
    for bad, match in (([0, -1], r"seed\[1\]=-1; allowed: None or an integer >= 0"),
                       (1.5, r"seed=1.5; allowed: None, an integer >= 0"),
                       ("ab", r"seed='ab'"), ([0, True], r"seed\[1\]=True")):
        with pytest.raises(ValueError, match=match):
            vec.reset(seed=bad)
    np.testing.assert_array_equal(vec.step(action)[1], ref.step(action)[1])


def test_view_options_are_checked_when_built():
    with pytest.raises(ValueError, match=r"flat_actions='False'; allowed: True or False"):
        gym.make("LeakGym-Digits-v0", flat_actions="False")
    with pytest.raises(ValueError, match=r"flat_actions='no'; allowed: True or False"):
        gym.make_vec("LeakGym-Digits-v0", num_envs=2, flat_actions="no")
    with pytest.raises(ValueError, match=r"device='bogus' is not a torch device name; available here: \['cpu'"):
        gym.make("LeakGym-Digits-v0", device="bogus")
    with pytest.raises(ValueError, match=r"device='cuda:7' is not available on this machine"):
        parallel_env("digits", device="cuda:7")


@pytest.mark.parametrize("kind", ["agent", "callable"])
def test_a_rejected_action_leaves_the_opponent_holding_the_callers_objects(cheap_overrides, kind):
    """A rejected learner action used to restore the opponent from deep copies: an opponent sharing a
    policy with the caller stopped seeing the caller's updates after any rejected step."""
    from leakgym.agents.policies.base import Agent
    from leakgym.envs.single_agent import LeakGymSingleAgentEnv

    table = {"action": np.zeros(6, np.int64)}  # a policy the caller keeps training

    class TableAgent(Agent):
        name = "table"

        def __init__(self, shared):
            self.shared = shared

        def act(self, observation, action_space, rng):
            return self.shared["action"].copy()

    class TablePolicy:
        def __init__(self, shared):
            self.shared = shared

        def __call__(self, observation, action_space, rng):
            return self.shared["action"].copy()

    opponent = TableAgent(table) if kind == "agent" else TablePolicy(table)
    env = LeakGymSingleAgentEnv("digits", role="attacker", opponent=opponent, **cheap_overrides)
    env.reset(seed=0)
    with pytest.raises(ValueError):
        env.step(np.array([0, 0, 0, 7]))
    table["action"][0] = 1  # the caller updates its policy
    env.step(np.array([0, 0, 0, 0]))
    assert env.parallel.last_round.defender_action.tolist() == [1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(("seed", "message"), [(True, r"seed=True; allowed: None or an integer >= 0"),
                                               (-1, r"seed=-1"), (1.0, r"seed=1.0")])
def test_the_single_agent_view_checks_seeds_as_the_other_views_do(cheap_overrides, seed, message):
    env = gym.make("LeakGym-Digits-v0", opponent="none", **cheap_overrides)
    with pytest.raises(ValueError, match=message):
        env.reset(seed=seed)
    first = env.reset(seed=np.int64(3))[0]  # numpy integers are seeds (Gymnasium's own check refused them)
    np.testing.assert_array_equal(first, env.reset(seed=3)[0])


def test_make_vec_takes_numpy_integer_sizes_and_declares_a_frame_rate(cheap_overrides):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=np.int64(2), opponent="none", **cheap_overrides)
    assert vec.num_envs == 2 and vec.metadata["render_fps"] == 2  # HumanRendering/RecordVideo need it


def test_vector_frames_are_a_tuple_as_gymnasiums_vector_envs_return_them(cheap_overrides):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none", render_mode="rgb_array", **cheap_overrides)
    vec.reset(seed=0)
    frames = vec.render()
    assert isinstance(frames, tuple) and len(frames) == 2 and frames[0].ndim == 3


@pytest.mark.parametrize("bad", [np.ma.masked_array([1], mask=[1]), np.timedelta64(1, "s")], ids=["masked", "timedelta"])
def test_flat_actions_refuse_what_multidiscrete_actions_refuse(cheap_overrides, bad):
    env = gym.make("LeakGym-Digits-v0", opponent="none", flat_actions=True, **cheap_overrides)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="flat action"):  # a masked entry played its hidden value
        env.step(bad)


def test_a_batch_decodes_each_action_pair_once(cheap_overrides, monkeypatch):
    """The step validated its actions by decoding them (plan_one) and the round decoded them again, game by
    game, every step; a batch now decodes each (defender, attacker) pair once. What the plan hands out is
    copied, so changing an info or a record changes no later round."""
    from leakgym.game.round import plan_one

    decoded = []
    real = round_module.attack_for

    def counting(*args, **kwargs):
        decoded.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(round_module, "attack_for", counting)
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none", **cheap_overrides)
    vec.reset(seed=0)
    action = np.zeros((2, len(vec.single_action_space.nvec)), dtype=np.int64)
    vec.step(action)
    vec.step(action)
    assert len(decoded) == 1  # one pair, two games, two steps
    env = parallel_env("digits", **cheap_overrides)
    env.reset(seed=0)
    games, row = env.games, env.row
    d, a = np.zeros(len(games.menus["defender"].dims), np.int64), np.zeros(len(games.menus["attacker"].dims), np.int64)
    first = plan_one(games, row, d, a)
    assert plan_one(games, row, d, a) is first and plan_one(games, row, d.tolist(), a) is first
    a[1] = 1  # the caller's array is the caller's: the plan kept its own copy
    assert first.attacker_action.tolist() == [0, 0, 0, 0] and not first.attacker_action.flags.writeable
    assert plan_one(games, row, d, a).attacker_action.tolist() == a.tolist()  # other actions: decoded anew
    env.step({"attacker": np.zeros(4, np.int64), "defender": d})
    env.games.last[env.row].defense_settings["oasis"].append("hflip")  # the record's own copy
    env._details["defender"]["defense_settings"]["oasis"].append("hflip")  # what round_details() copies from
    env.step({"attacker": np.zeros(4, np.int64), "defender": d})
    assert env.round_details("defender")["defense_settings"]["oasis"] == [] and first.defense_settings["oasis"] == []


def test_a_cached_plan_is_found_only_for_an_action_of_the_checked_form(cheap_overrides):
    """A decoded plan is handed out without checking again only for an int64 array of the menu's shape
    (bytes name values then): the same bytes in another shape or dtype, and any bad action, are still
    checked and refused, after the valid one was decoded."""
    from leakgym.game.round import plan_one

    env = parallel_env("digits", **cheap_overrides)
    env.reset(seed=0)
    games, row = env.games, env.row
    width = len(games.menus["attacker"].dims)
    d, a = np.zeros(len(games.menus["defender"].dims), np.int64), np.zeros(width, np.int64)
    first = plan_one(games, row, d, a)
    assert plan_one(games, row, d.copy(), a.copy()) is first
    with pytest.raises(ValueError, match="shape"):
        plan_one(games, row, d, a.reshape(2, width // 2))  # the same bytes in another shape
    with pytest.raises(ValueError, match="shape"):
        plan_one(games, row, d, np.zeros(2 * width, np.int32))  # the same byte count in another dtype
    bad = a.copy()
    bad[0] = 99
    with pytest.raises(ValueError, match="allowed range"):
        plan_one(games, row, d, bad)
    with pytest.raises(ValueError, match="bool"):
        plan_one(games, row, d, [True] + [0] * (width - 1))

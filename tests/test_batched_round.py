"""The round at RL scale: one engine call for all strategies whatever the budgets; batched benign clients.

A game's result stays a function of its own (update, knowledge, seed, budget): exactly on the
engine's sequential path, within the seed tests' tolerance on the vectorised one
(``tests/test_attacks_seeds.py``), and within the batched-FL tolerance of ``tests/test_batched_fl.py``
when the benign clients are batched.
"""

from __future__ import annotations

import copy
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

import leakgym  # noqa: F401  (registers the ids)
from leakgym.agents.policies.scripted import FixedAgent
from leakgym.attacks import build_attack
from leakgym.attacks.engine import optimization
from leakgym.envs import RoundError, parallel_env
from leakgym.envs.leakgym_env import share_batch
from leakgym.game import round as round_module
from leakgym.game.batch import GameBatch
from leakgym.game.records import AttackJob
from leakgym.game.round import play_round, reconstruct_all

VECTORISED_TOL = {"rtol": 1e-4, "atol": 1e-4}
FL_TOL = 1e-5
MENU = {"strategies": ["inverting-gradients", "dlg", "prior-init", "gradinversion"], "iterations": [2, 3, 5],
        "restarts": [1, 2], "tv": [0.0, 1e-4, 1e-2]}


@pytest.fixture(scope="module")
def victims(digit_victims):
    return digit_victims(4, known=lambda i: False)


def _jobs(victims, settings, vectorize=True):
    jobs = []
    for i, ((update, knowledge), (strategy, options)) in enumerate(zip(victims, settings)):
        attack = build_attack(strategy, **options)
        attack.vectorize = vectorize
        jobs.append(AttackJob(attack=attack, update=update, knowledge=knowledge, seed=100 + i))
    return jobs


@pytest.mark.parametrize("vectorize", [False, True])
def test_a_game_with_budget_20_beside_budgets_60_and_150_gets_its_result_alone(victims, vectorize, monkeypatch):
    settings = [("inverting-gradients", {"iterations": 20, "tv": 1e-4}),
                ("inverting-gradients", {"iterations": 60, "tv": 0.0}),
                ("inverting-gradients", {"iterations": 150, "tv": 1e-2, "restarts": 2}),
                ("dlg", {"iterations": 7})]
    calls = []
    original = optimization.run_joint_matching
    monkeypatch.setattr(optimization, "run_joint_matching", lambda *a, **k: calls.append(1) or original(*a, **k))
    together, _ = reconstruct_all(_jobs(victims, settings, vectorize))
    assert len(calls) == 1  # one engine call: Inverting Gradients (Adam) and DLG (L-BFGS) side by side
    assert [r.cost.iterations for r in together] == [20, 60, 150, 7]
    assert [r.cost.units for r in together] == [20, 60, 300, 7]
    for i in (0, 3):
        job = dataclasses.replace(_jobs(victims[i:i + 1], settings[i:i + 1], vectorize)[0], seed=100 + i)
        (alone,), _ = reconstruct_all([job])
        assert alone.cost.iterations == together[i].cost.iterations
        if vectorize:
            torch.testing.assert_close(together[i].images, alone.images, **VECTORISED_TOL)
        else:
            assert torch.equal(together[i].images, alone.images)
            assert together[i].history == alone.history


def test_a_vector_step_with_random_actions_makes_one_engine_call(cheap_overrides, monkeypatch):
    overrides = dict(cheap_overrides, **MENU)
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=12, opponent="none", **overrides)
    vec.reset(seed=0)
    calls = []
    original = optimization.run_joint_matching
    monkeypatch.setattr(optimization, "run_joint_matching", lambda *a, **k: calls.append(1) or original(*a, **k))
    rng = np.random.default_rng(0)
    for _ in range(2):
        actions = rng.integers(0, vec.single_action_space.nvec, size=(12, 4))
        calls.clear()
        _, _, _, _, infos = vec.step(actions)
        assert len(set(infos["strategy_index"])) > 1
        assert len(calls) == 1  # all four strategies (three Adam, one L-BFGS) in one engine call
        assert len({tuple(a[1:]) for a in actions}) > 1  # budgets, restarts and TV weights did differ
        units = infos["attack_units"]
        for a, u in zip(actions, units):
            assert u == MENU["iterations"][a[1]] * MENU["restarts"][a[2]]  # each game pays its own budget
    vec.close()


def _vector(cheap_overrides, batch_clients, monkeypatch):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=4, opponent="random", batch_attacks=False,
                       batch_clients=batch_clients, **dict(cheap_overrides, num_clients=3))
    vec.reset(seed=[5, 6, 7, 8])
    rng = np.random.default_rng(1)
    steps = []
    for _ in range(cheap_overrides["rounds"] + 2):  # across an episode end (autoreset)
        steps.append(vec.step(rng.integers(0, vec.single_action_space.nvec, size=(4, 4))))
    vec.close()
    return steps


def test_batched_clients_play_the_game_by_game_trajectory_to_rounding(cheap_overrides, monkeypatch):
    loop = _vector(cheap_overrides, False, monkeypatch)
    batch = _vector(cheap_overrides, True, monkeypatch)
    played = 0
    for (o1, r1, te1, tr1, i1), (o2, r2, te2, tr2, i2) in zip(loop, batch):
        np.testing.assert_allclose(o1, o2, atol=1e-4)
        np.testing.assert_allclose(r1, r2, atol=1e-4)
        assert (te1 == te2).all() and (tr1 == tr2).all()
        assert i1.keys() == i2.keys()
        if "test_loss" not in i1:  # every game reset in this step
            continue
        np.testing.assert_array_equal(i1["round"], i2["round"])
        np.testing.assert_allclose(i1["test_loss"], i2["test_loss"], rtol=FL_TOL)
        np.testing.assert_allclose(i1["accuracy"], i2["accuracy"], atol=1e-9)
        played += 1
    assert played >= cheap_overrides["rounds"]


def test_a_refused_share_batch_moves_no_env(cheap_overrides):
    """Found in an audit: share_batch joined the envs one by one, so a refused call (here the second env
    has started an episode) had already moved the first into the new batch."""
    fresh, started = parallel_env("digits", **cheap_overrides), parallel_env("digits", **cheap_overrides)
    started.reset(seed=0)
    before = [(e.games, e.row) for e in (fresh, started)]
    with pytest.raises(ValueError, match="environment 1: join\\(\\) moves an env before its first reset"):
        share_batch([fresh, started])
    with pytest.raises(ValueError, match="the same environment twice"):
        share_batch([fresh, fresh])
    assert [(e.games, e.row) for e in (fresh, started)] == before


def test_a_failing_batched_phase_restores_every_game(cheap_overrides, monkeypatch):
    envs = [parallel_env("digits", **cheap_overrides) for _ in range(3)]
    games = share_batch(envs)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    before = [({k: v.clone() for k, v in games.model(i).state_dict().items()},
               copy.deepcopy(games.rngs[i].bit_generator.state), e.round) for i, e in enumerate(envs)]
    original = round_module._aggregate_together

    def fails(*args, **kwargs):
        original(*args, **kwargs)
        raise RuntimeError("aggregation on fire")

    monkeypatch.setattr(round_module, "_aggregate_together", fails)
    actions = [(np.zeros(6, np.int64), np.zeros(4, np.int64))] * 3
    with pytest.raises(RoundError, match="aggregation on fire"):
        play_round(games, [0, 1, 2], actions, batch_clients=True)
    for i, (e, (state, rng, rnd)) in enumerate(zip(envs, before)):
        assert e.round == rnd and games.rngs[i].bit_generator.state == rng
        assert all(torch.equal(v, state[k]) for k, v in games.model(i).state_dict().items())


@pytest.mark.parametrize("batch_clients", [False, True])
def test_dcs2_synthesises_every_game_at_once_only_with_batch_clients(cheap_overrides, batch_clients, monkeypatch):
    """With batch_clients the victims of all games train in lock-step and DCS² synthesises all their
    concealed samples in one computation; without it, game by game (each bit-identical to the game alone)."""
    import leakgym.defenses.dcs2 as dcs2_module

    calls = []
    original = dcs2_module.dcs2_gradients
    monkeypatch.setattr(dcs2_module, "dcs2_gradients", lambda m, *a: calls.append(len(m)) or original(m, *a))
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=5, opponent=FixedAgent([0, 0, 1, 0, 0, 0]),
                       batch_clients=batch_clients, **cheap_overrides)
    vec.reset(seed=0)
    _, rewards, *_ = vec.step(np.zeros((5, 4), dtype=np.int64))
    vec.close()
    assert calls == ([5] if batch_clients else [1] * 5)
    assert np.isfinite(rewards).all()


# ------------------------------------------------------------------------- the attacker's summaries
def _summary_reference(update):
    """The attacker's update summary written out for one update (leakgym/game/feedback.py module docstring)."""
    import math

    from leakgym.game.feedback import LAYER_GROUPS

    tensors = [torch.nan_to_num(t.detach().reshape(-1).double().cpu()) for t in update.tensors.values()]
    norms, zeros = [], []
    for g in np.array_split(np.arange(len(tensors)), LAYER_GROUPS):
        if len(g) == 0:  # fewer tensors than groups
            norms.append(0.0)
            zeros.append(0.0)
            continue
        flat = torch.cat([tensors[i] for i in g])
        norms.append(min(max((math.log10(float(flat.norm()) + 1e-12) + 8) / 10, 0.0), 1.0))
        zeros.append(float((flat == 0).double().mean()))
    allv = torch.cat(tensors)
    centred = allv - allv.mean()
    var = float((centred**2).mean())
    kurt = float((centred**4).mean()) / var**2 - 3 if var > 0 else 0.0
    rms = math.sqrt(float((allv**2).mean()))
    return np.array(norms + zeros + [(math.tanh(kurt / 10) + 1) / 2, float(allv.abs().mean()) / rms if rms else 0.0],
                    np.float32)


def _updates(device="cpu"):
    from leakgym.fl.update import SharedUpdate

    gen = torch.Generator().manual_seed(0)
    shapes = {"c1.w": (12, 1, 5, 5), "c1.b": (12,), "c2.w": (12, 12, 5, 5), "c2.b": (12,), "fc.w": (10, 48), "fc.b": (10,)}
    ups = []
    for k in range(9):
        t = {n: torch.randn(s, generator=gen) * 10.0 ** (k - 5) for n, s in shapes.items()}
        if k % 3 == 0:
            t["c1.w"][t["c1.w"].abs() < 10.0 ** (k - 5)] = 0  # pruned
        if k == 4:
            t = {n: torch.zeros(s) for n, s in shapes.items()}
        ups.append(SharedUpdate({n: v.to(device) for n, v in t.items()}))
    small = {n: torch.randn(s, generator=gen) for n, s in {"w": (3, 4), "b": (3,)}.items()}  # another architecture
    return ups[:5] + [None, SharedUpdate({n: v.to(device) for n, v in small.items()})] + ups[5:]


def test_update_summaries_of_all_games_equal_each_update_alone(monkeypatch):
    """One batched computation per architecture gives every game exactly its own summary (a vector game
    sees what it sees alone), equal to the summary written out per update; chunking changes nothing."""
    from leakgym.game import feedback as observations

    ups = _updates()
    together = observations.update_summaries(ups)
    assert together.shape == (len(ups), observations.SUMMARY_SIZE) and together.dtype == np.float32
    for i, u in enumerate(ups):
        alone = observations.update_summaries([u])[0]
        np.testing.assert_array_equal(together[i], alone)
        np.testing.assert_array_equal(alone, np.zeros(observations.SUMMARY_SIZE) if u is None else _summary_reference(u))
    assert together[0, LAYER_ZERO_FRACTION] > 0.3 and together[1, LAYER_ZERO_FRACTION] == 0  # pruned vs not
    size = sum(t.numel() for t in ups[0].tensors.values())
    for games_per_chunk in (1, 3):  # (the CPU's bound applies here; the other one on accelerators)
        for name in ("SUMMARY_ENTRIES", "CPU_SUMMARY_ENTRIES"):
            monkeypatch.setattr(observations, name, games_per_chunk * size)
        np.testing.assert_array_equal(observations.update_summaries(ups), together)


def test_an_update_larger_than_the_cpus_bound_is_summarised_in_blocks(monkeypatch):
    """On a CPU an update of more than CPU_SUMMARY_ENTRIES entries (ResNet-18's 11.2 M: 342 -> 34 ms) is
    summarised from blocks of at most that many entries, two passes, instead of as one float64 row: the same
    summaries as the reference written out per update and as the one-row computation, to float64 rounding,
    for pruned, all-zero, tiny and huge updates, and for non-finite entries. Each game's alone as in a vector."""
    from leakgym.fl.update import SharedUpdate
    from leakgym.game import feedback as observations

    ups = [u for u in _updates() if u is not None]
    gen = torch.Generator().manual_seed(1)
    odd = {"a": torch.randn(40, generator=gen), "b": torch.randn(3, 7, generator=gen)}  # two tensors: two empty groups
    odd["a"][3], odd["a"][5], odd["b"][1, 2] = float("nan"), float("inf"), float("-inf")
    ups.append(SharedUpdate(odd))
    rows = {id(u): observations._summary_rows(torch.cat([t.reshape(1, -1) for t in u.tensors.values()], dim=1),
                                              [t.numel() for t in u.tensors.values()])[0] for u in ups}
    blocks = []
    real = observations._summary_in_blocks
    monkeypatch.setattr(observations, "_summary_in_blocks", lambda t, s: blocks.append(len(t)) or real(t, s))
    monkeypatch.setattr(observations, "CPU_SUMMARY_ENTRIES", 8)  # every update past it; tensors in several blocks
    together = observations.update_summaries(ups)
    assert len(blocks) == len(ups)
    for i, u in enumerate(ups):
        np.testing.assert_allclose(together[i], rows[id(u)], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(observations.update_summaries([u])[0], together[i])
        if i < len(ups) - 1:
            np.testing.assert_allclose(together[i], _summary_reference(u), rtol=1e-6, atol=1e-7)
    # (an infinite entry makes the noise statistics NaN in both forms; the observation maps NaN to 0)
    assert np.isnan(together[-1, -2:]).all() and np.isfinite(together[:-1]).all()


LAYER_ZERO_FRACTION = 4  # the first layer group's zero fraction


@pytest.mark.cuda
def test_update_summaries_on_cuda_match_the_cpu():
    ups = _updates("cuda")
    cpu = [None if u is None else type(u)({n: t.cpu() for n, t in u.tensors.items()}) for u in ups]
    from leakgym.game.feedback import update_summaries

    np.testing.assert_allclose(update_summaries(ups), update_summaries(cpu), rtol=1e-6, atol=1e-6)


def test_a_games_batch_signature_is_its_server_models_signature_for_the_episode(cheap_overrides, monkeypatch):
    """The signature that groups games' clients is computed once per episode for the server's model
    (rebuilt at reset), and every time for any other model (a malicious server's modified copy)."""
    import copy

    from leakgym.fl import batched
    from leakgym.game.scenario import load_scenario

    games = GameBatch(load_scenario("digits", **cheap_overrides))
    games.reset(0, seed=0)
    calls = []
    real = batched.signature
    monkeypatch.setattr(batched, "signature", lambda m: calls.append(m) or real(m))
    model = games.model(0)
    assert games.signature(0, model) == real(model) and games.signature(0, model) == real(model)
    assert calls == [model]
    other = copy.deepcopy(model)
    assert games.signature(0, other) == real(other) and games.signature(0, other) == real(other)
    assert calls == [model, other, other]
    games.reset(0, seed=1)  # a new episode, a new model
    assert games.model(0) is not model and games.signature(0, games.model(0)) == real(games.model(0))
    assert calls[-1] is games.model(0)


def test_the_self_audits_time_is_attack_time_in_a_vector_too(cheap_overrides, monkeypatch):
    """Found in an audit: each game of a vector took its share of the engine call as its attack time, without
    the defenders' self-audits, which ran in the same phase; `leakgym bench env` then put them in the Python
    overhead of its vector rows (90% at 150 audit iterations) and in the attack of its sequential baseline."""
    import time

    real = round_module._self_audits

    def slow(*args, **kwargs):
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(round_module, "_self_audits", slow)
    envs = [parallel_env("digits", **cheap_overrides) for _ in range(2)]
    games = share_batch(envs)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    play_round(games, [0, 1], [(np.zeros(6, np.int64), np.zeros(4, np.int64))] * 2)
    assert all(games.timings[r]["attack_s"] >= 0.1 for r in (0, 1)), [games.timings[r] for r in (0, 1)]

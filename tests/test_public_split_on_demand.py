"""A game's public split is gathered only for the rounds that read it.

Attacks declare whether they read it (``Attack.public_split``), as defenses do; a game keeps its split
as indices and :meth:`GameBatch.public_split` gathers the images for the games whose attack or defense
reads it, keeping the most recently read ones within ``PUBLIC_SPLIT_CACHE_BYTES``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_attacks_seeds import problems_for

from leakgym.attacks import ATTACKS, AttackerKnowledge
from leakgym.attacks.inverting_gradients import InvertingGradients
from leakgym.data import federated_split, load_dataset
from leakgym.envs import parallel_env
from leakgym.game import batch as batch_module
from leakgym.models import build_model

READERS = {"prior-init", "loda-inversion", "mixup-decoding", "imprint"}


@pytest.fixture(scope="module")
def setting():
    ds = load_dataset("digits", image_size=16)
    split = federated_split(ds, num_clients=1, seed=0)
    return ds.spec, split, build_model("lenet", ds.spec, seed=0)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_declared_a_non_reader_gives_the_same_result_without_the_split(name, setting, tmp_path):
    """A declared non-reader's sent model and reconstruction are bit for bit the same with and without the
    public split; the declared readers are the attacks that use it."""
    attack = ATTACKS[name]
    assert attack.public_split == (name in READERS)
    if name in READERS:
        return
    torch.manual_seed(0)
    spec, split, model = setting
    atk, updates, knowledges = problems_for(name, setting, tmp_path, n=2)
    with_split = atk.reconstruct_batch(updates, knowledges, seeds=[3, 4])
    blind = [AttackerKnowledge(model=k.model, spec=k.spec, batch_size=k.batch_size) for k in knowledges]
    without = atk.reconstruct_batch(updates, blind, seeds=[3, 4])
    for a, b in zip(with_split, without):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    sent = [atk.prepare_model(model, spec, public_x=p) for p in (split.public_x, None)]
    for (na, a), (nb, b) in zip(sent[0].state_dict().items(), sent[1].state_dict().items()):
        assert na == nb and torch.equal(a, b)


def test_an_attack_that_does_not_declare_it_reads_the_split_whatever_its_parent_says():
    class Mine(InvertingGradients):
        name = "mine"

    class Quiet(InvertingGradients):
        name = "quiet"
        public_split = False

    assert not InvertingGradients().reads_public_split()
    assert Mine().reads_public_split() and not Quiet().reads_public_split()


def test_a_defense_that_does_not_declare_it_reads_the_split_whatever_its_parent_says():
    from leakgym.defenses import DefenseConfig
    from leakgym.defenses.perturbation import Noise

    class LouderNoise(Noise):
        """Declares nothing about the public split (on purpose: the rule under test)."""

    assert not Noise.public_split and LouderNoise.public_split
    assert LouderNoise().reads_public_split(DefenseConfig())


def _actions(env, strategy: str) -> dict[str, np.ndarray]:
    batch = env.games
    attacker = np.zeros(len(batch.menus["attacker"].dims), np.int64)
    attacker[0] = batch.strategies.index(strategy)
    return {"attacker": attacker, "defender": np.zeros(len(batch.menus["defender"].dims), np.int64)}


def _seen_public(monkeypatch) -> list:
    """Record the public split every attack's knowledge carries."""
    from leakgym.game import round as game_round

    seen = []
    real = game_round.AttackerKnowledge

    def knowledge(**kwargs):
        seen.append(kwargs["public_x"])
        return real(**kwargs)

    monkeypatch.setattr(game_round, "AttackerKnowledge", knowledge)
    return seen


def test_a_round_gathers_the_split_only_for_a_reader_and_keeps_it(monkeypatch):
    env = parallel_env("digits", iterations=[1])
    try:
        env.reset(seed=3)
        batch = env.games
        seen = _seen_public(monkeypatch)
        env.step(_actions(env, "inverting-gradients"))  # no defense, a non-reader attack
        assert seen == [None] and not batch._public
        env.step(_actions(env, "prior-init"))
        x, y = batch.public_split(0)
        assert seen[-1] is x  # the gathered split, kept: the next read is the same tensor
        rows = batch.public_rows[0]  # (test_game_data: these are federated_split's public indices)
        assert torch.equal(x, batch.dataset.train_x[rows]) and torch.equal(y, batch.dataset.train_y[rows])
        env.step(_actions(env, "prior-init"))
        assert seen[-1] is x
        env.reset(seed=4)  # a new split: the old one is dropped
        assert not batch._public
    finally:
        env.close()


def test_a_split_gathered_again_keeps_its_derived_values(monkeypatch):
    """A split dropped and gathered again (equal values, another tensor): prior-init's class means, derived
    from it, are still computed once for the episode (``gathered_from``)."""
    from leakgym.attacks import adaptive

    env = parallel_env("digits", iterations=[1])
    try:
        env.reset(seed=0)
        batch = env.games
        means = []
        real = adaptive.class_mean_images
        monkeypatch.setattr(adaptive, "class_mean_images", lambda *a, **k: means.append(1) or real(*a, **k))
        gathers = []
        for _ in range(3):
            batch._public.pop(0, None)  # dropped
            env.step(_actions(env, "prior-init"))
            gathers.append(batch.public_split(0)[0])
        assert gathers[0] is not gathers[1] and torch.equal(gathers[0], gathers[1])
        assert len(means) == 1
        env.reset(seed=1)  # a new episode, a new split
        env.step(_actions(env, "prior-init"))
        assert len(means) == 2
    finally:
        env.close()


def test_the_kept_splits_fit_the_budget_or_the_most_one_round_read(monkeypatch):
    """Kept until their games reset, as many as fit in the larger of the budget and the most one call read
    at once (a round holds those anyway); past that, gathered for each read. Not least recently used: games
    reading in turn would then drop every split before its next read."""
    import gymnasium as gym

    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, opponent="none", iterations=[1])
    try:
        vec.reset(seed=0)
        batch = vec.games
        one = sum(t.nbytes for t in batch.public_split(0))
        batch.reset(0, seed=5)
        assert not batch._public and batch._public_bytes == 0
        monkeypatch.setattr(batch_module, "PUBLIC_SPLIT_CACHE_BYTES", 2 * one + one // 2)
        first = [batch.public_split(r)[0] for r in range(3)]
        second = [batch.public_split(r)[0] for r in range(3)]
        assert sorted(batch._public) == [0, 1] and batch._public_bytes == 2 * one
        assert second[0] is first[0] and second[1] is first[1] and second[2] is not first[2]
        batch.reset(1, seed=6)
        assert sorted(batch._public) == [0] and batch._public_bytes == one
        batch.public_split(2)
        assert sorted(batch._public) == [0, 2]
        batch.public_splits([0, 1, 2])  # three read at once: holding three raises no peak
        assert sorted(batch._public) == [0, 1, 2] and batch._public_peak == 3 * one
        batch.reset(2, seed=7)
        twice = batch.public_splits([2, 2])  # a row named twice is one gather, kept and counted once
        assert twice[0][0] is twice[1][0] and batch._public_bytes == 3 * one
    finally:
        vec.close()


def test_a_round_gathers_the_split_for_a_defense_that_reads_it(monkeypatch):
    """DCS²'s 'public' start reads the split, its 'random' start does not (``reads_public_split``)."""
    from leakgym.defenses import DefenseConfig, reads_public_split

    assert not reads_public_split(DefenseConfig(noise_sigma=0.1, dcs2_lambda_g=0.5, dcs2_start="random"))
    assert reads_public_split(DefenseConfig(noise_sigma=0.1, dcs2_lambda_g=0.5, dcs2_start="public"))
    assert not reads_public_split(DefenseConfig(dcs2_start="public"))  # DCS² off
    env = parallel_env("digits", iterations=[1], defense_defaults={"dcs2_start": "public", "dcs2_steps": 2})
    try:
        env.reset(seed=0)
        seen = _seen_public(monkeypatch)
        actions = _actions(env, "inverting-gradients")
        env.step(actions)
        assert seen == [None]
        actions["defender"][env.games.menus["defender"].names.index("dcs2_lambda_g")] = 1  # DCS² at 0.5
        env.step(actions)
        assert seen[-1] is env.games.public_split(0)[0]
    finally:
        env.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_game_gathers_its_split_on_its_device(monkeypatch):
    """Gathered from the CPU dataset onto the game's device, equal to the CPU gather; prior-init reads it there."""
    env = parallel_env("digits", device="cuda", iterations=[1])
    try:
        env.reset(seed=0)
        seen = _seen_public(monkeypatch)
        env.step(_actions(env, "prior-init"))
        x, y = env.games.public_split(0)
        assert seen[-1] is x and x.device.type == "cuda" and y.device.type == "cuda"
        rows = env.games.public_rows[0]
        assert torch.equal(x.cpu(), env.games.dataset.train_x[rows])
    finally:
        env.close()


def test_a_game_not_reset_has_no_split():
    env = parallel_env("digits")
    try:
        with pytest.raises(RuntimeError, match="game 0 has not been reset"):
            env.games.public_split(0)
        with pytest.raises(ValueError, match=r"row=3; allowed: integers in \[0, 0\]"):
            env.games.public_splits([3])
    finally:
        env.close()

"""The checks have teeth: each one fails on a broken version of its method.

A sceptical review replaced methods one at a time by broken versions and the default suite did not
notice. Here each broken version is monkeypatched in and the check of ``test_method_checks.py``
(``method_checks.check_defense`` / ``check_attack``) or of ``test_seeds.py`` (``check_reset_seed``)
must raise ``AssertionError`` — with the message of the part of the check that catches it:

* every registered defense replaced by the identity (and the batched ``apply_many`` of those that
  have one) -> "does not change the shared update";
* a registered defense that only rescales the update (``ToyScale``), and PPP-NG with negligible noise
  (the review's "PPP-NG1 as a no-op" passed a bar below the attack's own spread) -> "does not lower
  the leakage";
* a registered defense or attack without a test case -> "has no ..." (new registrations are covered);
* every registered attack returning uniform noise (the review's EOT, LODA inversion, Mixup decoding)
  -> "does not beat the ... baseline";
* prior-init returning its start image -> "does not beat the class-mean baseline";
* GradInversion without its BN and group priors -> "does not beat gradinversion";
* LODA inversion raising on every call -> the error itself (the default suite now runs it);
* the environment ignoring the reset seed -> "different seeds, same initial model".
"""

from __future__ import annotations

import dataclasses

import pytest
from method_checks import (
    IDENTITY_APPLY,
    DefenseCase,
    check_attack,
    check_defense,
    check_reset_seed,
    check_vector_seeds,
    noise_reconstruction,
    play_gymnasium,
    play_pettingzoo,
    play_vector,
    prepared,
    start_image_reconstruction,
)
from toy_defense import ToyScale

from leakgym.attacks import ATTACKS, DLG
from leakgym.attacks.adaptive import PriorInit
from leakgym.attacks.gradinversion import GradInversion
from leakgym.attacks.loda_inversion import LodaInversion
from leakgym.defenses import DEFENSES, DefenseConfig, registered
from leakgym.defenses.ppp import PPP
from leakgym.defenses.registry import InputDefense, StepDefense, UpdateDefense
from leakgym.game.batch import GameBatch

STAGE_CLASSES = {"input": InputDefense, "update": UpdateDefense, "step": StepDefense}


@pytest.fixture(scope="module", autouse=True)
def _prepared(tmp_path_factory):
    with prepared(tmp_path_factory.getbasetemp() / "leakgym-data"):
        yield


# -- defenses -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(DEFENSES))
def test_a_defense_replaced_by_the_identity_fails_its_check(name, monkeypatch):
    defense = DEFENSES[name]
    monkeypatch.setattr(type(defense), "apply", IDENTITY_APPLY[defense.stage])
    # the batched form (the pipeline's path) must not hide the broken apply
    monkeypatch.setattr(type(defense), "apply_many", STAGE_CLASSES[defense.stage].apply_many)
    with pytest.raises(AssertionError, match="does not change the shared update"):
        check_defense(name)


#: An identity apply_many per stage: what each stage's batched form returns when it changes nothing.
IDENTITY_APPLY_MANY = {
    "input": lambda self, ctxs, xs, ys: [(x, y, {}) for x, y in zip(xs, ys)],
    "step": lambda self, ctxs, models, xs, ys, grads, *, step: [(dict(g), {}) for g in grads],
    "update": lambda self, ctxs, updates, xs, ys: [(dict(u), {}) for u in updates],
}


@pytest.mark.parametrize("name", [n for n, d in DEFENSES.items()
                                  if type(d).apply_many is not STAGE_CLASSES[d.stage].apply_many])
def test_a_batched_defense_replaced_by_the_identity_fails_its_check(name, monkeypatch):
    """The defenses with their own apply_many (the pipeline's path over all games: LODA, DCS², CENSOR,
    prune, clip): that batched form replaced by the identity fails the check too."""
    defense = DEFENSES[name]
    monkeypatch.setattr(type(defense), "apply_many", IDENTITY_APPLY_MANY[defense.stage])
    with pytest.raises(AssertionError, match="does not change the shared update"):
        check_defense(name)


def test_a_defense_that_only_rescales_the_update_fails_the_leakage_check():
    """Halving the update changes it, but a cosine-matching attack does not care."""
    with registered(ToyScale()), pytest.raises(AssertionError, match="does not lower the leakage"):
        check_defense("toy_scale", DefenseCase(DefenseConfig(toy_scale=0.5)))


def test_ppp_with_negligible_noise_fails_the_leakage_check(monkeypatch):
    """PPP-NG adding noise of std 1e-5 instead of 0.1: the update changes, the leakage does not."""
    original = PPP.apply

    def weak(self, ctx, update, x, y):
        return original(self, dataclasses.replace(ctx, config=ctx.config.replace(ppp_sigma=1e-5)), update, x, y)

    monkeypatch.setattr(PPP, "apply", weak)
    with pytest.raises(AssertionError, match="does not lower the leakage"):
        check_defense("ppp")


def test_a_registered_defense_without_a_test_setting_fails():
    with registered(ToyScale()), pytest.raises(AssertionError, match="has no active test setting"):
        check_defense("toy_scale")


# -- attacks --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attack_returning_noise_fails_its_check(name, monkeypatch):
    monkeypatch.setattr(ATTACKS[name], "_reconstruct_batch", noise_reconstruction)
    with pytest.raises(AssertionError, match="does not beat the noise baseline"):
        check_attack(name)


def test_prior_init_returning_its_start_image_fails(monkeypatch):
    monkeypatch.setattr(PriorInit, "_reconstruct_batch", start_image_reconstruction)
    with pytest.raises(AssertionError, match="does not beat the class-mean baseline"):
        check_attack("prior-init")


def test_gradinversion_without_its_priors_fails(monkeypatch):
    original = GradInversion.objective
    monkeypatch.setattr(GradInversion, "objective",
                        lambda self: dataclasses.replace(original(self), bn=0.0, group=0.0))
    with pytest.raises(AssertionError, match="does not beat gradinversion"):
        check_attack("gradinversion")


def test_loda_inversion_that_raises_fails(monkeypatch):
    def broken(self, updates, knowledges, *, seeds):
        raise RuntimeError("LODA inversion is broken")

    monkeypatch.setattr(LodaInversion, "_reconstruct_batch", broken)
    with pytest.raises(RuntimeError, match="broken"):
        check_attack("loda-inversion")


def test_a_registered_attack_without_a_case_fails(monkeypatch):
    monkeypatch.setitem(ATTACKS, "toy-attack", DLG)
    with pytest.raises(AssertionError, match="has no test case"):
        check_attack("toy-attack")


# -- environment seeds ----------------------------------------------------------------------------------
@pytest.mark.parametrize("view", ["pettingzoo", "gymnasium", "vector"])
def test_an_env_that_ignores_the_reset_seed_fails_the_seed_check(view, cheap_overrides, monkeypatch):
    original = GameBatch.reset
    monkeypatch.setattr(GameBatch, "reset", lambda self, row, seed: original(self, row, 0))
    with pytest.raises(AssertionError, match="different seeds, same initial model"):
        if view == "vector":
            check_vector_seeds(play_vector(cheap_overrides, [1, 2, 1], batch_attacks=False), exact=True)
        else:
            play = play_pettingzoo if view == "pettingzoo" else play_gymnasium
            check_reset_seed(lambda seed: play(cheap_overrides, seed))

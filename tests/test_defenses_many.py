"""apply_defense_many over a vector step's victims with a *mix* of defenses, protocols and seeds.

Each game's result is its own apply_defense's (exactly call by call, to float32 rounding batched) in
any company and any order; a game draws only from its own seed; every value a configuration accepts
runs to a finite update and report, and every value it refuses is refused when the configuration is
built, naming the value and the allowed range.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from leakgym.defenses import DefenseCall, DefenseConfig, apply_defense, apply_defense_many, defense_fields
from leakgym.models import build_model

D = DefenseConfig

#: (config, batch size, update kind, local steps, public split) of each game; LeNet victims.
MIXED = [
    (D(dcs2_lambda_g=0.7, dcs2_steps=2), 1, "gradient", 1, 0),
    (D(censor_trials=3), 2, "model_delta", 2, None),
    (D(noise_sigma=0.01, prune=0.5), 2, "gradient", 1, None),
    (D(), 2, "model_delta", 3, None),
    (D(censor_trials=2, censor_step=1e3, censor_fallback="skip"), 2, "gradient", 1, None),  # skips its round
    (D(oasis=1 | 8, censor_trials=2, soteria=0.5), 1, "model_delta", 3, None),
    (D(dcs2_lambda_g=0.5, dcs2_steps=3, censor_trials=2, noise_sigma=0.1, dcs2_start="public"), 2, "model_delta", 3, 1),
    (D(mixup_k=2, censor_trials=2), 2, "gradient", 1, None),
    (D(instahide_k=2, censor_trials=2, censor_fallback="original"), 2, "model_delta", 2, 0),
    (D(dcs2_lambda_g=0.7, dcs2_steps=2, dcs2_num_concealed=2, dcs2_start="random"), 2, "model_delta", 2, None),
    (D(oasis=4, noise_sigma=0.01, clip=0.5, topk=0.5, clip_value=1e-3), 1, "gradient", 1, None),
    (D(censor_trials=3), 2, "model_delta", 3, None),
]


def _publics(digits):
    return [(digits.train_x[100:116], digits.train_y[100:116]), (digits.train_x[200:216], digits.train_y[200:216])]


def _call(digits, i: int, config, b: int, kind: str, steps: int, public, *, seed: int | None = None,
          model=None) -> DefenseCall:
    spec = digits.spec
    px, py = (None, None) if public is None else _publics(digits)[public]
    return DefenseCall(build_model("lenet", spec, seed=i) if model is None else model,
                       spec.normalize(digits.train_x[3 * i:3 * i + b]), digits.train_y[3 * i:3 * i + b], config,
                       update_kind=kind, local_steps=steps, local_lr=0.05, seed=100 + i if seed is None else seed,
                       public_x=px, public_y=py)


def _alone(c: DefenseCall):
    return apply_defense(c.model, c.x, c.y, c.config, seed=c.seed, public_x=c.public_x, public_y=c.public_y,
                         update_kind=c.update_kind, local_steps=c.local_steps, local_lr=c.local_lr)


def _differences(a, b, exact: bool, path: str = "") -> list:
    """Where two nested results (dicts, lists, tensors, numbers, strings) differ; exactly, or to float32
    rounding (``rtol=1e-4, atol=1e-5``)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return [(path, "keys", sorted(set(a) ^ set(b)) if isinstance(b, dict) else type(b))]
        return [d for k in a for d in _differences(a[k], b[k], exact, f"{path}.{k}")]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return [(path, "length")]
        return [d for i, (u, v) in enumerate(zip(a, b)) for d in _differences(u, v, exact, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return [(path, "tensor kind")]
        if exact or not a.is_floating_point():
            return [] if torch.equal(a, b) else [(path, "tensor")]
        return [] if torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5) else [(path, "tensor")]
    if isinstance(a, float) and not isinstance(a, bool) and not exact:
        return [] if isinstance(b, float) and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) else [(path, a, b)]
    return [] if (a == b and type(a) is type(b)) else [(path, a, b)]


def _result_differences(one, other, exact: bool) -> list:
    (upd, rep), (upd2, rep2) = one, other
    diffs = _differences(upd.tensors, upd2.tensors, exact, "tensors")
    diffs += _differences(upd.metadata, upd2.metadata, exact, "metadata")
    diffs += _differences(rep.details, rep2.details, exact, "details")
    diffs += _differences(rep.fidelity, rep2.fidelity, exact, "fidelity")
    diffs += [] if rep.applied == rep2.applied else [("applied", rep.applied, rep2.applied)]
    for attribute in ("kind", "batch_size", "local_steps", "local_lr"):
        if getattr(upd, attribute) != getattr(upd2, attribute):
            diffs.append((attribute, getattr(upd, attribute), getattr(upd2, attribute)))
    return diffs


def _non_finite(obj, path: str = "") -> list[str]:
    """Paths of the non-finite numbers (floats, float tensors) in a nested result."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, torch.Tensor):
        return [] if not obj.is_floating_point() or bool(torch.isfinite(obj).all()) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _non_finite(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _non_finite(v, f"{path}[{i}]")]
    return []


@pytest.fixture(scope="module")
def mixed(digits):
    """The mixed games, and each game's apply_defense alone."""
    calls = [_call(digits, i, *game) for i, game in enumerate(MIXED)]
    return calls, [_alone(c) for c in calls]


@pytest.mark.parametrize("batch_defenses", [False, True])
def test_a_mix_of_defenses_and_protocols_gives_every_game_its_own_result_in_any_order(mixed, batch_defenses):
    """DCS², CENSOR (one skipping its round, one sending the original), OASIS, Mixup/InstaHide, update-side
    defenses and none at all; FedSGD and FedAvg victims with 1-3 local steps in one call (the lock-step loop
    gives a later step's defenses only the clients still training). Each game gets what apply_defense gives
    it alone -- shared tensors, metadata, report -- bit for bit call by call, to float32 rounding batched;
    and the order of the games changes nothing."""
    calls, alone = mixed
    together = apply_defense_many(calls, batch_defenses=batch_defenses)
    exact = not batch_defenses
    for i, (result, reference) in enumerate(zip(together, alone)):
        assert _result_differences(result, reference, exact) == [], i
        upd, rep = result
        assert _non_finite(upd.tensors) == [] and _non_finite(rep.details) == [], i
        assert math.isfinite(rep.fidelity) and math.isfinite(rep.overhead_s) and rep.overhead_s >= 0, i
    order = list(range(len(calls)))
    random.Random(3).shuffle(order)
    shuffled = apply_defense_many([calls[i] for i in order], batch_defenses=batch_defenses)
    for position, i in enumerate(order):
        assert _result_differences(shuffled[position], together[i], exact) == [], i
    # the mix holds what it claims: a skipped round, an original-gradient fallback, a no-defense game
    skipped, _ = together[4]
    assert skipped.metadata.get("skipped") is True and all(not t.any() for t in skipped.tensors.values())
    assert "original" in [s["sent"] for s in together[8][1].details["censor"]]
    assert together[3][1].applied == [] and together[3][1].fidelity == 1.0
    assert [len(together[i][1].details["censor"]) for i in (1, 5, 6, 11)] == [2, 3, 3, 3]


@pytest.mark.parametrize("batch_defenses", [False, True])
def test_a_game_draws_only_from_its_own_seed(digits, batch_defenses):
    """Two games that differ in nothing share their result, whatever sits between them in the call; the same
    game with another seed differs wherever its defense draws (DCS²'s start, CENSOR's candidates, the noise,
    Mixup's and InstaHide's coefficients and signs), and OASIS (no randomness) does not."""
    randomised = [(D(dcs2_lambda_g=0.7, dcs2_steps=2, dcs2_start="random"), 2, "gradient", 1, None),
                  (D(dcs2_lambda_g=0.7, dcs2_steps=2), 1, "model_delta", 2, 0),
                  (D(censor_trials=3), 2, "model_delta", 3, None),
                  (D(noise_sigma=0.01, noise_kind="laplace"), 2, "gradient", 1, None),
                  (D(mixup_k=2), 2, "model_delta", 2, None),
                  (D(instahide_k=2), 2, "gradient", 1, 1)]
    fixed = [(D(oasis=1 | 2), 2, "model_delta", 2, None)]
    calls = []
    for i, game in enumerate(randomised + fixed):
        model = build_model("lenet", digits.spec, seed=i)
        calls += [_call(digits, i, *game, seed=7, model=model), _call(digits, i, *game, seed=8, model=model)]
    # the twins of every game come last, after every other game (other neighbours, other positions)
    twins = [_call(digits, i, *game, seed=7, model=calls[2 * i].model) for i, game in enumerate(randomised + fixed)]
    out = apply_defense_many(calls + twins, batch_defenses=batch_defenses)
    for i in range(len(randomised + fixed)):
        first, other_seed, twin = out[2 * i], out[2 * i + 1], out[len(calls) + i]
        assert _result_differences(twin, first, exact=not batch_defenses) == [], i
        differs = any(not torch.allclose(t, other_seed[0].tensors[n], rtol=1e-3, atol=1e-6)
                      for n, t in first[0].tensors.items())
        assert differs == (i < len(randomised)), i


NUMERIC = {name: spec for name, spec in defense_fields().items() if spec.kind in ("real", "int")}


@pytest.mark.parametrize("value", [True, False, None, "1", float("nan"), float("inf"), -float("inf"), [1]])
def test_values_of_the_wrong_kind_are_refused_by_every_field_when_the_config_is_built(value):
    """Every field refuses bools (``True`` is an int in Python, a bool is never a count or a scale),
    strings, None, NaN, infinities and lists, naming the field, the value and the allowed values."""
    accepted = []
    for name in defense_fields():
        try:
            DefenseConfig(**{name: value})
        except ValueError as err:
            assert f"DefenseConfig.{name}={value!r}; allowed" in str(err), str(err)
        else:
            accepted.append(name)
    assert accepted == []


#: What switches a field's defense on cheaply (a field that is its defense's switch needs nothing more).
SWITCH_ON = {"loda": {"loda_c": 9.0, "loda_steps": 1}, "dcs2": {"dcs2_lambda_g": 0.7, "dcs2_steps": 2},
             "censor": {"censor_trials": 2}, "ppp": {}}


def _extremes(spec) -> list:
    """The largest and the smallest value a numeric field accepts (1e300 for an unbounded real, none for an
    unbounded integer: those are counts of work), other than its default "off" value."""
    out = []
    if spec.kind == "real":
        high = 1e300 if spec.high is None or spec.high == math.inf else spec.high
        out.append(math.nextafter(high, 0.0) if spec.high_open else high)
        low = 0.0 if spec.low is None else spec.low
        out.append(5e-324 if low == 0.0 else (math.nextafter(low, math.inf) if spec.low_open else low))
    elif spec.high is not None:
        out += [spec.high, max(spec.low, 1)]
    return [v for v in dict.fromkeys(out) if v != spec.default or spec.defense in SWITCH_ON]


EXTREMES = [pytest.param(name, value, id=f"{name}={value!r}") for name in sorted(NUMERIC) for value in _extremes(NUMERIC[name])]


@pytest.fixture(scope="module")
def loda_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:  # the LODA extractor is trained into a throwaway cache
        patch.setenv("LEAKGYM_DATA", str(tmp_path_factory.mktemp("leakgym-data")))
        yield


@pytest.mark.parametrize(("name", "value"), EXTREMES)
def test_every_accepted_value_runs_to_a_finite_update_and_report(digits, loda_cache, name, value):
    """A configuration accepted when built does not fail mid-run, nor send or report NaN/inf, even at the ends
    of its ranges (found in review: ``clip_value=1e300`` raised "value cannot be converted to type float
    without overflow" in the middle of a round; ``loda_c=1e38`` obscured every image to NaN and the client
    sent a NaN update; ``censor_step=1e38`` reported NaN trial losses)."""
    spec = NUMERIC[name]
    settings = {**SWITCH_ON.get(spec.defense, {}), name: value}
    if name == "ppp_sigma":
        settings["ppp"] = "ng"
    if name == "ppp_prune":
        settings["ppp"] = "gc"
    config = DefenseConfig(**settings)
    assert spec.defense in config.active()
    model = build_model("mlp", digits.spec, precode=True, width=16, seed=0) if spec.defense == "ppp" \
        else build_model("lenet", digits.spec, seed=0)
    px, py = _publics(digits)[0]
    for kind, steps in (("gradient", 1), ("model_delta", 2)):
        upd, rep = apply_defense(model, digits.spec.normalize(digits.train_x[:2]), digits.train_y[:2], config,
                                 seed=1, public_x=px, public_y=py, update_kind=kind, local_steps=steps)
        assert _non_finite(upd.tensors) == [] and _non_finite(rep.details) == [], (kind, rep.details)
        assert math.isfinite(rep.fidelity) and math.isfinite(rep.overhead_s), kind

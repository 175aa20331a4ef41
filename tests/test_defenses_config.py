"""DefenseConfig: default is no defense, validation messages name value and range, presets."""

from __future__ import annotations

import dataclasses

import pytest

from leakgym.defenses import PIPELINE_ORDER, PRESETS, DefenseConfig, defense_field


def test_default_is_no_defense():
    cfg = DefenseConfig()
    assert cfg.is_identity and cfg.active() == []


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("noise_sigma", -0.1, "DefenseConfig.noise_sigma=-0.1; allowed range [0, 1e+06]"),
        ("prune", 1.0, "DefenseConfig.prune=1.0; allowed range [0, 1)"),
        ("topk", 0.0, "DefenseConfig.topk=0.0; allowed range (0, 1]"),
        ("soteria", 1.5, "DefenseConfig.soteria=1.5; allowed range [0, 1)"),
        ("clip", float("nan"), "DefenseConfig.clip=nan; allowed range [0, inf)"),
        ("oasis", 32, "DefenseConfig.oasis=32; allowed: integers in [0, 31]"),
        ("censor_trials", -1, "DefenseConfig.censor_trials=-1; allowed: integers >= 0"),
        ("censor_step", 0.0, "DefenseConfig.censor_step=0.0; allowed range (0, 1e+06]"),
        ("ppp", "noise", "DefenseConfig.ppp='noise'; allowed: 'off', 'ng', 'gc'"),
        ("noise_kind", "uniform", "DefenseConfig.noise_kind='uniform'; allowed: 'gaussian', 'laplace'"),
        ("dcs2_lambda_g", 1.2, "DefenseConfig.dcs2_lambda_g=1.2; allowed range [0, 1]"),
        ("dcs2_start", "zeros", "DefenseConfig.dcs2_start='zeros'; allowed: 'random', 'public', 'mixup'"),
        ("loda_steps", 0, "DefenseConfig.loda_steps=0; allowed: integers >= 1"),
        ("mixup_k", 1, "DefenseConfig.mixup_k=1 mixes nothing"),
        ("instahide_k", 2.5, "DefenseConfig.instahide_k=2.5; allowed: integers >= 0"),
        # found in review: accepted, then failing or doing nothing later
        ("loda_layers", 9, "DefenseConfig.loda_layers=9; allowed: integers in [1, 8]"),  # after training the extractor
        ("noise_sigma", 10**400, "DefenseConfig.noise_sigma=" + str(10**400)[:10]),  # was an OverflowError
        ("noise_sigma", 1e39, "DefenseConfig.noise_sigma=1e+39; allowed range [0, 1e+06]"),  # inf updates
        ("ppp_sigma", 0.0, "DefenseConfig.ppp_sigma=0.0; allowed range (0, 1e+06]"),  # PPP-NG that adds nothing
        ("ppp_prune", 0.0, "DefenseConfig.ppp_prune=0.0; allowed range (0, 1)"),  # PPP-GC that prunes nothing
    ],
)
def test_validation_messages_name_value_and_range(field, value, message):
    with pytest.raises(ValueError) as err:
        DefenseConfig(**{field: value})
    assert message in str(err.value)


def test_numpy_scalars_are_accepted_as_plain_values_and_numpy_bools_refused():
    """Found in an audit: np.int64 and np.float32 values in range were refused, where every other layer takes
    numpy integers (leakgym.checks.is_integer). The config holds them as Python values (infos are JSON)."""
    import json

    import numpy as np

    cfg = DefenseConfig(oasis=np.int64(1), censor_trials=np.int32(2), noise_sigma=np.float32(0.5), prune=np.float64(0.5),
                        noise_kind=np.str_("laplace"))
    assert cfg == DefenseConfig(oasis=1, censor_trials=2, noise_sigma=0.5, prune=0.5, noise_kind="laplace")
    assert [type(v) for v in (cfg.oasis, cfg.noise_sigma, cfg.noise_kind)] == [int, float, str]
    json.dumps(cfg.to_dict())
    for field, bad in (("censor_trials", np.bool_(True)), ("noise_sigma", np.bool_(True)), ("oasis", np.float64(1.0)),
                       ("noise_sigma", np.float32("nan"))):
        with pytest.raises(ValueError, match=f"DefenseConfig.{field}="):
            DefenseConfig(**{field: bad})


def test_mixup_and_instahide_are_exclusive_and_replace_rejects_unknown_fields():
    with pytest.raises(ValueError, match="set at most one"):
        DefenseConfig(mixup_k=2, instahide_k=4)
    with pytest.raises(ValueError, match=r"unknown DefenseConfig field\(s\) \['sigma'\]"):
        DefenseConfig().replace(sigma=1.0)


def test_active_follows_pipeline_order_regardless_of_field_order():
    every = {"noise_sigma": 0.1, "clip": 1.0, "topk": 0.5, "prune": 0.5, "soteria": 0.5, "ppp": "ng", "censor_trials": 2,
             "loda_c": 1.0, "oasis": 1, "clip_value": 1.0}
    # DCS² and Mixup (and Mixup and InstaHide) exclude each other: one of each pair at a time. (The expected
    # order is PIPELINE_ORDER restricted to the defenses switched on: a defense added as docs/extending.md
    # says joins it without editing this test.)
    def on(fields):
        return [n for n in PIPELINE_ORDER if n in {defense_field(f).defense for f in fields}]

    cfg = DefenseConfig(**every, mixup_k=2)
    assert cfg.active() == on([*every, "mixup_k"]) and len(cfg.active()) == len(every) + 1
    cfg = DefenseConfig(**every, dcs2_lambda_g=0.7)
    assert cfg.active() == on([*every, "dcs2_lambda_g"]) and len(cfg.active()) == len(every) + 1
    assert DefenseConfig(instahide_k=2).active() == ["instahide"]


def test_presets_and_round_trip():
    assert DefenseConfig.preset("ppp-ng1") == DefenseConfig(ppp="ng", ppp_sigma=0.1)
    assert DefenseConfig.preset("PPP-GC99").ppp_prune == 0.99
    assert PRESETS["none"].is_identity
    assert all(not cfg.is_identity for name, cfg in PRESETS.items() if name != "none")
    cfg = PRESETS["censor"]
    assert DefenseConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown defense preset 'nope'"):
        DefenseConfig.preset("nope")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.censor_trials = 3  # type: ignore[misc]

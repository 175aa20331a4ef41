"""The defense registry: a defense is one object; config, order, pipeline and cost follow from it."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from toy_defense import ToyScale

from leakgym import defenses
from leakgym.data import dataset_spec
from leakgym.defenses import (
    DEFENSES,
    PIPELINE_ORDER,
    DefenseConfig,
    UpdateDefense,
    apply_defense,
    defense_compute_units,
    defense_field,
    real_field,
    register_defense,
    registered,
    unregister_defense,
)
from leakgym.defenses.catalog import BUILTIN
from leakgym.defenses.registry import STAGES
from leakgym.defenses.value_clipping import clip_values
from leakgym.models import build_model

SPEC = dataset_spec("digits", image_size=16)
#: The built-in defenses in the order leakgym/defenses/catalog.py lists them (adding one there is all it takes)
BUILTIN_ORDER = tuple(d.name for d in BUILTIN)


def _setup():
    g = torch.Generator().manual_seed(0)
    return build_model("lenet", SPEC, seed=0), torch.randn(2, 1, 16, 16, generator=g), torch.tensor([3, 8])


def test_a_registered_toy_defense_joins_config_order_pipeline_and_cost_and_leaves_cleanly():
    model, x, y = _setup()
    before = (tuple(PIPELINE_ORDER), dict(DEFENSES), DefenseConfig().to_dict())
    with registered(ToyScale()) as toy:
        assert DEFENSES["toy_scale"] is toy and PIPELINE_ORDER[-1] == "toy_scale"  # last of the update stage
        spec = defense_field("toy_scale")
        assert (spec.type, spec.default, spec.low, spec.high, spec.defense) == (float, 1.0, -2.0, 2.0, "toy_scale")
        with pytest.raises(ValueError, match=r"DefenseConfig.toy_scale=3.0; allowed range \[-2, 2\]"):
            DefenseConfig(toy_scale=3.0)
        cfg = DefenseConfig(toy_scale=-1.0, censor_trials=2)
        assert cfg.active() == ["censor", "toy_scale"] and DefenseConfig().is_identity
        assert DefenseConfig.from_dict(cfg.to_dict()) == cfg and pickle.loads(pickle.dumps(cfg)) == cfg
        assert defense_compute_units(cfg) == 0.5 * 2 + 0.25

        flipped, rep = apply_defense(model, x, y, DefenseConfig(toy_scale=-1.0), seed=0)
        clean, _ = apply_defense(model, x, y, DefenseConfig(), seed=0)
        for name, t in clean.tensors.items():
            assert torch.equal(flipped.tensors[name], -t), name
        assert rep.applied == ["toy_scale"] and rep.details["toy_scale"] == {"factor": -1.0}
        assert rep.fidelity == pytest.approx(-1.0)
    assert (tuple(PIPELINE_ORDER), dict(DEFENSES), DefenseConfig().to_dict()) == before
    with pytest.raises(ValueError, match=r"unknown DefenseConfig field\(s\) \['toy_scale'\]"):
        DefenseConfig(toy_scale=-1.0)
    with pytest.raises(ValueError, match="unknown DefenseConfig field 'toy_scale'"):
        defense_field("toy_scale")


def test_registration_rejects_duplicates_clashes_and_bad_positions():
    class ClashingField(UpdateDefense):
        name = "clash"
        fields = (real_field("noise_sigma", 0.0, "taken by noise"),)

        def apply(self, ctx, update, x, y):
            return update, {}

    with pytest.raises(ValueError, match="'noise' is already registered"):
        register_defense(type(DEFENSES["noise"])())
    with pytest.raises(ValueError, match=r"field\(s\) \['noise_sigma'\] already taken \(owned by \{'noise_sigma': 'noise'\}"):
        register_defense(ClashingField())
    with pytest.raises(ValueError, match="before='censor'; allowed: a registered update-stage defense"):
        register_defense(ToyScale(), before="censor")
    with pytest.raises(ValueError, match="no defense named 'nope'"):
        unregister_defense("nope")
    with pytest.raises(ValueError, match="field name 'replace'"):
        real_field("replace", 0.0, "shadows a DefenseConfig method")
    with pytest.raises(ValueError, match=r"DefenseConfig.bad=-1.0; allowed range \[0, inf\)"):
        real_field("bad", -1.0, "default out of its own range")
    assert tuple(PIPELINE_ORDER) == BUILTIN_ORDER


def test_before_places_a_defense_inside_its_stage():
    with registered(ToyScale(), before="noise"):
        assert PIPELINE_ORDER[-2:] == ("toy_scale", "noise")
        assert list(defenses.defense_fields())[-3:] == ["toy_scale", "noise_sigma", "noise_kind"]
    assert tuple(PIPELINE_ORDER) == BUILTIN_ORDER


def test_builtin_registry_matches_the_config_and_the_cost_model():
    assert tuple(PIPELINE_ORDER) == BUILTIN_ORDER and PIPELINE_ORDER == BUILTIN_ORDER
    stages = [DEFENSES[n].stage for n in BUILTIN_ORDER]
    assert stages == sorted(stages, key=STAGES.index)  # the catalog lists them stage by stage
    # the order of the defenses shipped so far (a new one joins anywhere in its stage); noise is added last
    shipped = ("oasis", "loda", "mixup", "instahide", "dcs2", "censor",
               "ppp", "soteria", "prune", "topk", "clip", "clip_value", "noise")
    assert tuple(n for n in BUILTIN_ORDER if n in shipped) == shipped and BUILTIN_ORDER[-1] == "noise"
    assert set(DefenseConfig().to_dict()) == set(defenses.defense_fields())
    assert defense_field("censor_fallback").choices == ("zeros", "original", "skip")
    assert defense_field("loda_steps").type is int and defense_field("loda_steps").allowed == "integers >= 1"
    # Every shipped defense's switch turns it on, alone (by name: a new defense joins without editing this;
    # an audit found the positional pairing broke for any defense added as docs/extending.md says).
    switches = {"oasis": 1, "loda_c": 7.0, "mixup_k": 2, "instahide_k": 2, "dcs2_lambda_g": 0.7,
                "censor_trials": 20, "ppp": "ng", "soteria": 0.5, "prune": 0.5, "topk": 0.5, "clip": 1.0,
                "clip_value": 0.1, "noise_sigma": 0.1}
    for switch, value in switches.items():
        name = defense_field(switch).defense
        assert DEFENSES[name].fields[0].name == switch and DefenseConfig(**{switch: value}).active() == [name]
    # The cost model that leakgym/game/feedback.py computed before the registry, term by term.
    cfg = DefenseConfig(dcs2_lambda_g=0.7, dcs2_num_concealed=2, dcs2_steps=10, censor_trials=20, oasis=1 | 8,
                        loda_c=7.0, loda_steps=30, noise_sigma=0.1, soteria=0.5)
    assert defense_compute_units(cfg) == (2 * 10 + 1) + 0.5 * 20 + (3 + 1) + 30
    assert defense_compute_units(cfg.replace(censor_subspace="samples")) == defense_compute_units(cfg) + 1
    assert defense_compute_units(DefenseConfig()) == 0.0


def test_config_value_semantics():
    cfg = DefenseConfig(noise_sigma=0.1, clip=1.0)
    assert cfg == DefenseConfig(clip=1.0, noise_sigma=0.1) and hash(cfg) == hash(DefenseConfig(clip=1.0, noise_sigma=0.1))
    assert cfg != DefenseConfig(noise_sigma=0.1) and cfg.replace(clip=0.0) == DefenseConfig(noise_sigma=0.1)
    assert repr(cfg).startswith("DefenseConfig(oasis=0, loda_c=0.0,") and "noise_sigma=0.1" in repr(cfg)
    assert eval(repr(cfg), {"DefenseConfig": DefenseConfig}) == cfg
    with pytest.raises(AttributeError, match="no field 'sigma'"):
        _ = cfg.sigma
    with pytest.raises(ValueError, match=r"unknown DefenseConfig field\(s\) \['sigma'\]"):
        DefenseConfig(sigma=1.0)
    assert DefenseConfig.preset("censor-paper").censor_fallback == "original"


def test_clip_value_clamps_every_entry_and_only_that():
    model, x, y = _setup()
    clean, _ = apply_defense(model, x, y, DefenseConfig(), seed=0)
    bound = 0.01
    upd, rep = apply_defense(model, x, y, DefenseConfig(clip_value=bound), seed=0)
    for name, t in clean.tensors.items():
        torch.testing.assert_close(upd.tensors[name], t.clamp(-bound, bound), rtol=0, atol=0)
        assert float(upd.tensors[name].abs().max()) <= bound
    frac = rep.details["clip_value"]["clipped_fraction"]
    assert 0.0 < frac < 1.0  # some entries were above the bound, some below: a real clamp, not a rescale
    assert 0.0 < rep.fidelity < 1.0 - 1e-3
    with pytest.raises(ValueError, match=r"DefenseConfig.clip_value=-1.0; allowed range \[0, inf\)"):
        DefenseConfig(clip_value=-1.0)
    with pytest.raises(ValueError, match="allowed range"):
        clip_values(clean.tensors, math.inf)

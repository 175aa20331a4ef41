"""A scenario's attacker settings are checked when it is built, not in the first round (found in an audit:
each setting below built, then the first round hung, ran out of memory or failed on a layer the model lacks)."""

from __future__ import annotations

import pytest

from leakgym.attacks import ATTACKS
from leakgym.attacks.base import config_limits
from leakgym.game.scenario import LIMITS, load_scenario


@pytest.mark.parametrize("scenario, strategy, field, value", [
    ("digits", "mixup-decoding", "decode_steps", 10**9),
    ("digits", "loda-inversion", "inversion_steps", 10**9),
    ("digits", "loda-inversion", "extractor_epochs", 10**9),
    ("digits", "loda-inversion", "extractor_width", 10**6),
    ("digits", "eot", "eot_samples", 10**9),
    ("digits-malicious", "imprint", "num_bins", 10**9),
    ("digits-malicious", "trap-weights", "num_neurons", 10**9),
])
def test_an_attacks_inner_loops_and_sizes_are_held_to_their_documented_limits(scenario, strategy, field, value):
    cap = config_limits(ATTACKS[strategy].Config)[field]
    assert LIMITS[field] == cap
    for where in ({"attack_defaults": {field: value}}, {"attacker_menu": {"strategy": [strategy], field: [1, value]}}):
        overrides = {"attacker_menu": {"strategy": [strategy]}, **where}
        with pytest.raises(ValueError, match=rf"{field}={value} exceeds the limit {cap}.*allow_large=True"):
            load_scenario(scenario, rounds=2, **overrides)
    sc = load_scenario(scenario, rounds=2, attacker_menu={"strategy": [strategy]}, attack_defaults={field: value},
                       allow_large=True)  # lifted by the caller
    assert sc.attack_defaults[field] == value


@pytest.mark.parametrize("strategy, setting, match", [
    ("analytic", {"layer": "bogus"}, r"layer='bogus' matches no nn.Linear with bias in LeNet; linear layers: \['head'\]"),
    ("layer-skipping", {"layers": ["nonexistent"]}, r"layers \['nonexistent'\] match no parameter of the model"),
    # (found in a review: the check stripped the dots its selection kept, and this entry built)
    ("layer-skipping", {"layers": ["body.conv1.."]}, r"layers \['body.conv1..'\] match no parameter of the model"),
    ("layer-skipping", {"layers": "before_bottleneck"}, "precode_layer_split needs a model with a PRECODE bottleneck"),
    ("inverting-gradients", {"layer_weights": {"nonexistent.weight": 1.0}},
     r"layer weights name unknown layers \['nonexistent.weight'\]"),
    ("loda-inversion", {"layers": 100}, r"layers=100; the extractor has 8 conv layers, allowed \[1, 8\]"),
])
def test_a_layer_the_model_lacks_is_refused_when_the_scenario_is_built(strategy, setting, match):
    for where in ({"attack_defaults": setting},
                  {"attacker_menu": {"strategy": [strategy], **{k: [v] for k, v in setting.items()}}}):
        overrides = {"attacker_menu": {"strategy": [strategy]}, **where}
        with pytest.raises(ValueError, match=rf"scenario 'digits': attacker setting .* for '{strategy}': {match}"):
            load_scenario("digits", rounds=2, **overrides)


def test_settings_the_model_has_build():
    load_scenario("digits", attacker_menu={"strategy": ["analytic"]}, attack_defaults={"layer": "head"})
    load_scenario("digits", attacker_menu={"strategy": ["layer-skipping"], "layers": [["body.conv1"], "all"]})
    load_scenario("digits", precode=True, attacker_menu={"strategy": ["layer-skipping"], "layers": ["before_bottleneck"]})
    load_scenario("digits", attacker_menu={"strategy": ["inverting-gradients"]},
                  attack_defaults={"layer_weights": {"head.weight": 1.0}})
    load_scenario("digits", attacker_menu={"strategy": ["loda-inversion"], "layers": [1, 8, "all"]})


def test_an_extractor_cache_that_cannot_be_written_is_named(tmp_path):
    """Found in an audit: LODA's extractor cache under a folder that cannot be made failed the round with a bare
    FileNotFoundError naming no path."""
    import torch

    from leakgym.data import dataset_spec
    from leakgym.defenses.loda import feature_extractor

    spec = dataset_spec("digits", 16)
    x, y = torch.rand(4, 1, 16, 16), torch.tensor([0, 1, 2, 3])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=rf"LODA extractor cache '{blocker}/cache': cannot write there"):
        feature_extractor(spec, x, y, cache_dir=blocker / "cache", epochs=0)

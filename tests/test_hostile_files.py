"""Smaller hostile inputs of issue 38 (item 6): deeply nested TOML and YAML, a damaged LODA cache.

Each is one ``ValueError`` naming the file (the CLI's one-line ``leakgym: error: ...``, exit 2), not a
``RecursionError`` traceback or a failure that does not say which file. (The IDX, archive and
policy.json cases are in test_data_formats.py, test_data_download.py and test_policy_loading.py.)
"""

from __future__ import annotations

import pytest
import torch

from leakgym.agents.experiments.cli_common import parse_overrides
from leakgym.agents.experiments.training import read_hyperparams_file
from leakgym.cli import main
from leakgym.data import federated_split, load_dataset
from leakgym.defenses import loda
from leakgym.game.scenario import load_scenario

DEEP = 100_000


def test_a_deeply_nested_scenario_file_is_one_line_error(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text('name = "deep"\noasis_bits = ' + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(ValueError, match=r"deep.toml'?: arrays or tables nested deeper than the parser can read"):
        load_scenario(path)


def test_deeply_nested_overrides_and_hyperparameter_files_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"override iterations=\.\.\.: the value nests deeper than the parser can read"):
        parse_overrides(["iterations=" + "[" * DEEP + "]" * DEEP])
    path = tmp_path / "deep.yml"
    path.write_text("LeakGym-Digits-v0:\n  n_timesteps: " + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(ValueError, match=r"deep.yml'?: nested deeper than the parser can read"):
        read_hyperparams_file(path)
    code = main(["eval", "--out", str(tmp_path / "out"), "--overrides", "rounds=" + "[" * DEEP + "]" * DEEP])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


@pytest.fixture(scope="module")
def cached_extractor(tmp_path_factory):
    split = federated_split(load_dataset("digits", image_size=16), num_clients=1, seed=0)
    spec = split.spec
    px, py = spec.normalize(split.public_x), split.public_y
    cache = tmp_path_factory.mktemp("loda")
    loda.feature_extractor(spec, px, py, seed=0, cache_dir=cache, epochs=1)
    (path,) = cache.glob("*.pt")
    return spec, px, py, cache, path


def test_a_truncated_loda_cache_file_is_named(cached_extractor, tmp_path):
    """A truncated cache made every later LODA round fail with a RoundError that did not name the file."""
    spec, px, py, _, path = cached_extractor
    damaged = tmp_path / path.name
    damaged.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match=rf"LODA extractor cache {damaged} is damaged \(.*\); delete it and the next "
                                         "LODA round trains the extractor again"):
        loda.feature_extractor(spec, px, py, seed=0, cache_dir=tmp_path, epochs=1)
    damaged.unlink()
    assert loda.feature_extractor(spec, px, py, seed=0, cache_dir=tmp_path, epochs=1).loaded_from_cache is False


def test_non_finite_weights_in_a_loda_cache_file_are_refused(cached_extractor, tmp_path):
    """NaN weights were accepted: every image obscured to NaN features (fidelity 0) without a word."""
    spec, px, py, cache, path = cached_extractor
    state = torch.load(path, weights_only=True)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = torch.full_like(state[name], float("nan"))
    torch.save(state, tmp_path / path.name)
    with pytest.raises(ValueError, match=rf"LODA extractor cache {tmp_path / path.name} holds non-finite weights "
                                         rf"\({name}\)"):
        loda.feature_extractor(spec, px, py, seed=0, cache_dir=tmp_path, epochs=1)
    assert loda.feature_extractor(spec, px, py, seed=0, cache_dir=cache, epochs=1).loaded_from_cache is True

"""The papers' scenarios (leakgym/game/scenarios/{imagenet,imagenette-malicious,celeba,tiny-imagenet-malicious,svhn}.toml):
listed, documented, and failing clearly where their data are missing (offline: downloads fail)."""

from __future__ import annotations

import urllib.error

import gymnasium as gym
import pytest

from leakgym.cli import main
from leakgym.data import DatasetUnavailableError
from leakgym.data import download as download_module
from leakgym.envs.registration import registered_ids
from leakgym.game.scenario import load_scenario

PAPER_SCENARIOS = {
    "LeakGym-ImageNet-v0": ("imagenet", "resnet18", 224, 1),
    "LeakGym-Imagenette-Malicious-v0": ("imagenette", "resnet18", 224, 8),
    "LeakGym-CelebA-v0": ("celeba", "convnet", 32, 1),
    "LeakGym-TinyImageNet-Malicious-v0": ("tiny-imagenet", "resnet18", 64, 1),
    "LeakGym-SVHN-v0": ("svhn", "resnet18", 32, 1),
}


def test_the_papers_scenarios_are_registered_listed_and_in_the_papers_settings(capsys):
    ids = registered_ids()
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for gym_id, (dataset, model, size, batch) in PAPER_SCENARIOS.items():
        sc = load_scenario(ids[gym_id])
        assert (sc.dataset, sc.model, sc.image_size, sc.batch_size) == (dataset, model, size, batch)
        assert gym_id in listed and dataset in listed.splitlines()[0]
    assert load_scenario("imagenet").defense_defaults["censor_fallback"] == "original"
    assert load_scenario("imagenette-malicious").threat_model == "malicious"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    def no_network(url, root, filename=None, md5=None):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(download_module, "download_url", no_network)
    monkeypatch.setenv("LEAKGYM_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.mark.parametrize("gym_id", sorted(PAPER_SCENARIOS))
def test_offline_a_papers_scenario_says_where_it_looked_and_what_to_put_there(offline, gym_id):
    dataset = PAPER_SCENARIOS[gym_id][0]
    with pytest.raises(DatasetUnavailableError) as exc:
        gym.make(gym_id)
    message = str(exc.value)
    assert f"dataset {dataset!r} is not available" in message and str(offline / dataset) in message
    assert "To provide it: " in message



@pytest.mark.parametrize("gym_id", sorted(PAPER_SCENARIOS))
def test_a_papers_env_page_says_it_needs_its_dataset_files(gym_id):
    """Found in an audit: the generated pages of these five said "offline: yes (bundled with scikit-learn)" and
    "Works offline", while each raises DatasetUnavailableError without its files (the page generator looked
    up the downloadable sources only, not the image sources)."""
    from leakgym.docgen import _data_requirements, _summary, offline

    assert not offline(gym_id)
    assert _summary(gym_id)["offline"] == "no: needs the dataset files"
    text = "\n".join(_data_requirements(gym_id))
    assert "Works offline" not in text and "DatasetUnavailableError" in text
    downloads = "downloaded and checked against their official MD5 digests" in text
    assert downloads == (PAPER_SCENARIOS[gym_id][0] in ("svhn", "imagenette")), text

def test_offline_the_cli_reports_a_missing_dataset_as_a_user_error(offline, capsys, tmp_path):
    code = main(["eval", "--env", "LeakGym-SVHN-v0", "--attackers", "random", "--defenders", "none",
                 "--episodes", "1", "--out", str(tmp_path / "out"), "--overrides", "rounds=1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("leakgym: error: dataset 'svhn' is not available")
    assert f"put the official train_32x32.mat, test_32x32.mat into {offline / 'svhn'}" in err

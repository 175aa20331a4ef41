"""LPIPS with the user's weights: ``$LEAKGYM_LPIPS_WEIGHTS`` (a file or a folder) and torch's hub cache.

The checkpoints written here hold a randomly initialised torchvision AlexNet's ``features.*`` tensors in
the real file format. These tests check which file is loaded and which is refused; they never check an
LPIPS value (the random backbone's numbers mean nothing). Where a test needs the loading path to accept
such a file, it declares the file's own SHA-256 prefix the expected one, as tests/test_metrics.py does.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.models import AlexNet

from leakgym.metrics import (
    LPIPS_BACKBONE_FILES,
    LPIPS_WEIGHTS_ENV,
    LPIPSWeightsMissingWarning,
    lpips,
    lpips_available,
    lpips_status,
    lpips_weights_path,
    perceptual,
)


@pytest.fixture
def clean(tmp_path, monkeypatch):
    """An empty TORCH_HOME, no LEAKGYM_LPIPS_WEIGHTS, a fresh warn-once registry and model cache."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(LPIPS_WEIGHTS_ENV, raising=False)
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    monkeypatch.setattr(perceptual, "_WARNED", set())
    monkeypatch.setattr(perceptual, "_MODELS", {})
    monkeypatch.setattr(perceptual, "_VERIFIED", set())
    return tmp_path


def _alexnet_checkpoint(path: Path, seed: int = 0) -> torch.nn.Module:
    """torchvision's AlexNet state dict format (features.* and classifier.*), random values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AlexNet()
    torch.save(model.state_dict(), path)
    return model.features


def _accept(monkeypatch, path: Path) -> None:
    monkeypatch.setitem(perceptual.LPIPS_SHA256_PREFIXES, "alex", hashlib.sha256(path.read_bytes()).hexdigest()[:8])


def _loaded_backbone() -> torch.nn.Module:
    (model,) = perceptual._MODELS.values()
    return model.net


def test_the_environment_variable_names_a_file_and_that_file_is_loaded(clean, monkeypatch):
    path = clean / "my-weights" / "alexnet-renamed.pth"
    features = _alexnet_checkpoint(path)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(path))
    _accept(monkeypatch, path)
    assert lpips_weights_path("alex") == path and lpips_available("alex")
    assert lpips_status() == f"LPIPS (alex) is reported, from {path}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", LPIPSWeightsMissingWarning)
        lpips(torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32))
    backbone = _loaded_backbone()
    torch.testing.assert_close(backbone.slice1[0].weight, features[0].weight, rtol=0, atol=0)
    torch.testing.assert_close(backbone.slice5[0].bias, features[10].bias, rtol=0, atol=0)


def test_the_environment_variable_names_a_folder_and_wins_over_the_hub_cache(clean, monkeypatch):
    folder = clean / "weights"
    mine = _alexnet_checkpoint(folder / LPIPS_BACKBONE_FILES["alex"], seed=1)
    _alexnet_checkpoint(clean / "torch" / "hub" / "checkpoints" / LPIPS_BACKBONE_FILES["alex"], seed=2)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(folder))
    assert lpips_weights_path("alex") == folder / LPIPS_BACKBONE_FILES["alex"]
    _accept(monkeypatch, folder / LPIPS_BACKBONE_FILES["alex"])
    lpips(torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16))
    torch.testing.assert_close(_loaded_backbone().slice1[0].weight, mine[0].weight, rtol=0, atol=0)
    # a folder without the file leaves torch's hub cache in charge
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(clean))
    assert lpips_weights_path("alex") == clean / "torch" / "hub" / "checkpoints" / LPIPS_BACKBONE_FILES["alex"]


def test_a_file_that_is_not_torchvisions_checkpoint_is_refused_and_never_used(clean, monkeypatch):
    path = clean / "random.pth"
    _alexnet_checkpoint(path)  # right format, but its digest is not torchvision's: refused
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(path))
    with pytest.raises(ValueError, match=rf"{path} is not torchvision's pretrained alex checkpoint: its SHA-256 is "
                                         r"[0-9a-f]{16}\.\.\., expected 7be5be79"):
        lpips(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32))
    assert perceptual._MODELS == {}
    # a file of another format is refused by name even with its digest accepted
    wrong = clean / "wrong.pth"
    torch.save({"features.0.weight": torch.zeros(3, 3, 3, 3)}, wrong)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(wrong))
    _accept(monkeypatch, wrong)
    with pytest.raises(ValueError, match=rf"{wrong} is not a torchvision alex checkpoint"):
        lpips(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32))
    junk = clean / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(junk))
    _accept(monkeypatch, junk)
    with pytest.raises(ValueError, match=rf"{junk} is not a readable torch checkpoint"):
        lpips(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32))


def test_a_variable_naming_nothing_is_an_error_and_no_weights_say_so(clean, monkeypatch):
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(clean / "nowhere.pth"))
    with pytest.raises(ValueError, match=rf"{LPIPS_WEIGHTS_ENV}='.*nowhere.pth': no such file or folder"):
        lpips_available()
    monkeypatch.delenv(LPIPS_WEIGHTS_ENV)
    assert not lpips_available()
    assert lpips_status().startswith(f"LPIPS (alex) is not reported: no backbone weights. Set {LPIPS_WEIGHTS_ENV}")
    with pytest.warns(LPIPSWeightsMissingWarning, match=LPIPS_WEIGHTS_ENV):
        values = lpips(torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32))
    assert all(math.isnan(v) for v in values.tolist())


def _one_round_infos(cheap_overrides) -> dict:
    from leakgym.envs import parallel_env

    env = parallel_env("digits", **cheap_overrides)
    env.reset(seed=0)
    _, _, _, _, infos = env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    env.close()
    return infos


def test_games_report_lpips_beside_ssim_and_psnr_only_where_weights_are_present(clean, monkeypatch, cheap_overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LPIPSWeightsMissingWarning)
        without = _one_round_infos(cheap_overrides)
    assert "leakage_ssim" in without["attacker"] and "leakage_lpips" not in without["attacker"]
    path = clean / "weights.pth"
    _alexnet_checkpoint(path)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(path))
    _accept(monkeypatch, path)
    infos = _one_round_infos(cheap_overrides)
    for role in ("attacker", "defender"):  # reported (its value is not checked: the backbone is random)
        assert {"leakage_ssim", "leakage_psnr", "leakage_lpips"} <= set(infos[role])
        assert math.isfinite(infos[role]["leakage_lpips"])


def test_describe_says_whether_lpips_is_reported(clean, monkeypatch, capsys):
    from leakgym.cli import main

    assert main(["describe", "LeakGym-Digits-v0"]) == 0
    assert "metrics: SSIM, PSNR; LPIPS (alex) is not reported: no backbone weights" in capsys.readouterr().out
    path = clean / "w.pth"
    _alexnet_checkpoint(path)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(path))
    assert main(["describe", "LeakGym-Digits-v0"]) == 0  # an untrained AlexNet: refused, and describe says so
    assert f"LPIPS (alex) is not reported: {path} is not torchvision's pretrained" in capsys.readouterr().out
    _accept(monkeypatch, path)
    assert main(["describe", "LeakGym-Digits-v0"]) == 0
    assert f"metrics: SSIM, PSNR; LPIPS (alex) is reported, from {path}" in capsys.readouterr().out


def test_the_round_picture_labels_lpips_beside_ssim_and_psnr_when_it_was_scored():
    from leakgym.envs.rendering import round_figure
    from leakgym.metrics import score_reconstruction

    x = torch.rand(2, 1, 8, 8)
    scores = score_reconstruction(x, x)
    titles = [ax.get_title() for ax in round_figure(x, x, scores).axes if "SSIM" in ax.get_title()]
    assert titles and not any("LPIPS" in t for t in titles)
    scores.per_image["lpips"] = np.array([0.25, float("nan")])  # as a game scores it (value not from a backbone)
    titles = [ax.get_title() for ax in round_figure(x, x, scores).axes if "SSIM" in ax.get_title()]
    assert "LPIPS 0.25" in titles[0] and "LPIPS" not in titles[1]


def test_an_environment_refuses_a_wrong_weights_file_when_it_is_made(clean, monkeypatch):
    """Found in an audit: with a file that is not torchvision's checkpoint under the weights' name, every
    environment (SSIM's too, since LPIPS is reported wherever weights are found) was made and failed on its
    first step. It is refused when the environment is made, and lpips_status says why LPIPS is not reported."""
    from leakgym.envs import parallel_env

    path = clean / "torch" / "hub" / "checkpoints" / LPIPS_BACKBONE_FILES["alex"]
    _alexnet_checkpoint(path)  # an untrained AlexNet under torchvision's name
    for metric in ("ssim", "lpips"):
        with pytest.raises(ValueError, match=rf"{path} is not torchvision's pretrained alex checkpoint"):
            parallel_env("digits", leakage_metric=metric)
    assert lpips_status().startswith(f"LPIPS (alex) is not reported: {path} is not torchvision's pretrained")
    _accept(monkeypatch, path)
    assert lpips_status() == f"LPIPS (alex) is reported, from {path}"
    parallel_env("digits", leakage_metric="lpips").close()

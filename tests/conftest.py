"""Shared fixtures: a cheap LeakGym scenario for API and determinism tests, a fake download server."""

import shutil
import urllib.error
from pathlib import Path

import pytest
import torch

from leakgym.data import download as download_module

# The models are tiny: one intra-op thread is fastest and keeps pytest from oversubscribing 2 cores.
torch.set_num_threads(1)

#: overrides that make LeakGym-Digits-v0 cheap enough for API checkers (a few ms of attack per round)
CHEAP = {
    "rounds": 3,
    "num_clients": 1,
    "eval_size": 32,
    "iterations": [2, 4],
    "restarts": [1],
    "tv": [0.0, 1e-2],
    "strategies": ["inverting-gradients", "dlg"],
    "defense_defaults": {"dcs2_steps": 2},
}


@pytest.fixture
def cheap_overrides():
    return {k: (v.copy() if hasattr(v, "copy") else v) for k, v in CHEAP.items()}


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run only where a CUDA device is present (they skip elsewhere)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (see shared/device/README.md)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():  # pragma: no cover - guarded by the marker as well
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test (restored after), whatever an earlier test set."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def digits():
    """The embedded digits dataset at 16x16 (one load per test module)."""
    from leakgym.data import load_dataset

    return load_dataset("digits", image_size=16)


@pytest.fixture(scope="session")
def digit_victims():
    """``make(n, known=lambda i: True, arch="lenet")``: n single-image digits victims, victim i with its own model
    (seed i), as ``(undefended update, AttackerKnowledge)``; ``known(i)`` says whether the server knows its label."""
    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.data import federated_split, load_dataset
    from leakgym.defenses import DefenseConfig, apply_defense
    from leakgym.models import build_model

    ds = load_dataset("digits", image_size=16)
    split = federated_split(ds, num_clients=1, seed=0)
    spec = ds.spec

    def make(n, known=lambda i: True, arch="lenet"):
        out = []
        for i in range(n):
            model = build_model(arch, spec, seed=i)  # every game has its own global model
            x, y = spec.normalize(split.clients[0][0][i:i + 1]), split.clients[0][1][i:i + 1]
            update, _ = apply_defense(model, x, y, DefenseConfig(), seed=i)
            out.append((update, AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y if known(i) else None,
                                                  public_x=split.public_x, public_y=split.public_y)))
        return out

    return make


@pytest.fixture
def eval_bn_convnets():
    """``make(spec, n)``: ``n`` ConvNets (BatchNorm) as the victims of a vector step hold them when they
    train on a batch of one: in train mode with every BatchNorm layer in eval mode (``bn_eval_if_single``),
    each model with its own parameters and its own random running statistics (so that a computation
    using one model's statistics for another's rows is caught)."""
    from leakgym.models import build_model

    def make(spec, n: int) -> list[torch.nn.Module]:
        models = []
        for i in range(n):
            model = build_model("convnet", spec, width=4, seed=i).train()
            g = torch.Generator().manual_seed(100 + i)
            for m in model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
                    m.eval()
            models.append(model)
        return models

    return make


@pytest.fixture
def fake_server(monkeypatch):
    """Serve local files in place of URLs; records every URL requested."""
    served: dict[str, Path] = {}
    requested: list[str] = []

    def fake_download_url(url, root, filename=None, md5=None):
        requested.append(url)
        if url not in served:
            raise urllib.error.URLError("Temporary failure in name resolution")
        shutil.copyfile(served[url], Path(root) / (filename or Path(url).name))

    monkeypatch.setattr(download_module, "download_url", fake_download_url)
    return served, requested

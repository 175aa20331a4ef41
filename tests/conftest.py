"""Shared fixtures: a cheap LeakGym scenario for API and determinism tests."""

import pytest
import torch

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

"""PPP: NG / GC perturb only the layers before the PRECODE bottleneck (PPP paper §3.4)."""

from __future__ import annotations

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.defenses import DefenseConfig, apply_defense
from leakgym.models import build_model, precode_layer_split

SPEC = dataset_spec("digits", image_size=16)


@pytest.mark.parametrize("preset", ["PPP-NG1", "PPP-GC90"])
def test_ppp_changes_exactly_the_pre_bottleneck_layers(preset):
    model = build_model("lenet", SPEC, seed=0, precode=True, precode_dim=32)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 1, 16, 16, generator=g), torch.tensor([1, 7])
    clean, _ = apply_defense(model, x, y, None, seed=1)
    upd, rep = apply_defense(model, x, y, DefenseConfig.preset(preset), seed=1)
    before, after = precode_layer_split(model)
    assert rep.applied == ["ppp"] and rep.details["ppp"]["layers"] == before
    for name in after:
        assert torch.equal(upd.tensors[name], clean.tensors[name]), name
    for name in before:
        assert not torch.equal(upd.tensors[name], clean.tensors[name]), name
    if preset == "PPP-GC90":
        for name in before:
            n = clean.tensors[name].numel()
            assert int((upd.tensors[name] == 0).sum()) >= int(0.9 * n), name
    else:
        diff = torch.cat([(upd.tensors[n] - clean.tensors[n]).flatten() for n in before])
        assert diff.std().item() == pytest.approx(0.1, rel=0.05)

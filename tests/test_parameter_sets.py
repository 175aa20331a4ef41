"""The one entry point of a model under N parameter sets (leakgym.models.parameter_sets): its row-wise and
vmap forms compute the same rows, the vmap form unfolds small convolutions only inside its call, and no form
leaves anything on the model."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from leakgym.data import DatasetSpec
from leakgym.models import build_model, task_loss
from leakgym.models.parameter_sets import (
    CPU_VMAP_MAX_PARAMETERS,
    batched_forward,
    batched_loss,
    vmap_pays_off,
    vmapped,
)
from leakgym.models.rowwise import RowwiseForward

SPEC = DatasetSpec(name="digits-like", channels=1, image_size=16, num_classes=10, mean=(0.5,), std=(0.25,))


def _rows(rows=5, batch=2, seed=0):
    torch.manual_seed(seed)
    model = build_model("lenet", SPEC).double()
    g = torch.Generator().manual_seed(seed + 1)
    params = {n: p.detach() + 0.05 * torch.randn(rows, *p.shape, generator=g, dtype=p.dtype)
              for n, p in model.named_parameters()}
    x = torch.randn(rows, batch, *SPEC.shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (rows, batch), generator=g)
    return model, params, x, y


def _untouched(model):
    return not any("forward" in vars(m) or m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("rows", [5, 17])  # 17: the unfold as a matrix product on a CPU
def test_both_forms_compute_each_rows_model(rows):
    """Row r of either form (row-wise, vmap with and without unfolded convolutions) is the model with
    parameter set r on x[r]: logits, the head's input and the task loss (float64)."""
    model, params, x, y = _rows(rows)
    form = RowwiseForward.of(model)
    assert form is not None
    want_logits = torch.stack([functional_call(model, {n: t[r] for n, t in params.items()}, (x[r],))
                               for r in range(rows)])
    want_loss = torch.stack([task_loss(model, x[r], y[r], params={n: t[r] for n, t in params.items()})
                             for r in range(rows)])
    for kwargs in ({"rowwise": form}, {}, {"unfold": False}):
        logits, features = batched_forward(model, params, x, features=True, **kwargs)
        torch.testing.assert_close(logits, want_logits, rtol=1e-12, atol=1e-12)
        assert features.shape == (rows, x.shape[1], model.head.in_features)
        torch.testing.assert_close(batched_forward(model, params, x, **kwargs), logits, rtol=0, atol=0)
        torch.testing.assert_close(batched_loss(model, params, x, y, **kwargs), want_loss, rtol=1e-12, atol=1e-12)
    assert _untouched(model)


def test_shared_parameters_are_every_rows():
    """``shared`` (no row dimension) is the same tensor for every row, in both forms."""
    model, params, x, y = _rows(4)
    shared = {n: t[0] for n, t in params.items() if n.startswith("head.")}
    own = {n: t for n, t in params.items() if n not in shared}
    expanded = {**own, **{n: t.expand(4, *t.shape) for n, t in shared.items()}}
    form = RowwiseForward.of(model)
    for kwargs in ({"rowwise": form}, {}):
        torch.testing.assert_close(batched_loss(model, own, x, y, shared=shared, **kwargs),
                                   batched_loss(model, expanded, x, y, rowwise=form), rtol=1e-12, atol=1e-12)


def test_the_vmap_form_unfolds_inside_its_call_only(monkeypatch):
    """The vmap form computes LeNet's four convolutions as unfold + matrix product (unfold=True), F.conv2d
    with unfold=False; the same model called outside is plain F.conv2d, and keeps no forward or hook."""
    from leakgym.models import convolution

    model, params, x, y = _rows(3, batch=1)
    real, calls = convolution.unfolded_conv2d, []
    monkeypatch.setattr(convolution, "unfolded_conv2d", lambda *a, **k: calls.append(1) or real(*a, **k))
    batched_loss(model, params, x, y)
    assert len(calls) == 4
    batched_loss(model, params, x, y, unfold=False)
    model(x[0])
    assert len(calls) == 4
    assert _untouched(model)


def test_vmapped_reports_random_operations_as_vmap_does():
    """vmapped is vmap(randomness="error"): a random operation in the row function is an error."""
    with pytest.raises(RuntimeError, match="randomness"):
        vmapped(lambda t: t + torch.rand(()), 3)(torch.zeros(3))


def test_the_vmap_form_pays_on_a_cpu_for_small_models_only():
    """CPU_VMAP_MAX_PARAMETERS (2 M) lies between the measured models: the CIFAR ConvNet (width 16, 0.19 M
    parameters: vmap pays) and the ConvNet at width 64 (2.9 M: even) and ResNet-18 (11.2 M: vmap loses). The
    bound is a CPU's: on any other device (here "meta", which holds no data) vmap always pays."""
    cifar = DatasetSpec(name="cifar-like", channels=3, image_size=32, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3)
    assert vmap_pays_off(build_model("lenet", SPEC)) and vmap_pays_off(build_model("convnet", cifar))
    wide, resnet = build_model("convnet", cifar, width=64), build_model("resnet18", cifar)
    for model in (wide, resnet):
        assert sum(p.numel() for p in model.parameters()) > CPU_VMAP_MAX_PARAMETERS
        assert not vmap_pays_off(model) and vmap_pays_off(model.to("meta"))
    assert vmap_pays_off(torch.nn.ReLU())  # no parameters: nothing to copy per row

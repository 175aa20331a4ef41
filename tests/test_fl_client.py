"""compute_update: FedSGD gradient, FedAvg model delta, per-step transforms, no mutation of the model."""

from __future__ import annotations

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.fl.client import compute_update
from leakgym.models import build_model, task_loss

SPEC = dataset_spec("digits", image_size=16)


def _batch(n: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_fedsgd_gradient_equals_autograd_and_model_untouched():
    model = build_model("lenet", SPEC, seed=0)
    model.eval()
    x, y = _batch()
    before = _state(model)
    upd = compute_update(model, x, y)
    loss = task_loss(model, x, y)
    ref = torch.autograd.grad(loss, list(model.parameters()))
    assert upd.kind == "gradient" and upd.batch_size == 3 and upd.buffers is None
    assert list(upd.tensors) == [n for n, _ in model.named_parameters()]
    for (name, _), g in zip(model.named_parameters(), ref):
        torch.testing.assert_close(upd.tensors[name], g, rtol=0, atol=0)
    assert not model.training  # mode restored (the work happened on a copy)
    for k, v in _state(model).items():
        assert torch.equal(v, before[k]), k


def test_fedavg_delta_equals_manual_sgd_steps():
    model = build_model("lenet", SPEC, seed=1)
    x, y = _batch(4, seed=1)
    upd = compute_update(model, x, y, kind="model_delta", local_steps=3, local_lr=0.05)
    manual = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    w0 = {n: p.detach().clone() for n, p in manual.items()}
    for _ in range(3):
        loss = task_loss(model, x, y, params=manual)
        grads = torch.autograd.grad(loss, list(manual.values()))
        manual = {n: (p - 0.05 * g).detach().requires_grad_(True) for (n, p), g in zip(manual.items(), grads)}
    assert upd.kind == "model_delta" and upd.local_steps == 3 and upd.local_lr == 0.05
    for n, w in w0.items():
        torch.testing.assert_close(upd.tensors[n], w - manual[n].detach(), rtol=1e-5, atol=1e-7)


def test_batchnorm_model_buffers_shared_but_model_untouched_and_single_example_works():
    model = build_model("convnet", SPEC, seed=0)
    before = _state(model)
    x, y = _batch(1)
    upd = compute_update(model, x, y)  # B = 1: BN must run on running statistics (eval) not fail
    assert upd.buffers is not None and set(before) >= set(upd.buffers)
    x2, y2 = _batch(4)
    upd2 = compute_update(model, x2, y2)
    # B = 4 trains BN with batch statistics: the shared running mean moved, the model's did not.
    name = next(k for k in upd2.buffers if k.endswith("running_mean"))
    assert not torch.equal(upd2.buffers[name], before[name])
    for k, v in _state(model).items():
        assert torch.equal(v, before[k]), k


def test_gradient_transform_is_called_every_local_step_with_current_model():
    model = build_model("lenet", SPEC, seed=2)
    x, y = _batch(2)
    seen = []

    def halve(work, xb, yb, grad, *, step):
        seen.append((step, float(next(work.parameters()).detach().sum())))
        return {k: 0.5 * v for k, v in grad.items()}

    full = compute_update(model, x, y, kind="model_delta", local_steps=1, local_lr=0.1)
    half = compute_update(model, x, y, kind="model_delta", local_steps=1, local_lr=0.1, gradient_transform=halve)
    for k in full.tensors:
        torch.testing.assert_close(half.tensors[k], 0.5 * full.tensors[k])
    seen.clear()
    compute_update(model, x, y, kind="model_delta", local_steps=3, gradient_transform=halve)
    assert [s for s, _ in seen] == [0, 1, 2]
    assert len({v for _, v in seen}) == 3  # the working model moves between steps


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "delta"}, "kind='delta'"),
        ({"local_steps": 0, "kind": "model_delta"}, "local_steps=0"),
        ({"local_steps": 2}, "FedSGD takes exactly 1 step"),
        ({"local_lr": 0.0, "kind": "model_delta"}, "local_lr=0.0"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(kwargs, match):
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(2)
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        compute_update(model, x, y, **kwargs)

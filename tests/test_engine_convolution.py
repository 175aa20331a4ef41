"""The engine's convolution as unfold + matrix product equals F.conv2d, to the second derivative."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from leakgym.attacks.base import AttackerKnowledge
from leakgym.attacks.engine.convolution import UnfoldedConvolutions, expressible, unfolded_conv2d
from leakgym.attacks.engine.problems import ProblemSet, UpdateSimulator
from leakgym.data import DatasetSpec
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss

CASES = [  # (in, out, kernel, stride, padding, dilation, size)
    (1, 12, 5, (2, 2), (2, 2), (1, 1), 16),  # LeNet's first layer
    (12, 12, 5, (1, 1), (2, 2), (1, 1), 4),
    (3, 16, 3, (1, 1), (1, 1), (1, 1), 8),  # ConvNet
    (4, 6, 3, (2, 1), (0, 1), (2, 1), 9),  # odd strides, padding and dilation
]


def _double_backward(conv, x, w, b):
    """Image gradient of a gradient-matching loss through ``conv``: the engine's double backward."""
    y = torch.sigmoid(conv(x, w, b)).pow(2).sum()
    gw, gb = torch.autograd.grad(y, [w, b], create_graph=True)
    return torch.autograd.grad((gw - 0.1).pow(2).sum() + gb.pow(2).sum(), [x, w])


@pytest.mark.parametrize(("cin", "cout", "k", "stride", "padding", "dilation", "size"), CASES)
def test_unfolded_conv2d_equals_conv2d_to_the_second_derivative(cin, cout, k, stride, padding, dilation, size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, cin, size, size, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(cout, cin, k, k, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(cout, generator=g, dtype=torch.float64, requires_grad=True)

    def native(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation)

    def unfolded(x, w, b):
        return unfolded_conv2d(x, w, b, stride, padding, dilation)

    torch.testing.assert_close(unfolded(x, w, b), native(x, w, b), rtol=1e-12, atol=1e-12)
    for got, want in zip(_double_backward(unfolded, x, w, b), _double_backward(native, x, w, b)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_unfolded_conv2d_under_vmap_with_a_weight_per_row():
    """The engine's case: rows with their own weights; equal to the rows computed one at a time."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 1, 8, 8, generator=g, dtype=torch.float64)
    w = torch.randn(5, 4, 1, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(5, 4, generator=g, dtype=torch.float64)
    rows = vmap(lambda x, w, b: unfolded_conv2d(x, w, b, (1, 1), (1, 1), (1, 1)))(x, w, b)
    for i in range(5):
        torch.testing.assert_close(rows[i], F.conv2d(x[i], w[i], b[i], padding=1), rtol=1e-12, atol=1e-12)


def test_layers_it_cannot_express_keep_their_own_forward():
    plain = nn.Conv2d(2, 4, 3, padding=1)
    grouped = nn.Conv2d(4, 4, 3, padding=1, groups=2)
    same = nn.Conv2d(4, 4, 3, padding="same")
    reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
    assert expressible(plain)
    assert not any(expressible(m) for m in (grouped, same, reflect))
    model = nn.Sequential(plain, grouped, same, reflect)
    patch = UnfoldedConvolutions(model)
    assert patch.modules == [plain]
    x = torch.randn(2, 2, 6, 6)
    want = model(x)
    patch.on = True
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    patch.close()
    assert "forward" not in vars(plain)


def test_the_simulator_uses_it_in_the_vectorised_path_only():
    """Vectorised dummy updates (unfold) equal the sequential reference (F.conv2d); the switch is off after."""
    spec = DatasetSpec(name="d16", channels=1, image_size=16, num_classes=10, mean=(0.5,), std=(0.3,))
    models = [build_model("lenet", spec, seed=s).double() for s in range(2)]
    updates, knowledges = [], []
    g = torch.Generator().manual_seed(0)
    for m in models:
        x, y = torch.randn(1, 1, 16, 16, generator=g, dtype=torch.float64), torch.tensor([3])
        grads = torch.autograd.grad(task_loss(m, x, y), list(m.parameters()))
        updates.append(SharedUpdate({n: t for (n, _), t in zip(m.named_parameters(), grads)}, batch_size=1))
        knowledges.append(AttackerKnowledge(model=m, spec=spec, batch_size=1, labels=y))
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                 labels=torch.tensor([[3], [3]]), dtype=torch.float64)
    sim = UpdateSimulator(ps, [2, 1], record_bn=False)
    try:
        x = torch.randn(3, 1, 1, 16, 16, generator=g, dtype=torch.float64)
        y = torch.tensor([[3], [3], [3]])
        eps = x.new_zeros(3, 0)
        fast, _ = sim.vectorised(x, y, eps)
        assert not sim.convolutions.on and len(sim.convolutions.modules) == 4
        slow, _ = sim.sequential(x, y, eps)
        for name in fast:
            torch.testing.assert_close(fast[name], slow[name], rtol=1e-10, atol=1e-12)
    finally:
        sim.close()
    assert all("forward" not in vars(m) for m in ps.model.modules() if isinstance(m, nn.Conv2d))


def test_only_layers_with_a_small_unfolded_input_use_it(monkeypatch):
    """Past UNFOLD_MAX_ENTRIES (per row: B * C * kh * kw * L) a layer keeps F.conv2d: unfold is slower there."""
    from leakgym.attacks.engine import convolution

    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    assert convolution.unfolded_entries(conv, x) == 2 * 3 * 9 * 64
    calls = []
    monkeypatch.setattr(convolution, "unfolded_conv2d", lambda *a: calls.append(1) or F.conv2d(a[0], a[1], a[2],
                                                                                                 padding=1))
    for limit, used in ((2 * 3 * 9 * 64, 1), (2 * 3 * 9 * 64 - 1, 0)):
        calls.clear()
        patch = UnfoldedConvolutions(conv, max_entries=limit)
        patch.on = True
        conv(x)
        patch.close()
        assert len(calls) == used


@pytest.mark.parametrize(("arch", "size", "b", "leaves"),
                         [("lenet", 16, 1, True), ("lenet", 16, 4, False), ("convnet", 32, 2, False), ("mlp", 16, 2, True)])
def test_the_simulator_picks_per_row_leaves_for_small_convolutions_only(arch, size, b, leaves):
    """Digits LeNet, one image: vmapped forward + autograd (faster there); larger convolutions (LeNet at
    batch 4, the CIFAR ConvNet): vmap(grad) (faster, no per-row weight copies); no convolutions: per-row
    leaves. Both forms equal the sequential loop."""
    spec = DatasetSpec(name="d", channels=1, image_size=size, num_classes=10, mean=(0.5,), std=(0.3,))
    m = build_model(arch, spec, seed=0).double()
    x, y = torch.randn(b, 1, size, size, dtype=torch.float64), torch.arange(b)
    grads = torch.autograd.grad(task_loss(m, x, y), list(m.parameters()))
    update = SharedUpdate({n: t for (n, _), t in zip(m.named_parameters(), grads)}, batch_size=b)
    knowledge = AttackerKnowledge(model=m, spec=spec, batch_size=b, labels=y)
    ps = ProblemSet.from_updates([update], [knowledge], names=list(update.tensors), labels=y.view(1, b),
                                 dtype=torch.float64)
    sim = UpdateSimulator(ps, 2, record_bn=False)
    try:
        assert sim.row_leaves is leaves
        dummy = torch.randn(2, b, 1, size, size, dtype=torch.float64)
        labels = y.view(1, b).expand(2, b)
        eps = dummy.new_zeros(2, 0)
        fast, _ = sim.vectorised(dummy, labels, eps)
        slow, _ = sim.sequential(dummy, labels, eps)
        for name in fast:
            torch.testing.assert_close(fast[name], slow[name], rtol=1e-9, atol=1e-11)
    finally:
        sim.close()

"""The engine's convolution as unfold + matrix product equals F.conv2d, to the second derivative."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from leakgym.attacks.base import AttackerKnowledge
from leakgym.attacks.engine.problems import ProblemSet, UpdateSimulator
from leakgym.data import DatasetSpec
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss
from leakgym.models.convolution import UnfoldedConvolutions, expressible, unfolded_conv2d

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


@pytest.mark.parametrize("via_matrix", [False, True])
@pytest.mark.parametrize(("cin", "cout", "k", "stride", "padding", "dilation", "size"), CASES)
def test_unfolded_conv2d_equals_conv2d_to_the_second_derivative(cin, cout, k, stride, padding, dilation, size,
                                                                 via_matrix):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, cin, size, size, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(cout, cin, k, k, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(cout, generator=g, dtype=torch.float64, requires_grad=True)

    def native(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation)

    def unfolded(x, w, b):
        return unfolded_conv2d(x, w, b, stride, padding, dilation, via_matrix=via_matrix)

    torch.testing.assert_close(unfolded(x, w, b), native(x, w, b), rtol=1e-12, atol=1e-12)
    for got, want in zip(_double_backward(unfolded, x, w, b), _double_backward(native, x, w, b)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("via_matrix", [False, True])
def test_unfolded_conv2d_under_vmap_with_a_weight_per_row(via_matrix):
    """The engine's case: rows with their own weights; equal to the rows computed one at a time."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 1, 8, 8, generator=g, dtype=torch.float64)
    w = torch.randn(5, 4, 1, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(5, 4, generator=g, dtype=torch.float64)
    rows = vmap(lambda x, w, b: unfolded_conv2d(x, w, b, (1, 1), (1, 1), (1, 1), via_matrix=via_matrix))(x, w, b)
    for i in range(5):
        torch.testing.assert_close(rows[i], F.conv2d(x[i], w[i], b[i], padding=1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("cin", "cout", "k", "stride", "padding", "dilation", "size"), CASES)
def test_the_unfold_matrix_copies_exactly_what_f_unfold_does(cin, cout, k, stride, padding, dilation, size):
    """x @ unfold_matrix is F.unfold bit for bit (one 1 per column; none where the kernel reads padding);
    a non-finite entry spoils only its own image's columns."""
    from leakgym.models.convolution import unfold_matrix

    x = torch.randn(3, cin, size, size, generator=torch.Generator().manual_seed(2))
    want = F.unfold(x, (k, k), dilation=dilation, padding=padding, stride=stride)
    matrix = unfold_matrix(size, size, (k, k), stride, padding, dilation)
    assert set(matrix.unique().tolist()) <= {0.0, 1.0} and (matrix.sum(dim=0) <= 1).all()
    got = (x.reshape(3, cin, -1) @ matrix).reshape(want.shape)
    assert torch.equal(got, want)
    x[1, 0, 0, 0] = float("inf")
    got = (x.reshape(3, cin, -1) @ matrix).reshape(want.shape)
    assert torch.equal(got[[0, 2]], want[[0, 2]])


def test_the_unfold_is_a_matrix_product_for_small_inputs_and_many_rows_on_a_cpu(monkeypatch):
    """On a CPU: inputs of at most MATRIX_MAX_POSITIONS positions, at least MATRIX_MIN_ROWS rows (the
    rows of the call, the simulator's selection); elsewhere F.unfold, whose per-image loop is cheap there."""
    from leakgym.models import convolution

    conv = nn.Conv2d(2, 3, 5, padding=2)
    small, large = torch.randn(1, 2, 8, 8), torch.randn(1, 2, 9, 9)
    geometry = (conv.kernel_size, conv.stride, conv.padding, conv.dilation)
    assert convolution.takes_matrix(small, *geometry, convolution.MATRIX_MIN_ROWS)
    assert not convolution.takes_matrix(small, *geometry, convolution.MATRIX_MIN_ROWS - 1)
    assert not convolution.takes_matrix(large, *geometry, 1000)
    spec = DatasetSpec(name="d16", channels=1, image_size=16, num_classes=10, mean=(0.5,), std=(0.3,))
    m = build_model("lenet", spec, seed=0)
    x, y = torch.randn(1, 1, 16, 16), torch.tensor([3])
    grads = torch.autograd.grad(task_loss(m, x, y), list(m.parameters()))
    update = SharedUpdate({n: t for (n, _), t in zip(m.named_parameters(), grads)}, batch_size=1)
    knowledge = AttackerKnowledge(model=m, spec=spec, batch_size=1, labels=y)
    ps = ProblemSet.from_updates([update], [knowledge], names=list(update.tensors), labels=y.view(1, 1))
    built = []
    real = convolution.unfold_matrix
    monkeypatch.setattr(convolution, "unfold_matrix", lambda *a, **k: built.append(a[:2]) or real(*a, **k))
    for rows, expected in ((convolution.MATRIX_MIN_ROWS - 1, []), (convolution.MATRIX_MIN_ROWS, [(8, 8), (4, 4)])):
        sim = UpdateSimulator(ps, rows, record_bn=False)
        try:
            built.clear()
            dummy = torch.randn(rows, 1, 1, 16, 16)
            fast, _ = sim.vectorised(dummy, y.view(1, 1).expand(rows, 1), dummy.new_zeros(rows, 0))
            slow, _ = sim.sequential(dummy, y.view(1, 1).expand(rows, 1), dummy.new_zeros(rows, 0))
            assert sorted(set(built), reverse=True) == expected  # LeNet's 8x8 and 4x4 inputs, not its 16x16 one
            for name in fast:
                torch.testing.assert_close(fast[name], slow[name], rtol=1e-4, atol=1e-5)
        finally:
            sim.close()


@pytest.mark.cuda
def test_the_matrix_unfold_on_cuda_equals_conv2d_to_the_second_derivative():
    """On a GPU the unfold is always the matrix product (F.unfold launches a kernel per image)."""
    from leakgym.models import convolution

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(4, 3, 8, 8, generator=g, device=dev, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, generator=g, device=dev, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=g, device=dev, dtype=torch.float64, requires_grad=True)
    assert convolution.takes_matrix(x, (3, 3), (1, 1), (1, 1), (1, 1), 1)

    def unfolded(x, w, b):
        return unfolded_conv2d(x, w, b, (1, 1), (1, 1), (1, 1), via_matrix=True)

    def native(x, w, b):
        return F.conv2d(x, w, b, padding=1)

    for got, want in zip(_double_backward(unfolded, x, w, b), _double_backward(native, x, w, b)):
        assert got.device.type == "cuda"
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_calls_it_cannot_express_keep_f_conv2d_and_no_module_changes(monkeypatch):
    """Inside UnfoldedConvolutions a grouped convolution and string padding keep F.conv2d; a plain layer and a
    reflect-padded one (which pads first and calls F.conv2d without padding) take the unfold. The mode
    intercepts the calls: no layer gets a forward of its own."""
    from leakgym.models import convolution

    plain = nn.Conv2d(2, 4, 3, padding=1)
    grouped = nn.Conv2d(4, 4, 3, padding=1, groups=2)
    same = nn.Conv2d(4, 4, 3, padding="same")
    reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
    assert expressible(plain)
    assert not any(expressible(m) for m in (grouped, same, reflect))  # for the row-wise form
    model = nn.Sequential(plain, grouped, same, reflect)
    x = torch.randn(2, 2, 6, 6)
    want = model(x)
    real, calls = convolution.unfolded_conv2d, []
    monkeypatch.setattr(convolution, "unfolded_conv2d", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    with UnfoldedConvolutions(rows=1):
        assert not any("forward" in vars(m) for m in model.modules())
        got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls == [plain.weight.shape, reflect.weight.shape]
    calls.clear()
    model(x)
    assert calls == []  # outside the block: F.conv2d


def test_the_simulator_uses_it_in_the_vectorised_path_only(monkeypatch):
    """Vectorised dummy updates (the vmap form, unfold) equal the sequential reference (F.conv2d); neither
    leaves anything on the model's layers."""
    from leakgym.models import convolution
    from leakgym.models.rowwise import RowwiseForward

    monkeypatch.setattr(RowwiseForward, "of", classmethod(lambda cls, model, *fit: None))  # the vmap form
    real, calls = convolution.unfolded_conv2d, []
    monkeypatch.setattr(convolution, "unfolded_conv2d", lambda *a, **k: calls.append(1) or real(*a, **k))
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
        assert len(calls) == 4  # LeNet's four convolutions, each once for all rows (vmap)
        slow, _ = sim.sequential(x, y, eps)
        assert len(calls) == 4
        for name in fast:
            torch.testing.assert_close(fast[name], slow[name], rtol=1e-10, atol=1e-12)
    finally:
        sim.close()
    assert all("forward" not in vars(m) for m in ps.model.modules() if isinstance(m, nn.Conv2d))


def test_only_layers_with_a_small_unfolded_input_use_it(monkeypatch):
    """Past UNFOLD_MAX_ENTRIES (per row: B * C * kh * kw * L) a layer keeps F.conv2d: unfold is slower there."""
    from leakgym.models import convolution

    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    assert convolution.unfolded_entries(conv, x) == 2 * 3 * 9 * 64
    calls = []
    monkeypatch.setattr(convolution, "unfolded_conv2d", lambda *a, **k: calls.append(1) or F.conv2d(a[0], a[1], a[2],
                                                                                                      padding=1))
    for limit, used in ((2 * 3 * 9 * 64, 1), (2 * 3 * 9 * 64 - 1, 0)):
        calls.clear()
        with UnfoldedConvolutions(rows=1, max_entries=limit):
            conv(x)
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

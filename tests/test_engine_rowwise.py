"""The row-wise model form (leakgym.models.rowwise, no vmap; used by the attack engine, the FL clients
and DCS2's synthesis) computes what the vmap form computes, to the second derivative, and is taken for
plain layer stacks only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from leakgym.attacks.engine import problems as problems_module
from leakgym.data import DatasetSpec
from leakgym.models import LeakGymModel, build_model, task_loss
from leakgym.models.convolution import rowwise_conv2d
from leakgym.models.rowwise import RowwiseForward

SPEC = DatasetSpec(name="digits-like", channels=1, image_size=16, num_classes=10, mean=(0.5,), std=(0.25,))


def _lenet(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    return build_model("lenet", SPEC, **kwargs).to(dtype)


@pytest.mark.parametrize("via_matrix", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_rowwise_conv2d_is_each_rows_conv2d(via_matrix, batch, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, batch, 3, 8, 8, generator=g, dtype=torch.float64)
    w = torch.randn(4, 5, 3, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(4, 5, generator=g, dtype=torch.float64) if bias else None
    got = rowwise_conv2d(x, w, b, (2, 1), (1, 1), (1, 1), via_matrix=via_matrix)
    for r in range(4):
        want = F.conv2d(x[r], w[r], None if b is None else b[r], stride=(2, 1), padding=(1, 1))
        torch.testing.assert_close(got[r], want, rtol=1e-12, atol=1e-12)


def test_the_rowwise_form_takes_plain_layer_stacks_only():
    """DLG's LeNet takes it; BatchNorm (ConvNet, MLP), ResNet, PRECODE, a hook or an own forward keep vmap."""
    assert RowwiseForward.of(_lenet()) is not None
    for name in ("convnet", "mlp", "resnet18"):
        spec = DatasetSpec(name="s", channels=3, image_size=32, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3)
        assert RowwiseForward.of(build_model(name, spec)) is None, name
    assert RowwiseForward.of(_lenet(precode=True)) is None
    hooked = _lenet()
    hooked.body.conv2.register_forward_hook(lambda *a: None)
    assert RowwiseForward.of(hooked) is None
    pooled = _lenet()
    pooled.body.add_module("pool", nn.AvgPool2d(1))
    assert RowwiseForward.of(pooled) is None

    class Doubled(type(_lenet())):
        def forward(self, x, return_kl=False):
            return super().forward(2 * x, return_kl)

    assert RowwiseForward.of(Doubled(SPEC)) is None


def test_a_forward_replaced_on_a_layer_or_hooks_on_every_module_keep_the_vmap_form():
    """A layer whose ``forward`` is set on the object (not its class) computes something the row-wise form
    does not know, and so do hooks registered for every module: both keep the vmap form, which runs them.
    The unfolded convolutions of the vmap form (a torch function mode) set nothing on the layers."""
    from leakgym.models.convolution import UnfoldedConvolutions

    patched = _lenet()
    native = type(patched.body.conv2).forward
    patched.body.conv2.forward = lambda x: 2 * native(patched.body.conv2, x)
    assert RowwiseForward.of(patched) is None

    unfolded = _lenet()
    with UnfoldedConvolutions(rows=1):
        assert RowwiseForward.of(unfolded) is not None

    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert RowwiseForward.of(_lenet()) is None
    finally:
        handle.remove()
    assert RowwiseForward.of(_lenet()) is not None


def test_the_engine_runs_a_layer_forward_replaced_on_the_object(digits):
    """A model whose convolution's ``forward`` is replaced on the object (here: doubled): at the true
    images the engine's dummy updates are the shared updates, on its vectorised and its sequential path
    (neither the row-wise form nor the unfolded convolutions put the class's forward back)."""
    import types

    from leakgym.attacks.engine.problems import ProblemSet, UpdateSimulator
    from tests.test_attack_engine import problems_for

    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    model.body.conv2.forward = types.MethodType(lambda self, x: 2 * type(self).forward(self, x), model.body.conv2)
    updates, knowledges = problems_for(model, digits, n=2, b=1)
    labels = torch.stack([k.labels for k in knowledges])
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors), labels=labels)
    x = torch.stack([digits.spec.normalize(digits.train_x[i:i + 1]) for i in range(2)])
    sim = UpdateSimulator(ps, [1, 1], record_bn=False)
    try:
        sim.select(torch.arange(2))
        assert sim.rowwise is None
        for path in (sim.vectorised, sim.sequential):
            dummy, _ = path(x, labels, x.new_zeros(2, 0))
            for i, update in enumerate(updates):
                for name, want in update.tensors.items():
                    torch.testing.assert_close(dummy[name][i], want, rtol=1e-4, atol=1e-6)
    finally:
        sim.close()


class _PlainMLP(LeakGymModel):
    """A plain stack with linear layers (one on the image's last dimension), ReLU, Tanh and a bias-free
    convolution in its body."""

    def __init__(self, spec):
        body = nn.Sequential(nn.Conv2d(spec.channels, 2, 3, stride=2, padding=1, bias=False), nn.Tanh(),
                             nn.Linear(8, 5), nn.Flatten(), nn.Linear(2 * 8 * 5, 16), nn.ReLU(), nn.Identity(),
                             nn.Linear(16, 8))
        super().__init__(spec, body, 8)


def _compare_with_vmap(rows, batch, soft, device, dtype, tol, model=None):
    model = (_lenet(dtype) if model is None else model.to(dtype)).to(device)
    form = RowwiseForward.of(model)  # the rows (x's first dimension) decide the matrix unfold
    g = torch.Generator().manual_seed(2)
    base = dict(model.named_parameters())
    params = {n: (p.detach() + 0.05 * torch.randn(rows, *p.shape, generator=g, dtype=dtype).to(device))
              for n, p in base.items()}
    x0 = torch.randn(rows, batch, 1, 16, 16, generator=g, dtype=dtype).to(device)
    y = torch.randint(0, 10, (rows, batch), generator=g).to(device)
    if soft:
        y = torch.softmax(torch.randn(rows, batch, 10, generator=g, dtype=dtype), dim=-1).to(device)
    reference = vmap(lambda p, x, t: task_loss(model, x, t, params=p))

    def derivatives(loss_of):
        x = x0.clone().requires_grad_(True)
        leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
        losses = loss_of(leaves, x, y)
        grads = torch.autograd.grad(losses.sum(), list(leaves.values()), create_graph=True)
        matching = sum((gr - 0.01).pow(2).sum() for gr in grads)
        (image_grad,) = torch.autograd.grad(matching, x)
        return losses.detach(), [gr.detach() for gr in grads], image_grad

    got, want = derivatives(form), derivatives(reference)
    torch.testing.assert_close(got[0], want[0], rtol=tol[0], atol=tol[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=tol[1], atol=tol[0])
    torch.testing.assert_close(got[2], want[2], rtol=tol[2], atol=tol[0])
    assert got[2].abs().sum() > 0


@pytest.mark.parametrize("rows", [3, 17])  # 17: the unfold as a matrix product (MATRIX_MIN_ROWS)
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("soft", [False, True])
def test_rowwise_losses_and_their_derivatives_equal_the_vmap_form(rows, batch, soft):
    """Per-row losses, per-row parameter gradients and the image gradient of a matching loss of those
    gradients (the engine's double backward), each row with its own parameters, float64."""
    _compare_with_vmap(rows, batch, soft, "cpu", torch.float64, (1e-12, 1e-10, 1e-9))


def test_rowwise_layers_beyond_lenet_equal_the_vmap_form():
    """Linear layers in the body (one on the image rows' last dimension), ReLU, Tanh, Identity, a
    convolution without bias and a head on 8 features: the same comparison (float64)."""
    torch.manual_seed(3)
    model = _PlainMLP(SPEC)
    assert RowwiseForward.of(model) is not None
    _compare_with_vmap(5, 2, False, "cpu", torch.float64, (1e-12, 1e-10, 1e-9), model=model)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [3, 17])
def test_rowwise_form_on_cuda_equals_the_vmap_form(cuda_device, rows, monkeypatch):
    """The same on CUDA: float64 as tightly as on the CPU, and float32 with TF32 off. The reference's
    convolutions are cuDNN's, which use TF32 by default (the row-wise form's matrix products do not):
    with it on, the reference itself was 9e-5 off in a gradient on an H200."""
    _compare_with_vmap(rows, 2, False, cuda_device, torch.float64, (1e-10, 1e-9, 1e-8))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    _compare_with_vmap(rows, 2, False, cuda_device, torch.float32, (1e-5, 1e-4, 1e-3))


def test_the_engine_takes_the_rowwise_form_for_lenet_and_reconstructs_as_with_vmap(monkeypatch, digits):
    """An Inverting Gradients engine run on digits LeNet: the simulator takes the row-wise form, and the
    images equal those of the vmap form (the form switched off) to float32 rounding."""
    from leakgym.attacks.inverting_gradients import InvertingGradients
    from tests.test_attack_engine import problems_for

    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=3, b=1)
    taken = []
    real_init = problems_module.UpdateSimulator.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        taken.append(self.rowwise is not None)

    monkeypatch.setattr(problems_module.UpdateSimulator, "__init__", spy)
    attack = InvertingGradients(iterations=6, restarts=2)
    fast = attack.reconstruct_batch(updates, knowledges, seeds=[1, 2, 3])
    monkeypatch.setattr(RowwiseForward, "of", classmethod(lambda cls, model, *fit: None))
    slow = attack.reconstruct_batch(updates, knowledges, seeds=[1, 2, 3])
    assert taken == [True, False]
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a.images, b.images, rtol=1e-4, atol=1e-4)


def test_rowwise_losses_take_int32_class_indices_as_task_loss_does():
    model = _lenet()
    form = RowwiseForward.of(model)
    params = {n: p.detach().expand(2, *p.shape) for n, p in model.named_parameters()}
    x = torch.randn(2, 1, 1, 16, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    y = torch.tensor([[3], [7]])
    assert torch.equal(form(params, x, y.to(torch.int32)), form(params, x, y))


@pytest.mark.parametrize("make", [lambda: _lenet(torch.float32), lambda: _PlainMLP(SPEC)])
def test_plain_logits_are_the_models_functional_call_bit_for_bit(make):
    """The CPU evaluation loop's direct layer calls (RowwiseForward.plain_logits) give exactly what the
    module gives with the same parameters (functional_call): same kernels, same order."""
    from torch.func import functional_call

    torch.manual_seed(5)
    model = make()
    params = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in model.named_parameters()}
    x = torch.randn(7, 1, 16, 16)
    want = functional_call(model, params, (x,))
    assert torch.equal(RowwiseForward.of(model).plain_logits(params, x), want)


@pytest.mark.cuda
def test_plain_logits_on_cuda_are_the_models_functional_call(cuda_device):
    """The same on CUDA (and evaluate_many's loop forced there), to cuDNN's rounding."""
    from torch.func import functional_call

    from leakgym.fl.batched import evaluate_many

    torch.manual_seed(5)
    model = _lenet(torch.float32).to(cuda_device)
    params = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in model.named_parameters()}
    x = torch.randn(7, 1, 16, 16, device=cuda_device)
    got = RowwiseForward.of(model).plain_logits(params, x)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, functional_call(model, params, (x,)), rtol=1e-5, atol=1e-5)
    stacked = {n: t.unsqueeze(0) for n, t in params.items()}
    y = torch.randint(0, 10, (7,), device=cuda_device)
    loop = evaluate_many(model, stacked, x, y, vectorise=False)
    vectorised = evaluate_many(model, stacked, x, y, vectorise=True)
    assert loop[0] == vectorised[0] and loop[1] == pytest.approx(vectorised[1], rel=1e-5)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("make", [lambda: _lenet(torch.float32), lambda: _PlainMLP(SPEC)])
def test_grouped_logits_are_each_models_plain_logits(make, shared):
    """The grouped form (evaluate_many's small held-out sets on a CPU: grouped convolutions, one unfold of a
    shared set) gives every model the logits plain_logits gives it, to float32 rounding; with one set per
    model, each model's own set."""
    torch.manual_seed(6)
    model = make()
    n = 5
    params = {name: p.detach() + 0.1 * torch.randn(n, *p.shape) for name, p in model.named_parameters()}
    x = torch.randn(7, 1, 16, 16) if shared else torch.randn(n, 7, 1, 16, 16)
    got = RowwiseForward.of(model).grouped_logits(params, x, shared=shared)
    assert got.shape == (n, 7, 10)
    for i in range(n):
        want = RowwiseForward.of(model).plain_logits({k: v[i] for k, v in params.items()}, x if shared else x[i])
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got[i], got[(i + 1) % n])


def test_grouped_logits_in_float64_match_to_rounding():
    """In float64 the grouped form and the per-model kernels agree to 1e-12: the same mathematics."""
    torch.manual_seed(7)
    model = _lenet(torch.float64)
    params = {name: p.detach() + 0.1 * torch.randn(3, *p.shape, dtype=torch.float64)
              for name, p in model.named_parameters()}
    x = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    got = RowwiseForward.of(model).grouped_logits(params, x, shared=True)
    for i in range(3):
        want = RowwiseForward.of(model).plain_logits({k: v[i] for k, v in params.items()}, x)
        torch.testing.assert_close(got[i], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("small_outputs", [0, 10**6])  # weight gradient by ATen / as a grouped convolution
@pytest.mark.parametrize(("stride", "padding", "dilation", "bias"), [
    ((1, 1), (2, 2), (1, 1), True), ((2, 1), (1, 2), (1, 1), False), ((2, 2), (2, 1), (2, 1), True)])
def test_grouped_conv2d_and_its_gradients_are_each_rows_conv2d(monkeypatch, small_outputs, stride, padding,
                                                             dilation, bias):
    """grouped_conv2d of R rows (the FL clients' grouped form): values and first-order gradients (input,
    weight, bias) are each row's F.conv2d's, in float64 to 1e-12, whichever way the weight gradient goes."""
    from leakgym.models import convolution
    from leakgym.models.convolution import grouped_conv2d

    monkeypatch.setattr(convolution, "GROUPED_WEIGHT_GRAD_MAX_POSITIONS", small_outputs)
    g = torch.Generator().manual_seed(3)
    rows, batch, c, o = 3, 2, 4, 5
    x = torch.randn(batch, rows * c, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(rows, o, c, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(rows, o, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    out = grouped_conv2d(x, w, b, stride, padding, dilation)
    probe = torch.randn(out.shape, generator=g, dtype=torch.float64)
    leaves = [x, w] + ([b] if bias else [])
    got = torch.autograd.grad((out * probe).sum(), leaves)
    want_out = torch.cat([F.conv2d(x[:, r * c:(r + 1) * c], w[r], None if b is None else b[r], stride, padding,
                                   dilation) for r in range(rows)], dim=1)
    want = torch.autograd.grad((want_out * probe).sum(), leaves)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(got, want):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    # no input gradient asked (the first layer): the weight's and bias' alone, the same
    only = torch.autograd.grad((grouped_conv2d(x.detach(), w, b, stride, padding, dilation) * probe).sum(), leaves[1:])
    for mine, theirs in zip(only, want[1:]):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.parametrize("small_outputs", [0, 10**6])
def test_grouped_forms_on_cuda(cuda_device, small_outputs, monkeypatch):
    """grouped_conv2d, grouped_logits and grouped_loss run on CUDA (float64: no TF32) and give each row's
    values and gradients there, both ways of the weight gradient."""
    from leakgym.models import convolution
    from leakgym.models.convolution import grouped_conv2d

    monkeypatch.setattr(convolution, "GROUPED_WEIGHT_GRAD_MAX_POSITIONS", small_outputs)
    g = torch.Generator().manual_seed(4)
    rows, batch, c, o = 3, 2, 4, 5
    x = torch.randn(batch, rows * c, 7, 6, generator=g, dtype=torch.float64).to(cuda_device).requires_grad_(True)
    w = torch.randn(rows, o, c, 3, 5, generator=g, dtype=torch.float64).to(cuda_device).requires_grad_(True)
    b = torch.randn(rows, o, generator=g, dtype=torch.float64).to(cuda_device).requires_grad_(True)
    out = grouped_conv2d(x, w, b, (2, 1), (1, 2), (1, 1))
    assert out.device.type == "cuda"
    probe = torch.randn(out.shape, generator=g, dtype=torch.float64).to(cuda_device)
    got = torch.autograd.grad((out * probe).sum(), [x, w, b])
    want_out = torch.cat([F.conv2d(x[:, r * c:(r + 1) * c], w[r], b[r], (2, 1), (1, 2)) for r in range(rows)], dim=1)
    want = torch.autograd.grad((want_out * probe).sum(), [x, w, b])
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    for mine, theirs in zip(got, want):
        assert mine.device.type == "cuda"
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10)
    model = _lenet(torch.float64).to(cuda_device)
    form = RowwiseForward.of(model)
    params = {n: (p.detach() + 0.1 * torch.randn(rows, *p.shape, generator=g, dtype=torch.float64).to(cuda_device))
              .requires_grad_(True) for n, p in model.named_parameters()}
    images = torch.randn(rows, 4, 1, 16, 16, generator=g, dtype=torch.float64).to(cuda_device)
    labels = torch.randint(0, 10, (rows, 4), generator=g).to(cuda_device)
    logits = form.grouped_logits(params, images[0], shared=True)
    assert logits.device.type == "cuda"
    for r in range(rows):
        torch.testing.assert_close(logits[r], form.plain_logits({k: v[r] for k, v in params.items()}, images[0]),
                                   rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(form.grouped_loss(params, images, labels).sum(), list(params.values()))
    want = torch.autograd.grad(form(params, images, labels).sum(), list(params.values()))
    for mine, theirs in zip(grads, want):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10)

"""Tests for leakgym.models: architectures, PRECODE, task loss, functional use, BatchNorm helpers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from leakgym.data.spec import DatasetSpec
from leakgym.models import (
    MODEL_NAMES,
    LeakGymModel,
    VariationalBottleneck,
    bn_eval_if_single,
    build_model,
    has_batchnorm,
    precode_layer_split,
    task_loss,
)

DIGITS16 = DatasetSpec("digits", 1, 16, 10, (0.5,), (0.5,))
CIFAR32 = DatasetSpec("cifar10", 3, 32, 10, (0.49, 0.48, 0.45), (0.25, 0.24, 0.26))
SPECS = [DIGITS16, CIFAR32]
# Small widths keep the default test run fast on CPU; architecture is unchanged.
SMALL_WIDTH = {"lenet": 12, "convnet": 4, "mlp": 32, "resnet18": 4}


def small(name: str, spec: DatasetSpec, **kwargs) -> LeakGymModel:
    return build_model(name, spec, width=SMALL_WIDTH[name], seed=0, **kwargs)


def batch(spec: DatasetSpec, n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *spec.shape, generator=g)
    y = torch.randint(0, spec.num_classes, (n,), generator=g)
    return x, y


def grads_close(a: dict, b: dict, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k, value in a.items():
        torch.testing.assert_close(value, b[k], rtol=rtol, atol=atol, msg=k)


# ---------------------------------------------------------------- shapes and structure


@pytest.mark.parametrize("precode", [False, True])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_shapes(name, spec, precode):
    model = small(name, spec, precode=precode)
    x, _ = batch(spec)
    logits, kl = model(x, return_kl=True)
    assert logits.shape == (4, spec.num_classes)
    assert kl.shape == ()
    assert model(x).shape == (4, spec.num_classes)
    feats = model.features(x)
    assert feats.shape == (4, model.head.in_features)
    if not precode:
        assert kl.item() == 0.0 and model.bottleneck is None and model.precode_beta == 0.0
    else:
        assert isinstance(model.bottleneck, VariationalBottleneck)


@pytest.mark.parametrize("name", ["lenet", "convnet", "mlp"])  # resnet18 default: parameter-count test
def test_default_widths_build_and_run(name):
    model = build_model(name, DIGITS16, seed=0)
    x, _ = batch(DIGITS16, n=2)
    assert model(x).shape == (2, 10)


def test_lenet_matches_dlg_structure_and_parameter_count():
    """LeakGym's LeNet: 4 conv5x5 (12 ch, strides 2,2,1,1, pad 2) + sigmoid, one linear layer (DLG's has 3
    convolutions, strides 2,2,1: the deviation stated in leakgym/models/lenet.py)."""
    for spec, flat in ((CIFAR32, 12 * 8 * 8), (DIGITS16, 12 * 4 * 4)):
        model = build_model("lenet", spec, seed=0)
        convs = [m for m in model.body if isinstance(m, nn.Conv2d)]
        assert [c.stride for c in convs] == [(2, 2), (2, 2), (1, 1), (1, 1)]
        assert all(c.kernel_size == (5, 5) and c.padding == (2, 2) and c.out_channels == 12 for c in convs)
        assert sum(isinstance(m, nn.Sigmoid) for m in model.body) == 4
        assert not any(isinstance(m, (nn.ReLU, nn.MaxPool2d, nn.modules.batchnorm._BatchNorm))
                       for m in model.modules())
        assert model.head.in_features == flat  # 768 for 32x32, as in DLG's nn.Linear(768, ...)
        c = spec.channels
        expected = (c * 12 * 25 + 12) + 3 * (12 * 12 * 25 + 12) + (flat * 10 + 10)
        assert sum(p.numel() for p in model.parameters()) == expected  # 19438 (CIFAR), 13078 (digits)
        # DLG initialisation: U(-0.5, 0.5) for every weight and bias.
        assert all(p.abs().max() <= 0.5 for p in model.parameters())
        assert model.body.conv1.weight.std() > 0.25  # U(-0.5,0.5) has std 0.289; PyTorch default ~0.1


def test_convnet_matches_inverting_gradients_reference():
    """IG ConvNet(width=64) on CIFAR: 8 conv-BN-ReLU blocks, 2 max-pools, Linear(36 * width)."""
    model = build_model("convnet", CIFAR32, width=64, seed=0)
    convs = [m for m in model.body if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128, 128, 256, 256, 256, 256, 256]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.body) == 8
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.body) == 2
    assert model.head.in_features == 36 * 64
    assert build_model("convnet", DIGITS16, width=16).head.in_features == 4 * 16  # 16 -> 5 -> 1


def test_resnet18_cifar_stem_and_parameter_count():
    """Standard CIFAR ResNet-18 has 11,173,962 parameters for 10 classes."""
    model = build_model("resnet18", CIFAR32, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 11_173_962
    stem = model.body.conv1
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    blocks = [len(getattr(model.body, f"layer{i}")) for i in range(1, 5)]
    assert blocks == [2, 2, 2, 2]


def test_mlp_first_layer_is_linear_with_bias_and_invertible():
    """Analytic attack premise: dL/dW_i / dL/db_i recovers the flattened input (batch of 1)."""
    model = build_model("mlp", DIGITS16, width=32, seed=0)
    assert isinstance(model.first_layer, nn.Linear) and model.first_layer.bias is not None
    assert model.first_layer.in_features == 16 * 16
    hidden = [m for m in model.body if isinstance(m, nn.Linear)]
    assert len(hidden) == 4 and sum(isinstance(m, nn.BatchNorm1d) for m in model.body) == 4
    x, y = batch(DIGITS16, n=1)
    with bn_eval_if_single(model, 1):
        loss = task_loss(model, x, y)
    gw, gb = torch.autograd.grad(loss, [model.first_layer.weight, model.first_layer.bias])
    i = int(gb.abs().argmax())
    torch.testing.assert_close(gw[i] / gb[i], x.flatten(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- functional use


@pytest.mark.parametrize("precode", [False, True])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_functional_call_equals_forward(name, precode):
    model = small(name, DIGITS16, precode=precode)
    x, _ = batch(DIGITS16)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    torch.manual_seed(1)
    out = model(x)
    torch.manual_seed(1)
    out_f = functional_call(model, params, (x,))
    torch.testing.assert_close(out, out_f)


@pytest.mark.parametrize(
    ("name", "precode", "soft"),
    [(n, p, False) for n in MODEL_NAMES for p in (False, True)] + [("lenet", True, True), ("mlp", False, True)],
)
def test_func_grad_of_task_loss_matches_autograd(name, precode, soft):
    model = small(name, DIGITS16, precode=precode)
    x, y = batch(DIGITS16)
    if soft:
        y = F.softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(3)), dim=1)
    params = {k: v.detach() for k, v in model.named_parameters()}
    torch.manual_seed(7)
    g_func = grad(lambda p: task_loss(model, x, y, params=p))(params)
    model.zero_grad()
    torch.manual_seed(7)
    task_loss(model, x, y).backward()
    g_auto = {k: v.grad for k, v in model.named_parameters()}
    grads_close(g_func, g_auto)


def test_task_loss_with_params_leaves_bn_buffers_untouched():
    model = small("convnet", DIGITS16).train()
    x, y = batch(DIGITS16)
    before = {k: v.clone() for k, v in model.named_buffers()}
    params = {k: v.detach() for k, v in model.named_parameters()}
    grad(lambda p: task_loss(model, x, y, params=p))(params)
    assert all(torch.equal(before[k], v) for k, v in model.named_buffers())
    task_loss(model, x, y)  # a plain train-mode call updates running statistics
    assert not torch.equal(before["body.bn0.running_mean"], model.body.bn0.running_mean)


def test_vmap_over_params_and_inputs_for_bn_free_model():
    """LeNet (BN-free) vmaps over stacked parameters; PRECODE needs randomness='different'."""
    models = [small("lenet", DIGITS16) for _ in range(2)]
    torch.manual_seed(5)
    models[1] = build_model("lenet", DIGITS16, seed=1)
    stacked = {k: torch.stack([dict(m.named_parameters())[k].detach() for m in models])
               for k, _ in models[0].named_parameters()}
    xs = torch.stack([batch(DIGITS16, seed=s)[0] for s in (0, 1)])
    ys = torch.stack([batch(DIGITS16, seed=s)[1] for s in (0, 1)])
    base = models[0]
    losses = vmap(lambda p, x, y: task_loss(base, x, y, params=p))(stacked, xs, ys)
    expected = torch.stack([task_loss(m, x, y) for m, x, y in zip(models, xs, ys)])
    torch.testing.assert_close(losses, expected)

    pre = small("lenet", DIGITS16, precode=True)
    params = {k: v.detach() for k, v in pre.named_parameters()}
    x, _ = batch(DIGITS16)
    x2 = torch.stack([x, x])
    out = vmap(lambda xx: functional_call(pre, params, (xx,)), randomness="different")(x2)
    assert out.shape == (2, 4, 10)
    assert not torch.allclose(out[0], out[1])  # independent samples per vmapped copy


# ---------------------------------------------------------------- PRECODE


def test_precode_kl_nonnegative_and_zero_at_prior():
    torch.manual_seed(0)
    vb = VariationalBottleneck(20, 8)
    for _ in range(5):
        _, kl = vb(torch.randn(6, 20) * 3)
        assert kl.item() >= 0.0
    # mu = 0, sigma = softplus(log(e - 1)) = 1 is the prior: KL must be 0.
    with torch.no_grad():
        vb.encoder.weight.zero_()
        vb.encoder.bias[:8] = 0.0
        vb.encoder.bias[8:] = math.log(math.e - 1)
    _, kl = vb(torch.randn(6, 20))
    assert abs(kl.item()) < 1e-5
    # Closed form for one latent dim, mu=1, sigma=1: KL = 0.5 nats = 0.5 / ln 2 bits.
    kl1 = VariationalBottleneck.kl_divergence(torch.ones(1, 1), torch.ones(1, 1))
    assert kl1.item() == pytest.approx(0.5 / math.log(2))


def test_precode_task_loss_adds_beta_times_kl():
    model = small("mlp", DIGITS16, precode=True, precode_beta=0.05)
    x, y = batch(DIGITS16)
    torch.manual_seed(3)
    logits, kl = model(x, return_kl=True)
    ce = F.cross_entropy(logits, y)
    torch.manual_seed(3)
    loss = task_loss(model, x, y)
    assert kl.item() > 0
    assert (loss - ce).item() == pytest.approx(0.05 * kl.item(), rel=1e-4)


def test_precode_stochastic_in_train_deterministic_in_eval():
    model = small("convnet", DIGITS16, precode=True)
    x, _ = batch(DIGITS16)
    model.train()
    assert not torch.allclose(model(x), model(x))
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.bottleneck.sample_in_eval = True  # official PRECODE behaviour
    assert not torch.allclose(model(x), model(x))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_precode_layer_split(name):
    model = small(name, DIGITS16, precode=True)
    before, after = precode_layer_split(model)
    names = [n for n, _ in model.named_parameters()]
    assert before + after == names  # disjoint, complete, in parameter order
    assert not set(before) & set(after)
    assert not any(n.startswith(("bottleneck.", "head.")) for n in before)
    assert {"bottleneck.encoder.weight", "bottleneck.decoder.weight", "head.weight"} <= set(after)
    assert all(n.startswith(("bottleneck.", "head.")) for n in after)
    with pytest.raises(ValueError, match="bottleneck"):
        precode_layer_split(small(name, DIGITS16))


def test_insert_bottleneck_keeps_parameter_order():
    model = small("lenet", DIGITS16)
    model.insert_bottleneck(precode_dim=16, precode_beta=0.01)
    names = [n for n, _ in model.named_parameters()]
    assert names[-2:] == ["head.weight", "head.bias"] and model.precode_beta == 0.01
    assert model.bottleneck.latent_dim == 16
    with pytest.raises(ValueError, match="already"):
        model.insert_bottleneck()


# ---------------------------------------------------------------- BatchNorm helpers


def test_batchnorm_helpers():
    assert not has_batchnorm(small("lenet", DIGITS16))
    for name in ("convnet", "mlp", "resnet18"):
        assert has_batchnorm(small(name, DIGITS16))
    model = small("mlp", DIGITS16).train()
    x, y = batch(DIGITS16, n=1)
    with pytest.raises(ValueError):  # BatchNorm1d cannot train on one sample
        task_loss(model, x, y)
    with bn_eval_if_single(model, 1):
        assert all(not m.training for m in model.modules() if isinstance(m, nn.BatchNorm1d))
        assert torch.isfinite(task_loss(model, x, y))
    assert all(m.training for m in model.modules())  # restored
    with bn_eval_if_single(model, 4):
        assert all(m.training for m in model.modules())


# ---------------------------------------------------------------- construction and validation


def test_seeded_build_leaves_every_gpu_generator_alone(monkeypatch):
    """build_model(seed=...) used torch.manual_seed inside fork_rng(devices=[]): the CPU state came back,
    but every GPU's generator was re-seeded for good (torch.manual_seed calls torch.cuda.manual_seed_all,
    lazily where CUDA is not initialised). The init must still be the one torch.manual_seed(seed) gives."""
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    model = build_model("lenet", DIGITS16, width=4, seed=5)
    from leakgym.defenses.registry import seeded_global_rng

    with seeded_global_rng(5, torch.device("cpu")):
        drawn = torch.rand(3)
    assert reseeded == []
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(5)
        expected = torch.rand(3)
        torch.manual_seed(5)
        reference = type(model)(DIGITS16, width=4)
    assert torch.equal(drawn, expected)
    for (ka, va), (kb, vb) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_seed_makes_init_reproducible_without_touching_global_rng():
    state = torch.random.get_rng_state()
    a = build_model("convnet", DIGITS16, width=4, seed=11, precode=True)
    b = build_model("convnet", DIGITS16, width=4, seed=11, precode=True)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    c = build_model("convnet", DIGITS16, width=4, seed=12)
    assert not torch.equal(a.body.conv0.weight, c.body.conv0.weight)


def test_device_and_dtype():
    model = build_model("lenet", DIGITS16, dtype=torch.float64, device="cpu", precode=True)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x, y = batch(DIGITS16)
    assert task_loss(model, x.double(), y).dtype == torch.float64


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"precode_beta": math.inf}, r"precode_beta=inf; allowed: a finite number >= 0"),  # task_loss was inf
    ({"precode_beta": math.nan}, r"precode_beta=nan; allowed: a finite number >= 0"),
    ({"precode_beta": "x"}, r"precode_beta='x'; allowed: a finite number >= 0"),  # TypeErrors
    ({"precode_beta": None}, r"precode_beta=None; allowed"),
    ({"precode_beta": True}, r"precode_beta=True; allowed"),
    ({"precode": "no"}, r"precode='no'; allowed: True or False"),  # a bottleneck
    ({"precode": None}, r"precode=None; allowed: True or False"),
    ({"seed": 1.5}, r"seed=1.5; allowed: an integer in \[-2\*\*63, 2\*\*64 - 1\]"),  # the seed 1
    ({"seed": True}, r"seed=True; allowed: an integer"),
    ({"seed": 2**70}, r"seed=1180591620717411303424; allowed: an integer in \[-2\*\*63, 2\*\*64 - 1\]"),  # Overflow
    ({"seed": "a"}, r"seed='a'; allowed"),
    ({"dtype": torch.int64}, r"dtype=torch.int64; allowed: a floating torch dtype"),  # TypeError
    ({"dtype": "float32"}, r"dtype='float32'; allowed: a floating torch dtype"),
    ({"device": "nope"}, r"device='nope' is not a torch device name; available here: \['cpu'"),  # RuntimeError
])
def test_build_model_refuses_bad_arguments_before_building(kwargs, match):
    """Each was accepted (``precode_beta=inf``, ``seed=1.5`` or ``True`` as 1, ``precode="no"`` as True) or raised
    a TypeError, RuntimeError or AttributeError from deep inside; now a ValueError naming the value and what is
    allowed, before the global RNG moves."""
    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match=match):
        build_model("lenet", DIGITS16, **kwargs)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_build_model_checks_spec_and_device_and_keeps_meta():
    with pytest.raises(ValueError, match=r"spec='digits'; allowed: a leakgym.data.spec.DatasetSpec"):
        build_model("lenet", "digits")  # an AttributeError
    if not torch.cuda.is_available():  # torch's 'Found no NVIDIA driver' at the first tensor
        with pytest.raises(ValueError, match=r"device='cuda' is not available on this machine; available here"):
            build_model("lenet", DIGITS16, device="cuda")
    # the scenario checks build shapes on the meta device, explicitly or through torch's default device
    assert all(p.is_meta for p in build_model("convnet", DIGITS16, width=4, device="meta").parameters())
    with torch.device("meta"):
        assert all(p.is_meta for p in build_model("lenet", DIGITS16, seed=0).parameters())
    # valid arguments of every accepted kind build what they built before
    a = build_model("lenet", DIGITS16, seed=3, precode=True, precode_beta=0, device=torch.device("cpu"))
    b = build_model("lenet", DIGITS16, seed=torch.tensor(3).numpy()[()], precode=torch.tensor(True).numpy()[()],
                    precode_beta=torch.tensor(0.0).numpy()[()], device="cpu", dtype=torch.float32)
    assert a.precode_beta == b.precode_beta == 0.0 and type(b.precode_beta) is float and b.bottleneck is not None
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert build_model("lenet", DIGITS16, seed=-1, dtype=torch.float16).head.weight.dtype == torch.float16
    assert build_model("lenet", DIGITS16, seed=2**64 - 1) is not None
    model = build_model("lenet", DIGITS16, width=4)
    with pytest.raises(ValueError, match=r"precode_beta=inf; allowed: a finite number >= 0"):
        model.insert_bottleneck(precode_beta=math.inf)
    assert model.bottleneck is None


def test_validation_errors():
    with pytest.raises(ValueError, match="lenet, convnet, mlp, resnet18"):
        build_model("vgg", DIGITS16)
    tiny = DatasetSpec("tiny", 1, 8, 10, (0.5,), (0.5,))
    with pytest.raises(ValueError, match="at least 9x9"):
        build_model("convnet", tiny)
    with pytest.raises(ValueError, match="at least 8x8"):
        build_model("resnet18", DatasetSpec("t", 1, 4, 10, (0.5,), (0.5,)))
    with pytest.raises(ValueError, match="width"):
        build_model("mlp", DIGITS16, width=0)
    with pytest.raises(ValueError, match=r"width=True; allowed: an integer >= 1"):  # was a width-1 model
        build_model("lenet", DIGITS16, width=True)
    shapes = [p.shape for p in build_model("lenet", DIGITS16, width=torch.tensor(3).numpy()[()]).parameters()]
    assert shapes == [p.shape for p in build_model("lenet", DIGITS16, width=3).parameters()]  # numpy integers
    with pytest.raises(ValueError, match="precode_dim"):
        build_model("mlp", DIGITS16, precode=True, precode_dim=0)
    with pytest.raises(ValueError, match="precode_beta"):
        build_model("lenet", DIGITS16, precode=True, precode_beta=-1.0)
    model = small("lenet", DIGITS16)
    x, y = batch(DIGITS16)
    with pytest.raises(ValueError, match="hard labels"):
        task_loss(model, x, y[:2])
    with pytest.raises(ValueError, match="soft labels"):
        task_loss(model, x, torch.rand(4, 3))
    with pytest.raises(ValueError, match="dtype"):
        task_loss(model, x, y.bool())

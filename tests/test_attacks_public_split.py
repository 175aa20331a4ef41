"""What attacks derive from a public split is computed once per split (``leakgym.attacks.public_split``),
and the trap-weight block once per setting; every cached path gives what the computation gives."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from leakgym.attacks import public_split
from leakgym.attacks.adaptive import PriorInit, class_mean_images
from leakgym.attacks.base import AttackerKnowledge
from leakgym.attacks.imprint import ImprintAttack
from leakgym.attacks.trap_weights import TrapWeightsAttack, trap_weights
from leakgym.data import dataset_spec
from leakgym.fl.client import compute_update
from leakgym.models import build_model
from leakgym.optim.randomness import seeded_generator

SPEC = dataset_spec("digits", image_size=16)


def _public(n: int = 40, seed: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *SPEC.shape, generator=g).to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def _counting(monkeypatch, module, name: str) -> list:
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_derived_value_is_kept_while_its_tensors_live_unchanged():
    x, y = _public()
    computed = []

    def value(tag):
        return lambda: computed.append(tag) or torch.tensor([float(len(computed))])

    first = public_split.derived(x, "k", value("a"), also=(y,))
    assert public_split.derived(x, "k", value("b"), also=(y,)) is first and computed == ["a"]
    public_split.derived(x, "other key", value("c"), also=(y,))
    assert computed == ["a", "c"] and public_split.derived(x, "k", value("d"), also=(y,)) is first
    x.mul_(1.0)  # an in-place write to the images, even one that changes no value
    public_split.derived(x, "k", value("e"), also=(y,))
    y.add_(0)  # ... or to the labels
    public_split.derived(x, "k", value("f"), also=(y,))
    public_split.derived(x, "k", value("g"), also=(y.clone(),))  # equal labels in another tensor
    assert computed == ["a", "c", "e", "f", "g"]
    before = len(public_split._DERIVED)
    del x
    gc.collect()
    assert len(public_split._DERIVED) == before - 1  # the entries go with their public split


def test_gathers_of_one_source_share_their_derived_values():
    """``gathered_from``: a split gathered again finds what was derived from an earlier gather, while the
    source and the gathered tensors are unchanged; images and labels of one source do not collide."""
    data_x, data_y = _public(60, seed=1)
    rows = torch.arange(5, 45)
    computed = []

    def gather(rows):
        x, y = data_x[rows], data_y[rows]
        public_split.gathered_from(x, rows, "x")
        public_split.gathered_from(y, rows, "y")
        return x, y

    def means(x, y):
        return public_split.derived(x, "means", lambda: computed.append(1) or class_mean_images(x, y, 10), also=(y,))

    x1, y1 = gather(rows)
    first = means(x1, y1)
    x2, y2 = gather(rows)
    assert means(x2, y2) is first and len(computed) == 1
    public_split.derived(y2, "means", lambda: computed.append(1), also=(x2,))  # the labels as the key tensor
    assert len(computed) == 2
    x2.add_(1.0)  # written after the gather: followed by itself, and computed on its own values
    assert torch.allclose(means(x2, y2), first + 1.0, atol=1e-6) and len(computed) == 3
    assert means(*gather(rows)) is first and len(computed) == 3
    rows.add_(1)  # the source changed
    assert means(*gather(rows)) is not first and len(computed) == 4
    before = len(public_split._DERIVED)
    del rows, x1, y1, x2, y2
    gc.collect()
    assert len(public_split._DERIVED) < before  # the entries go with their source


def test_an_inference_tensor_is_not_cached():
    """Tensors made under torch.inference_mode keep no version counter (reading it raises): a value derived
    from one is computed every call, and prior-init still runs on such a split."""
    with torch.inference_mode():
        x, y = _public()
    computed = []
    for _ in range(2):
        public_split.derived(x, "k", lambda: computed.append(1), also=(y,))
    assert len(computed) == 2
    model = build_model("lenet", SPEC, seed=0)
    knowledge = AttackerKnowledge(model=model, spec=SPEC, batch_size=1, public_x=x, public_y=y)
    start = PriorInit(iterations=1).initial_images(knowledge, y[:1], 1, torch.Generator().manual_seed(0))
    assert start.shape == (1, 1, *SPEC.shape)


def test_prior_init_computes_the_class_means_once_per_public_split(monkeypatch):
    """Two rounds against the same game's public split: the class means are computed once, and each start
    image is what the class means computed afresh give."""
    from leakgym.attacks import adaptive

    calls = _counting(monkeypatch, adaptive, "class_mean_images")
    model = build_model("lenet", SPEC, seed=0)
    px, py = _public()
    x, y = _public(1, seed=1)
    update = compute_update(model, SPEC.normalize(x), y)
    knowledge = AttackerKnowledge(model=model, spec=SPEC, batch_size=1, labels=y, public_x=px, public_y=py)
    attack = PriorInit(iterations=1, prior_noise=0.0)
    starts = [attack.initial_images(knowledge, y, 1, torch.Generator().manual_seed(0)) for _ in range(2)]
    assert len(calls) == 1
    expected = SPEC.normalize(class_mean_images(px, py, 10)[y].float()).unsqueeze(0)
    assert all(torch.equal(s, expected) for s in starts)
    assert attack.reconstruct(update, knowledge, seed=0).images.shape == (1, *SPEC.shape) and len(calls) == 1


def test_imprint_computes_its_thresholds_once_per_public_split_and_setting(monkeypatch):
    from leakgym.attacks import imprint

    calls = _counting(monkeypatch, imprint, "imprint_thresholds")
    model = build_model("mlp", SPEC, seed=0)
    px, _ = _public()
    first = ImprintAttack(num_bins=16).prepare_model(model, SPEC, public_x=px)
    again = ImprintAttack(num_bins=16).prepare_model(model, SPEC, public_x=px)
    assert len(calls) == 1
    for (name, a), b in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    reference = imprint.imprint_thresholds(ImprintAttack(num_bins=16).measurement_direction(SPEC), 16, SPEC, px)
    assert torch.equal(first.imprint.linear0.bias, (-reference).to(torch.float32))
    # another setting, another public split, or none: computed for it
    ImprintAttack(num_bins=8).prepare_model(model, SPEC, public_x=px)
    ImprintAttack(num_bins=16, measurement="random").prepare_model(model, SPEC, public_x=px)
    ImprintAttack(num_bins=16).prepare_model(model, SPEC, public_x=px.clone())
    ImprintAttack(num_bins=16).prepare_model(model, SPEC)
    assert len(calls) == 1 + 1 + 4


def test_trap_weights_draw_their_block_once_per_setting(monkeypatch):
    """The block every game is sent is drawn once per setting, bit for bit the block drawn afresh (as each
    round drew it before)."""
    from leakgym.attacks import trap_weights as module

    module._trap_block.cache_clear()
    calls = _counting(monkeypatch, module, "trap_weights")
    model = build_model("mlp", SPEC, seed=0)
    attack = TrapWeightsAttack(num_neurons=32, seed=3)
    blocks = [attack.prepare_model(model, SPEC).trap for _ in range(2)]
    assert len(calls) == 1
    d = math.prod(SPEC.shape)
    generator = seeded_generator(3)
    weight = trap_weights(32, d, attack.config.scale_factor, generator=generator)
    zero = torch.zeros((1, *SPEC.shape), dtype=torch.float64)
    mean = SPEC.denormalize(zero).flatten()
    std = (SPEC.denormalize(torch.ones_like(zero)) - SPEC.denormalize(zero)).flatten()
    out = torch.randn((d, 32), generator=generator, dtype=torch.float64) / math.sqrt(d)
    for block in blocks:
        reference = torch.zeros_like(block.linear0.weight)
        assert torch.equal(block.linear0.weight, reference.copy_(weight * std))
        assert torch.equal(block.linear0.bias, torch.zeros_like(block.linear0.bias).copy_(weight @ mean))
        assert torch.equal(block.linear2.weight, torch.zeros_like(block.linear2.weight).copy_(out))
    TrapWeightsAttack(num_neurons=32, seed=4).prepare_model(model, SPEC)
    assert len(calls) == 2


@pytest.mark.cuda
def test_class_means_and_imprint_thresholds_of_a_cuda_public_split(cuda_device):
    px, py = _public(device=cuda_device)
    means = public_split.derived(px, ("class means", 10, px.device), lambda: class_mean_images(px, py, 10), also=(py,))
    assert means.device == px.device
    model = build_model("mlp", SPEC, seed=0, device=cuda_device)
    on_cuda = ImprintAttack(num_bins=16).prepare_model(model, SPEC, public_x=px)
    on_cpu = ImprintAttack(num_bins=16).prepare_model(build_model("mlp", SPEC, seed=0), SPEC, public_x=px.cpu())
    assert on_cuda.imprint.linear0.bias.device.type == "cuda"
    assert torch.equal(on_cuda.imprint.linear0.bias.cpu(), on_cpu.imprint.linear0.bias)

"""Noise, clipping, per-layer pruning, global top-k and Soteria on known inputs."""

from __future__ import annotations

import math

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.defenses.perturbation import add_noise, clip_norm, global_norm, laplace_like
from leakgym.defenses.soteria import representation_scores, soteria
from leakgym.defenses.sparsification import prune_smallest, top_k
from leakgym.models import build_model

SPEC = dataset_spec("digits", image_size=16)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_gaussian_and_laplace_noise_have_the_right_scale_and_respect_names():
    upd = {"a": torch.zeros(200_000), "b": torch.ones(3)}
    g = add_noise(upd, 0.5, generator=_gen(), names=["a"])
    assert torch.equal(g["b"], upd["b"]) and torch.equal(upd["a"], torch.zeros(200_000))  # input untouched
    assert g["a"].std().item() == pytest.approx(0.5, rel=0.01)
    lap = laplace_like(torch.zeros(200_000), 0.5, _gen(1))
    # Laplace(0, b): mean |X| = b and Var = 2 b^2.
    assert lap.abs().mean().item() == pytest.approx(0.5, rel=0.01)
    assert lap.var().item() == pytest.approx(2 * 0.25, rel=0.03)
    with pytest.raises(ValueError, match="noise kind='uniform'"):
        add_noise(upd, 0.1, kind="uniform", generator=_gen())


def test_clip_norm_bounds_global_norm_and_leaves_small_updates():
    upd = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}  # global norm 5
    clipped, factor = clip_norm(upd, 1.0)
    assert factor == pytest.approx(0.2) and float(global_norm(clipped)) == pytest.approx(1.0)
    same, factor = clip_norm(upd, 10.0)
    assert factor == 1.0 and torch.equal(same["a"], upd["a"])
    with pytest.raises(ValueError, match=r"clip max_norm=0.0; allowed range \(0, inf\)"):
        clip_norm(upd, 0.0)


def test_per_layer_pruning_zeroes_exactly_the_smallest_magnitudes_in_each_layer():
    upd = {"w": torch.tensor([0.1, -5.0, 0.3, -0.2, 4.0]), "b": torch.tensor([-1.0, 2.0])}
    out = prune_smallest(upd, 0.6)
    assert torch.equal(out["w"], torch.tensor([0.0, -5.0, 0.0, 0.0, 4.0]))  # floor(0.6*5)=3 smallest |.|
    assert torch.equal(out["b"], torch.tensor([0.0, 2.0]))                 # floor(0.6*2)=1 per layer


def test_top_k_keeps_the_global_largest_entries():
    upd = {"w": torch.tensor([0.1, -5.0, 0.3]), "b": torch.tensor([-1.0, 2.0, 0.05])}
    out = top_k(upd, 0.5)  # ceil(0.5*6)=3 largest overall: -5, 2, -1
    assert torch.equal(out["w"], torch.tensor([0.0, -5.0, 0.0]))
    assert torch.equal(out["b"], torch.tensor([-1.0, 2.0, 0.0]))
    assert math.isclose(sum(int((t != 0).sum()) for t in top_k(upd, 1.0).values()), 6)


def test_soteria_scores_match_brute_force_and_prune_head_columns_with_smallest_score():
    model = build_model("lenet", SPEC, seed=0)
    x = torch.randn(2, 1, 16, 16, generator=_gen(2))
    scores = representation_scores(model, x)
    xr = x.clone().requires_grad_(True)
    r = model.features(xr)
    ref = torch.stack([
        torch.autograd.grad(r[:, i].sum(), xr, retain_graph=True)[0].flatten(1).norm(dim=1)
        for i in range(r.shape[1])
    ])  # (D, B): ||dr_{b,i}/dx_b||, one backward per unit
    ref = (ref / (r.detach().abs().T + 0.1)).sum(dim=1)
    torch.testing.assert_close(scores, ref, rtol=1e-5, atol=1e-6)

    upd = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    out, info = soteria(upd, model, x, 0.25)
    assert info == {"pruned_units": 48, "units": 192}
    pruned_cols = (out["head.weight"] == 0).all(dim=0)
    assert torch.equal(pruned_cols.nonzero().flatten().sort().values,
                       torch.topk(ref, 48, largest=False).indices.sort().values)
    assert all(torch.equal(out[n], upd[n]) for n in upd if n != "head.weight")  # only the defended layer


def test_soteria_works_with_batchnorm_in_train_mode():
    model = build_model("convnet", SPEC, seed=0, width=4).train()
    x = torch.randn(3, 1, 16, 16, generator=_gen(3))
    scores = representation_scores(model, x)
    assert scores.shape == (model.feature_dim,) and torch.isfinite(scores).all()


def test_soteria_leaves_an_update_without_the_head_weight_as_it_is():
    """A frozen head is not shared: Soteria has nothing of it to prune (it raised KeyError)."""
    from leakgym.defenses import DefenseConfig, apply_defense
    from leakgym.models import build_model

    spec = dataset_spec("digits", image_size=16)
    model = build_model("lenet", spec, seed=0)
    model.head.weight.requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 1, 16, 16, generator=g), torch.tensor([1, 7])
    clean, _ = apply_defense(model, x, y, DefenseConfig(), seed=0)
    upd, rep = apply_defense(model, x, y, DefenseConfig(soteria=0.5), seed=0)
    assert "head.weight" not in upd.tensors and rep.details["soteria"]["pruned_units"] == 0
    assert all(torch.equal(upd.tensors[n], t) for n, t in clean.tensors.items())


def test_entry_counts_are_those_of_the_decimal_fraction():
    """floor(0.29 * 100) on binary floats is 28 (0.29 * 100 = 28.999999999999996) and ceil(0.07 * 100) is 8:
    pruning zeroed one entry too few, top-k kept one too many (helper review)."""
    from leakgym.defenses.sparsification import entry_count

    update = {"w": torch.arange(1.0, 101.0)}
    assert int((prune_smallest(update, 0.29)["w"] == 0).sum()) == 29
    assert int((top_k(update, 0.07)["w"] != 0).sum()) == 7
    assert entry_count(0.29, 100) == 29 and entry_count(0.07, 100, round_up=True) == 7
    assert entry_count(0.295, 100) == 29 and entry_count(0.295, 100, round_up=True) == 30  # not near an integer
    assert entry_count(0.5, 3) == 1 and entry_count(0.5, 3, round_up=True) == 2
    # exact for large n too (a relative tolerance snapped real fractional parts of ResNet-sized updates)
    assert entry_count(0.421, 11_173_962, round_up=True) == 4_704_239
    assert entry_count(0.579, 11_173_962) == 6_469_723
    assert entry_count(0.3333, 1_000_003) == 333_300 and entry_count(0.9999999999, 10**6) == 999_999

"""OASIS (§III-B Eq. 7, §IV-A): batch layout and labels, exact 90° rotations and flips, fill."""

from __future__ import annotations

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.defenses import DefenseConfig, apply_defense
from leakgym.defenses.oasis import augment, black_fill, copies_per_image
from leakgym.fl.client import compute_update
from leakgym.models import build_model

SPEC = dataset_spec("digits", image_size=16)


def _batch(n: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=g), torch.tensor([4, 1, 9][:n])


def test_batch_composition_and_labels_follow_eq7():
    x, y = _batch()
    xa, ya, names = augment(x, y, 31)
    assert copies_per_image(31) == 3 + 3 + 3 + 1 + 1 == len(names)
    assert xa.shape == (3 * 12, 1, 8, 8)
    assert torch.equal(xa[:3], x)  # originals first, then one block of B copies per transform
    assert torch.equal(ya, y.repeat(12))  # every copy carries its original's label
    assert names == ["major_rotation:90", "major_rotation:180", "major_rotation:270",
                     "minor_rotation:30", "minor_rotation:45", "minor_rotation:60",
                     "shear:0.55", "shear:1", "shear:0.9", "hflip", "vflip"]
    # Combination "major rotation + shearing" = union of both sets of copies.
    xc, _yc, names_c = augment(x, y, 1 | 4)
    assert xc.shape[0] == 3 * 7 and names_c == names[:3] + names[6:9]
    assert torch.equal(augment(x, y, 0)[0], x)


def test_major_rotations_and_flips_are_exact_pixel_permutations():
    x, y = _batch()
    xa, _, _ = augment(x, y, 1 | 8 | 16)
    r90, r180, r270, hf, vf = (xa[3 * k: 3 * (k + 1)] for k in range(1, 6))
    n = x.shape[-1]
    for i in range(n):
        for j in range(n):
            # Counter-clockwise quarter turn: out[i, j] = in[j, n-1-i].
            assert torch.equal(r90[..., i, j], x[..., j, n - 1 - i])
            assert torch.equal(r180[..., i, j], x[..., n - 1 - i, n - 1 - j])
            assert torch.equal(r270[..., i, j], x[..., n - 1 - j, i])
            assert torch.equal(hf[..., i, j], x[..., i, n - 1 - j])  # Eq. (3)
            assert torch.equal(vf[..., i, j], x[..., n - 1 - i, j])  # Eq. (4)
    # Why torch.rot90: kornia's interpolating rotate is *not* exact at 90° (bilinear resampling).
    import kornia.geometry.transform as KT

    interp = KT.rotate(x, torch.full((3,), 90.0))
    assert not torch.equal(interp, r90)


def test_interpolated_transforms_fill_with_black_and_shear_follows_eq5():
    x = torch.ones(1, 1, 8, 8)
    fill = black_fill((0.5,), (0.25,))  # black in normalised space: (0 - 0.5) / 0.25 = -2
    xa, _, names = augment(x, torch.tensor([0]), 2 | 4, fill=fill)
    rot45 = xa[1 + names.index("minor_rotation:45")]
    assert rot45[0, 0, 0].item() == pytest.approx(-2.0)  # corner enters from outside: black
    assert rot45[0, 4, 4].item() == pytest.approx(1.0)   # centre stays
    # Eq. (5) I'(i, j) = I(i + mu j, j): a vertical bar at column c moves to c - mu * row.
    bar = torch.zeros(1, 1, 8, 8)
    bar[..., 6] = 1.0
    sheared = augment(bar, torch.tensor([0]), 4)[0][1 + 1]  # mu = 1.0
    for row in range(7):
        assert sheared[0, row, 6 - row].item() == pytest.approx(1.0, abs=1e-5), row


def test_pipeline_trains_on_augmented_batch_but_declares_original_size():
    model = build_model("lenet", SPEC, seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 1, 16, 16, generator=g), torch.tensor([2, 5])
    upd, rep = apply_defense(model, x, y, DefenseConfig(oasis=1))
    assert upd.batch_size == 2 and rep.details["examples_used"] == 8 and rep.applied == ["oasis"]
    xa, ya, _ = augment(x, y, 1)
    ref = compute_update(model, xa, ya)
    assert all(torch.equal(upd.tensors[k], ref.tensors[k]) for k in ref.tensors)
    assert rep.fidelity < 1.0

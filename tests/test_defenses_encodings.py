"""Mixup / InstaHide encodings (leakgym.defenses.encodings) and their decoding attack."""

from __future__ import annotations

import pytest
import torch

from leakgym.defenses.encodings import UPPER_BOUND, instahide_encode, mixup_encode


def _batch(n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_mixup_encoding_is_a_convex_mix_with_soft_labels():
    x, y = _batch()
    x_enc, y_soft, info = mixup_encode(x, y, k=4, num_classes=10, generator=torch.Generator().manual_seed(1))
    lams, idx, mix = info["coefficients"], info["indices"], info["mixing_matrix"]
    assert lams.shape == (6, 4) and idx.shape == (6, 4)
    torch.testing.assert_close(lams.sum(1), torch.ones(6))
    assert (lams >= 0).all() and (lams <= UPPER_BOUND + 1e-6).all()
    assert (idx[:, 0] == torch.arange(6)).all(), "slot 0 holds the encoded image itself"
    assert all(len(set(row.tolist())) == 4 for row in idx), "k distinct images per mix"
    # The encoding is exactly sum_s lambda_s x_{idx_s}, i.e. M X.
    manual = torch.stack([(lams[i].view(-1, 1, 1, 1) * x[idx[i]]).sum(0) for i in range(6)])
    torch.testing.assert_close(x_enc, manual)
    torch.testing.assert_close(x_enc, torch.einsum("ij,jchw->ichw", mix, x))
    # Soft labels: same coefficients, rows sum to 1, and the mass sits on the mixed classes.
    assert y_soft.shape == (6, 10) and y_soft.dtype == torch.float32
    torch.testing.assert_close(y_soft.sum(1), torch.ones(6))
    for i in range(6):
        expected = torch.zeros(10).index_add_(0, y[idx[i]], lams[i])
        torch.testing.assert_close(y_soft[i], expected)


def test_mixup_is_reproducible_from_the_generator_and_validates_k():
    x, y = _batch()
    a = mixup_encode(x, y, k=3, num_classes=10, generator=torch.Generator().manual_seed(5))
    b = mixup_encode(x, y, k=3, num_classes=10, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a[0], b[0])
    with pytest.raises(ValueError, match="k=7"):
        mixup_encode(x, y, k=7, num_classes=10, generator=torch.Generator())
    with pytest.raises(ValueError, match="k=0"):
        mixup_encode(x, y, k=0, num_classes=10, generator=torch.Generator())
    x_id, y_id, _ = mixup_encode(x, y, k=1, num_classes=10, generator=torch.Generator())
    torch.testing.assert_close(x_id, x)
    torch.testing.assert_close(y_id.argmax(1), y)


def test_instahide_inside_dataset_is_mixup_times_an_exact_sign_mask():
    x, y = _batch()
    x_enc, y_soft, info = instahide_encode(x, y, k=4, num_classes=10, generator=torch.Generator().manual_seed(2))
    signs = info["signs"]
    assert signs.shape == x.shape
    assert ((signs == 1) | (signs == -1)).all(), "sign flip must be exactly +-1"
    frac = (signs == -1).float().mean().item()
    assert 0.4 < frac < 0.6, f"about half the pixels flipped, got {frac:.2f}"
    mixed = torch.einsum("ij,jchw->ichw", info["mixing_matrix"], x)
    torch.testing.assert_close(x_enc, mixed * signs)
    torch.testing.assert_close(x_enc.abs(), mixed.abs())
    torch.testing.assert_close(y_soft.sum(1), torch.ones(6))


def test_instahide_cross_dataset_mixes_public_images_and_private_labels_only():
    x, y = _batch()
    g = torch.Generator().manual_seed(3)
    public = torch.randn(20, 1, 8, 8, generator=g)
    x_enc, y_soft, info = instahide_encode(x, y, k=4, num_classes=10, generator=g, public_x=public)
    lams, priv, pub = info["coefficients"], info["indices"], info["public_indices"]
    assert (priv[:, 0] == torch.arange(6)).all() and (priv[:, 1] >= 0).all() and (priv[:, 2:] == -1).all()
    assert (pub[:, :2] == -1).all() and (pub[:, 2:] >= 0).all()
    torch.testing.assert_close(info["mixing_matrix"].sum(1) + info["public_matrix"].sum(1), torch.ones(6))
    mixed = torch.einsum("ij,jchw->ichw", info["mixing_matrix"], x) + torch.einsum(
        "ij,jchw->ichw", info["public_matrix"], public
    )
    torch.testing.assert_close(x_enc, mixed * info["signs"])
    # Labels: only the two private images' classes, renormalised to sum to 1.
    torch.testing.assert_close(y_soft.sum(1), torch.ones(6))
    for i in range(6):
        w = lams[i, :2] / lams[i, :2].sum()
        expected = torch.zeros(10).index_add_(0, y[priv[i, :2]], w)
        torch.testing.assert_close(y_soft[i], expected)

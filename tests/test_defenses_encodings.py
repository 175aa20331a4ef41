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


@pytest.fixture(scope="module")
def digits_batch():
    from leakgym.data import federated_split, load_dataset

    split = federated_split(load_dataset("digits", image_size=16), num_clients=4, seed=0)
    spec = split.spec
    xu, y = split.clients[0][0][:4], split.clients[0][1][:4]
    return spec, xu, y


def _ssim(spec, x_n, xu):
    from leakgym.metrics import score_reconstruction

    return score_reconstruction(spec.denormalize(x_n), xu).mean["ssim"]


def test_mixup_demixing_with_the_known_matrix_recovers_the_batch(digits_batch):
    """Stage 2 of MixupDecoding (LODA Eq. 3) on exact Mixup encodings, k=4, batch 4.

    Measured SSIM vs the private images: encodings themselves 0.85; demixed from one round 0.96,
    from three rounds of fresh encodings 0.997."""
    from leakgym.attacks.mixup_decoding import demix

    spec, xu, y = digits_batch
    x = spec.normalize(xu)
    lo, hi = spec.unit_bounds(x)
    g = torch.Generator().manual_seed(0)
    encs, mats = [], []
    for _ in range(3):
        xe, _, info = mixup_encode(x, y, k=4, num_classes=10, generator=g)
        encs.append(xe)
        mats.append(info["mixing_matrix"])
    enc, mix = torch.cat(encs), torch.cat(mats)
    decoded, hist = demix(enc, mix, torch.zeros_like(enc), scheme="mixup", steps=1000, lr=0.01, lower=lo, upper=hi,
                          generator=torch.Generator().manual_seed(0))
    assert hist[-1] < 1e-2 * hist[0]
    assert _ssim(spec, decoded, xu) > 0.98 > _ssim(spec, encs[0], xu)


def test_instahide_demixing_fits_the_absolute_values_but_not_the_signs(digits_batch):
    """The abs() regression (LODA Eq. 3) is solved -- |M X| matches |E| -- but it cannot tell a
    pixel column's sign across the batch (X[:, p] -> -X[:, p] leaves |M X| unchanged), and the box
    only fixes it for bright pixels. Measured SSIM: encodings 0.09, decoded 0.09-0.10 from 1 or 3
    rounds: decoding does NOT raise SSIM for InstaHide here (documented, not hidden)."""
    from leakgym.attacks.mixup_decoding import demix

    spec, xu, y = digits_batch
    x = spec.normalize(xu)
    lo, hi = spec.unit_bounds(x)
    xe, _, info = instahide_encode(x, y, k=4, num_classes=10, generator=torch.Generator().manual_seed(0))
    decoded, hist = demix(xe, info["mixing_matrix"], torch.zeros_like(xe), scheme="instahide", steps=1000,
                          lr=0.01, lower=lo, upper=hi, generator=torch.Generator().manual_seed(0))
    assert hist[-1] < 0.25 * hist[0]  # measured 0.14
    assert _ssim(spec, decoded, xu) < 0.5


def test_mixup_decoding_without_an_encoding_is_plain_inversion(digits_batch):
    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.attacks.inverting_gradients import InvertingGradients
    from leakgym.attacks.mixup_decoding import MixupDecoding
    from leakgym.fl.client import compute_update
    from leakgym.fl.update import SharedUpdate
    from leakgym.models import build_model

    spec, x, y = digits_batch
    model = build_model("lenet", spec, seed=0)
    knowledge = AttackerKnowledge(model=model, spec=spec, batch_size=4, labels=y)
    # an unencoded update is the identity encoding: the attack is its inversion stage alone, Inverting
    # Gradients with the same settings and seed (it asserted only a shape, on an all-zero update). Equal to
    # float rounding (measured 1e-5: the labels enter as one-hot distributions); another seed is 3 apart.
    real = compute_update(model, spec.normalize(x), y)
    plain = MixupDecoding(iterations=5).reconstruct(real, knowledge, seed=3)
    ig = InvertingGradients(iterations=5).reconstruct(real, knowledge, seed=3)
    torch.testing.assert_close(plain.images, ig.images, rtol=0, atol=1e-4)
    assert plain.labels.tolist() == ig.labels.tolist()
    update = SharedUpdate({n: torch.zeros_like(p) for n, p in model.named_parameters()}, batch_size=4)
    update.metadata["encoding"] = {"scheme": "mixup"}  # an encoding without its matrix is malformed
    with pytest.raises(ValueError, match="metadata"):
        MixupDecoding(iterations=1).reconstruct(update, knowledge)
    with pytest.raises(ValueError, match="decode_steps"):
        MixupDecoding(decode_steps=-1)


@pytest.mark.slow
def test_mixup_decoding_against_plain_inversion_of_encoded_updates(digits_batch):
    """End to end, LeNet, batch 2, Mixup k=2, Inverting Gradients 150 iterations.

    Measured: no defense SSIM 0.99 (batch 4: 0.997); plain inversion of one Mixup update 0.83
    (the encodings themselves 0.89: k=2 barely hides a digit); per-round decoding 0.66 -- WORSE,
    because a single round's 2x2 mixing matrix is ill-conditioned and amplifies the inversion
    error. Joint decoding of 4 rounds re-encoding the same batch (LODA: "combine the reconstructed
    images from 50 iterations"): measured 0.69 vs plain 0.83 -- decoding does NOT beat plain
    inversion here, although demixing exact encodings does (see the test above): stage-1 inversion
    errors (B=2 from one averaged gradient) are amplified by the demixing. Asserted: what holds."""
    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.attacks.inverting_gradients import InvertingGradients
    from leakgym.attacks.mixup_decoding import MixupDecoding
    from leakgym.fl.update import SharedUpdate
    from leakgym.models import build_model, task_loss

    spec, xu, y = digits_batch
    xu, y = xu[:2], y[:2]
    x = spec.normalize(xu)
    model = build_model("lenet", spec, seed=0)

    def grad(xx, yy):
        gs = torch.autograd.grad(task_loss(model, xx, yy), list(model.parameters()))
        return {n: g.detach() for (n, _), g in zip(model.named_parameters(), gs)}

    gen = torch.Generator().manual_seed(0)
    updates = []
    for _ in range(4):
        xe, ys, info = mixup_encode(x, y, k=2, num_classes=10, generator=gen)
        meta = {"encoding": {"scheme": "mixup", "mixing_matrix": info["mixing_matrix"], "labels": ys}}
        updates.append(SharedUpdate(grad(xe, ys), batch_size=2, metadata=meta))
    kns = [AttackerKnowledge(model=model, spec=spec, batch_size=2, labels=y) for _ in updates]
    plain = InvertingGradients(iterations=150).reconstruct_batch(updates, kns)
    s_plain = sum(_ssim(spec, r.images, xu) for r in plain) / len(plain)
    decoded = MixupDecoding(iterations=150, joint=True).reconstruct_batch(updates, kns)
    s_decoded = _ssim(spec, decoded[0].images, xu)
    assert s_plain < 0.9 and 0.5 < s_decoded < s_plain, (s_plain, s_decoded)


@pytest.mark.parametrize("scheme", ["mixup", "instahide", "instahide-public"])
def test_the_decoded_images_get_their_own_labels(scheme):
    """Without knowledge.labels, MixupDecoding labels decoded image j from the soft labels by solving
    ``M Z = soft * rowsum(M)``; it used to take encoding j's arg-max (its largest coefficient, often
    below 0.5, belongs to another image): ~1/3 of the labels were wrong."""
    from leakgym.attacks.mixup_decoding import _demixed_labels

    wrong_before = 0
    for seed in range(6):
        x, y = _batch(8, seed=seed)
        g = torch.Generator().manual_seed(seed)
        if scheme == "mixup":
            _, soft, info = mixup_encode(x, y, k=2, num_classes=10, generator=g)
        else:
            public = torch.randn(5, 1, 8, 8, generator=g) if scheme == "instahide-public" else None
            _, soft, info = instahide_encode(x, y, k=4, num_classes=10, generator=g, public_x=public)
        mixing = info["mixing_matrix"].double()
        labels = _demixed_labels((scheme, mixing, soft.double(), None))
        assert labels.tolist() == y.tolist()
        wrong_before += int((soft.argmax(dim=1) != y).sum())
    assert wrong_before > 0  # the old rule is wrong on these batches


def test_mixup_decoding_infers_labels_with_its_label_method():
    """On an unencoded update MixupDecoding inferred labels with the default method whatever its
    ``label_method`` (four images of one class: 'yin' and the count-based default disagree)."""
    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.attacks.labels import infer_labels
    from leakgym.attacks.mixup_decoding import MixupDecoding
    from leakgym.data import load_dataset
    from leakgym.fl.client import compute_update
    from leakgym.models import build_model

    data = load_dataset("digits", image_size=16)
    spec = data.spec
    model = build_model("lenet", spec, seed=0)
    rows = (data.test_y == 3).nonzero().flatten()[:4]
    update = compute_update(model, spec.normalize(data.test_x[rows]), data.test_y[rows])
    knowledge = AttackerKnowledge(model=model, spec=spec, batch_size=4)
    yin = infer_labels(update, knowledge, method="yin").tolist()
    assert yin != infer_labels(update, knowledge).tolist()  # the case tells the methods apart
    out = MixupDecoding(iterations=1, decode_steps=1, label_method="yin").reconstruct(update, knowledge)
    assert sorted(out.labels.tolist()) == sorted(yin)


@pytest.mark.parametrize("mixing", ["mixup_k", "instahide_k"])
def test_mixup_decoding_inverts_an_oasis_enlarged_mix_as_unencoded(mixing, cheap_overrides):
    """Found in an audit: Mixup or InstaHide after OASIS mixes the enlarged batch (the originals and their
    copies: a (4, 4) matrix for 2 images and one flip), and every round against mixup-decoding failed with
    "mixing_matrix has shape (4, 4); expected (2, 2)". The attack now inverts such an update as an unencoded
    one, as Inverting Gradients does against OASIS."""
    import numpy as np

    from leakgym.envs import parallel_env

    overrides = {k: v for k, v in cheap_overrides.items() if k not in ("strategies", "rounds")}
    env = parallel_env("digits", defender_menu={mixing: [0, 2]}, oasis_bits=["hflip"], batch_size=2, rounds=2,
                       strategies=["mixup-decoding"], attack_defaults={"decode_steps": 2}, **overrides)
    env.reset(seed=0)
    defender = np.ones(len(env.action_space("defender").nvec), dtype=np.int64)  # Mixup/InstaHide 2 and the flip
    _, rewards, *_ = env.step({"defender": defender,
                                      "attacker": np.zeros(len(env.action_space("attacker").nvec), dtype=np.int64)})
    applied = env.round_details("defender")["defenses"]
    assert len(applied) == 2 and "oasis" in applied, applied
    assert all(np.isfinite(r) for r in rewards.values())

"""Input encodings that mix images: Mixup and InstaHide.

Both encode a private batch before the client computes its update, so the shared gradient is the
gradient of *encoded* images with *soft* labels.

* **Mixup** (Zhang et al. 2018, used as a privacy baseline by Huang et al. 2020/2021 and by LODA,
  Wan et al., Sec. 5.1): every private image is mixed with ``k - 1`` other images of the same batch,
  ``E_i = sum_s lambda_{i,s} x_{j(i,s)}``, and its label with the same coefficients.
* **InstaHide** (Huang, Song, Li & Arora, ICML 2020; LODA Eq. 2): Mixup followed by a random
  pixel-wise sign flip ``sigma``, ``E(X) = sigma(M X)``. *Inside-dataset* InstaHide mixes private
  images only; *cross-dataset* InstaHide mixes the private image with one other private image and
  ``k - 2`` public (unlabelled) images, and mixes only the private labels.

Coefficients follow the Mixup/InstaHide baselines of Huang et al. 2021 (the GradAttack code that
the LODA paper's k=4/k=6 settings follow): ``lambda ~ Dirichlet(3, 1, ..., 1)``, resampled until
no single coefficient exceeds :data:`UPPER_BOUND` = 0.65 (InstaHide's bound on a single
coefficient). The large-concentration slot 0 always holds the encoded image itself, so each
encoding is "for" one private image and its largest component is usually that image (the
comparison LODA uses to score Mixup/InstaHide without the adaptive attack).

Images are the normalised model inputs (``(x - mean) / std``); the sign flip acts on them, as
InstaHide flips the signs of its zero-centred pixels.

The returned ``info`` dict holds the encoding's secret: the coefficients, the indices of the mixed
images, the dense mixing matrix ``M`` (``E = M X`` before the sign flip) and, for InstaHide, the
sign mask. :class:`leakgym.attacks.mixup_decoding.MixupDecoding` assumes an attacker who knows
``M`` (but never the sign mask), as in Huang et al. 2021's decoding evaluation.

The registered defenses :data:`MIXUP` (field ``mixup_k``) and :data:`INSTAHIDE` (``instahide_k``)
encode the private batch (input stage, free in the cost model) and attach the encoding to the shared
update as ``metadata["encoding"]``: the scheme, the mixing matrix ``M``, the soft labels and, for
cross-dataset InstaHide, the public matrix. That is the *upper-bound* threat model of the decoding
attack (GradAttack's evaluation, :mod:`leakgym.attacks.mixup_decoding`): an attacker that estimated
``M`` perfectly. Sign masks and per-pixel coefficients stay secret. InstaHide is cross-dataset when
the client has a public split (``public_x`` given to the pipeline), inside-dataset otherwise.

Random draws use the generator on its own device (a CUDA generator cannot fill CPU tensors).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from leakgym.defenses.registry import DefenseContext, InputDefense, int_field

#: InstaHide's upper bound on a single mixing coefficient (Huang et al. 2020; GradAttack default).
UPPER_BOUND = 0.65
#: Dirichlet concentration of the encoded image's own coefficient (others get 1.0), as in GradAttack.
OWN_CONCENTRATION = 3.0


def _validate(x: Tensor, y: Tensor, k: int, num_classes: int) -> None:
    if x.ndim != 4:
        raise ValueError(f"x must be (N, C, H, W); got shape {tuple(x.shape)}")
    if y.ndim != 1 or y.shape[0] != x.shape[0] or y.dtype != torch.int64:
        raise ValueError(f"y must be int64 of shape ({x.shape[0]},); got {y.dtype} {tuple(y.shape)}")
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes}; must be >= 2")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes - 1}]; got [{int(y.min())}, {int(y.max())}]")
    if k < 1:
        raise ValueError(f"k={k}; must be >= 1")


def sample_coefficients(n: int, k: int, generator: torch.Generator) -> Tensor:
    """``n`` rows of ``k`` mixing coefficients: Dirichlet(3, 1, ..., 1), max <= 0.65, rows sum to 1.

    ``torch.distributions.Dirichlet`` takes no generator, so a NumPy generator is seeded from
    ``generator`` (the only randomness consumed), keeping the draw reproducible from it.
    """
    if k == 1:
        return torch.ones(n, 1)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    rng = np.random.default_rng(seed)
    alpha = np.ones(k)
    alpha[0] = OWN_CONCENTRATION
    lams = rng.dirichlet(alpha, size=n)
    for i in range(n):
        while lams[i].max() > UPPER_BOUND:
            lams[i] = rng.dirichlet(alpha)
    return torch.from_numpy(lams).float()


def _pick_others(n: int, i: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` distinct indices of ``range(n)`` other than ``i``, uniformly at random."""
    others = [j for j in range(n) if j != i]
    perm = torch.randperm(len(others), generator=generator, device=generator.device)[:count].tolist()
    return [others[p] for p in perm]


def mixup_encode(
    x: Tensor, y: Tensor, *, k: int, num_classes: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, dict]:
    """Mixup of ``k`` images of the batch per encoding; soft labels out.

    Args:
        x: ``(B, C, H, W)`` normalised images.
        y: ``(B,)`` int64 labels.
        k: images per mix, ``1 <= k <= B`` (``k = 1`` is the identity).
        num_classes: label space size.
        generator: the source of all randomness.

    Returns:
        ``(x_enc, y_soft, info)``: encoded images ``(B, C, H, W)``, soft labels
        ``(B, num_classes)`` (rows sum to 1) and ``info`` with ``coefficients`` ``(B, k)``,
        ``indices`` ``(B, k)`` (column 0 is the image itself), ``mixing_matrix`` ``(B, B)``.
    """
    _validate(x, y, k, num_classes)
    b = x.shape[0]
    if k > b:
        raise ValueError(f"k={k}; inside-batch Mixup needs 1 <= k <= batch size {b}")
    lams = sample_coefficients(b, k, generator).to(device=x.device, dtype=x.dtype)
    idx = torch.tensor(
        [[i] + _pick_others(b, i, k - 1, generator) for i in range(b)], dtype=torch.long, device=x.device
    ).reshape(b, k)
    mixing = torch.zeros(b, b, dtype=x.dtype, device=x.device)
    mixing.scatter_add_(1, idx, lams)
    x_enc = torch.einsum("ij,jchw->ichw", mixing, x)
    onehot = torch.nn.functional.one_hot(y, num_classes).to(x.dtype)
    y_soft = mixing @ onehot
    info = {"coefficients": lams, "indices": idx, "mixing_matrix": mixing}
    return x_enc, y_soft, info


def random_signs(shape: torch.Size | tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """A uniformly random ``{-1, +1}`` mask (InstaHide's ``sigma``)."""
    bits = torch.randint(0, 2, tuple(shape), generator=generator, device=generator.device)
    return (bits * 2 - 1).to(device=like.device, dtype=like.dtype)


def instahide_encode(
    x: Tensor,
    y: Tensor,
    *,
    k: int,
    num_classes: int,
    generator: torch.Generator,
    public_x: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """InstaHide (Huang et al. 2020; LODA Eq. 2): mix ``k`` images, then flip pixel signs at random.

    Inside-dataset (``public_x is None``): the Mixup of :func:`mixup_encode` followed by a uniform
    pixel-wise sign flip. Cross-dataset (``public_x`` given, normalised like ``x``): the private
    image, one other private image (when ``k >= 3`` and the batch has one) and the remaining
    ``k - 1 - (#other private)`` images drawn from ``public_x``; the soft label mixes the private
    labels only, renormalised to sum to 1 (public images are unlabelled).

    Returns:
        ``(x_enc, y_soft, info)``; ``info`` has ``coefficients``, ``indices`` (into the batch, -1
        for public slots), ``public_indices`` (into ``public_x``, -1 for private slots),
        ``mixing_matrix`` ``(B, B)``, ``public_matrix`` ``(B, P)`` (cross-dataset only) and
        ``signs`` ``(B, C, H, W)`` with entries exactly ``+-1``.
    """
    _validate(x, y, k, num_classes)
    if public_x is None:
        x_mix, y_soft, info = mixup_encode(x, y, k=k, num_classes=num_classes, generator=generator)
        info["public_indices"] = torch.full_like(info["indices"], -1)
    else:
        if public_x.ndim != 4 or public_x.shape[1:] != x.shape[1:]:
            raise ValueError(
                f"public_x must be (P, {', '.join(map(str, x.shape[1:]))}); got {tuple(public_x.shape)}"
            )
        b, p = x.shape[0], public_x.shape[0]
        n_pub = public_images_per_mix(k, b)
        n_other = k - 1 - n_pub
        if n_pub > p:
            raise ValueError(f"k={k} needs {n_pub} public images per mix; public_x has {p}")
        lams = sample_coefficients(b, k, generator).to(device=x.device, dtype=x.dtype)
        priv_idx = torch.full((b, k), -1, dtype=torch.long, device=x.device)
        pub_idx = torch.full((b, k), -1, dtype=torch.long, device=x.device)
        for i in range(b):
            priv_idx[i, 0] = i
            if n_other:
                priv_idx[i, 1] = _pick_others(b, i, 1, generator)[0]
            if n_pub:
                pub_idx[i, 1 + n_other :] = torch.randperm(p, generator=generator, device=generator.device)[:n_pub].to(x.device)
        mixing = torch.zeros(b, b, dtype=x.dtype, device=x.device)
        public_matrix = torch.zeros(b, p, dtype=x.dtype, device=x.device)
        is_priv = priv_idx >= 0
        mixing.scatter_add_(1, priv_idx.clamp(min=0), lams * is_priv)
        public_matrix.scatter_add_(1, pub_idx.clamp(min=0), lams * ~is_priv)
        x_mix = torch.einsum("ij,jchw->ichw", mixing, x) + torch.einsum("ij,jchw->ichw", public_matrix, public_x)
        onehot = torch.nn.functional.one_hot(y, num_classes).to(x.dtype)
        y_soft = mixing @ onehot
        y_soft = y_soft / y_soft.sum(dim=1, keepdim=True)
        info = {
            "coefficients": lams,
            "indices": priv_idx,
            "public_indices": pub_idx,
            "mixing_matrix": mixing,
            "public_matrix": public_matrix,
        }
    signs = random_signs(x_mix.shape, generator, x_mix)
    info["signs"] = signs
    return x_mix * signs, y_soft, info


def _attach_encoding(ctx: DefenseContext, scheme: str, info: dict, labels: Tensor) -> None:
    """Put the encoding on the shared update for the decoding attack's upper-bound threat model."""
    ctx.metadata["encoding"] = {
        "scheme": scheme,
        "mixing_matrix": info["mixing_matrix"].detach(),
        "labels": labels.detach(),
        **({"public_matrix": info["public_matrix"].detach()} if "public_matrix" in info else {}),
    }


def _check_k(config, name: str) -> None:
    if getattr(config, name) == 1:
        raise ValueError(f"DefenseConfig.{name}=1 mixes nothing; allowed: 0 (off) or an integer >= 2")


class Mixup(InputDefense):
    """Inside-batch Mixup of ``mixup_k`` images per encoded example."""

    name = "mixup"
    public_split = False
    fields = (int_field("mixup_k", 0, "Mixup encoding: images mixed per encoded example; 0 off.",
                        limit_option="batch_size",
                        limit_why="mixes up to k images of the private batch; needs k <= batch_size"),)

    def validate(self, config) -> None:
        _check_k(config, "mixup_k")

    def apply(self, ctx: DefenseContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, dict]:
        x_enc, y_soft, info = mixup_encode(x, y, k=ctx.config.mixup_k, num_classes=ctx.spec.num_classes,
                                           generator=ctx.generator)
        _attach_encoding(ctx, "mixup", info, y_soft)
        return x_enc, y_soft, info


def public_images_per_mix(k: int, batch_size: int) -> int:
    """How many public images :func:`instahide_encode` mixes into each encoded example: ``k - 1``, less one
    private image where ``k >= 3`` and the batch holds another."""
    return max(0, k - 1 - (1 if k >= 3 and batch_size >= 2 else 0))


def _public_images_suffice(k: int, scenario) -> str | None:
    """A scenario's InstaHide k may mix no more public images than its split holds."""
    needed, held = public_images_per_mix(k, scenario.batch_size), scenario.public_images
    if needed > held:
        return (f"mixes {needed} public images into each example (k={k}, batch_size={scenario.batch_size}); "
                f"the public split holds {held}")
    return None


class InstaHide(InputDefense):
    """InstaHide: Mixup of ``instahide_k`` images, then a random pixel-wise sign flip."""

    name = "instahide"
    fields = (int_field("instahide_k", 0, "InstaHide encoding: images mixed per encoded example (InstaHide paper: 4); "
                        "0 off.", scenario_check=_public_images_suffice),)

    def validate(self, config) -> None:
        _check_k(config, "instahide_k")
        if config.mixup_k and config.instahide_k:
            raise ValueError(
                f"DefenseConfig.mixup_k={config.mixup_k} and instahide_k={config.instahide_k}: InstaHide already "
                "is a Mixup encoding; set at most one of them > 0"
            )

    def apply(self, ctx: DefenseContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, dict]:
        x_enc, y_soft, info = instahide_encode(x, y, k=ctx.config.instahide_k, num_classes=ctx.spec.num_classes,
                                               generator=ctx.generator, public_x=ctx.public_x)
        _attach_encoding(ctx, "instahide", info, y_soft)
        return x_enc, y_soft, info


MIXUP = Mixup()
INSTAHIDE = InstaHide()

"""OASIS: augmented copies of every private image added to the batch (Jeter et al., 2023).

"OASIS: Offsetting Active Reconstruction Attacks in Federated Learning", §III-B Eq. (7): the client
trains on ``D' = D ∪ ⋃_t X'_t``, where ``X'_t`` holds transformations of image ``x_t`` that carry
``x_t``'s label. A neuron that an active (or passive) attacker isolates for ``x_t`` is then also
activated by its transformations, so what the attacker recovers is a linear combination of ``x_t``
and its transforms rather than ``x_t``.

Transformations (§II-B Eqs. (2)-(5); settings of §IV-A), selected by an integer bit mask:

====  ================  =====================================================================
bit   name              copies per image
====  ================  =====================================================================
1     major rotation    rotations by 90°, 180°, 270° (``torch.rot90``: exact pixel permutation)
2     minor rotation    rotations by 30°, 45°, 60° (``kornia.geometry.transform.rotate``,
                        bilinear, about the image centre)
4     shear             Eq. (5) ``I'(i, j) = I(i + mu j, j)`` for mu in {0.55, 1.0, 0.9}
                        (``kornia.geometry.transform.shear``, bilinear, about pixel (0, 0))
8     horizontal flip   Eq. (3) ``I'(i, j) = I(-i, j)`` (``torch.flip`` on the width axis: exact)
16    vertical flip     Eq. (4) ``I'(i, j) = I(i, -j)`` (``torch.flip`` on the height axis: exact)
====  ================  =====================================================================

A mask with several bits ("Major Rotation + Shearing", §IV-B/C) adds the copies of each selected
transformation: the union of the per-transformation sets. The augmented batch is laid out as
``[x; T_1(x); T_2(x); ...]`` — the originals first, then for each transformation (bit order, then
angle/factor order) one copy of every image — and labels are repeated accordingly.

Rotations by multiples of 90° and flips must be exact: kornia's ``rotate`` resamples on a grid and
would blur even a 90° turn, so those use ``torch.rot90``/``torch.flip``. Interpolated transforms
(minor rotation, shear) fill the area that enters the frame with *black* (unit value 0, i.e. the
normalised value ``-mean/std``), as torchvision/kornia do on unnormalised images; this is why the
dataset spec (``fill``) is a parameter.

The registered defense :data:`OASIS` (field ``oasis``, the mask; input stage) augments the private
batch before any gradient. Its cost is ``copies_per_image(mask)`` clean-gradient units: the batch
grows by that many copies of every image, one extra batch gradient each.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from leakgym.defenses.registry import BitMenu, DefenseContext, InputDefense, int_field

MAJOR_ROTATION, MINOR_ROTATION, SHEAR, HFLIP, VFLIP = 1, 2, 4, 8, 16
ALL_BITS = MAJOR_ROTATION | MINOR_ROTATION | SHEAR | HFLIP | VFLIP
BIT_NAMES: dict[int, str] = {
    MAJOR_ROTATION: "major_rotation",
    MINOR_ROTATION: "minor_rotation",
    SHEAR: "shear",
    HFLIP: "hflip",
    VFLIP: "vflip",
}
#: Paper settings (§IV-A).
MAJOR_ANGLES = (90, 180, 270)
MINOR_ANGLES = (30.0, 45.0, 60.0)
SHEAR_FACTORS = (0.55, 1.0, 0.9)


def copies_per_image(mask: int) -> int:
    """How many augmented copies of each image ``mask`` adds."""
    _check_mask(mask)
    counts = {MAJOR_ROTATION: 3, MINOR_ROTATION: 3, SHEAR: 3, HFLIP: 1, VFLIP: 1}
    return sum(c for bit, c in counts.items() if mask & bit)


def _check_mask(mask: int) -> None:
    if not isinstance(mask, int) or isinstance(mask, bool) or not (0 <= mask <= 31):
        raise ValueError(f"OASIS mask={mask!r}; allowed: integers in [0, 31] "
                         "(1 major rotation, 2 minor rotation, 4 shear, 8 hflip, 16 vflip)")


def _with_fill(fn, x: Tensor, fill: Tensor | None) -> Tensor:
    """Apply a zero-padding warp so that padded pixels take the value ``fill`` instead of 0."""
    if fill is None:
        return fn(x)
    fill = fill.to(x).view(1, -1, 1, 1)
    return fn(x - fill) + fill


def augment(x: Tensor, y: Tensor, mask: int, *, fill: Tensor | None = None) -> tuple[Tensor, Tensor, list[str]]:
    """The OASIS batch of Eq. (7).

    Args:
        x: images ``(B, C, H, W)`` (normalised model inputs).
        y: labels ``(B,)`` (hard) or ``(B, K)`` (soft); copies get their original's label.
        mask: bit mask of transformations (module docstring); 0 returns the batch unchanged.
        fill: per-channel value of the area an interpolated warp brings into the frame; ``None``
            pads with 0. :func:`black_fill` gives the normalised value of black.

    Returns:
        ``(x_aug, y_aug, names)``: ``(B * (1 + copies), ...)`` tensors laid out originals first,
        and the name of the transformation of every block of ``B`` rows after the originals
        (e.g. ``"major_rotation:90"``).
    """
    import kornia.geometry.transform as KT  # lazy: kornia is only needed when OASIS is on

    _check_mask(mask)
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W), got shape {tuple(x.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y has {y.shape[0]} entries but x has {x.shape[0]} images")
    b = x.shape[0]
    blocks: list[Tensor] = [x]
    names: list[str] = []
    if mask & MAJOR_ROTATION:
        if x.shape[-1] != x.shape[-2]:
            raise ValueError(f"major rotation needs square images, got {tuple(x.shape[-2:])}")
        for angle in MAJOR_ANGLES:
            # rot90 with k turns counter-clockwise by k * 90 degrees (dims = (H, W)): exact.
            blocks.append(torch.rot90(x, k=angle // 90, dims=(-2, -1)))
            names.append(f"major_rotation:{angle}")
    if mask & MINOR_ROTATION:
        for angle in MINOR_ANGLES:
            a = torch.full((b,), angle, dtype=x.dtype, device=x.device)
            blocks.append(_with_fill(partial(KT.rotate, angle=a, mode="bilinear", padding_mode="zeros"), x, fill))
            names.append(f"minor_rotation:{angle:g}")
    if mask & SHEAR:
        for mu in SHEAR_FACTORS:
            # Eq. (5) samples the input at (i + mu j, j); kornia's factors move *points* by
            # x_out = x + shx * y, i.e. sample the input at x_out - shx * y, hence shx = -mu.
            s = torch.tensor([[-mu, 0.0]], dtype=x.dtype, device=x.device).expand(b, 2)
            blocks.append(_with_fill(partial(KT.shear, shear=s, mode="bilinear", padding_mode="zeros"), x, fill))
            names.append(f"shear:{mu:g}")
    if mask & HFLIP:
        blocks.append(torch.flip(x, dims=(-1,)))
        names.append("hflip")
    if mask & VFLIP:
        blocks.append(torch.flip(x, dims=(-2,)))
        names.append("vflip")
    x_aug = torch.cat(blocks, dim=0)
    y_aug = torch.cat([y] * len(blocks), dim=0)
    return x_aug, y_aug, names


def black_fill(mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """Normalised value of a black (unit 0) pixel per channel: ``-mean / std``."""
    return torch.tensor([-m / s for m, s in zip(mean, std)], dtype=torch.float32)



class Oasis(InputDefense):
    """OASIS Eq. (7): the private batch plus the selected augmented copies of every image."""

    name = "oasis"
    public_split = False
    fields = (int_field("oasis", 0, "OASIS augmentation bit mask: 1 major rotation, 2 minor rotation, 4 shear, "
                        "8 hflip, 16 vflip; 0 off.", low=0, high=ALL_BITS,
                        # a scenario offers one on/off action dimension per augmentation named in oasis_bits
                        bit_menu=BitMenu("oasis_bits", {name: bit for bit, name in BIT_NAMES.items()},
                                         default=("major_rotation", "hflip"), what="OASIS augmentation")),)

    def apply(self, ctx: DefenseContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, dict]:
        mask = ctx.config.oasis
        x_aug, y_aug, names = augment(x, y, mask, fill=black_fill(ctx.spec.mean, ctx.spec.std))
        return x_aug, y_aug, {"mask": mask, "copies_per_image": copies_per_image(mask), "transforms": names}

    def cost(self, config) -> float:
        return float(copies_per_image(config.oasis))


OASIS = Oasis()

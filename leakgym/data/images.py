"""Image tensor helpers: uint8 -> unit float, resizing, and mapping model inputs back to ``[0, 1]``."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from leakgym.data.spec import DatasetSpec

__all__ = ["resize_images", "to_unit_images", "uint8_to_unit"]


def uint8_to_unit(images: np.ndarray) -> Tensor:
    """uint8 pixels ``(N, C, H, W)`` or ``(N, H, W)`` -> float32 ``(N, C, H, W)`` in ``[0, 1]``."""
    if images.dtype != np.uint8:
        raise ValueError(f"uint8_to_unit: expected uint8 pixels, got {images.dtype}")
    x = torch.from_numpy(np.ascontiguousarray(images))
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"uint8_to_unit: expected (N, H, W) or (N, C, H, W), got shape {tuple(x.shape)}")
    return x.to(torch.float32).div_(255.0)


def resize_images(x: Tensor, size: int, *, chunk: int = 4096) -> Tensor:
    """Resize unit images ``(N, C, H, W)`` to ``(N, C, size, size)``, clamped to ``[0, 1]``.

    Bilinear interpolation with antialiasing (``F.interpolate(..., antialias=True)``, the same filter
    as ``torchvision.transforms.Resize``'s default): when shrinking, the kernel is widened to the
    output pixel footprint so high frequencies are averaged rather than aliased; when enlarging, it
    is plain bilinear interpolation. Images already at ``size`` are returned unchanged.
    Work is done in chunks of ``chunk`` images to bound peak memory.
    """
    if x.dim() != 4:
        raise ValueError(f"resize_images: expected (N, C, H, W), got shape {tuple(x.shape)}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"resize_images: size={size!r} must be an integer >= 2")
    if x.shape[-2:] == (size, size):
        return x
    if x.shape[0] == 0:
        return x.new_empty((0, x.shape[1], size, size))
    parts = [
        F.interpolate(part, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        for part in x.split(chunk)
    ]
    return torch.cat(parts).clamp_(0.0, 1.0)


def to_unit_images(x: Tensor, spec: DatasetSpec) -> Tensor:
    """Model inputs (normalised with ``spec``) -> unit images clamped to ``[0, 1]``.

    ``spec.denormalize`` followed by a clamp: what metrics and pictures consume.
    """
    return spec.denormalize(x).clamp(0.0, 1.0)

"""Dataset descriptions: shape, class count and normalisation statistics."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor


@functools.lru_cache(maxsize=64)
def _channel_stats(mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype,
                   device: torch.device) -> tuple[Tensor, Tensor]:
    """``(1, C, 1, 1)`` mean and std tensors, made once per dtype and device (a vector step normalises
    every game's images; on a GPU each fresh ``torch.tensor`` is a host-to-device copy). Read-only."""
    shape = (1, -1, 1, 1)
    return (torch.tensor(mean, dtype=dtype, device=device).view(shape),
            torch.tensor(std, dtype=dtype, device=device).view(shape))


@dataclass(frozen=True)
class DatasetSpec:
    """Everything a model, attack or metric needs to know about a dataset's images.

    Images handed around the library are *unit* images in ``[0, 1]``; models consume *normalised*
    images ``(x - mean) / std`` with the per-channel statistics here.
    """

    name: str
    channels: int
    image_size: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(
                f"DatasetSpec {self.name!r}: mean/std need {self.channels} entries, "
                f"got {len(self.mean)} and {len(self.std)}"
            )
        if not all(math.isfinite(s) and s > 0 for s in self.std):  # NaN fails `s <= 0` too
            raise ValueError(f"DatasetSpec {self.name!r}: std={self.std} must be finite and > 0")
        if not all(math.isfinite(m) for m in self.mean):
            raise ValueError(f"DatasetSpec {self.name!r}: mean={self.mean} must be finite")
        for field_name in ("channels", "image_size", "num_classes"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DatasetSpec {self.name!r}: {field_name}={value!r} must be an integer >= 1")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def _stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if not x.is_floating_point():  # uint8 statistics round std to 0: every pixel would become inf
            raise ValueError(f"DatasetSpec {self.name!r}: images must be floating point (unit images in [0, 1]), "
                             f"got dtype {x.dtype}")
        if torch.is_inference_mode_enabled():  # inference tensors must not be cached: autograd rejects them later
            return _channel_stats.__wrapped__(tuple(self.mean), tuple(self.std), x.dtype, x.device)
        return _channel_stats(tuple(self.mean), tuple(self.std), x.dtype, x.device)

    def normalize(self, x_unit: Tensor) -> Tensor:
        """Unit images in [0, 1] -> model inputs."""
        mean, std = self._stats(x_unit)
        return (x_unit - mean) / std

    def denormalize(self, x: Tensor) -> Tensor:
        """Model inputs -> unit images (not clamped; metrics and pictures clamp to [0, 1])."""
        mean, std = self._stats(x)
        return x * std + mean

    def unit_bounds(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """Per-channel bounds of valid normalised images (the box constraint of attacks)."""
        mean, std = self._stats(like)
        return (0 - mean) / std, (1 - mean) / std

"""Dataset descriptions: shape, class count and normalisation statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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
        if any(s <= 0 for s in self.std):
            raise ValueError(f"DatasetSpec {self.name!r}: std={self.std} must be > 0")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def _stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return mean, std

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

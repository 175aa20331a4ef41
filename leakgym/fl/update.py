"""The shared update: the only thing a federated client sends to the server each round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

UpdateKind = Literal["gradient", "model_delta"]


@dataclass
class SharedUpdate:
    """What the victim client shares with the server in one round.

    ``tensors`` maps parameter names (as in ``model.named_parameters()``) to either the gradient of
    the training loss (FedSGD, ``kind="gradient"``) or the model difference ``w_before - w_after``
    after ``local_steps`` SGD steps with learning rate ``local_lr`` (FedAvg, ``kind="model_delta"``).
    The model difference is signed like a gradient so that the server applies both the same way.
    """

    tensors: dict[str, Tensor]
    kind: UpdateKind = "gradient"
    batch_size: int = 1
    local_steps: int = 1
    local_lr: float = 0.0
    buffers: dict[str, Tensor] | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("gradient", "model_delta"):
            raise ValueError(f"SharedUpdate.kind={self.kind!r}; allowed: 'gradient', 'model_delta'")
        if self.batch_size < 1:
            raise ValueError(f"SharedUpdate.batch_size={self.batch_size}; must be >= 1")

    def flat(self) -> Tensor:
        """All tensors concatenated into one vector (in ``tensors`` order)."""
        return torch.cat([t.reshape(-1) for t in self.tensors.values()])

    def names(self) -> list[str]:
        return list(self.tensors)

    def to(self, device: torch.device | str) -> SharedUpdate:
        return SharedUpdate(
            tensors={k: v.to(device) for k, v in self.tensors.items()},
            kind=self.kind,
            batch_size=self.batch_size,
            local_steps=self.local_steps,
            local_lr=self.local_lr,
            buffers=None if self.buffers is None else {k: v.to(device) for k, v in self.buffers.items()},
            metadata=dict(self.metadata),
        )

    def detached(self) -> SharedUpdate:
        return SharedUpdate(
            tensors={k: v.detach().clone() for k, v in self.tensors.items()},
            kind=self.kind,
            batch_size=self.batch_size,
            local_steps=self.local_steps,
            local_lr=self.local_lr,
            buffers=None if self.buffers is None else {k: v.detach().clone() for k, v in self.buffers.items()},
            metadata=dict(self.metadata),
        )


def cosine_similarity(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """Cosine between two updates over their common parameter names (0 when either is zero)."""
    names = [k for k in a if k in b]
    va = torch.cat([a[k].reshape(-1).double() for k in names])
    vb = torch.cat([b[k].reshape(-1).double() for k in names])
    denom = va.norm() * vb.norm()
    return float((va @ vb) / denom) if denom > 0 else 0.0

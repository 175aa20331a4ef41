"""The attack interface: what every gradient-inversion attack takes and returns.

An attack consumes plain data — the victim's :class:`~leakgym.fl.update.SharedUpdate` and the
server's :class:`AttackerKnowledge` — and produces an :class:`AttackResult`. Attacks never see the
private batch. Malicious-server attacks additionally get to modify the model before the round
through :meth:`Attack.prepare_model`.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from leakgym.data import DatasetSpec
from leakgym.fl.update import SharedUpdate


@dataclass
class AttackerKnowledge:
    """What the server knows when it attacks one client's update."""

    model: nn.Module
    spec: DatasetSpec
    batch_size: int
    labels: Tensor | None = None
    bn_stats: list[tuple[Tensor, Tensor]] | None = None
    public_x: Tensor | None = None
    public_y: Tensor | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"AttackerKnowledge.batch_size={self.batch_size}; must be >= 1")
        if self.labels is not None and self.labels.shape[0] != self.batch_size:
            raise ValueError(
                f"AttackerKnowledge.labels has {self.labels.shape[0]} entries; batch_size is {self.batch_size}"
            )


@dataclass
class AttackCost:
    """The budget an attack spent: optimisation iterations x restarts, and wall time."""

    iterations: int
    restarts: int
    wall_time_s: float

    @property
    def units(self) -> int:
        """Iterations x restarts: the budget unit the environment charges for."""
        return self.iterations * self.restarts


@dataclass
class AttackResult:
    """Reconstructed images (normalised space), inferred labels, cost and per-iteration statistics."""

    images: Tensor
    labels: Tensor
    cost: AttackCost
    history: dict[str, list[float]] = field(default_factory=dict)
    final_loss: float = float("nan")


class Attack(ABC):
    """Base class: a config dataclass plus :meth:`reconstruct_batch`.

    Subclasses set ``name`` and ``Config`` and implement :meth:`_reconstruct_batch`. The base class
    validates inputs, times the call and fills in the wall time of every result.
    """

    name: ClassVar[str] = "attack"
    Config: ClassVar[type] = object
    #: True for attacks that modify the model before the round (malicious server).
    malicious: ClassVar[bool] = False

    def __init__(self, config: Any | None = None, **overrides: Any) -> None:
        if config is None:
            config = self.Config()
        if overrides:
            known = {f.name for f in dataclasses.fields(config)}
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise ValueError(
                    f"unknown option(s) {unknown} for attack {self.name!r}; allowed: {sorted(known)}"
                )
            config = dataclasses.replace(config, **overrides)
        self.config = config

    # -- malicious servers -------------------------------------------------------------------
    def prepare_model(self, model: nn.Module, spec: DatasetSpec, *, public_x: Tensor | None = None) -> nn.Module:
        """Return the model the server sends to clients. Honest attacks send it unchanged.

        ``public_x`` (unit images of the public split) lets a malicious server calibrate the
        layers it inserts.
        """
        return model

    # -- reconstruction ----------------------------------------------------------------------
    def reconstruct(self, update: SharedUpdate, knowledge: AttackerKnowledge, *, seed: int = 0) -> AttackResult:
        return self.reconstruct_batch([update], [knowledge], seed=seed)[0]

    def reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seed: int = 0
    ) -> list[AttackResult]:
        """Run N independent reconstructions (one per update) as one computation."""
        if len(updates) != len(knowledges):
            raise ValueError(f"got {len(updates)} updates but {len(knowledges)} knowledges; they must pair up")
        if not updates:
            return []
        start = time.perf_counter()
        results = self._reconstruct_batch(updates, knowledges, seed=seed)
        elapsed = time.perf_counter() - start
        for r in results:
            # Wall time of a batched call is shared by its N problems.
            r.cost.wall_time_s = elapsed / len(results)
        return results

    @abstractmethod
    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seed: int
    ) -> list[AttackResult]:
        """The attack's own maths: N reconstructions, wall time filled in by the caller."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g

"""What every problem minimises, and with which budget and optimiser.

For a victim update ``t`` the objective is (Geiping et al. 2020, Eq. 4; Yin et al. 2021, Eq. 3)

    D(U(theta, x, y), t) + sum_k alpha_k R_k(x)

with ``D`` a gradient distance and ``R_k`` image priors (:mod:`leakgym.attacks.losses`).
:class:`MatchingObjective` chooses them; :func:`matching_term` and :func:`objective_terms` evaluate
them for ``P`` problems at once. With a :data:`DefenseSimulator` the matching term is Expectation over
Transformation (CENSOR paper, Zhang et al. 2025, Sec. V-D): the attacker applies E random draws of
the defense to its own dummy updates and matches their mean (or averages the E distances).
:class:`Schedule` is the optimiser and budget; :class:`PerProblem` lets the problems of one engine call
differ in budget (iterations, restarts), learning rate and TV weight, so that games choosing different
budgets of one attack still make one engine call.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from leakgym.attacks.base import check_integer
from leakgym.attacks.losses import (
    LAYER_WEIGHT_SCHEMES,
    bn_statistics_loss,
    gradient_distance,
    group_consistency,
    l2_prior,
    total_variation,
)
from leakgym.optim.randomness import BatchedGenerator

#: ``simulate_defense(grads, generator) -> grads``: a randomised transformation applied to the
#: attacker's dummy updates (EOT). ``grads`` maps names to ``(P, *shape)`` tensors (one row per
#: problem x restart); ``generator`` is a :class:`~leakgym.optim.randomness.BatchedGenerator`
#: whose draws have the same ``P`` rows, each block from its own problem's generator. The callable
#: must draw only from ``generator``, treat rows independently and stay differentiable.
DefenseSimulator = Callable[[dict[str, Tensor], BatchedGenerator], dict[str, Tensor]]


@dataclass(frozen=True)
class MatchingObjective:
    """What each problem minimises: a gradient distance plus weighted image priors."""

    distance: Literal["l2", "cosine"] = "cosine"
    """``"l2"`` (DLG) or ``"cosine"`` (Inverting Gradients); see :func:`~leakgym.attacks.losses.gradient_distance`."""
    layer_weights: str | Mapping[str, float] = "equal"
    """Per-layer weights of the distance: ``"equal"``, ``"linear"``, ``"exp"`` or a name->weight mapping."""
    tv: float = 0.0
    """Weight of the total-variation prior."""
    l2: float = 0.0
    """Weight of the image-norm prior (GradInversion ``R_l2``)."""
    bn: float = 0.0
    """Weight of the BatchNorm-statistics prior (GradInversion ``R_BN``); needs target statistics."""
    group: float = 0.0
    """Weight of the group-consistency prior across restarts (GradInversion ``R_group``)."""
    eot_samples: int = 1
    """Number of samples E of ``simulate_defense`` averaged per evaluation (EOT)."""
    eot_average: Literal["gradient", "objective"] = "gradient"
    """EOT: match the mean of the E simulated updates, or average the E distances."""
    simulate_defense: DefenseSimulator | None = None
    """Randomised defense the attacker simulates on its own dummy updates (None: none)."""

    def __post_init__(self) -> None:
        if self.distance not in ("l2", "cosine"):
            raise ValueError(f"distance={self.distance!r}; allowed: 'l2', 'cosine'")
        if isinstance(self.layer_weights, str) and self.layer_weights not in LAYER_WEIGHT_SCHEMES:
            raise ValueError(f"layer_weights={self.layer_weights!r}; allowed: {LAYER_WEIGHT_SCHEMES} or a mapping")
        for name in ("tv", "l2", "bn", "group"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}={v}; must be a finite number >= 0")
        check_integer(self.eot_samples, "eot_samples", 1)
        if self.eot_average not in ("gradient", "objective"):
            raise ValueError(f"eot_average={self.eot_average!r}; allowed: 'gradient', 'objective'")


@dataclass(frozen=True)
class Schedule:
    """The optimisation budget and optimiser: ``iterations x restarts`` evaluations per victim."""

    iterations: int
    """Optimiser iterations (one objective and gradient evaluation each)."""
    restarts: int = 1
    """Independent restarts per victim, folded into the batch; the best by matching loss is kept."""
    optimizer: Literal["adam", "lbfgs"] = "adam"
    """``"adam"`` (Inverting Gradients, GradInversion) or ``"lbfgs"`` (DLG)."""
    lr: float = 0.1
    """Step size (Adam learning rate; L-BFGS fixed step length as in ``torch.optim.LBFGS``)."""
    signed: bool = False
    """Replace the image gradient by its sign before the Adam step (Inverting Gradients)."""
    lr_decay: bool = False
    """Multiply the Adam learning rate by 0.1 at 3/8, 5/8 and 7/8 of the iterations (Inverting Gradients)."""
    boxed: bool = False
    """Project images onto the valid normalised range after every step (``DatasetSpec.unit_bounds``)."""
    history_size: int = 100
    """L-BFGS memory (pairs kept)."""

    def __post_init__(self) -> None:
        for name in ("iterations", "restarts"):
            check_integer(getattr(self, name), name, 1)
        if self.optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"optimizer={self.optimizer!r}; allowed: 'adam', 'lbfgs'")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr}; must be a finite number > 0")
        check_integer(self.history_size, "history_size", 1)  # 2.5 never equals the stored count: unbounded memory


@dataclass(frozen=True)
class PerProblem:
    """Settings that may differ between the N problems of one engine call (None: the shared value).

    Each field is one value per problem (a sequence or an ``(N,)`` tensor). Problem ``i`` then runs
    ``iterations[i]`` optimiser iterations and ``restarts[i]`` restarts with step size ``lr[i]`` and TV
    weight ``tv[i]``, exactly as it would alone with those values in its :class:`Schedule` and
    :class:`MatchingObjective`: a problem past its budget is frozen (no further update of its images,
    label logits or optimiser state) while the others go on, its learning-rate decay milestones are
    fractions of its own budget, and its restarts are rows of its own.
    """

    iterations: Sequence[int] | Tensor | None = None
    """Optimiser iterations per problem (None: ``Schedule.iterations`` for every problem)."""
    restarts: Sequence[int] | Tensor | None = None
    """Restarts per problem (None: ``Schedule.restarts``)."""
    lr: Sequence[float] | Tensor | None = None
    """Step size per problem (None: ``Schedule.lr``)."""
    tv: Sequence[float] | Tensor | None = None
    """Total-variation weight per problem (None: ``MatchingObjective.tv``)."""

    def resolve(self, n: int, schedule: Schedule, objective: MatchingObjective) -> ResolvedPerProblem:
        """Validated per-problem lists of length ``n`` (the shared value where a field is None)."""

        def values(name: str, default, kind):
            given = getattr(self, name)
            if given is None:
                return [default] * n
            # A scalar, a 0-d tensor or a string used to fail with a TypeError (or a ValueError of
            # float() naming a character), a nested or non-numeric entry likewise: name the field.
            scalar = isinstance(given, (str, bytes)) or (isinstance(given, Tensor) and given.dim() != 1)
            try:
                out = None if scalar else given.tolist() if isinstance(given, Tensor) else list(given)
            except TypeError:
                out = None
            if out is None:
                raise ValueError(f"PerProblem.{name}={given!r}; must be one value per problem (a sequence or an "
                                 f"(N,) tensor)")
            if len(out) != n:
                raise ValueError(f"PerProblem.{name} has {len(out)} values for {n} problems")
            if kind is int:  # 2.7 used to become 2 silently, NaN an int() error
                return [check_integer(v, f"PerProblem.{name}[{i}]", 1) for i, v in enumerate(out)]
            for i, v in enumerate(out):
                if isinstance(v, bool) or not isinstance(v, numbers.Real):
                    raise ValueError(f"PerProblem.{name}[{i}]={v!r}; must be a real number")  # noqa: TRY004 (contract)
            return [kind(v) for v in out]

        iterations = values("iterations", schedule.iterations, int)
        restarts = values("restarts", schedule.restarts, int)
        lr = values("lr", schedule.lr, float)
        tv = values("tv", objective.tv, float)
        for name, vals, ok in (("iterations", iterations, lambda v: v >= 1), ("restarts", restarts, lambda v: v >= 1),
                               ("lr", lr, lambda v: v > 0 and math.isfinite(v)),
                               ("tv", tv, lambda v: v >= 0 and math.isfinite(v))):
            bad = [(i, v) for i, v in enumerate(vals) if not ok(v)]
            if bad:
                i, v = bad[0]
                allowed = {"iterations": ">= 1", "restarts": ">= 1", "lr": "finite and > 0", "tv": "finite and >= 0"}
                raise ValueError(f"PerProblem.{name}[{i}]={v}; must be {allowed[name]}")
        return ResolvedPerProblem(iterations=iterations, restarts=restarts, lr=lr, tv=tv)


@dataclass(frozen=True)
class ResolvedPerProblem:
    """:class:`PerProblem` resolved against a schedule and objective: one Python value per problem."""

    iterations: list[int]
    restarts: list[int]
    lr: list[float]
    tv: list[float]


def matching_term(
    objective: MatchingObjective,
    dummy: dict[str, Tensor],
    targets: dict[str, Tensor],
    weights: Mapping[str, float],
    target_norm_sq: Tensor | None,
    generator: BatchedGenerator,
) -> Tensor:
    """``(P,)`` distance between the dummy updates ``(P, ...)`` and the victims' ``(N, ...)``.

    Without ``simulate_defense``: ``D(U, t)``. With it (EOT): ``D(mean_e T_e(U), t)`` for
    ``eot_average="gradient"``, ``mean_e D(T_e(U), t)`` for ``"objective"``; the E draws come from
    ``generator`` (rows = problems x restarts).
    """

    def distance(updates: dict[str, Tensor]) -> Tensor:
        return gradient_distance(updates, targets, weights, distance=objective.distance, target_norm_sq=target_norm_sq)

    if objective.simulate_defense is None:
        return distance(dummy)
    samples = [objective.simulate_defense(dict(dummy), generator) for _ in range(objective.eot_samples)]
    if objective.eot_average == "gradient":
        return distance({k: torch.stack([s[k] for s in samples]).mean(dim=0) for k in targets})
    return torch.stack([distance(s) for s in samples]).mean(dim=0)


@dataclass(frozen=True)
class RowPriors:
    """The prior weights of every row of an engine run: ``(P,)`` tensors, None where every row's weight
    is 0. Rows of different strategies (Inverting Gradients' TV, GradInversion's l2, BN and group terms)
    then share one evaluation of each prior; a row of weight 0 adds exactly 0."""

    tv: Tensor | None = None
    l2: Tensor | None = None
    bn: Tensor | None = None
    group: Tensor | None = None

    @classmethod
    def of_rows(cls, values: dict[str, Sequence[float]], *, dtype: torch.dtype, device: torch.device) -> RowPriors:
        """``name -> one weight per row``; a prior whose weights are all 0 becomes None."""
        return cls(**{name: torch.tensor(list(v), dtype=dtype, device=device) if any(w > 0 for w in v) else None
                      for name, v in values.items()})

    def select(self, index: Tensor) -> RowPriors:
        """The weights of rows ``index``."""
        return RowPriors(**{name: None if w is None else w.index_select(0, index)
                            for name, w in vars(self).items()})


def objective_terms(
    matching: Tensor,
    x: Tensor,
    priors: RowPriors,
    *,
    restarts: int | None = None,
    bn_stats: tuple[tuple[Tensor, Tensor], ...] = (),
    bn_targets: list[tuple[Tensor, Tensor]] | None = None,
    groups: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``(P,)`` total objective: ``matching`` plus the dummy images' ``x`` priors, each weighted row by row.

    The group-consistency consensus is taken over blocks of ``restarts`` consecutive rows, or, with
    ``groups = (index, sizes)`` (see :func:`ragged_group_consistency`), over groups of any size.
    """
    total = matching
    if priors.tv is not None:
        total = total + priors.tv.to(total.dtype) * total_variation(x)
    if priors.l2 is not None:
        total = total + priors.l2.to(total.dtype) * l2_prior(x)
    if priors.bn is not None:
        total = total + priors.bn.to(total.dtype) * bn_statistics_loss(bn_stats, bn_targets)
    if priors.group is not None:
        term = ragged_group_consistency(x, *groups) if groups is not None else group_consistency(x, restarts or 1)
        total = total + priors.group.to(total.dtype) * term
    return total


def ragged_group_consistency(x: Tensor, index: Tensor, sizes: Tensor) -> Tensor:
    """GradInversion's group consistency (:func:`~leakgym.attacks.losses.group_consistency`) for groups
    of different sizes: row ``p`` of ``x (P, ...)`` is pulled towards the detached pixel mean of the rows
    of its group ``index[p]`` (``(P,)`` in ``[0, G)``); ``sizes`` ``(G,)`` counts each group's rows. A
    group of one row adds exactly 0."""
    flat = x.flatten(1)
    sums = flat.new_zeros(sizes.shape[0], flat.shape[1]).index_add_(0, index, flat.detach())
    consensus = sums / sizes.to(flat.dtype).unsqueeze(1)
    return (flat - consensus.index_select(0, index)).pow(2).mean(dim=1)


__all__ = [
    "DefenseSimulator",
    "MatchingObjective",
    "PerProblem",
    "ResolvedPerProblem",
    "RowPriors",
    "Schedule",
    "matching_term",
    "objective_terms",
    "ragged_group_consistency",
]

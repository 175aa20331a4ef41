"""Inverting Gradients (Geiping, Bauermeister, Droege & Moeller, NeurIPS 2020), the "GS" attack.

The attack solves (paper Eq. 4)

    argmin_{x in [0,1]^n}  1 - <grad L(x, y), t> / (||grad L(x, y)|| ||t||)  +  alpha_TV TV(x)

with, following the paper (Sec. 4-5) and its reference code (github.com/JonasGeiping/
invertinggradients, ``reconstruction_algorithms.py``):

* cosine similarity over all layers (optional per-layer weights ``"equal"``/``"linear"``/``"exp"``);
* total variation as image prior (weight ``tv``);
* Adam on the *sign* of the image gradient (``signed``), learning rate 0.1;
* a box constraint keeping images valid (``boxed``; normalised bounds of ``DatasetSpec.unit_bounds``);
* learning-rate decay by 0.1 at 3/8, 5/8 and 7/8 of the iterations (``lr_decay``);
* restarts, the best chosen by its final gradient-matching loss;
* labels inferred from the head's update (iDLG for one image, LLG for batches) unless known;
* for FedAvg model differences the attacker unrolls ``local_steps`` SGD steps (paper Sec. 5).

Deviation: the reference code keeps the final iterate; the engine keeps each restart's iterate with
the lowest objective (as ``breaching`` does), which equals the final one whenever the loss decreased.
Default budget is far below the paper's 4,800-24,000 iterations: LeakGym's images are 16x16 and the
environment charges for iterations; pass ``iterations`` to change it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from leakgym.attacks.engine import MatchingObjective, OptimizationAttack, OptimizationConfig, Schedule
from leakgym.attacks.losses import LAYER_WEIGHT_SCHEMES, check_weight_mapping, layer_weights


@dataclass
class InvertingGradientsConfig(OptimizationConfig):
    """Options of Inverting Gradients (defaults: paper settings, reduced budget)."""

    iterations: int = 400
    """Adam iterations per restart (paper: 4,800-24,000 on CIFAR/ImageNet)."""
    lr: float = 0.1
    """Adam learning rate (paper: 0.1)."""
    tv: float = 1e-4
    """Total-variation weight (paper: 1e-4 to 1e-1 depending on the dataset)."""
    distance: str = "cosine"
    """Gradient distance: ``"cosine"`` (paper) or ``"l2"``."""
    layer_weights: str | Mapping[str, float] = "equal"
    """Per-layer weights of the distance: ``"equal"``, ``"linear"``, ``"exp"`` or a mapping."""
    signed: bool = True
    """Adam on the sign of the image gradient (paper's "signed gradients")."""
    boxed: bool = True
    """Project onto valid images after every step."""
    lr_decay: bool = True
    """MultiStep decay (x0.1) at 3/8, 5/8, 7/8 of the iterations."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.tv >= 0 and math.isfinite(self.tv)):
            raise ValueError(f"tv={self.tv}; must be a finite number >= 0")
        if self.distance not in ("cosine", "l2"):
            raise ValueError(f"distance={self.distance!r}; allowed: 'cosine', 'l2'")
        if isinstance(self.layer_weights, str):
            if self.layer_weights not in LAYER_WEIGHT_SCHEMES:
                raise ValueError(f"layer_weights={self.layer_weights!r}; allowed: {LAYER_WEIGHT_SCHEMES} or a mapping")
        elif isinstance(self.layer_weights, Mapping):
            check_weight_mapping(self.layer_weights)  # the names: against the model (check_scenario, and when it attacks)
        else:
            raise ValueError(  # noqa: TRY004 - the library reports all bad input as ValueError
                f"layer_weights={self.layer_weights!r}; allowed: {LAYER_WEIGHT_SCHEMES} or a mapping")


class InvertingGradients(OptimizationAttack):
    """Inverting Gradients (Geiping et al. 2020): cosine matching + TV, signed Adam, box, restarts."""

    name = "inverting-gradients"
    public_split = False
    Config = InvertingGradientsConfig

    @classmethod
    def check_scenario(cls, config: InvertingGradientsConfig, model, spec) -> None:
        if isinstance(config.layer_weights, Mapping):  # keyed by the model's parameter names
            layer_weights([n for n, _ in model().named_parameters()], config.layer_weights)

    def objective(self) -> MatchingObjective:
        c = self.config
        return MatchingObjective(distance=c.distance, layer_weights=c.layer_weights, tv=c.tv)

    def schedule(self) -> Schedule:
        c = self.config
        return Schedule(iterations=c.iterations, restarts=c.restarts, optimizer="adam", lr=c.lr,
                        signed=c.signed, lr_decay=c.lr_decay, boxed=c.boxed)

"""GradInversion (Yin, Mallya, Vahdat, Alvarez, Kautz & Molchanov, CVPR 2021).

The objective (paper Eq. 3-9) adds image priors to gradient matching:

    argmin_x  L_grad(x) + a_TV R_TV(x) + a_l2 R_l2(x) + a_BN R_BN(x) + a_group R_group(x)

* ``L_grad``: squared Euclidean gradient distance (Eq. 3; ``distance="cosine"`` also offered).
* ``R_TV`` and ``R_l2`` (Eq. 5): total variation and the image norm.
* ``R_BN`` (Eq. 6): ``sum_l ||mu_l(x) - mu_l||_2 + ||var_l(x) - var_l||_2`` between the dummy batch's
  BatchNorm-input statistics and the victim's. Yin et al. use the running statistics of a trained
  model as the target; LeakGym's threat model passes the victim batch's own statistics as
  ``AttackerKnowledge.bn_stats`` (list of ``(mean, biased var)`` per BN layer in ``model.modules()``
  order) -- the prior is used only when they are given and the model has BN layers. The dummy
  statistics are captured by forward pre-hooks on the BN layers of the engine's functional model.
* ``R_group`` (Eq. 9): each restart is pulled towards the group consensus, the pixel-wise mean of the
  restarts of the same victim (detached), by the pixel mean of the squared difference where Yin et al.
  take its Euclidean norm (:func:`~leakgym.attacks.losses.group_consistency` says why). Yin et al. first
  register the restarts to each other (RANSAC-flow alignment); LeakGym's small, unaugmented images make
  alignment unnecessary, so it is omitted. With a single restart the term is disabled.
* Labels from the head's update: Yin et al.'s Eq. 4 (``label_method="yin"``, distinct labels only) or
  LLG (default ``"auto"``), which also handles repeated labels.

Optimiser: Adam (paper: Adam with learning-rate warm-up and cosine decay over 20k iterations); here
Adam with the MultiStep decay of Inverting Gradients and a box constraint, for a comparable budget.
The returned image is the restart with the lowest matching loss (the paper reports the consensus of
its best group; the consensus mean blurs restarts that disagree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from leakgym.attacks.base import AttackerKnowledge
from leakgym.attacks.engine import MatchingObjective, OptimizationAttack, OptimizationConfig, Schedule
from leakgym.models import has_batchnorm


@dataclass
class GradInversionConfig(OptimizationConfig):
    """Options of GradInversion (prior weights tuned for 16-32 px images)."""

    iterations: int = 400
    """Adam iterations per restart."""
    restarts: int = 4
    """Restarts per victim; they form the group of the consistency prior."""
    lr: float = 0.1
    """Adam learning rate."""
    distance: str = "l2"
    """Gradient distance: ``"l2"`` (paper) or ``"cosine"``."""
    tv: float = 1e-4
    """Weight of the total-variation prior."""
    l2: float = 1e-6
    """Weight of the image-norm prior."""
    bn: float = 1e-2
    """Weight of the BN-statistics prior (used when knowledge.bn_stats is given)."""
    group: float = 1e-2
    """Weight of the group-consistency prior (used when restarts >= 2)."""
    signed: bool = False
    """Adam on the sign of the image gradient (off in the paper)."""
    boxed: bool = True
    """Project onto valid images after every step."""
    lr_decay: bool = True
    """MultiStep decay (x0.1) at 3/8, 5/8, 7/8 of the iterations."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.distance not in ("cosine", "l2"):
            raise ValueError(f"distance={self.distance!r}; allowed: 'cosine', 'l2'")
        for name in ("tv", "l2", "bn", "group"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}={v}; must be a finite number >= 0")


class GradInversion(OptimizationAttack):
    """GradInversion (Yin et al. 2021): L2 matching + TV/l2 + BN-statistics + group-consistency priors."""

    name = "gradinversion"
    public_split = False
    Config = GradInversionConfig

    def uses_bn_stats(self, knowledge: AttackerKnowledge) -> bool:
        return self.config.bn > 0 and knowledge.bn_stats is not None and has_batchnorm(knowledge.model)

    def objective(self) -> MatchingObjective:
        c = self.config
        # The group term of a victim with one restart is identically 0 (its consensus is itself): the
        # engine drops it then, so the objective does not depend on the (per-problem) restart count.
        return MatchingObjective(distance=c.distance, tv=c.tv, l2=c.l2, bn=c.bn, group=c.group)

    def schedule(self) -> Schedule:
        c = self.config
        return Schedule(iterations=c.iterations, restarts=c.restarts, optimizer="adam", lr=c.lr,
                        signed=c.signed, lr_decay=c.lr_decay, boxed=c.boxed)

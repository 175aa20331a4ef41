"""Deep Leakage from Gradients (Zhu, Liu & Han, NeurIPS 2019).

DLG (paper Alg. 1, Eq. 4) optimises dummy images *and* dummy labels jointly,

    x*, y* = argmin_{x, y'}  || grad_theta L(F(x), softmax(y')) - t ||^2 ,

with L-BFGS (reference code github.com/mit-han-lab/dlg: ``torch.optim.LBFGS`` with learning rate 1,
no line search; images and label logits initialised from a standard normal). The returned label is the
argmax of the optimised label distribution. With ``infer_labels=True`` the label is instead recovered
analytically from the head's update (iDLG, Zhao et al. 2020; LLG for batches) and only the images are
optimised. Known labels (``AttackerKnowledge.labels``) are always used as given.

The engine's batched L-BFGS (:class:`~leakgym.optim.lbfgs.BatchedLBFGS`) follows
``torch.optim.LBFGS`` step for step, per problem; one iteration is one evaluation of the objective
and its gradient (DLG's 300 ``step()`` calls of up to 20 inner iterations each are 300-6,000 of
these). DLG has no box constraint and no prior; both are off by default here. Diverging iterates
(L-BFGS without line search can overflow) are replaced by the problem's best iterate.
"""

from __future__ import annotations

from dataclasses import dataclass

from leakgym.attacks.base import AttackerKnowledge, check_integer
from leakgym.attacks.engine import MatchingObjective, OptimizationAttack, OptimizationConfig, Schedule


@dataclass
class DLGConfig(OptimizationConfig):
    """Options of DLG (defaults: reference code, reduced budget)."""

    iterations: int = 300
    """L-BFGS iterations (objective evaluations) per restart."""
    lr: float = 1.0
    """L-BFGS step length (``torch.optim.LBFGS`` default, as in the reference code)."""
    history_size: int = 100
    """L-BFGS memory."""
    infer_labels: bool = False
    """Infer unknown labels analytically (iDLG/LLG) instead of optimising soft labels jointly."""
    boxed: bool = False
    """Project onto valid images after every step (not in DLG)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.history_size = check_integer(self.history_size, "history_size", 1)


class DLG(OptimizationAttack):
    """Deep Leakage from Gradients: L2 gradient matching, L-BFGS, joint label optimisation."""

    name = "dlg"
    public_split = False
    Config = DLGConfig

    def label_mode(self, knowledge: AttackerKnowledge):
        if knowledge.labels is not None:
            return "known"
        return "infer" if self.config.infer_labels else "optimize"

    def objective(self) -> MatchingObjective:
        return MatchingObjective(distance="l2")

    def schedule(self) -> Schedule:
        c = self.config
        return Schedule(iterations=c.iterations, restarts=c.restarts, optimizer="lbfgs", lr=c.lr,
                        history_size=c.history_size, boxed=c.boxed)

"""Batched Adam: P rows optimised together, each with its own learning rate and decay milestones.

The engine's problems may differ in step size and budget (:class:`~leakgym.attacks.engine.objective.PerProblem`),
so one ``torch.optim.Adam`` with one learning rate per parameter group cannot drive them. Adam's state
is element-wise, so :class:`BatchedAdam` is ``torch.optim.Adam`` (defaults: betas ``(0.9, 0.999)``,
eps ``1e-8``, no weight decay) with the scalar learning rate replaced by a ``(P,)`` vector and the
``MultiStepLR`` decay by per-row milestones. Rows that leave the optimisation (a problem past its budget)
are dropped from the state with :meth:`BatchedAdam.keep`; every remaining row has taken the same number
of steps, so the bias correction stays one scalar.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

#: Inverting Gradients' learning-rate decay: x0.1 at 3/8, 5/8 and 7/8 of the iterations.
DECAY_FRACTIONS = (3 / 8, 5 / 8, 7 / 8)
DECAY_GAMMA = 0.1


def decay_milestones(iterations: int, fractions: Sequence[float] = DECAY_FRACTIONS) -> list[int]:
    """The decay milestones of a budget of ``iterations`` (as ``MultiStepLR(milestones=...)`` takes them)."""
    return [int(iterations * f) for f in fractions]


def decayed_rates(lr: float, milestones: Sequence[int], gamma: float = DECAY_GAMMA) -> list[float]:
    """``rates[k]``: the learning rate once ``k`` of ``milestones`` have passed, computed as
    ``torch.optim.lr_scheduler.MultiStepLR`` does (``lr * gamma ** count`` at each distinct milestone)."""
    rates, current = [lr], lr
    ordered = sorted(milestones)
    i = 0
    while i < len(ordered):
        count = ordered.count(ordered[i])
        current = current * gamma**count
        rates.extend([current] * count)
        i += count
    return rates


class BatchedAdam:
    """Adam over variables with a leading row dimension ``P``, one learning rate schedule per row.

    Args:
        variables: tensors ``(P, ...)`` updated in place by :meth:`step`.
        lr: ``(P, K + 1)`` learning rate of each row once ``k`` of its ``K`` milestones have passed
            (:func:`decayed_rates`), or ``(P,)`` constant rates.
        milestones: ``(P, K)`` iteration indices from which the next rate applies (None: constant).

    The learning rate of row ``p`` at iteration ``t`` (0-based) is ``lr[p, #{k: milestones[p, k] <= t}]``:
    the rate ``torch.optim.Adam`` uses when ``MultiStepLR.step()`` follows every ``Adam.step()``.
    """

    def __init__(self, variables: Sequence[Tensor], *, lr: Tensor, milestones: Tensor | None = None,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.variables = list(variables)
        self.lr = lr if lr.dim() == 2 else lr.unsqueeze(1)
        self.milestones = milestones
        if milestones is not None and milestones.shape[1] + 1 != self.lr.shape[1]:
            raise ValueError(f"lr has {self.lr.shape[1]} rates per row; expected milestones + 1 = {milestones.shape[1] + 1}")
        self.betas, self.eps = betas, eps
        self.exp_avg = [torch.zeros_like(v) for v in self.variables]
        self.exp_avg_sq = [torch.zeros_like(v) for v in self.variables]
        self.steps = 0

    def rates(self) -> Tensor:
        """``(P,)`` learning rates of the next step (float64)."""
        if self.milestones is None:
            return self.lr[:, 0]
        phase = (self.milestones <= self.steps).sum(dim=1, keepdim=True)
        return self.lr.gather(1, phase).squeeze(1)

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor]) -> None:
        """One Adam step of every row (the arithmetic of ``torch.optim.Adam``'s single-tensor path)."""
        beta1, beta2 = self.betas
        rate = self.rates()
        self.steps += 1
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = (1 - beta2**self.steps) ** 0.5
        neg_step = -(rate / bias_correction1)
        for v, g, m, s in zip(self.variables, grads, self.exp_avg, self.exp_avg_sq):
            m.lerp_(g, 1 - beta1)
            s.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (s.sqrt() / bias_correction2_sqrt).add_(self.eps)
            view = (-1,) + (1,) * (v.dim() - 1)
            v.add_(neg_step.to(v.dtype).view(view) * m / denom)

    def keep(self, mask: Tensor, variables: Sequence[Tensor]) -> None:
        """Keep only the rows ``mask`` (``(P,)`` bool); ``variables`` are the kept rows' tensors."""
        self.variables = list(variables)
        self.exp_avg = [m[mask] for m in self.exp_avg]
        self.exp_avg_sq = [s[mask] for s in self.exp_avg_sq]
        self.lr = self.lr[mask]
        if self.milestones is not None:
            self.milestones = self.milestones[mask]


__all__ = ["DECAY_FRACTIONS", "DECAY_GAMMA", "BatchedAdam", "decay_milestones", "decayed_rates"]

"""Batched L-BFGS: P independent problems optimised together, each following its own L-BFGS iterates.

DLG (Zhu et al. 2019) optimises with ``torch.optim.LBFGS``; the engine needs the same optimiser for
P problems at once, with every dot product, history pair and curvature estimate per problem, so
that problem ``p`` follows the iterates it would follow alone (Nocedal & Wright, *Numerical
Optimization*, Alg. 7.4, the two-loop recursion).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class BatchedLBFGS:
    """L-BFGS without line search (as ``torch.optim.LBFGS(line_search_fn=None)``), per problem.

    The variables are tensors with a leading problem dimension ``P``; every dot product, history
    pair and curvature estimate is per problem, so P problems optimised together follow exactly the
    iterates each would follow alone. One :meth:`step` is one iteration of
    ``torch.optim.LBFGS``'s inner loop: the two-loop recursion (Nocedal & Wright, Alg. 7.4) and a
    step of length ``lr`` (the first step scaled by ``min(1, 1/||g||_1)``).

    Deviations from ``torch.optim.LBFGS``: a curvature pair with ``y.s <= 1e-10`` is stored as a
    zero pair (it contributes nothing) instead of being skipped, so that histories stay aligned
    across problems; the tolerance-based early exits are replaced by freezing problems whose gradient
    is below ``tolerance_grad`` (the engine always spends its full budget).

    ``lr`` is one step length for every problem or a ``(P,)`` tensor of step lengths, one per problem.
    :meth:`keep` drops problems that leave the optimisation (past their budget): every kept problem's
    history pairs, curvature estimate and last step stay exactly as they were.
    """

    def __init__(self, variables: Sequence[Tensor], *, lr: float | Tensor = 1.0, history_size: int = 100,
                 tolerance_grad: float = 1e-7) -> None:
        self.variables = list(variables)
        self.lr = lr
        self.history_size = history_size
        self.tolerance_grad = tolerance_grad
        self.p = self.variables[0].shape[0]
        self._s: list[Tensor] = []
        self._y: list[Tensor] = []
        self._rho: list[Tensor] = []
        self._h_diag: Tensor | None = None
        self._prev_g: Tensor | None = None
        self._d: Tensor | None = None
        self._t: Tensor | None = None

    def _lr(self, g: Tensor) -> Tensor:
        if isinstance(self.lr, Tensor):
            return self.lr.to(dtype=g.dtype, device=g.device)
        return torch.full((self.p,), self.lr, dtype=g.dtype, device=g.device)

    def keep(self, mask: Tensor, variables: Sequence[Tensor]) -> None:
        """Keep only the problems ``mask`` (``(P,)`` bool); ``variables`` are the kept problems' tensors."""
        self.variables = list(variables)
        self.p = self.variables[0].shape[0]
        self._s = [s[mask] for s in self._s]
        self._y = [y[mask] for y in self._y]
        self._rho = [r[mask] for r in self._rho]
        if isinstance(self.lr, Tensor):
            self.lr = self.lr[mask]
        for name in ("_h_diag", "_prev_g", "_d", "_t"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[mask])

    def _flat(self, tensors: Sequence[Tensor]) -> Tensor:
        return torch.cat([t.reshape(self.p, -1) for t in tensors], dim=1)

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor]) -> None:
        g = self._flat(grads)
        if self._prev_g is None:
            d = -g
            self._h_diag = torch.ones(self.p, dtype=g.dtype, device=g.device)
            t = (1.0 / g.abs().sum(dim=1)).clamp(max=1.0) * self._lr(g)
        else:
            y = g - self._prev_g
            s = self._d * self._t[:, None]
            ys = (y * s).sum(dim=1)
            ok = ys > 1e-10
            rho = torch.where(ok, 1.0 / torch.where(ok, ys, torch.ones_like(ys)), torch.zeros_like(ys))
            if len(self._s) == self.history_size:
                self._s.pop(0), self._y.pop(0), self._rho.pop(0)
            self._s.append(torch.where(ok[:, None], s, torch.zeros_like(s)))
            self._y.append(torch.where(ok[:, None], y, torch.zeros_like(y)))
            self._rho.append(rho)
            yy = (y * y).sum(dim=1)
            self._h_diag = torch.where(ok, ys / torch.where(ok, yy, torch.ones_like(yy)), self._h_diag)
            q = -g
            alphas = []
            for s_i, y_i, r_i in zip(reversed(self._s), reversed(self._y), reversed(self._rho)):
                a_i = (s_i * q).sum(dim=1) * r_i
                q = q - a_i[:, None] * y_i
                alphas.append(a_i)
            d = q * self._h_diag[:, None]
            for s_i, y_i, r_i, a_i in zip(self._s, self._y, self._rho, reversed(alphas)):
                b_i = (y_i * d).sum(dim=1) * r_i
                d = d + s_i * (a_i - b_i)[:, None]
            t = self._lr(g).expand(self.p).clone()
        converged = g.abs().amax(dim=1) <= self.tolerance_grad
        t = torch.where(converged, torch.zeros_like(t), t)
        self._prev_g, self._d, self._t = g, d, t
        step = d * t[:, None]
        offset = 0
        for v in self.variables:
            size = v[0].numel()
            v.add_(step[:, offset:offset + size].reshape(v.shape))
            offset += size


__all__ = ["BatchedLBFGS"]

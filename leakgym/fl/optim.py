"""The clients' local optimiser in FedAvg: SGD (momentum, weight decay) or Adam, and a learning-rate schedule.

FedAvg (McMahan et al. 2017) trains every selected client for ``E`` local steps from the global model and
shares ``w_0 - w_E``. The paper's clients run plain SGD; the defense papers train with other optimisers
(PPP, Scheliga et al., §4: "Local training minimizes the cross-entropy loss using Adam optimizer with
learning rate 1e-3", betas (0.9, 0.999), one local epoch), and the utility of a defense depends on it
(PRECODE on LeNet diverges under SGD lr 0.5 and trains under Adam 1e-3, issue 36). This module holds:

* :class:`LocalOptimizer` -- the optimiser's settings (``"sgd"`` with ``momentum`` and ``weight_decay``,
  or ``"adam"`` with ``weight_decay``), validated at construction;
* :meth:`LocalOptimizer.torch_optimizer` -- the reference: ``torch.optim.SGD`` / ``torch.optim.Adam``
  over a private copy's parameters (the plain client, :class:`leakgym.fl.client.compute_update`);
* :meth:`LocalOptimizer.init` / :meth:`LocalOptimizer.step` -- the same update written out as a pure
  function of ``(params, grads, state)``, elementwise, for the batched paths: ``torch.optim`` mutates
  leaf tensors and cannot run inside ``torch.func.vmap`` (:func:`leakgym.fl.batched.benign_updates`
  unrolls the ``E`` steps functionally over stacked parameters), so the formulas of
  ``torch.optim.SGD`` and ``torch.optim.Adam`` (``foreach=False``, ``maximize=False``, no Nesterov, no
  dampening, no AMSGrad) are written by hand here, once; ``tests/test_fl_optim.py`` checks them against
  ``torch.optim`` and the plain client against the batched ones;
* :func:`scheduled_lr` -- the round's local learning rate under a schedule over the FedAvg rounds.

Clients are **stateless across rounds** (cross-device FedAvg): every round starts with fresh optimiser
state (Adam's moments and step count, SGD's momentum buffer), as a client that is sampled anew each
round has no state to keep. The default (``"sgd"``, momentum 0, weight decay 0, constant lr) is
``w <- w - lr * g``, computed by the clients exactly as before this module existed (bit-identical
trajectories).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

LOCAL_OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "exponential", "cosine")


def _number(value, name: str, low: float, high: float, *, low_open: bool = False, high_open: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}={value!r}; allowed range {shown}")
    return float(value)


@dataclass(frozen=True)
class LocalOptimizer:
    """A FedAvg client's local optimiser (the update rule of its ``E`` local steps).

    Args:
        name: ``"sgd"`` (``torch.optim.SGD``) or ``"adam"`` (``torch.optim.Adam``, Kingma & Ba 2015).
        momentum: SGD's heavy-ball momentum in ``[0, 1)`` (must be 0 for Adam, whose first-moment
            coefficient is ``betas[0]``).
        weight_decay: L2 penalty in ``[0, inf)`` added to the gradient (``g + weight_decay * w``), as
            both ``torch.optim`` classes do (not AdamW's decoupled decay).
        betas, eps: Adam's coefficients (PyTorch's and the PPP paper's defaults 0.9, 0.999; 1e-8).
    """

    name: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in LOCAL_OPTIMIZERS:
            raise ValueError(f"local_optimizer={self.name!r}; allowed: {', '.join(LOCAL_OPTIMIZERS)}")
        _number(self.momentum, "local_momentum", 0.0, 1.0)
        _number(self.weight_decay, "local_weight_decay", 0.0, math.inf)
        if self.name == "adam" and self.momentum != 0:
            raise ValueError(f"local_momentum={self.momentum!r} with local_optimizer='adam'; allowed: 0 (Adam's "
                             f"first-moment coefficient is betas[0] = {self.betas[0]})")
        if not (isinstance(self.betas, tuple) and len(self.betas) == 2):
            raise ValueError(f"betas={self.betas!r}; allowed: a pair (beta1, beta2) in [0, 1)")
        for i, b in enumerate(self.betas):
            _number(b, f"betas[{i}]", 0.0, 1.0)
        _number(self.eps, "eps", 0.0, math.inf, low_open=True)

    @property
    def plain(self) -> bool:
        """True for plain SGD (``w <- w - lr * g``), the clients' update before this module existed."""
        return self.name == "sgd" and self.momentum == 0 and self.weight_decay == 0

    def describe(self) -> str:
        """E.g. ``sgd``, ``sgd (momentum 0.9, weight decay 0.0005)``, ``adam``."""
        extras = []
        if self.momentum:
            extras.append(f"momentum {self.momentum:g}")
        if self.weight_decay:
            extras.append(f"weight decay {self.weight_decay:g}")
        return self.name + (f" ({', '.join(extras)})" if extras else "")

    # -- the reference: torch.optim on a module's parameters ------------------------------------------
    def torch_optimizer(self, params: list[Tensor], lr: float) -> torch.optim.Optimizer:
        """``torch.optim.SGD`` or ``torch.optim.Adam`` over ``params`` with these settings (single-tensor
        kernels, ``foreach=False``: the loop order :meth:`step` follows)."""
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay,
                                   foreach=False)
        return torch.optim.Adam(params, lr=lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                foreach=False)

    # -- the same update as a pure function (vmap-able, stacked parameters) -----------------------------
    def init(self, params: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
        """The fresh optimiser state of a client whose parameters are ``params`` (any leading stacked
        dimensions): SGD with momentum: ``{"momentum": ...}`` (empty until the first step, as PyTorch's
        buffer); Adam: first and second moments, zero."""
        if self.name == "adam":
            return {"exp_avg": {n: torch.zeros_like(p) for n, p in params.items()},
                    "exp_avg_sq": {n: torch.zeros_like(p) for n, p in params.items()}}
        return {}

    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], state: dict[str, dict[str, Tensor]],
             lr: float, t: int) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
        """One local step ``t`` (1-based) from ``params`` with gradients ``grads``: the new parameters and
        state, without modifying the inputs. Elementwise, so stacked parameters ``(K, ...)`` take K
        clients' steps at once and it runs under ``vmap``. The arithmetic of ``torch.optim.SGD`` /
        ``torch.optim.Adam`` (``_single_tensor_sgd`` / ``_single_tensor_adam``, PyTorch 2.x):

        * SGD: ``g <- g + wd w``; with momentum ``mu``: ``b <- g`` at the first step, else
          ``b <- mu b + g``, and ``g <- b``; ``w <- w - lr g``;
        * Adam: ``g <- g + wd w``; ``m <- m + (g - m)(1 - beta1)`` (``lerp``), ``v <- beta2 v + (1 - beta2)
          g^2``; ``w <- w - (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``.

        Each as the same out-of-place kernel ``torch.optim`` runs in place (``add`` with ``alpha``, which fuses its
        product on a CPU, ``lerp``, ``addcmul``, ``addcdiv``), so a client trained alone with these steps is
        :func:`~leakgym.fl.client.compute_update`'s ``torch.optim`` client bit for bit (found in an audit: written
        as ``g + wd * w`` and ``w - lr * g``, weight decay and Adam differed in the last bits, which BatchNorm on
        small batches made 1.6e-3 and 2.9e-2 after three steps).

        Plain SGD is ``w - lr * g``, exactly the expression the clients used before this module existed.
        """
        if self.plain:
            return {n: p - lr * grads[n] for n, p in params.items()}, state
        wd = self.weight_decay
        g = {n: grads[n].add(p, alpha=wd) if wd else grads[n] for n, p in params.items()}
        if self.name == "sgd":
            new_state = state
            if self.momentum:
                old = state.get("momentum")
                buf = {n: g[n] if old is None else old[n].mul(self.momentum).add(g[n]) for n in params}
                new_state, g = {"momentum": buf}, buf
            return {n: p.add(g[n], alpha=-lr) for n, p in params.items()}, new_state
        beta1, beta2 = self.betas
        m = {n: torch.lerp(state["exp_avg"][n], g[n], 1 - beta1) for n in params}
        v = {n: torch.addcmul(state["exp_avg_sq"][n].mul(beta2), g[n], g[n], value=1 - beta2) for n in params}
        bias1, bias2 = 1 - beta1 ** t, 1 - beta2 ** t
        step_size, root2 = lr / bias1, bias2 ** 0.5  # (as torch.optim.Adam computes them)
        out = {n: torch.addcdiv(p, m[n], (v[n].sqrt() / root2).add(self.eps), value=-step_size)
               for n, p in params.items()}
        return out, {"exp_avg": m, "exp_avg_sq": v}


#: Plain SGD: the clients' optimiser when none is given.
PLAIN_SGD = LocalOptimizer()


def scheduled_lr(lr: float, schedule: str, rnd: int, rounds: int, decay: float = 1.0) -> float:
    """The local learning rate of FedAvg round ``rnd`` (0-based) of ``rounds``, from the initial ``lr``:

    * ``"constant"``: ``lr``;
    * ``"exponential"``: ``lr * decay ** rnd`` (``decay`` in ``(0, 1]``, e.g. 0.99 per round);
    * ``"cosine"``: ``lr * (1 + cos(pi * rnd / rounds)) / 2`` (Loshchilov & Hutter 2017 without restarts,
      over the episode's rounds; never 0 inside the episode: ``rnd < rounds``).

    The schedule acts on the rounds (each round's local steps share one rate), the usual form in FedAvg,
    where a client's local steps of one round form one short optimisation.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"local_lr_schedule={schedule!r}; allowed: {', '.join(LR_SCHEDULES)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r}; allowed: integers >= 1")
    if isinstance(rnd, bool) or not isinstance(rnd, int) or not 0 <= rnd < rounds:
        raise ValueError(f"round={rnd!r}; allowed: integers in [0, {rounds - 1}]")
    _number(decay, "local_lr_decay", 0.0, 1.0, low_open=True, high_open=False)
    if schedule == "constant":
        return float(lr)
    if schedule == "exponential":
        return float(lr * decay ** rnd)
    return float(lr * (1 + math.cos(math.pi * rnd / rounds)) / 2)


__all__ = ["LOCAL_OPTIMIZERS", "LR_SCHEDULES", "PLAIN_SGD", "LocalOptimizer", "scheduled_lr"]

"""CENSOR: share a loss-reducing gradient drawn orthogonally to the true one (Zhang et al., NDSS 2025).

"Censor: Defense Against Gradient Inversion via Orthogonal Subspace Bayesian Sampling", Algorithm 1
(LOCAL_UPDATE, lines 8-36):

1. ``G0 = grad f(D, theta)`` (line 9) and ``l* = L(f_theta(x), y)`` (line 10).
2. For each of ``T`` trials (line 12):

   * Phase 1, ORTHOGONAL_GRAD (lines 24-30, Eq. 12): for every layer ``l`` sample
     ``g_r ~ N(0, I)`` shaped like ``g_l`` and keep its component orthogonal to ``g_l``,
     ``g_l^o = g_r - <g_r, g_l> / <g_l, g_l> * g_l``.
   * Phase 2, NORMALIZE_GRAD (lines 31-36): rescale it to the layer's gradient norm,
     ``g~_l^o = g_l^o * ||g_l|| / ||g_l^o||``.
   * Phase 3 (lines 15-19): take a trial step ``theta^t = theta - eta * G_N^t``, evaluate the loss on
     the private batch and keep the candidate if ``l^t < l*``.

Deviation (fallback). Algorithm 1 line 11 initialises the best gradient with ``G* = G0``, so when no
trial lowers the loss it would return the *original* gradient — the very thing CENSOR exists to
hide, and at odds with the paper's own claim (§I, "we will not inadvertently return the original
gradients"). We initialise ``G*`` with zeros instead: with no improving candidate the client sends
no update. ``l*`` is initialised as in line 10 (the loss of the unchanged model), so every returned
non-zero candidate strictly lowers the batch loss at step ``eta``.

Layers are the entries of the update dict (one per parameter tensor, weights and biases separately).
A layer whose gradient is exactly zero has no direction to avoid; its candidate is set to zero
(``||g_l|| = 0`` after normalisation anyway). Projections are computed in float64 so the
orthogonality holds to ~1e-7 relative after casting back.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from leakgym.models import task_loss

Update = dict[str, Tensor]


def orthogonal_candidate(grad: Update, generator: torch.Generator) -> Update:
    """Phases 1-2: a layer-wise orthogonal, norm-matched Gaussian sample (Algorithm 1 lines 24-36)."""
    out: Update = {}
    for name, g in grad.items():
        g64 = g.detach().double().reshape(-1)
        gg = g64 @ g64
        if gg == 0:
            out[name] = torch.zeros_like(g)
            continue
        r = torch.randn(g64.shape, generator=generator, device=g.device, dtype=torch.float64)
        o = r - (r @ g64) / gg * g64                   # Eq. (12)
        o = o * (gg.sqrt() / o.norm())                 # line 34
        out[name] = o.to(g.dtype).view_as(g)
    return out


@torch.no_grad()
def _loss_at(model: nn.Module, x: Tensor, y: Tensor, params: dict[str, Tensor]) -> float:
    return float(task_loss(model, x, y, params=params))


def censor_gradient(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    grad: Update,
    *,
    trials: int,
    step: float,
    generator: torch.Generator,
) -> tuple[Update, dict]:
    """Algorithm 1 LOCAL_UPDATE: the best of ``trials`` orthogonal candidates, or zeros.

    Args:
        model: the model at the parameters ``theta`` the gradient was computed at (not modified).
        x, y: the private batch (the EVALUATE data of lines 21-23).
        grad: ``G0``, keyed by parameter name.
        trials: ``T``.
        step: the trial step size ``eta`` of line 15.
        generator: source of the Gaussian samples.

    Returns:
        ``(G*, details)`` with ``details = {"chosen_trial": t or -1, "initial_loss": l0,
        "best_loss": l*, "trial_losses": [l^1, ..., l^T]}``.
    """
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"CENSOR trials={trials!r}; allowed: integers >= 1")
    if not (step > 0):
        raise ValueError(f"CENSOR step={step!r}; allowed range (0, inf)")
    theta = {n: p.detach() for n, p in model.named_parameters()}
    # The loss is evaluated by the same forward pass the client trains with (model mode kept);
    # PRECODE's sampling makes it stochastic, so the global RNG is re-seeded per evaluation to
    # compare all candidates under the same noise draw.
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))

    def evaluate(params: dict[str, Tensor]) -> float:
        with torch.random.fork_rng(devices=[] if x.device.type == "cpu" else [x.device]):
            torch.manual_seed(seed)
            return _loss_at(model, x, y, params)

    initial = evaluate(theta)
    best_loss, best, chosen = initial, {n: torch.zeros_like(g) for n, g in grad.items()}, -1
    losses: list[float] = []
    for t in range(trials):
        cand = orthogonal_candidate(grad, generator)
        trial_params = {n: theta[n] - step * cand[n] if n in cand else theta[n] for n in theta}
        loss_t = evaluate(trial_params)
        losses.append(loss_t)
        if loss_t < best_loss:
            best_loss, best, chosen = loss_t, cand, t
    details = {"chosen_trial": chosen, "initial_loss": initial, "best_loss": best_loss, "trial_losses": losses}
    return best, details


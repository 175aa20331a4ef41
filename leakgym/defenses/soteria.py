"""Soteria: prune the gradient of the representation layer (Sun et al., CVPR 2021).

"Soteria: Provable Defense against Privacy Leakage in Federated Learning from Representation
Perspective", §4. The client perturbs the representation ``r = features(X)`` that enters the
classifier into ``r'`` so that the input an attacker could reconstruct from it moves as far as
possible, under a sparsity budget: ``max ||X - X'||  s.t.  ||r - r'||_0 <= eps`` (Eq. 5). Removing
a single unit ``i`` changes the input by approximately ``||r_i (dr_i/dX)^{-1}||``, which Sun et al.
approximate by the ratio

    ``rho_i = ||r_i|| / ||dr_i / dX||``                                  (§4.2)

and the units with the *largest* ``rho_i`` are removed. Since the representation enters the network
only through the head, removing units amounts to zeroing the corresponding **columns of the head's
weight gradient** (the "defended layer"); all other layers are shared unchanged.

What is computed here, following the official implementation (``jeremy313/Soteria``,
``defense_soteria``; also in the DCS² authors' code):

* ``dr_{b,i}/dx_b`` for every example ``b`` of the victim's batch and every unit ``i``, as one
  forward pass and a backward pass vmapped over the rows of the identity (``torch.func.vjp`` +
  ``vmap``; ``autograd.grad(..., is_grads_batched=True)`` for models with BatchNorm in train mode,
  whose in-place running-statistics update ``torch.func`` cannot trace).
* the per-unit score ``s_i = sum_b ||dr_{b,i}/dx_b|| / (|r_{b,i}| + 0.1)`` — the inverse ratio with
  the official code's ``+ 0.1`` stabiliser, summed over the batch. We take ``|r|`` so signed
  representations (the PRECODE decoder output) cannot divide by ~0; for ReLU features it is ``r``.
* the ``floor(fraction * D)`` units with the smallest ``s_i`` (largest ``rho_i``) are pruned.

Approximations to note: the ratio is Sun et al.'s single-unit first-order estimate, not the solution
of Eq. (5); the derivative of the batch-summed features is used, so with BatchNorm in train mode the
(small) coupling of examples through batch statistics is folded into each example's row; with
PRECODE the representation is the sampled bottleneck output of one forward pass.

The registered defense :data:`SOTERIA` (field ``soteria``, update stage) scores the units on a
train-mode copy of the model (as the client trained; the caller's model and its BatchNorm statistics
stay untouched) with the batch the client trained on, under the round's seeded global RNG (PRECODE).
Free in the cost model (:meth:`Defense.cost` is 0), although the Jacobian is one input gradient per
representation unit: 576 on the CIFAR ConvNet, 2.7 s a call for one image on one CPU thread, the costliest
defense in wall time. A defense's cost reads only its settings, and this one depends on the model; see
``docs/limits.md``.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from leakgym.defenses.registry import DefenseContext, UpdateDefense, real_field
from leakgym.defenses.sparsification import entry_count
from leakgym.models import bn_eval_if_single

Update = dict[str, Tensor]
#: Stabiliser of the official implementation (denominator ``|r| + 0.1``).
STABILISER = 0.1


def representation_scores(model: nn.Module, x: Tensor) -> Tensor:
    """Per-unit score ``s_i = sum_b ||dr_{b,i}/dx_b|| / (|r_{b,i}| + 0.1)``, shape ``(D,)``.

    Units with a small score are those whose removal moves the reconstruction most.
    """
    x = x.detach()
    bn_training = any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules())
    if not bn_training:
        r, vjp = torch.func.vjp(model.features, x)

        def batched_vjp(cot: Tensor) -> Tensor:
            return torch.vmap(vjp)(cot)[0]
    else:
        # torch.func cannot trace BatchNorm's in-place running-stat update; batch the backward instead.
        xg = x.clone().requires_grad_(True)
        r = model.features(xg)

        def batched_vjp(cot: Tensor) -> Tensor:
            return torch.autograd.grad(r, xg, grad_outputs=cot, is_grads_batched=True)[0]
    if r.dim() != 2:
        raise ValueError(f"model.features must return (N, D), got shape {tuple(r.shape)}")
    d = r.shape[1]
    # Cotangent i is e_i on every example: row i is d(sum_b r_{b,i})/dx, i.e. every dr_{b,i}/dx_b.
    cot = torch.eye(d, dtype=r.dtype, device=r.device)[:, None, :].expand(d, r.shape[0], d)
    jac = batched_vjp(cot)                                    # (D, B, C, H, W)
    dr_dx = jac.flatten(2).norm(dim=2)                       # (D, B)
    ratio = dr_dx / (r.detach().abs().T + STABILISER)         # (D, B)
    return ratio.sum(dim=1)


def soteria_mask(model: nn.Module, x: Tensor, fraction: float) -> tuple[Tensor, Tensor]:
    """Boolean keep-mask over the ``D`` representation units, and the scores it was built from."""
    if not (0.0 <= fraction < 1.0):
        raise ValueError(f"Soteria fraction={fraction!r}; allowed range [0, 1)")
    scores = representation_scores(model, x)
    n_prune = entry_count(fraction, scores.numel())
    keep = torch.ones_like(scores, dtype=torch.bool)
    if n_prune:
        keep[torch.topk(scores, n_prune, largest=False).indices] = False
    return keep, scores


def head_weight_name(model: nn.Module) -> str:
    """Parameter name of the head's weight (the layer Soteria defends)."""
    for name, p in model.named_parameters():
        if p is model.head.weight:
            return name
    raise ValueError(f"{type(model).__name__}.head.weight is not among the model's parameters")


def soteria(update: Update, model: nn.Module, x: Tensor, fraction: float) -> tuple[Update, dict]:
    """Zero the head-weight update columns of the pruned representation units.

    Args:
        update: the shared update (gradient or model delta), keyed by parameter name.
        model: the model the client computed the update with (mode as used for training).
        x: the batch the client trained on (normalised images).
        fraction: fraction of representation units to prune, in ``[0, 1)``.

    Returns:
        ``(update', {"pruned_units": n, "units": D})``.
    """
    name = head_weight_name(model)
    if name not in update:  # a frozen head is not shared: nothing of it to prune
        return {k: v.clone() for k, v in update.items()}, {"pruned_units": 0, "units": int(model.head.weight.shape[1])}
    keep, _ = soteria_mask(model, x, fraction)
    out = {k: v.clone() for k, v in update.items()}
    out[name] = update[name] * keep.to(update[name].dtype)[None, :]
    return out, {"pruned_units": int((~keep).sum()), "units": int(keep.numel())}


class Soteria(UpdateDefense):
    """Prune the head-weight update columns of the representation units Soteria scores lowest."""

    name = "soteria"
    public_split = False
    fields = (real_field("soteria", 0.0, "Soteria: fraction of representation units whose head-weight gradient "
                         "columns are pruned; 0 off.", high=1.0, high_open=True),)

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        work = copy.deepcopy(ctx.model).train()
        with bn_eval_if_single(work, x.shape[0]), ctx.global_rng():
            return soteria(update, work, x, ctx.config.soteria)


SOTERIA = Soteria()

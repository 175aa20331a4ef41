"""The client's update computation: one gradient (FedSGD) or E local SGD steps (FedAvg).

``compute_update`` is functional: the caller's model is never modified (parameters, buffers, mode).
The work happens on a private copy of the model, in **train** mode (BatchNorm normalises with batch
statistics, PRECODE samples; see :mod:`leakgym.models.base`), except that BatchNorm layers use
their running statistics when the batch holds a single example
(:func:`leakgym.models.bn_eval_if_single`).

* FedSGD (``kind="gradient"``, McMahan et al. 2017): the shared tensors are
  ``g = grad_w L(w; x, y)``, the gradient of the batch-mean :func:`leakgym.models.task_loss`.
* FedAvg (``kind="model_delta"``): ``E = local_steps`` full-batch SGD steps
  ``w_{e+1} = w_e - lr * g_e`` on the same batch, and the shared tensors are ``w_0 - w_E``
  (signed like a gradient, see :class:`~leakgym.fl.update.SharedUpdate`).

``gradient_transform``, if given, is called on every step's gradient before it is used (FedSGD: the
one gradient that is shared; FedAvg: each local step). This is where per-step defenses (DCS²,
CENSOR) act. It receives the working model *at the current local parameters*, the batch and the
gradient, and returns the gradient to use; it must not modify the model.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch
from torch import Tensor, nn

from leakgym.fl.update import SharedUpdate, UpdateKind
from leakgym.models import bn_eval_if_single, has_batchnorm, task_loss


class GradientTransform(Protocol):
    """A per-step gradient transform: ``(model, x, y, grad, step=...) -> grad``."""

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor, grad: dict[str, Tensor], *,
                 step: int) -> dict[str, Tensor]: ...


def batch_gradient(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """``grad_w task_loss(model; x, y)`` for every trainable parameter, as a detached dict.

    Runs the model in its current mode (callers choose train/eval); BatchNorm running statistics of
    ``model`` are updated as a side effect in train mode, so call it on a copy when that matters.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = task_loss(model, x, y)
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g.detach()) for (n, p), g in zip(named, grads)}


def compute_update(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    kind: UpdateKind = "gradient",
    local_steps: int = 1,
    local_lr: float = 0.1,
    gradient_transform: GradientTransform | None = None,
    batch_size: int | None = None,
) -> SharedUpdate:
    """The update a client shares after training on ``(x, y)``; ``model`` is not modified.

    Args:
        model: the global model as received (a :class:`~leakgym.models.LeakGymModel`).
        x: normalised images ``(N, C, H, W)``.
        y: labels, ``int64 (N,)`` or soft ``float (N, num_classes)``.
        kind: ``"gradient"`` (FedSGD) or ``"model_delta"`` (FedAvg).
        local_steps: FedAvg local SGD steps ``E`` (must be 1 for ``kind="gradient"``).
        local_lr: FedAvg local learning rate (recorded in the update; unused by FedSGD).
        gradient_transform: optional per-step transform (see the module docstring).
        batch_size: the batch size the client *declares* (default ``N``); defenses that add
            examples (OASIS) declare the original size.

    Returns:
        A :class:`SharedUpdate`. ``buffers`` holds the BatchNorm running statistics after the round
        when the model has BatchNorm, else ``None``.
    """
    if kind not in ("gradient", "model_delta"):
        raise ValueError(f"kind={kind!r}; allowed: 'gradient', 'model_delta'")
    if not isinstance(local_steps, int) or local_steps < 1:
        raise ValueError(f"local_steps={local_steps!r}; allowed: integers >= 1")
    if kind == "gradient" and local_steps != 1:
        raise ValueError(f"local_steps={local_steps} with kind='gradient'; FedSGD takes exactly 1 step")
    if not (local_lr > 0):
        raise ValueError(f"local_lr={local_lr!r}; allowed range (0, inf)")
    if x.dim() != 4 or x.shape[0] < 1:
        raise ValueError(f"x must be a non-empty (N, C, H, W) batch, got shape {tuple(x.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y has {y.shape[0]} entries but x has {x.shape[0]} images")

    work = copy.deepcopy(model)
    work.train()
    names = [n for n, p in work.named_parameters() if p.requires_grad]
    start = {n: p.detach().clone() for n, p in work.named_parameters() if p.requires_grad}
    with bn_eval_if_single(work, x.shape[0]):
        if kind == "gradient":
            grad = batch_gradient(work, x, y)
            if gradient_transform is not None:
                grad = gradient_transform(work, x, y, grad, step=0)
            tensors = {n: grad[n] for n in names}
        else:
            params = dict(work.named_parameters())
            for step in range(local_steps):
                grad = batch_gradient(work, x, y)
                if gradient_transform is not None:
                    grad = gradient_transform(work, x, y, grad, step=step)
                with torch.no_grad():
                    for n in names:
                        params[n].sub_(local_lr * grad[n])
            tensors = {n: (start[n] - params[n].detach()).clone() for n in names}
    buffers = None
    if has_batchnorm(work):
        buffers = {n: b.detach().clone() for n, b in work.named_buffers()}
    return SharedUpdate(
        tensors=tensors,
        kind=kind,
        batch_size=int(x.shape[0] if batch_size is None else batch_size),
        local_steps=local_steps,
        local_lr=float(local_lr) if kind == "model_delta" else 0.0,
        buffers=buffers,
    )

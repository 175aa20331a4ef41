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

:func:`compute_updates` trains several clients in lock-step (step ``s`` of every client, then one
batched transform of all their step-``s`` gradients): the defense pipeline uses it for the victims of
all games of a vector step, so that a defense like DCS² runs its inner optimisation for all of them at once.
"""

from __future__ import annotations

import contextlib
import copy
from contextlib import AbstractContextManager
from dataclasses import dataclass
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


@dataclass
class LocalTraining:
    """One client's arguments to :func:`compute_updates` (those of :func:`compute_update`), and ``rng``:
    a re-enterable context manager (e.g. :class:`leakgym.defenses.registry.GlobalRngStream`) entered
    around each of this client's gradient computations, so that a client's draws from torch's global
    RNG (PRECODE's sampling) do not depend on the other clients trained beside it."""

    model: nn.Module
    x: Tensor
    y: Tensor
    kind: UpdateKind = "gradient"
    local_steps: int = 1
    local_lr: float = 0.1
    batch_size: int | None = None
    rng: AbstractContextManager | None = None


class BatchedGradientTransform(Protocol):
    """A per-step transform of several clients' gradients at once: ``(clients, models, xs, ys, grads,
    step=...) -> grads``. ``clients`` are the indices (into :func:`compute_updates`' list) of the clients
    taking step ``step``; the other lists are theirs, in that order."""

    def __call__(self, clients: list[int], models: list[nn.Module], xs: list[Tensor], ys: list[Tensor],
                 grads: list[dict[str, Tensor]], *, step: int) -> list[dict[str, Tensor]]: ...


def _check(job: LocalTraining) -> None:
    kind, local_steps, local_lr, x, y = job.kind, job.local_steps, job.local_lr, job.x, job.y
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
        local_lr: FedAvg local learning rate, > 0 for either protocol (FedSGD does not step with it and
            records 0.0 in the update).
        gradient_transform: optional per-step transform (see the module docstring).
        batch_size: the batch size the client *declares* (default ``N``); defenses that add
            examples (OASIS) declare the original size.

    Returns:
        A :class:`SharedUpdate`. ``buffers`` holds the BatchNorm running statistics after the round
        when the model has BatchNorm, else ``None``.
    """
    job = LocalTraining(model, x, y, kind=kind, local_steps=local_steps, local_lr=local_lr, batch_size=batch_size)
    many = None
    if gradient_transform is not None:
        def many(clients, models, xs, ys, grads, *, step):
            return [gradient_transform(models[0], xs[0], ys[0], grads[0], step=step)]
    return compute_updates([job], many)[0]


def compute_updates(jobs: list[LocalTraining],
                    gradient_transform: BatchedGradientTransform | None = None) -> list[SharedUpdate]:
    """:func:`compute_update` of several clients in lock-step, so that a per-step defense can transform
    every client's step-``s`` gradient in one batched computation (DCS²'s synthesis over the victims of
    all games of a vector step, :meth:`~leakgym.defenses.registry.StepDefense.apply_many`).

    Step ``s`` computes the gradient of every client with more than ``s`` local steps (each inside its
    own ``rng``), passes them all to ``gradient_transform``, then takes every such client's SGD step.
    Client ``i``'s update is what :func:`compute_update` computes for it alone when the transform
    treats clients independently. Every job is validated before any work starts.
    """
    for job in jobs:
        _check(job)
    if not jobs:
        return []
    works = [copy.deepcopy(job.model).train() for job in jobs]
    names = [[n for n, p in w.named_parameters() if p.requires_grad] for w in works]
    # FedAvg's update is start - end: only model_delta clients keep a copy of their start.
    start = [{n: p.detach().clone() for n, p in w.named_parameters() if p.requires_grad}
             if job.kind == "model_delta" else {} for job, w in zip(jobs, works)]
    params = [dict(w.named_parameters()) for w in works]
    last: list[dict[str, Tensor]] = [{} for _ in jobs]
    with contextlib.ExitStack() as stack:
        for job, work in zip(jobs, works):
            stack.enter_context(bn_eval_if_single(work, job.x.shape[0]))
        for step in range(max(job.local_steps for job in jobs)):
            clients = [i for i, job in enumerate(jobs) if step < job.local_steps]
            grads = []
            for i in clients:
                with jobs[i].rng or contextlib.nullcontext():
                    grads.append(batch_gradient(works[i], jobs[i].x, jobs[i].y))
            if gradient_transform is not None:
                grads = gradient_transform(clients, [works[i] for i in clients], [jobs[i].x for i in clients],
                                           [jobs[i].y for i in clients], grads, step=step)
            for i, grad in zip(clients, grads):
                last[i] = grad
                if jobs[i].kind == "model_delta":
                    with torch.no_grad():
                        for n in names[i]:
                            params[i][n].sub_(jobs[i].local_lr * grad[n])
    out = []
    for i, (job, work) in enumerate(zip(jobs, works)):
        if job.kind == "gradient":
            tensors = {n: last[i][n] for n in names[i]}
        else:
            tensors = {n: (start[i][n] - params[i][n].detach()).clone() for n in names[i]}
        buffers = {n: b.detach().clone() for n, b in work.named_buffers()} if has_batchnorm(work) else None
        out.append(SharedUpdate(
            tensors=tensors,
            kind=job.kind,
            batch_size=int(job.x.shape[0] if job.batch_size is None else job.batch_size),
            local_steps=job.local_steps,
            local_lr=float(job.local_lr) if job.kind == "model_delta" else 0.0,
            buffers=buffers,
        ))
    return out

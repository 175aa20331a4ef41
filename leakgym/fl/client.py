"""The client's update computation: one gradient (FedSGD) or E local SGD steps (FedAvg).

``compute_update`` is functional: the caller's model is never modified (parameters, buffers, mode).
The work happens on a private copy of the model, in **train** mode (BatchNorm normalises with batch
statistics, PRECODE samples; see :mod:`leakgym.models.base`), except that BatchNorm layers use
their running statistics when the batch holds a single example
(:func:`leakgym.models.bn_eval_if_single`).

* FedSGD (``kind="gradient"``, McMahan et al. 2017): the shared tensors are
  ``g = grad_w L(w; x, y)``, the gradient of the batch-mean :func:`leakgym.models.task_loss`.
* FedAvg (``kind="model_delta"``): ``E = local_steps`` full-batch steps of the local optimiser on the
  same batch -- plain SGD ``w_{e+1} = w_e - lr * g_e`` by default, or SGD with momentum / weight decay or
  Adam (``optimizer=``, :class:`leakgym.fl.optim.LocalOptimizer`, fresh state every round) -- and the
  shared tensors are ``w_0 - w_E`` (signed like a gradient, see :class:`~leakgym.fl.update.SharedUpdate`).
  The plain client steps with ``torch.optim`` on its private copy; the stacked cohort
  (``batched=True``) with the same ``torch.optim`` class on its stacked ``(K, ...)`` parameters (the
  optimisers are elementwise, so a stacked step is every client's own step).

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
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from leakgym.devices import in_library_modes
from leakgym.fl import batched as fl_batched
from leakgym.fl.optim import PLAIN_SGD, LocalOptimizer
from leakgym.fl.update import SharedUpdate, UpdateKind
from leakgym.models import bn_eval_if_single, has_batchnorm, in_mode, task_loss


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
    #: FedAvg's local optimiser (None: plain SGD, :data:`leakgym.fl.optim.PLAIN_SGD`)
    optimizer: LocalOptimizer | None = None


class BatchedGradientTransform(Protocol):
    """A per-step transform of several clients' gradients at once: ``(clients, models, xs, ys, grads,
    step=...) -> grads``. ``clients`` are the indices (into :func:`compute_updates`' list) of the clients
    taking step ``step``; the other lists are theirs, in that order."""

    def __call__(self, clients: list[int], models: list[nn.Module], xs: list[Tensor], ys: list[Tensor],
                 grads: list[dict[str, Tensor]], *, step: int) -> list[dict[str, Tensor]]: ...


def _check(job: LocalTraining) -> None:
    fl_batched.check_protocol(job.kind, job.local_steps, job.local_lr, job.optimizer)
    x, y = job.x, job.y
    if x.dim() != 4 or x.shape[0] < 1:
        raise ValueError(f"x must be a non-empty (N, C, H, W) batch, got shape {tuple(x.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y has {y.shape[0]} entries but x has {x.shape[0]} images")
    size = job.batch_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"batch_size={size!r}; allowed: integers >= 1, or None (the batch's size)")


def _check_labels(jobs: list[LocalTraining]) -> None:
    """Class-index labels in ``[0, classes)`` (:func:`leakgym.fl.batched.check_labels`), one host copy for all jobs."""
    fl_batched.check_labels([(job.model, job.y) for job in jobs], lambda i: f"client {i}")


@in_library_modes
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
    optimizer: LocalOptimizer | None = None,
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
        optimizer: FedAvg's local optimiser (:class:`~leakgym.fl.optim.LocalOptimizer`; None: plain SGD);
            anything but plain SGD needs ``kind="model_delta"``.

    Returns:
        A :class:`SharedUpdate`. ``buffers`` holds the BatchNorm running statistics after the round
        when the model has BatchNorm, else ``None``.
    """
    job = LocalTraining(model, x, y, kind=kind, local_steps=local_steps, local_lr=local_lr, batch_size=batch_size,
                        optimizer=optimizer)
    many = None
    if gradient_transform is not None:
        def many(clients, models, xs, ys, grads, *, step):
            return [gradient_transform(models[0], xs[0], ys[0], grads[0], step=step)]
    return compute_updates([job], many)[0]


@in_library_modes
def compute_updates(jobs: list[LocalTraining], gradient_transform: BatchedGradientTransform | None = None, *,
                    batched: bool = False) -> list[SharedUpdate]:
    """:func:`compute_update` of several clients in lock-step, so that a per-step defense can transform
    every client's step-``s`` gradient in one batched computation (DCS²'s synthesis over the victims of
    all games of a vector step, :meth:`~leakgym.defenses.registry.StepDefense.apply_many`).

    Step ``s`` computes the gradient of every client with more than ``s`` local steps (each inside its
    own ``rng``), passes them all to ``gradient_transform``, then takes every such client's SGD step.
    Client ``i``'s update is what :func:`compute_update` computes for it alone when the transform
    treats clients independently. Every job is validated before any work starts.

    ``batched=True``: clients that :func:`leakgym.fl.batched.supports` (no dropout, no PRECODE: nothing
    drawn from ``rng``) with no BatchNorm layer in train mode (no BatchNorm, or a batch of one, which
    normalises with the running statistics), and that share an architecture, batch and label shapes and
    protocol, train as one cohort: their parameters stacked, each step's gradients one vmapped
    computation (:func:`leakgym.fl.batched.benign_updates`), no private copy of each model (the
    transform gets the clients' own models, in train mode while it runs, at step 0; FedAvg's later steps
    give it copies at the current parameters). Equal to the client-by-client computation to float32
    rounding (vectorised kernels), hence off by default; a lone client keeps the exact path.
    """
    for job in jobs:
        _check(job)
    if not jobs:
        return []
    _check_labels(jobs)
    cohorts = _cohorts(jobs, batched)
    with contextlib.ExitStack() as stack:
        for cohort in cohorts:
            stack.enter_context(cohort.training())
        for step in range(max(job.local_steps for job in jobs)):
            taking = [c for c in cohorts if step < c.local_steps]
            grad_of = {i: g for c in taking for i, g in zip(c.members, c.gradients())}
            clients = sorted(grad_of)  # the transform sees the clients in order
            if gradient_transform is not None:
                model_of = {i: m for c in taking for i, m in zip(c.members, c.models(step))}
                grad_of = dict(zip(clients, gradient_transform(
                    clients, [model_of[i] for i in clients], [jobs[i].x for i in clients], [jobs[i].y for i in clients],
                    [grad_of[i] for i in clients], step=step)))
            for c in taking:
                c.take_step([grad_of[i] for i in c.members])
    out: list[SharedUpdate | None] = [None] * len(jobs)
    for cohort in cohorts:
        for i, update in zip(cohort.members, cohort.updates()):
            out[i] = update
    return out  # type: ignore[return-value]


def _shared_update(job: LocalTraining, tensors: dict[str, Tensor], buffers: dict[str, Tensor] | None) -> SharedUpdate:
    update = SharedUpdate(
        tensors=tensors,
        kind=job.kind,
        batch_size=int(job.x.shape[0] if job.batch_size is None else job.batch_size),
        local_steps=job.local_steps,
        local_lr=float(job.local_lr) if job.kind == "model_delta" else 0.0,
        buffers=buffers,
    )
    mark_optimizer(update, job.optimizer)
    return update


def mark_optimizer(update: SharedUpdate, optimizer: LocalOptimizer | None) -> None:
    """Record a FedAvg update's local optimiser in ``update.metadata["local_optimizer"]`` when it is not plain
    SGD (the attacks' simulation of the local steps is plain SGD with ``local_lr``; the mark says when the
    client's steps were another rule)."""
    if optimizer is not None and not optimizer.plain:
        update.metadata["local_optimizer"] = optimizer.describe()


class _OnItsCopy:
    """One client trained on a private copy of its model (any model; the reference computation)."""

    def __init__(self, index: int, job: LocalTraining) -> None:
        self.members, self.job, self.local_steps = [index], job, job.local_steps
        self.work = copy.deepcopy(job.model).train()
        self.names = [n for n, p in self.work.named_parameters() if p.requires_grad]
        self.params = dict(self.work.named_parameters())
        # FedAvg's update is start - end: only model_delta clients keep a copy of their start.
        self.start = {n: self.params[n].detach().clone() for n in self.names} if job.kind == "model_delta" else {}
        self.last: dict[str, Tensor] = {}
        opt = job.optimizer or PLAIN_SGD
        # Plain SGD keeps its in-place w -= lr * g (bit-identical to the trajectories before optimisers);
        # any other rule is torch.optim's on the private copy, with fresh state (stateless clients).
        self.optimizer = (None if opt.plain or job.kind != "model_delta"
                          else opt.torch_optimizer([self.params[n] for n in self.names], job.local_lr))

    def training(self) -> AbstractContextManager:
        return bn_eval_if_single(self.work, self.job.x.shape[0])

    def gradients(self) -> list[dict[str, Tensor]]:
        with self.job.rng or contextlib.nullcontext():
            return [batch_gradient(self.work, self.job.x, self.job.y)]

    def models(self, step: int) -> list[nn.Module]:
        return [self.work]

    def take_step(self, grads: list[dict[str, Tensor]]) -> None:
        self.last = grads[0]
        if self.optimizer is not None:
            for n in self.names:
                self.params[n].grad = self.last[n].detach().clone()
            self.optimizer.step()
            for n in self.names:
                self.params[n].grad = None
        elif self.job.kind == "model_delta":
            with torch.no_grad():
                for n in self.names:
                    self.params[n].sub_(self.job.local_lr * self.last[n])

    def updates(self) -> list[SharedUpdate]:
        if self.job.kind == "gradient":
            tensors = {n: self.last[n] for n in self.names}
        else:
            tensors = {n: (self.start[n] - self.params[n].detach()).clone() for n in self.names}
        buffers = {n: b.detach().clone() for n, b in self.work.named_buffers()} if has_batchnorm(self.work) else None
        return [_shared_update(self.job, tensors, buffers)]


class _Stacked:
    """Clients of one architecture and protocol trained together: parameters stacked ``(K, ...)``, each
    step's gradients one vmapped computation (:func:`leakgym.fl.batched.benign_updates` with one client
    per row). Their models :func:`leakgym.fl.batched.supports` and none has BatchNorm in train mode, so
    a model's forward pass draws nothing and changes no buffer (see :func:`compute_updates`)."""

    def __init__(self, members: list[int], jobs: list[LocalTraining]) -> None:
        self.members, self.jobs = members, [jobs[i] for i in members]
        lead = self.jobs[0]
        self.kind, self.local_steps, self.local_lr = lead.kind, lead.local_steps, lead.local_lr
        self.architecture = lead.model
        self.start = fl_batched.stack_parameters([j.model for j in self.jobs])
        self.params = self.start
        opt = lead.optimizer or PLAIN_SGD
        self.optimizer = None
        if self.kind == "model_delta" and not opt.plain:
            # torch.optim on the stacked (K, ...) leaves: SGD and Adam are elementwise, so one step of the
            # stack is each client's own step (what _OnItsCopy takes on a copy of one model).
            self.params = {n: t.detach().clone() for n, t in self.start.items()}
            self.optimizer = opt.torch_optimizer(list(self.params.values()), self.local_lr)
        self.buffers = fl_batched.stack_buffers([j.model for j in self.jobs]) if has_batchnorm(lead.model) else None
        self.x = torch.stack([j.x for j in self.jobs]).unsqueeze(1)
        self.y = torch.stack([j.y for j in self.jobs]).unsqueeze(1)
        self.copies: list[nn.Module] | None = None
        self.last: list[dict[str, Tensor]] = []

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """The clients' models in train mode while they train (BatchNorm in eval mode for a batch of one, as
        on a private copy), every module in its own mode again after."""
        with contextlib.ExitStack() as stack:
            for model in {id(j.model): j.model for j in self.jobs}.values():
                stack.enter_context(in_mode(model, True))
                stack.enter_context(bn_eval_if_single(model, self.x.shape[2]))
            yield

    def gradients(self) -> list[dict[str, Tensor]]:
        # (the jobs were checked by compute_updates: no check again at every local step)
        out = fl_batched.benign_updates_unchecked(self.architecture, self.params, self.x, self.y, kind="gradient",
                                                  local_steps=1, local_lr=0.1, buffers=self.buffers,
                                                  optimizer=PLAIN_SGD, vectorise=None)
        return [{n: t[k, 0] for n, t in out.tensors.items()} for k in range(len(self.members))]

    def models(self, step: int) -> list[nn.Module]:
        """The clients' models at their current parameters, for the gradient transform."""
        if step == 0:
            return [j.model for j in self.jobs]
        if self.copies is None:  # FedAvg's later steps: private copies, in the clients' training modes
            self.copies = [copy.deepcopy(j.model) for j in self.jobs]
        with torch.no_grad():
            for k, model in enumerate(self.copies):
                own = dict(model.named_parameters())
                torch._foreach_copy_([own[n] for n in self.params], [t[k] for t in self.params.values()])
        return self.copies

    def take_step(self, grads: list[dict[str, Tensor]]) -> None:
        self.last = grads
        if self.optimizer is not None:
            for n, p in self.params.items():
                p.grad = torch.stack([g[n] for g in grads])
            self.optimizer.step()
            for p in self.params.values():
                p.grad = None
        elif self.kind == "model_delta":
            self.params = {n: p - self.local_lr * torch.stack([g[n] for g in grads]) for n, p in self.params.items()}

    def updates(self) -> list[SharedUpdate]:
        out = []
        for k, job in enumerate(self.jobs):
            if self.kind == "gradient":
                tensors = {n: self.last[k][n] for n in self.params}
            else:
                tensors = {n: (self.start[n][k] - self.params[n][k]).clone() for n in self.params}
            # No BatchNorm layer trained (see the class docstring): the running statistics are the model's.
            buffers = {n: b.detach().clone() for n, b in job.model.named_buffers()} if self.buffers is not None else None
            out.append(_shared_update(job, tensors, buffers))
        return out


def _cohorts(jobs: list[LocalTraining], batched: bool) -> list[_OnItsCopy | _Stacked]:
    """The clients grouped for training: with ``batched``, clients that :class:`_Stacked` takes and that
    share a key form one stacked cohort (two or more); every other client trains on its own copy."""
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        model = job.model
        if batched and fl_batched.supports(model) and (job.x.shape[0] == 1 or not has_batchnorm(model)):
            key = (fl_batched.signature(model), tuple(job.x.shape), job.x.dtype, job.x.device, tuple(job.y.shape),
                   job.y.dtype, job.kind, job.local_steps, job.local_lr, job.optimizer or PLAIN_SGD)
            groups.setdefault(key, []).append(i)
    cohorts: list[_OnItsCopy | _Stacked] = [_Stacked(m, jobs) for m in groups.values() if len(m) > 1]
    stacked = {i for c in cohorts for i in c.members}
    return cohorts + [_OnItsCopy(i, job) for i, job in enumerate(jobs) if i not in stacked]

"""The client-side defense pipeline: (model, private batch, DefenseConfig) -> (SharedUpdate, report).

A client's shared update is built in three stages; within a stage the registered defenses apply in
registry order (:data:`~leakgym.defenses.registry.PIPELINE_ORDER`), and any subset composes:

1. **Input side** — transform the private batch the client trains on (built in: ``oasis``
   (add augmented copies, :mod:`.oasis`) -> ``loda`` (replace images by obscured ones, :mod:`.loda`)
   -> ``mixup`` / ``instahide`` (mix images, soft labels, :mod:`.encodings`)).
2. **Training** — one gradient (FedSGD, ``update_kind="gradient"``) or ``local_steps`` SGD steps
   (FedAvg, ``update_kind="model_delta"``) via :func:`leakgym.fl.client.compute_updates`; every step's
   gradient passes through the step-stage defenses (``dcs2`` (concealed samples, :mod:`.dcs2`) ->
   ``censor`` (orthogonal resampling, :mod:`.censor`)). Several calls (:func:`apply_defense_many`: the
   victims of a vector step's games) train in lock-step, so each step defense sees every call's
   step-``s`` gradient at once (DCS² synthesises all its clients' concealed samples together), and
   with ``batch_defenses`` the calls of one architecture take each step's gradients as one vmapped
   computation over their stacked parameters (``compute_updates(batched=True)``).
3. **Update side** — transform the final shared update (``ppp`` (perturb the pre-bottleneck layers,
   :mod:`.ppp`) -> ``soteria`` (prune head-weight columns, :mod:`.soteria`) -> ``prune`` (per-layer
   magnitude pruning) -> ``topk`` (global top-k, :mod:`.sparsification`) -> ``clip`` (global L2
   clipping) -> ``clip_value`` (per-entry clamping, :mod:`.value_clipping`) -> ``noise``
   (Gaussian/Laplace, :mod:`.perturbation`)).

Input-side first because they change what is trained on; update-side last because they post-process
what is sent; within the update side, selection/pruning precedes clipping, and noise comes last so
that it is never pruned or clipped away (the DP-SGD order clip -> noise).

The pipeline knows no defense by name: each one's ``apply`` gets a
:class:`~leakgym.defenses.registry.DefenseContext` and returns its details, which land in
``DefenseReport.details[name]`` (a list with one entry per local step for step-stage defenses).
What a defense attaches to the update (Mixup's ``"encoding"``) goes through ``ctx.metadata`` into
``SharedUpdate.metadata``. A defense may withhold the round's update (``ctx.skip_round()``, CENSOR's
``"skip"`` fallback): the shared tensors are then all zero, ``metadata["skipped"]`` is ``True`` and
``details["skipped"]`` too; the server leaves such updates out of the aggregate.

The declared ``batch_size`` of the shared update is always the original ``B``: OASIS adds copies,
and the client does not tell the server. The model passed in is never modified.

The report compares against the *clean* update — the same computation with no defense, same seed —
so ``fidelity`` (cosine between shared and clean update over all parameters) is 1.0 exactly and
``overhead_s`` is 0 when no defense is on. With input-side or step defenses ``overhead_s`` is the
measured wall time of the defended computation minus that of the clean one (clamped at 0; both include
the gradient computation); with update-side defenses only, the defended update is the clean update
post-processed (computed once), and ``overhead_s`` is the post-processing time.

Randomness: every defense draws from its own ``torch.Generator`` derived from ``seed`` and its name,
created on the private batch's device, so switching one defense on does not change another's
draws. The PRECODE bottleneck samples from the global RNG (``torch.randn_like`` has no generator),
so both the clean and the defended computation run inside ``torch.random.fork_rng`` seeded with
``seed``; the caller's global RNG state is untouched. Calls trained in lock-step each keep their own
stream (:class:`~leakgym.defenses.registry.GlobalRngStream`), entered around each of the call's
computations, so a call draws what it would draw alone.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from leakgym.defenses.config import DefenseConfig
from leakgym.defenses.registry import (
    DEFENSES,
    DefenseContext,
    GlobalRngStream,
    derived_generator,
    reads_public_split,
    seeded_global_rng,
)
from leakgym.devices import in_library_modes
from leakgym.fl.bank import ModelBank
from leakgym.fl.client import LocalTraining, compute_update, compute_updates
from leakgym.fl.optim import LocalOptimizer
from leakgym.fl.update import SharedUpdate, UpdateKind, cosine_similarity

__all__ = ["DefenseCall", "DefenseReport", "apply_defense", "apply_defense_many", "derived_generator"]


@dataclass
class DefenseReport:
    """What a defense did to one client's update.

    Attributes:
        applied: names of the defenses applied, in pipeline order (``[]`` for no defense).
        overhead_s: extra wall time over computing the clean update (seconds, measured, >= 0).
        fidelity: cosine similarity between the shared and the clean update (1.0 = unchanged).
        details: per-defense numbers under the defense's name, e.g. ``details["censor"]`` (one
            entry per local step: what was sent, chosen trial, initial/best/trial losses),
            ``details["soteria"]["pruned_units"]``; and ``details["examples_used"]`` (examples
            actually trained on), ``details["declared_batch_size"]``, ``details["skipped"]`` (the
            update was withheld).
    """

    applied: list[str]
    overhead_s: float
    fidelity: float
    details: dict = field(default_factory=dict)


@in_library_modes
def apply_defense(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    config: DefenseConfig | None = None,
    *,
    update_kind: UpdateKind = "gradient",
    local_steps: int = 1,
    local_lr: float = 0.1,
    seed: int = 0,
    public_x: Tensor | None = None,
    public_y: Tensor | None = None,
    clean: SharedUpdate | None = None,
    clean_seconds: float = 0.0,
    optimizer: LocalOptimizer | None = None,
) -> tuple[SharedUpdate, DefenseReport]:
    """Compute the update a defended client shares (see the module docstring for the order).

    Args:
        model: the global model (a :class:`~leakgym.models.LeakGymModel`, which carries its ``spec``).
        x: the private batch, normalised images ``(B, C, H, W)``.
        y: its labels, ``int64 (B,)``.
        config: the defense; ``None`` or ``DefenseConfig()`` is no defense.
        update_kind: ``"gradient"`` (FedSGD) or ``"model_delta"`` (FedAvg).
        local_steps, local_lr: FedAvg local training (``local_steps`` must be 1 for FedSGD).
        seed: seeds every random choice of the defenses (and PRECODE's sampling).
        public_x, public_y: the public split as *unit* images ``[0, 1]`` and labels (the
            convention of :class:`~leakgym.attacks.base.AttackerKnowledge`); used by LODA, DCS² and
            cross-dataset InstaHide. Moved to ``x``'s device and normalised here.
        clean: the clean update, when the caller has already computed it -- what
            ``compute_update(model, x, y, kind=update_kind, local_steps=local_steps, local_lr=local_lr)``
            returns, e.g. for all games of a vector step at once (:mod:`leakgym.fl.batched`); it is not
            modified. ``clean_seconds``: the time it took (this client's share), for ``overhead_s``.
        optimizer: FedAvg's local optimiser (:class:`leakgym.fl.optim.LocalOptimizer`; None: plain SGD),
            used for the clean and the defended training alike.

    Without input-side or step defenses the defended update *is* the clean update, post-processed by
    the update-side defenses: it is not computed a second time.

    Returns:
        ``(SharedUpdate, DefenseReport)``.
    """
    return apply_defense_many([DefenseCall(
        model, x, y, config, update_kind=update_kind, local_steps=local_steps, local_lr=local_lr, seed=seed,
        public_x=public_x, public_y=public_y, clean=clean, clean_seconds=clean_seconds, optimizer=optimizer)])[0]


@dataclass
class DefenseCall:
    """The arguments of one :func:`apply_defense` call (one client), for :func:`apply_defense_many`."""

    model: nn.Module
    x: Tensor
    y: Tensor
    config: DefenseConfig | None = None
    update_kind: UpdateKind = "gradient"
    local_steps: int = 1
    local_lr: float = 0.1
    seed: int = 0
    public_x: Tensor | None = None
    public_y: Tensor | None = None
    clean: SharedUpdate | None = None
    clean_seconds: float = 0.0
    optimizer: LocalOptimizer | None = None


@dataclass
class _Client:
    """One call's state between the stages of :func:`apply_defense_many`."""

    call: DefenseCall
    config: DefenseConfig
    clean: SharedUpdate
    t_clean: float
    details: dict
    applied: list[str] = field(default_factory=list)
    done: tuple[SharedUpdate, DefenseReport] | None = None
    ctx: dict[str, DefenseContext] = field(default_factory=dict)
    shared: SharedUpdate | None = None
    x_in: Tensor | None = None
    y_in: Tensor | None = None
    metadata: dict = field(default_factory=dict)
    recomputed: bool = False
    seconds: float = 0.0


@in_library_modes
def apply_defense_many(calls: list[DefenseCall], *,
                       batch_defenses: bool = True) -> list[tuple[SharedUpdate, DefenseReport]]:
    """:func:`apply_defense` of every call (e.g. the victims of all games of a vector step), each stage
    batched over the calls: each input-side defense runs once for all calls that apply it
    (:meth:`~leakgym.defenses.registry.InputDefense.apply_many`); the calls that train are trained in
    lock-step and each step defense runs once per local step for all calls that apply it
    (:meth:`~leakgym.defenses.registry.StepDefense.apply_many`); each update-side defense runs once, as
    :meth:`~leakgym.defenses.registry.UpdateDefense.apply_many` over every call that applies it (pipeline
    order is kept for each call). The clean updates not given are computed call by call. Each call's
    result equals its own :func:`apply_defense` (to the rounding of a defense's batched kernels); a
    batched defense's wall time is shared equally by the calls in it; the calls that train and share an
    architecture take their gradients as one vmapped computation (``compute_updates(batched=True)``;
    the models' modes are set for training and restored, their parameters untouched).
    ``batch_defenses=False`` applies the input and step defenses and trains call by call instead (their
    ``apply``, a private copy of each model): each call's result is then bit-identical to its own
    :func:`apply_defense` (the update-side batches are bit-identical anyway).
    """
    clients = [_begin(c) for c in calls]
    busy = [c for c in clients if c.done is None]
    _train(busy, batch_defenses)
    t0 = time.perf_counter()
    staged = [c for c in busy if any(DEFENSES[n].stage == "update" for n in c.applied)]
    for d in DEFENSES.values():
        if d.stage != "update":
            continue
        members = [c for c in staged if d.name in c.applied]
        if not members:
            continue
        outs = d.apply_many([c.ctx[d.name] for c in members], [c.shared.tensors for c in members],
                            [c.x_in for c in members], [c.y_in for c in members])
        for c, (tensors, info) in zip(members, outs):
            c.shared.tensors, c.details[d.name] = tensors, info
    share = (time.perf_counter() - t0) / max(1, len(staged))
    for c in staged:
        c.seconds += share
    return [c.done if c.done is not None else _finish(c) for c in clients]


def _begin(call: DefenseCall) -> _Client:
    """Validate a call and get its clean update; a call with no defense is done here."""
    model, x, y = call.model, call.x, call.y
    config = DefenseConfig() if call.config is None else call.config
    if not isinstance(config, DefenseConfig):
        raise ValueError(f"config must be a DefenseConfig, got {type(config).__name__}")  # noqa: TRY004 (contract)
    if x.dim() != 4 or x.shape[0] < 1:
        raise ValueError(f"x must be a non-empty (B, C, H, W) batch, got shape {tuple(x.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y has {y.shape[0]} entries but x has {x.shape[0]} images")
    if (call.public_x is None) != (call.public_y is None):
        raise ValueError("public_x and public_y must be given together")
    batch = int(x.shape[0])
    device = x.device
    clean = call.clean
    update_kind, local_steps, local_lr, seed = call.update_kind, call.local_steps, call.local_lr, call.seed
    if clean is None:
        t0 = time.perf_counter()
        with seeded_global_rng(seed, device):
            clean = compute_update(model, x, y, kind=update_kind, local_steps=local_steps, local_lr=local_lr,
                                   optimizer=call.optimizer)
        t_clean = time.perf_counter() - t0
    else:
        named = ModelBank.named_parameters(model) or model.named_parameters()  # (a game's model: banked)
        trained = {n for n, p in named if p.requires_grad}
        if clean.kind != update_kind or set(clean.tensors) != trained:
            raise ValueError(f"clean is a {clean.kind!r} update of {sorted(clean.tensors)[:3]}...; expected the "
                             f"{update_kind!r} update of every parameter of the model")
        t_clean = float(call.clean_seconds)
    details: dict = {"declared_batch_size": batch, "examples_used": batch}
    client = _Client(call=call, config=config, clean=clean, t_clean=t_clean, details=details, applied=config.active())
    if not client.applied:
        client.done = (clean, DefenseReport(applied=[], overhead_s=0.0, fidelity=1.0, details=details))
        return client
    spec = model.spec
    public_xn = public_yd = None
    if call.public_x is not None and reads_public_split(config):
        public_xn, public_yd = spec.normalize(call.public_x.to(x)), call.public_y.to(device)
    client.ctx = {
        name: DefenseContext(
            name=name, config=config, model=model, spec=spec, device=device, seed=seed,
            generator=derived_generator(seed, name, device), public_x=public_xn, public_y=public_yd,
            batch_size=batch, update_kind=update_kind, metadata=client.metadata,
        )
        for name in client.applied
    }
    return client


def _train(clients: list[_Client], batch_defenses: bool = True) -> None:
    """Stages 1 and 2 of every call: each input-side defense once for all calls that apply it
    (:meth:`~leakgym.defenses.registry.InputDefense.apply_many`), then the calls that train (an
    input-side or step defense is on) trained in lock-step (:func:`~leakgym.fl.client.compute_updates`),
    each step's gradients passed through each step defense once for all calls that apply it
    (:meth:`~leakgym.defenses.registry.StepDefense.apply_many`); the others reuse their clean update.
    ``batch_defenses``: the calls of one architecture train as one vmapped computation
    (``compute_updates(batched=True)``); False: every defense's ``apply`` and every call's training call by
    call instead."""
    # ---- 1. input side: each defense once for the calls that apply it, in pipeline order -------------
    for c in clients:
        c.x_in, c.y_in = c.call.x, c.call.y
    for d in DEFENSES.values():
        members = [c for c in clients if d.stage == "input" and d.name in c.applied]
        if not members:
            continue
        ctxs, xs, ys = [c.ctx[d.name] for c in members], [c.x_in for c in members], [c.y_in for c in members]
        outs, seconds = _timed_per_call(batch_defenses, functools.partial(d.apply_many, ctxs, xs, ys),
                                        [functools.partial(d.apply, *one) for one in zip(ctxs, xs, ys)])
        for c, (x_in, y_in, info), sec in zip(members, outs, seconds):
            c.x_in, c.y_in, c.details[d.name] = x_in, y_in, info
            c.seconds += sec
    for c in clients:
        t1 = time.perf_counter()
        details = c.details
        details["examples_used"] = int(c.x_in.shape[0])
        for name in c.applied:
            if DEFENSES[name].stage == "step":
                details[name] = []
        c.recomputed = any(DEFENSES[n].stage in ("input", "step") for n in c.applied)
        if not c.recomputed:  # the same computation as the clean update (same arguments, same seeded RNG): reuse it
            clean = c.clean
            c.shared = dataclasses.replace(clean, tensors={k: t.clone() for k, t in clean.tensors.items()},
                                           metadata=dict(clean.metadata))
        c.seconds += time.perf_counter() - t1

    # ---- 2. training with per-step gradient transforms -------------------------------------------
    training = [c for c in clients if c.recomputed]
    if not training:
        return
    streams = [GlobalRngStream(c.call.seed, c.call.x.device) for c in training]
    for c, stream in zip(training, streams):
        for ctx in c.ctx.values():
            ctx.training_rng = stream
    step_defenses = [d for d in DEFENSES.values() if d.stage == "step" and any(d.name in c.applied for c in training)]
    spent = [0.0] * len(training)

    def transform(indices, models, xs, ys, grads, *, step):
        grads = list(grads)
        for d in step_defenses:
            members = [k for k, i in enumerate(indices) if d.name in training[i].applied]
            if not members:
                continue
            ctxs = [training[indices[k]].ctx[d.name] for k in members]
            args = ([models[k] for k in members], [xs[k] for k in members], [ys[k] for k in members],
                    [grads[k] for k in members])
            outs, seconds = _timed_per_call(
                batch_defenses, functools.partial(d.apply_many, ctxs, *args, step=step),
                [functools.partial(_apply_in_stream, d, *one, step=step) for one in zip(ctxs, *args)])
            for k, (grad, info), sec in zip(members, outs, seconds):
                grads[k] = grad
                training[indices[k]].details[d.name].append(info)
                spent[indices[k]] += sec
        return grads

    jobs = [LocalTraining(c.call.model, c.x_in, c.y_in, kind=c.call.update_kind, local_steps=c.call.local_steps,
                          local_lr=c.call.local_lr, batch_size=int(c.call.x.shape[0]), rng=stream,
                          optimizer=c.call.optimizer)
            for c, stream in zip(training, streams)]
    t0 = time.perf_counter()
    updates = compute_updates(jobs, transform if step_defenses else None, batched=batch_defenses)
    # Each call's own step-defense time, plus an equal share of the rest (its gradients, the lock-step loop).
    rest = max(0.0, time.perf_counter() - t0 - sum(spent)) / len(training)
    for c, update, own in zip(training, updates, spent):
        c.shared = update
        c.seconds += own + rest


def _timed_per_call(batched: bool, many: Callable[[], list], ones: list[Callable[[], Any]]) -> tuple[list, list[float]]:
    """One defense for several calls: ``many()`` at once (its wall time shared equally), or each of
    ``ones`` in turn (each timed on its own). Returns the results and each call's seconds."""
    t0 = time.perf_counter()
    if batched:
        outs = many()
        return outs, [(time.perf_counter() - t0) / len(ones)] * len(ones)
    outs, seconds = [], []
    for one in ones:
        outs.append(one())
        seconds.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
    return outs, seconds


def _apply_in_stream(d, ctx: DefenseContext, *args: Any, step: int):
    """A step defense's ``apply`` for one call, inside the call's training RNG stream."""
    with ctx.training_rng:
        return d.apply(ctx, *args, step=step)


def _finish(c: _Client) -> tuple[SharedUpdate, DefenseReport]:
    """Stage 3's aftermath: a withheld update, the metadata, the report."""
    shared, details = c.shared, c.details
    if c.metadata.get("skipped"):
        # The client sends nothing this round; the zeros are a placeholder the server ignores.
        shared.tensors = {k: torch.zeros_like(t) for k, t in shared.tensors.items()}
        details["skipped"] = True
    shared.metadata.update(c.metadata)
    report = DefenseReport(
        applied=c.applied,
        # recomputed: the defended computation includes its own gradient; else only the post-processing
        overhead_s=max(0.0, c.seconds - c.t_clean) if c.recomputed else c.seconds,
        fidelity=cosine_similarity(shared.tensors, c.clean.tensors),
        details=details,
    )
    return shared, report

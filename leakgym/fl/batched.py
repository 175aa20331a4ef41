"""Federated-learning rounds of many games at once: benign updates, aggregation and evaluation.

A vector of N games runs, every round, K benign clients per game, one aggregation per game and one
evaluation per game. Done game by game (:func:`leakgym.fl.client.compute_update`,
:meth:`leakgym.fl.server.Server.aggregate`, :meth:`~leakgym.fl.server.Server.evaluate`) that is
``N x (K + 2)`` small computations with a ``deepcopy`` each; here it is one computation per phase:

* :func:`benign_updates` -- the ``N x K`` client updates as one ``torch.func.vmap`` (over games, with
  each game's parameters stacked) of a ``vmap`` (over clients) of ``torch.func.grad`` of
  :func:`leakgym.models.task_loss`: FedSGD gradients, or FedAvg model differences ``w_0 - w_E`` after
  ``E`` local steps of the clients' optimiser unrolled functionally (plain SGD, or
  :meth:`leakgym.fl.optim.LocalOptimizer.step`: SGD with momentum / weight decay, Adam), and for BatchNorm models each client's running
  statistics after its training; :func:`client_updates` -- the same for one client per game (the
  victims' clean updates), as ``SharedUpdate`` objects. A plain layer stack (DLG's LeNet) skips vmap:
  its ``N x K`` clients are rows of its row-wise form (:func:`leakgym.models.parameter_sets.batched_loss`
  with :mod:`leakgym.models.rowwise`), each with its own copy of its game's
  parameters, and one ``torch.autograd.grad`` of the rows' summed losses gives every client its own
  gradient, where its convolutions are small enough for the unfolded form
  (:meth:`~leakgym.models.rowwise.RowwiseForward.fits`; measured per call on digits LeNet, one
  image per client, one CPU thread: 1 game x 4 clients 3.5 -> 1.1 ms, 16 x 4 7.8 -> 5.5 ms, 64 x 4
  20.7 -> 22.0 ms, 256 x 1 23.6 -> 20.9 ms). Larger batches of such a stack on a CPU take its grouped form
  (:meth:`~leakgym.models.rowwise.RowwiseForward.grouped_loss`: the grouped convolutions vmap makes, with
  a faster weight gradient for small outputs, :func:`leakgym.models.convolution.grouped_conv2d`; measured
  per call, digits LeNet, 256 games x 1 client x 8 images, one thread: 73-83 -> 54-56 ms vmapped vs grouped;
  64 x 4 x 8, FedAvg 2 steps, 146-152 -> 117-124 ms; CIFAR-10 LeNet, 64 x 1 x 8, 81-90 -> 73-81 ms); the victims'
  defended training
  (:func:`leakgym.fl.client.compute_updates` with ``batched=True``) takes one :func:`benign_updates`
  gradient per local step, so that a step defense can transform it in between. Any other model (BatchNorm:
  the CIFAR ConvNet, ResNet-18) is vmapped on an accelerator, but on a CPU its clients train one after
  another (:func:`_looped_updates`: ``functional_call`` of the model under each game's parameters, the plain
  kernels of one model, and ``torch.autograd.grad``; BatchNorm updates a copy of the game's running
  statistics in place, as ``compute_update``'s private copy does). Vmap makes every convolution of the games'
  own weights one grouped convolution, and on a CPU that loses to the games' plain convolutions. Measured,
  CIFAR ConvNet on 32x32 images, one CPU thread, ms per game, one after another / vmapped / a loop of
  ``compute_update``: 16 games x 1 client x 8 images 38-45 / 110-114 / 39-47; 8 games x 7 clients x 8
  images 266-269 / 1,084-1,116 / 277-283; 16 x 1 x 2 11-11.4 / 18.5-19.3 / 13-14; 16 x 1 x 1 (the victims'
  clean updates) 7.4-7.5 / 6.8-7.4 / 9.3-9.5. Vmapped passes of fewer games did not help (16 x 1 x 8, passes
  of 1 / 2 / 4 games: 63 / 70 / 66 ms);
* :func:`aggregate_many` -- every game's example-weighted mean of its clients' updates applied to its
  parameters, and :func:`average_buffers_many` -- of their BN running statistics, with the arithmetic
  of :meth:`Server.aggregate` (same operations in the same order);
* :func:`evaluate_many` -- accuracy and mean cross-entropy of N models on their held-out sets.

BatchNorm: clients train in train mode, so BN normalises with the batch's statistics and updates its
running statistics in place -- which ``vmap`` cannot do to one shared buffer. The clients here run on a
private copy of the architecture whose BN layers keep no running statistics
(``torch.func.replace_all_batch_norm_modules_``; the same batch-statistics normalisation), forward
pre-hooks record each BN layer's batch mean and unbiased variance at every local step, and the running
statistics are then updated outside ``vmap`` with PyTorch's formula ``r <- (1 - momentum) r + momentum
s`` once per step, as the client's in-place update does. A batch of one example uses the running
statistics (eval-mode BN, :func:`leakgym.models.bn_eval_if_single`), passed per game, and leaves them
unchanged.

Exactness (CPU, float32): aggregation is bit-identical to ``Server.aggregate`` given the same updates.
The vmapped (or row-wise) gradients and forward passes run batched kernels (a convolution over N games
becomes a grouped convolution, or a batched matrix product), so they equal the per-game loop to
rounding: measured for LeNet on digits, at most 2e-7 absolute in a gradient entry and 1e-6 relative in
the test loss (``tests/test_batched_fl.py``). The clients trained one after another (a CPU's form for
BatchNorm models) run ``compute_update``'s kernels and are its updates and running statistics bit for bit.
Where the rounding meets a discrete choice the difference is larger: a max-pooling window or a ReLU input tied
to rounding (the vmapped CIFAR ConvNet's gradients up to 5% of a layer's largest entry), and Adam, whose step
is about ``local_lr`` in the sign of the gradient however small, on entries whose true gradient is 0 (a bias
just before BatchNorm: up to ``2 * local_lr * local_steps``); measured in ``docs/limits.md``.

Scope: models whose forward is a deterministic function of parameters, BN statistics and input --
no PRECODE bottleneck (it samples from torch's global RNG), no dropout, no state other than BN
running statistics (with ``track_running_stats`` and a ``momentum``), no frozen parameter. :func:`supports` says whether a
model qualifies; callers run the others game by game.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from leakgym.checks import is_integer
from leakgym.devices import in_library_modes
from leakgym.fl.bank import ModelBank
from leakgym.fl.optim import PLAIN_SGD, LocalOptimizer
from leakgym.fl.server import check_weights, correct_predictions
from leakgym.fl.update import SharedUpdate
from leakgym.models import BatchNormInputStatistics, bn_eval_if_single, in_mode, task_loss
from leakgym.models.parameter_sets import batched_loss
from leakgym.models.precode import VariationalBottleneck
from leakgym.models.rowwise import RowwiseForward


def _bn_layers(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def supports(model: nn.Module) -> bool:
    """True when ``model``'s clients can be computed by :func:`benign_updates` (see the module docstring).
    Every parameter must be trainable: the stacks hold the trainable ones, and a frozen one would be taken
    from the one model that gives the architecture, for every game."""
    random = (nn.modules.dropout._DropoutNd, VariationalBottleneck)
    if any(isinstance(m, random) for m in model.modules()):
        return False
    if not all(p.requires_grad for p in model.parameters()):
        return False
    bns = _bn_layers(model)
    if any(not m.track_running_stats or m.momentum is None for _, m in bns):
        return False
    allowed = {f"{n}.{b}" if n else b for n, _ in bns for b in ("running_mean", "running_var", "num_batches_tracked")}
    return all(name in allowed for name, _ in model.named_buffers())


def independent_rows(model: nn.Module) -> bool:
    """True when every example's forward pass through ``model`` stands alone: :func:`supports`, and every
    BatchNorm layer in eval mode (normalising with its running statistics, as a client's batch of one
    does, :func:`leakgym.models.bn_eval_if_single`; train-mode statistics couple a batch), so per-example
    rows of any grouping may be vmapped, each row with its model's parameters and running statistics
    (the batched DCS² and CENSOR computations, :func:`stack_buffers`)."""
    return supports(model) and all(not m.training for _, m in _bn_layers(model))


def signature(model: nn.Module) -> tuple:
    """Models with equal signatures share an architecture and can be stacked: the class, every parameter's
    name, shape, dtype and device, and every submodule's type and settings (``extra_repr``: strides,
    padding, BatchNorm's eps and momentum, ...; the parameters alone did not tell two BatchNorm eps apart,
    and the first model's was used for both)."""
    return (type(model), tuple((n, tuple(p.shape), p.dtype, p.device) for n, p in model.named_parameters()),
            tuple((n, type(m), m.extra_repr()) for n, m in model.named_modules()))


def stack_parameters(models: Sequence[nn.Module]) -> dict[str, Tensor]:
    """``name -> (N, *shape)``: the trainable parameters of N models of one signature, stacked (detached
    copies). Models of one :class:`~leakgym.fl.bank.ModelBank` (a vector env's games) are read from its
    stacks: one ``index_select`` per name instead of a stack of N parameters."""
    names = [n for n, p in models[0].named_parameters() if p.requires_grad]
    banked = ModelBank.of(models)
    if banked is not None:
        bank, rows = banked
        return bank.gather(rows, names)
    each = [dict(m.named_parameters()) for m in models]
    return {n: torch.stack([p[n].detach() for p in each]) for n in names}


def stack_buffers(models: Sequence[nn.Module]) -> dict[str, Tensor]:
    """``name -> (N, *shape)``: the floating-point buffers (BN running statistics) of N models, stacked."""
    names = [n for n, b in models[0].named_buffers() if b.is_floating_point()]
    if not names:  # (a walk of every model's modules for nothing)
        return {}
    each = [dict(m.named_buffers()) for m in models]
    return {n: torch.stack([b[n].detach() for b in each]) for n in names}


@dataclass
class ClientUpdates:
    """What :func:`benign_updates` returns: the updates of K clients in each of N games."""

    tensors: dict[str, Tensor]
    """``name -> (N, K, *shape)``: the shared tensors (gradients or model differences)."""
    buffers: dict[str, Tensor] | None = None
    """``name -> (N, K, *shape)``: each client's BN running statistics after its training (the floating
    buffers; ``num_batches_tracked`` is in :func:`unpack`); None for models without BatchNorm."""


_STATELESS: dict[tuple, tuple[nn.Module, BatchNormInputStatistics]] = {}


def _stateless_copy(model: nn.Module) -> tuple[nn.Module, BatchNormInputStatistics]:
    """A private copy of ``model``'s architecture whose BN layers keep no running statistics (batch
    statistics, no in-place update), with a recorder of those statistics; one per :func:`signature`."""
    key = signature(model)
    if key not in _STATELESS:
        twin = copy.deepcopy(model)
        torch.func.replace_all_batch_norm_modules_(twin)
        _STATELESS[key] = (twin, BatchNormInputStatistics(twin, unbiased=True))
    return _STATELESS[key]


def check_protocol(kind: str, local_steps: int, local_lr: float, optimizer: LocalOptimizer | None) -> None:
    """The update protocol's arguments, with :func:`leakgym.fl.client.compute_update`'s rules and messages: a
    ``ValueError`` naming the bad value and what is allowed (a bool is not a step count or a learning rate:
    ``local_steps=True`` and ``local_lr=True`` trained as 1 step at rate 1 here, and were refused by the client)."""
    if kind not in ("gradient", "model_delta"):
        raise ValueError(f"kind={kind!r}; allowed: 'gradient', 'model_delta'")
    if not is_integer(local_steps) or local_steps < 1:  # (numpy integers too; not a bool)
        raise ValueError(f"local_steps={local_steps!r}; allowed: integers >= 1")
    if kind == "gradient" and local_steps != 1:
        raise ValueError(f"local_steps={local_steps} with kind='gradient'; FedSGD takes exactly 1 step")
    if isinstance(local_lr, (bool, np.bool_)) or not isinstance(local_lr, numbers.Real) or not 0 < local_lr < math.inf:
        raise ValueError(f"local_lr={local_lr!r}; allowed range (0, inf)")  # (NaN too; numpy floats are reals)
    if optimizer is not None and not isinstance(optimizer, LocalOptimizer):
        raise ValueError(f"optimizer={optimizer!r}; allowed: a leakgym.fl.optim.LocalOptimizer or None (plain SGD)")
    if kind == "gradient" and optimizer is not None and not optimizer.plain:
        raise ValueError(f"optimizer={optimizer.describe()!r} with kind='gradient'; FedSGD shares one gradient and "
                         "takes no local step: allowed only with kind='model_delta'")


def check_labels(labelled: Sequence[tuple[nn.Module, Tensor]], where: Callable[[int], str]) -> None:
    """Class-index labels must lie in ``0..classes-1`` (``classes``: the model's ``spec.num_classes`` where it has
    one, else only ``>= 0``): out of range, cross-entropy raised an IndexError on a CPU and a device-side assert,
    which ends the process's CUDA context, on a GPU, and ``-100`` (its ignore index) left the example out of one
    form of the batched clients and not of another. ``labelled``: ``(model, labels)`` pairs (labels of any shape;
    soft labels and empty ones pass); ``ValueError`` ``"{where(i)}: labels span low..high; allowed: ..."`` for the
    first pair ``i`` out of range. One min/max reduction per pair and one host read for all of them."""
    hard = [(i, y) for i, (_, y) in enumerate(labelled) if not y.is_floating_point() and y.numel()]
    if not hard:
        return
    pairs = [torch.stack([y.min(), y.max()]).to(torch.int64) for _, y in hard]
    bounds = torch.stack(pairs).tolist() if len({t.device for t in pairs}) == 1 else [t.tolist() for t in pairs]
    for (i, _), (low, high) in zip(hard, bounds):
        classes = getattr(getattr(labelled[i][0], "spec", None), "num_classes", None)
        if low < 0 or (classes is not None and high >= classes):
            allowed = f"0..{classes - 1}" if classes is not None else "integers >= 0"
            raise ValueError(f"{where(i)}: labels span {low}..{high}; allowed: {allowed}")


def _check_stacked_labels(model: nn.Module, y: Tensor) -> None:
    """:func:`check_labels` of the ``(N, K, b)`` labels of N games' K clients: one check over all of them (one host
    read per call, not one per game); when it fails, the first game and client out of range are named."""
    try:
        check_labels([(model, y)], lambda _: "labels")
    except ValueError:
        k_clients = y.shape[1]
        check_labels([(model, y[n, k]) for n in range(y.shape[0]) for k in range(k_clients)],
                     lambda i: f"game {i // k_clients}, client {i % k_clients}")
        raise


@in_library_modes
def benign_updates(
    model: nn.Module,
    params: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    kind: str = "gradient",
    local_steps: int = 1,
    local_lr: float = 0.1,
    buffers: dict[str, Tensor] | None = None,
    optimizer: LocalOptimizer | None = None,
    vectorise: bool | None = None,
) -> ClientUpdates:
    """The updates of K clients in each of N games.

    Args:
        model: the architecture (any of the N models; evaluated functionally, never modified).
        params: each game's parameters, ``name -> (N, *shape)`` (:func:`stack_parameters`).
        x: normalised client batches ``(N, K, b, C, H, W)``; ``y``: labels ``(N, K, b)``, or soft labels
            ``(N, K, b, classes)`` (a Mixup or InstaHide client's).
        kind, local_steps, local_lr: the update protocol, as in :func:`leakgym.fl.client.compute_update`.
        buffers: each game's BN running statistics, ``name -> (N, *shape)`` (:func:`stack_buffers`);
            required for models with BatchNorm.
        optimizer: FedAvg's local optimiser (None: plain SGD), as in :func:`~leakgym.fl.client.compute_update`;
            its update is :meth:`~leakgym.fl.optim.LocalOptimizer.step` (``torch.optim`` cannot run inside
            ``vmap``), the formulas of the ``torch.optim`` class the plain client uses.
        vectorise: the form (module docstring). None picks by model and device: a plain layer stack takes its
            row-wise form where its convolutions fit (:meth:`~leakgym.models.rowwise.RowwiseForward.fits`),
            else on a CPU its grouped form; any other model (BatchNorm: the ConvNet, ResNet-18) is vmapped on
            an accelerator and on a CPU trains its clients one after another (module docstring, with the
            measurements). True: always vmapped; False: always one client after another.

    Client ``(n, k)``'s update is ``compute_update(model_n, x[n, k], y[n, k], ...)`` computed in one
    vectorised call (equal to rounding, see the module docstring), its BN statistics included. The arguments are
    checked as ``compute_update`` checks them (:func:`check_protocol`; the labels by :func:`check_labels`, all
    games' at once) before any work.
    """
    check_protocol(kind, local_steps, local_lr, optimizer)
    if x.dim() != 6 or y.shape[:3] != x.shape[:3] or y.dim() not in (3, 4):
        raise ValueError(f"x must be (N, K, b, C, H, W) and y (N, K, b), or (N, K, b, classes) soft labels; got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    _check_stacked_labels(model, y)
    if not supports(model):
        raise ValueError(f"{type(model).__name__} has dropout, a PRECODE bottleneck or state other than BatchNorm "
                         "running statistics; compute its clients with leakgym.fl.client.compute_update")
    bns = _bn_layers(model)
    if bns and buffers is None:
        raise ValueError(f"{type(model).__name__} has BatchNorm: pass each game's running statistics as buffers= "
                         "(stack_buffers)")
    return benign_updates_unchecked(model, params, x, y, kind=kind, local_steps=local_steps, local_lr=local_lr,
                           buffers=buffers, optimizer=PLAIN_SGD if optimizer is None else optimizer,
                           vectorise=vectorise)


def benign_updates_unchecked(model: nn.Module, params: dict[str, Tensor], x: Tensor, y: Tensor, *, kind: str,
                    local_steps: int, local_lr: float, buffers: dict[str, Tensor] | None, optimizer: LocalOptimizer,
                    vectorise: bool | None) -> ClientUpdates:
    """:func:`benign_updates` of arguments a caller has checked: its own passes of games, and
    :func:`leakgym.fl.client.compute_updates`' stacked clients, whose jobs it checked once (their labels read
    on the host once, not at every local step)."""
    opt = optimizer
    bns = _bn_layers(model)
    n_games, k_clients, b = x.shape[:3]
    single = b == 1  # a batch of one normalises with the running statistics (bn_eval_if_single)
    frozen = {n: t.detach() for n, t in model.named_parameters() if n not in params}
    on_cpu = x.device.type == "cpu"
    if vectorise is None:
        form = None if bns else RowwiseForward.of(model, b, tuple(x.shape[3:]))
        if form is not None:  # a plain layer stack (DLG's LeNet) and small batches: every client a row, no vmap
            return ClientUpdates(tensors=_rowwise_updates(model, form, params, frozen, x, y, kind=kind,
                                                          local_steps=local_steps, local_lr=local_lr, optimizer=opt))
        form = None if bns or not on_cpu else RowwiseForward.of(model)
        if form is not None:  # larger batches of a plain layer stack on a CPU: every client a row, grouped kernels
            return ClientUpdates(tensors=_rowwise_updates(model, form, params, frozen, x, y, kind=kind,
                                                          local_steps=local_steps, local_lr=local_lr, optimizer=opt,
                                                          grouped=True))
    if vectorise is False or (vectorise is None and on_cpu):
        return _looped_updates(model, params, frozen, buffers if bns else None, x, y, kind=kind,
                               local_steps=local_steps, local_lr=local_lr, optimizer=opt)
    positions = k_clients * b * x.shape[-2] * x.shape[-1]
    games = max(1, CLIENT_POSITIONS_PER_PASS // max(positions, 1))
    if n_games > games:  # the vmapped training of at most `games` games per pass (bounded memory)
        def rows(stacks: dict[str, Tensor] | None, lo: int) -> dict[str, Tensor] | None:
            return None if stacks is None else {n: t[lo:lo + games] for n, t in stacks.items()}

        parts = [benign_updates_unchecked(model, rows(params, lo), x[lo:lo + games], y[lo:lo + games], kind=kind,
                                 local_steps=local_steps, local_lr=local_lr, buffers=rows(buffers, lo),
                                 optimizer=opt, vectorise=True) for lo in range(0, n_games, games)]
        return ClientUpdates(
            tensors={n: torch.cat([part.tensors[n] for part in parts]) for n in parts[0].tensors},
            buffers=None if parts[0].buffers is None else {n: torch.cat([part.buffers[n] for part in parts])
                                                           for n in parts[0].buffers})

    net, recorder = (model, None) if not bns or single else _stateless_copy(model)

    def loss(p: dict[str, Tensor], bufs: dict[str, Tensor], xb: Tensor, yb: Tensor):
        if recorder is not None:
            recorder.start()
        value = task_loss(net, xb, yb, params={**frozen, **bufs, **p})
        return value, (recorder.stop() if recorder is not None else ())

    step = grad(loss, has_aux=True)

    def client(p0: dict[str, Tensor], bufs: dict[str, Tensor], xb: Tensor, yb: Tensor):
        if kind == "gradient":
            g, stats = step(p0, bufs, xb, yb)
            return g, (stats,)
        p, all_stats, state = p0, [], opt.init(p0)
        for t in range(local_steps):
            g, stats = step(p, bufs, xb, yb)
            all_stats.append(stats)
            p, state = opt.step(p, g, state, local_lr, t + 1)  # plain SGD: p - local_lr * g, as before
        return {n: p0[n] - p[n] for n in p0}, tuple(all_stats)

    game_buffers = buffers if (bns and single) else {}
    per_game = vmap(client, in_dims=(None, None, 0, 0))
    with in_mode(net, True), bn_eval_if_single(net, b):
        tensors, stats = vmap(per_game, in_dims=(0, 0, 0, 0))(params, game_buffers, x, y)
    if not bns:
        return ClientUpdates(tensors=tensors)
    expand = {n: t.unsqueeze(1).expand(n_games, k_clients, *t.shape[1:]) for n, t in buffers.items()}
    if single:  # eval-mode BN: the running statistics stay as they were
        return ClientUpdates(tensors=tensors, buffers={n: t.clone() for n, t in expand.items()})
    new = {}
    for layer, (name, m) in enumerate(bns):
        prefix = f"{name}." if name else ""
        mean, var = expand[prefix + "running_mean"], expand[prefix + "running_var"]
        for step_stats in stats:  # one update per local step, in order
            batch_mean, batch_var = step_stats[layer]
            mean = (1 - m.momentum) * mean + m.momentum * batch_mean.to(mean)
            var = (1 - m.momentum) * var + m.momentum * batch_var.to(var)
        new[prefix + "running_mean"], new[prefix + "running_var"] = mean, var
    return ClientUpdates(tensors=tensors, buffers=new)


def _looped_updates(model: nn.Module, params: dict[str, Tensor], frozen: dict[str, Tensor],
                    buffers: dict[str, Tensor] | None, x: Tensor, y: Tensor, *, kind: str, local_steps: int,
                    local_lr: float, optimizer: LocalOptimizer) -> ClientUpdates:
    """:func:`benign_updates` one client after another: client ``(n, k)`` is ``task_loss`` of ``model`` under
    game ``n``'s parameters (``functional_call``, the plain kernels of one model) and ``torch.autograd.grad``,
    and a BatchNorm layer updates a copy of game ``n``'s running statistics itself, in place, as on
    :func:`~leakgym.fl.client.compute_update`'s private copy (a batch of one leaves them alone,
    :func:`~leakgym.models.bn_eval_if_single`): ``compute_update``'s kernels, its results bit for bit. The
    form a CPU takes for models outside the row-wise ones (module docstring, with the measurements)."""
    n_games, k_clients, b = x.shape[:3]
    tensors: list[dict[str, Tensor]] = []
    statistics: list[dict[str, Tensor]] = []
    with in_mode(model, True), bn_eval_if_single(model, b):
        for game in range(n_games):
            start = {n: t[game] for n, t in params.items()}
            for k in range(k_clients):
                own = {} if buffers is None else {n: t[game].clone() for n, t in buffers.items()}
                def loss(leaves, xb=x[game, k], yb=y[game, k], own=own):  # (this client's, bound now)
                    return task_loss(model, xb, yb, params={**frozen, **own, **leaves})

                tensors.append(_local_training(start, loss, kind=kind, local_steps=local_steps, local_lr=local_lr,
                                               optimizer=optimizer))
                statistics.append(own)

    def stacked(rows: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        return {n: torch.stack([r[n] for r in rows]).reshape(n_games, k_clients, *rows[0][n].shape)
                for n in rows[0]}

    return ClientUpdates(tensors=stacked(tensors), buffers=None if buffers is None else stacked(statistics))


def _rowwise_updates(model: nn.Module, form: RowwiseForward, params: dict[str, Tensor], frozen: dict[str, Tensor],
                     x: Tensor, y: Tensor, *, kind: str, local_steps: int, local_lr: float,
                     optimizer: LocalOptimizer = PLAIN_SGD, grouped: bool = False) -> dict[str, Tensor]:
    """:func:`benign_updates` of a model in its row-wise form ``form``
    (:func:`~leakgym.models.parameter_sets.batched_loss`): client ``(n, k)`` is row ``n * K + k`` with its own
    copy of game ``n``'s parameters, and the gradient of the rows' summed losses is each client's own gradient
    (the same mathematics as the vmapped ``grad``, to rounding; ``tests/test_batched_fl.py``). Measured on
    digits LeNet, one CPU thread: see the module docstring."""
    n_games, k_clients = x.shape[:2]
    rows = n_games * k_clients
    start = {name: t.detach().unsqueeze(1).expand(n_games, k_clients, *t.shape[1:]).reshape(rows, *t.shape[1:])
             for name, t in params.items()}
    xs, ys = x.reshape(rows, *x.shape[2:]), y.reshape(rows, *y.shape[2:])

    def loss(leaves: dict[str, Tensor]) -> Tensor:  # every row its own client: the sum's gradient is each row's
        if grouped:
            return form.grouped_loss({**{n: t.expand(rows, *t.shape) for n, t in frozen.items()}, **leaves}, xs, ys).sum()
        return batched_loss(model, leaves, xs, ys, shared=frozen, rowwise=form).sum()

    out = _local_training(start, loss, kind=kind, local_steps=local_steps, local_lr=local_lr, optimizer=optimizer)
    return {name: t.reshape(n_games, k_clients, *t.shape[1:]) for name, t in out.items()}


def _local_training(start: dict[str, Tensor], loss: Callable[[dict[str, Tensor]], Tensor], *, kind: str,
                    local_steps: int, local_lr: float, optimizer: LocalOptimizer) -> dict[str, Tensor]:
    """The update of clients that start from ``start`` and train on ``loss(leaves)`` (a scalar; rows that own
    their leaves get their own gradients from its sum) by ``torch.autograd``: the gradient (FedSGD), or
    ``start - w_E`` after ``local_steps`` steps of ``optimizer`` (:meth:`LocalOptimizer.step`, elementwise:
    every row its own client's step)."""
    current, state = start, optimizer.init(start)
    for index in range(local_steps):
        leaves = {n: t.detach().requires_grad_(True) for n, t in current.items()}
        with torch.enable_grad():
            grads = dict(zip(leaves, torch.autograd.grad(loss(leaves), list(leaves.values()))))
        if kind == "gradient":
            return grads
        current, state = optimizer.step({n: t.detach() for n, t in leaves.items()}, grads, state, local_lr, index + 1)
    return {n: start[n] - current[n] for n in start}


@in_library_modes
def client_updates(
    models: Sequence[nn.Module],
    x: Sequence[Tensor],
    y: Sequence[Tensor],
    *,
    kind: str = "gradient",
    local_steps: int = 1,
    local_lr: float = 0.1,
    signed: bool = False,
    optimizer: LocalOptimizer | None = None,
) -> list[SharedUpdate]:
    """``compute_update(models[i], x[i], y[i], ...)`` for N clients of N games, as one vectorised call.

    The models share a :func:`signature` and :func:`supports` them; the batches share a shape. ``signed``:
    the caller grouped the models by :func:`signature` already (the check costs ~0.1 ms per model). It is
    :func:`benign_updates` with one client per game, packed as the :class:`~leakgym.fl.update.SharedUpdate`
    that :func:`~leakgym.fl.client.compute_update` returns (equal to rounding, module docstring; BN
    running statistics in ``buffers``) -- without its ``deepcopy`` of every model. The victims of a
    vector step use it for their clean updates.
    """
    if len(models) != len(x) or len(x) != len(y) or not models:
        raise ValueError(f"got {len(models)} models, {len(x)} batches and {len(y)} label sets; one of each per game")
    if not signed and len({signature(m) for m in models}) != 1:
        raise ValueError("client_updates needs models of one architecture (equal signature)")
    params = stack_parameters(models)
    buffers = stack_buffers(models) if _bn_layers(models[0]) else None
    out = benign_updates(models[0], params, torch.stack(list(x)).unsqueeze(1), torch.stack(list(y)).unsqueeze(1),
                         kind=kind, local_steps=local_steps, local_lr=local_lr, buffers=buffers, optimizer=optimizer)
    return _unpack_games(out, models, [int(t.shape[0]) for t in x], kind=kind, local_steps=local_steps,
                         local_lr=local_lr, optimizer=optimizer)


def _unpack_games(updates: ClientUpdates, models: Sequence[nn.Module], batch_sizes: Sequence[int], *, kind: str,
                  local_steps: int, local_lr: float, optimizer: LocalOptimizer | None) -> list[SharedUpdate]:
    """``[unpack(updates, i, 0, model=models[i], batch_size=batch_sizes[i], ...) for i]``: the same
    :class:`~leakgym.fl.update.SharedUpdate` s (the same views of the stacked tensors), with one ``unbind`` per
    name instead of an indexing per name and game (measured at 256 games of LeNet, one thread: 3.8 -> 1.25 ms)."""
    def rows(stacks: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        names = list(stacks)
        return [dict(zip(names, views)) for views in zip(*(t.select(1, 0).unbind(0) for t in stacks.values()))]

    tensors = rows(updates.tensors)
    buffers = [None] * len(models) if updates.buffers is None else rows(updates.buffers)
    marked = optimizer is not None and not optimizer.plain
    lr = float(local_lr) if kind == "model_delta" else 0.0
    out = []
    for game, (model, batch_size) in enumerate(zip(models, batch_sizes)):
        own = buffers[game]
        if own is not None and model is not None:
            trained = batch_size > 1  # a batch of one leaves the running statistics (and the count) alone
            for n, b in model.named_buffers():
                if not b.is_floating_point():
                    own[n] = b.detach() + (local_steps if trained else 0)
        update = SharedUpdate(tensors=tensors[game], kind=kind, batch_size=batch_size, local_steps=local_steps,
                              local_lr=lr, buffers=own)
        if marked:  # as leakgym.fl.client.mark_optimizer
            update.metadata["local_optimizer"] = optimizer.describe()
        out.append(update)
    return out


def unpack(updates: ClientUpdates, game: int, client: int, *, kind: str, batch_size: int, local_steps: int,
           local_lr: float, model: nn.Module | None = None, optimizer: LocalOptimizer | None = None) -> SharedUpdate:
    """Client ``client`` of game ``game`` out of :func:`benign_updates`' output, as the
    :class:`~leakgym.fl.update.SharedUpdate` that :func:`~leakgym.fl.client.compute_update` returns;
    ``model`` (the game's model) gives BN models their ``num_batches_tracked`` after the client's steps."""
    buffers = None
    if updates.buffers is not None:
        buffers = {n: t[game, client] for n, t in updates.buffers.items()}
        if model is not None:
            trained = batch_size > 1  # a batch of one leaves the running statistics (and the count) alone
            for n, b in model.named_buffers():
                if not b.is_floating_point():
                    buffers[n] = b.detach() + (local_steps if trained else 0)
    update = SharedUpdate(tensors={n: t[game, client] for n, t in updates.tensors.items()}, kind=kind,
                          batch_size=batch_size, local_steps=local_steps,
                          local_lr=float(local_lr) if kind == "model_delta" else 0.0, buffers=buffers)
    if optimizer is not None and not optimizer.plain:  # as leakgym.fl.client.mark_optimizer
        update.metadata["local_optimizer"] = optimizer.describe()
    return update


@torch.no_grad()
def aggregate_many(
    params: dict[str, Tensor],
    updates: Sequence[dict[str, Tensor]],
    weights: Tensor,
    *,
    step: float,
) -> dict[str, Tensor]:
    """New parameters of N games after aggregating their clients' updates, ``name -> (N, *shape)``.

    Args:
        params: ``name -> (N, *shape)`` parameters before the round.
        updates: one entry per client slot ``j`` (e.g. the victim, then the K benign clients), each
            ``name -> (N, *shape)``; a name missing from slot ``j`` is absent from that client's update.
        weights: ``(N, J)`` example weights of the slots (0 for a client that sent nothing).
        step: the server step: the learning rate for FedSGD gradients, 1.0 for FedAvg differences.

    Game ``n``'s parameter ``w`` becomes ``w - step * sum_j weights[n, j] t_j / sum_j weights[n, j]`` over
    the slots whose update has ``w`` and whose weight is positive, with the arithmetic of
    :meth:`leakgym.fl.server.Server.aggregate` (bit-identical): games with the same weights are
    computed together with Python-float weights, slot by slot in order. A game whose every weight is 0
    keeps its parameters.
    """
    return _weighted_means(params, updates, weights, lambda p, mean: p - step * mean)


@torch.no_grad()
def average_buffers_many(
    buffers: dict[str, Tensor],
    updates: Sequence[dict[str, Tensor]],
    weights: Tensor,
) -> dict[str, Tensor]:
    """New BN running statistics of N games: each game's example-weighted mean of its clients' buffers
    (``updates``: one ``name -> (N, *shape)`` per client slot, ``weights`` ``(N, J)``, 0 for a client
    that sent none), as :meth:`leakgym.fl.server.Server.aggregate` averages them (bit-identical); a
    buffer no positive-weight slot has keeps its value."""
    return _weighted_means(buffers, updates, weights, lambda b, mean: mean)


def _weighted_means(current: dict[str, Tensor], updates: Sequence[dict[str, Tensor]], weights: Tensor,
                    combine) -> dict[str, Tensor]:
    """``combine(current, weighted mean of the slots)`` per game and name, Server.aggregate's arithmetic."""
    j = weights.shape[1]
    if len(updates) != j:
        raise ValueError(f"got {len(updates)} update slots for weights of shape {tuple(weights.shape)}")
    table = weights.tolist()
    check_weights([w for row in table for w in row])  # a negative weight was dropped silently
    rows: dict[tuple[float, ...], list[int]] = {}
    for i, w in enumerate(table):
        rows.setdefault(tuple(w), []).append(i)
    if len(rows) == 1:  # every game the same weights (the usual round): no gathers, no scatters
        (w,) = rows
        out = {}
        for name, p in current.items():
            mean = _weighted_mean(w, updates, name, p, lambda t: t)
            out[name] = p.clone() if mean is None else combine(p, mean)
        return out
    out = {name: p.clone() for name, p in current.items()}
    for w, members in rows.items():
        index = torch.tensor(members, device=next(iter(current.values())).device)
        for name, p in current.items():
            mean = _weighted_mean(w, updates, name, p, lambda t, index=index: t.index_select(0, index))
            if mean is not None:
                out[name].index_copy_(0, index, combine(p.index_select(0, index), mean))
    return out


def _weighted_mean(w: tuple[float, ...], updates: Sequence[dict[str, Tensor]], name: str, like: Tensor,
                   rows) -> Tensor | None:
    """``sum_s w[s] rows(t_s) / sum_s w[s]`` over the slots ``s`` whose update has ``name`` and whose weight is
    positive (None when none does), with Server.aggregate's arithmetic: Python-float weights, slot by slot in
    order, each term cast to ``like``'s dtype and device."""
    parts = [(w[s], updates[s][name]) for s in range(len(updates)) if w[s] > 0 and name in updates[s]]
    if not parts:
        return None
    total = 0
    for wt, t in parts:
        total = total + wt * rows(t).to(like)
    return total / sum(wt for wt, _ in parts)


#: Largest client batch (images x height x width, summed over the games and clients of a pass) whose
#: vmapped training :func:`benign_updates` runs in one pass; more games run in several. The CIFAR ConvNet's
#: clients (7 benign clients of 8 images per game) held about 370 MB per game on a CPU, and N = 256 such
#: games peaked at 115 GB on an H200 (docs/results/bench_env_gpu.md); at this bound a pass of CIFAR clients
#: holds 2,048 images (about 13 GB by that measure), and 1,024 digits games of 8 images are still one pass.
#: Measured with the bound on the same kind of card: N = 256 CIFAR games peaked at 18.4 GB.
CLIENT_POSITIONS_PER_PASS = 1 << 21


#: Largest number of held-out images (summed over games) in one vectorised evaluation pass. A pass holds
#: every layer's activations of all its images: 32 CIFAR ConvNets (width 16) on 1,000 images each peaked at
#: 29 GB on an H100 (``docs/results/bench_env_gpu.md``); 8,192 images keep a pass near 7 GB.
EVAL_IMAGES_PER_PASS = 8192


#: On a CPU, largest held-out set per game (images x height x width) that :func:`evaluate_many` evaluates
#: in the grouped form of a plain layer stack (:meth:`~leakgym.models.rowwise.RowwiseForward.grouped_logits`)
#: rather than one game after another. Measured (DLG's LeNet, one CPU thread, passes of 32 games, grouped vs
#: one game at a time): digits 16x16, 256 games, 8 / 16 / 32 images per game 16.6 vs 43.2 / 31 vs 50 / 60 vs
#: 66 ms; MNIST 28x28, 128 games, 4 / 8 images 12.0 vs 23.2 / 21.5 vs 28.2 ms; CIFAR-10 32x32, 64 games,
#: 8 / 16 images 15.7 vs 15.9 / 31.5 vs 22.6 ms. Larger images make each game's convolutions efficient kernels
#: on their own, and the grouped convolution loses.
GROUPED_MAX_POSITIONS = 4096


def _grouped_pays(x: Tensor, same_shapes: bool) -> bool:
    """Whether held-out sets like ``x`` (``(B, C, H, W)``, one game's) take the grouped form on a CPU."""
    return same_shapes and x.dim() == 4 and x.shape[0] * x.shape[-2] * x.shape[-1] <= GROUPED_MAX_POSITIONS


@torch.no_grad()
def evaluate_many(
    model: nn.Module,
    params: dict[str, Tensor],
    x: Tensor | Sequence[Tensor],
    y: Tensor | Sequence[Tensor],
    *,
    chunk: int = 32,
    vectorise: bool | None = None,
    buffers: dict[str, Tensor] | None = None,
) -> tuple[list[float], list[float]]:
    """Test accuracy and mean cross-entropy of N models (``params``, ``name -> (N, *shape)``).

    ``x``/``y`` are one held-out set for every game (``(n, C, H, W)``/``(n,)``) or one per game (sequences
    of N such tensors). Models run in eval mode, at most ``chunk`` games and :data:`EVAL_IMAGES_PER_PASS`
    held-out images (at least one game) per vectorised forward pass (memory);
    ``buffers`` (``name -> (N, *shape)``, :func:`stack_buffers`) are their BN running statistics.
    Equal to :meth:`Server.evaluate` of each game to rounding (module docstring).

    On a CPU the games are evaluated one after another (``functional_call`` on each game's row of
    ``params``, no module copies): a held-out set is a large batch, where the grouped convolution that
    ``vmap`` makes of N models is the slower kernel -- measured for 16 digits LeNets on 256 images, one
    thread: 51 ms vectorised, 29 ms one game at a time. A plain layer stack (DLG's LeNet,
    :class:`~leakgym.models.rowwise.RowwiseForward`) calls its layers' functional kernels directly
    (:meth:`~leakgym.models.rowwise.RowwiseForward.plain_logits`, the same values bit for bit) -- unless
    its held-out sets are small (at most :data:`GROUPED_MAX_POSITIONS` images x pixels per game, one shape
    for all games): then each pass of games is one computation per layer, its convolutions grouped
    (:meth:`~leakgym.models.rowwise.RowwiseForward.grouped_logits`; equal to the loop to rounding, not bit
    for bit; measured for 256 digits LeNets on 16 images each, one thread: 31 ms grouped, 50 ms one game
    at a time). Other devices take the vectorised pass; ``vectorise`` forces one or the other (``False``:
    one game at a time, never the grouped form).
    """
    n_games = next(iter(params.values())).shape[0]
    params = {**(buffers or {}), **params}
    shared = isinstance(x, Tensor)
    if not shared and (len(x) != n_games or len(y) != n_games):
        raise ValueError(f"got {len(x)} held-out sets for {n_games} models")

    def forward(p: dict[str, Tensor], xb: Tensor) -> Tensor:
        return functional_call(model, p, (xb,))

    if any(t.shape[0] == 0 for t in ([x] if shared else list(x))):
        raise ValueError("every held-out set needs >= 1 image")
    auto = vectorise is None
    if auto:
        vectorise = next(iter(params.values())).device.type != "cpu"
    if vectorise and not shared and len({tuple(t.shape) for t in x}) > 1:
        # held-out sets of different sizes: one vectorised pass per size, results in game order
        by_shape: dict[tuple, list[int]] = {}
        for i, t in enumerate(x):
            by_shape.setdefault(tuple(t.shape), []).append(i)
        accuracy, losses = [0.0] * n_games, [0.0] * n_games
        for members in by_shape.values():
            index = torch.tensor(members, device=next(iter(params.values())).device)
            acc, loss = evaluate_many(model, {k: v.index_select(0, index) for k, v in params.items()},
                                      [x[i] for i in members], [y[i] for i in members], chunk=chunk, vectorise=True)
            for i, a, lo in zip(members, acc, loss):
                accuracy[i], losses[i] = a, lo
        return accuracy, losses
    with in_mode(model, False):
        grouped = None
        if not vectorise:
            # A plain layer stack calls its layers' functional kernels directly: the same values, without
            # functional_call's reparametrisation and the module calls around every layer.
            # (functional_call takes a parameter missing from ``params`` from the module; the layers' calls
            # need every one.)
            plain = RowwiseForward.of(model)
            if plain is not None and any(n not in params for n, _ in model.named_parameters()):
                plain = None
            if plain is not None and auto and _grouped_pays(x if shared else x[0], shared or len(
                    {tuple(t.shape) for t in x}) == 1):
                grouped = plain
            else:
                logits_of = forward if plain is None else plain.plain_logits
                accuracy, losses = [], []
                for i in range(n_games):
                    xi, yi = (x, y) if shared else (x[i], y[i])
                    logits = logits_of({k: v[i] for k, v in params.items()}, xi)
                    ce = F.cross_entropy(logits, yi, reduction="none")
                    accuracy.append(int(correct_predictions(logits, yi).sum()) / yi.shape[0])
                    losses.append(float(ce.sum()) / yi.shape[0])
                return accuracy, losses
        per_game = (x if shared else x[0]).shape[0]
        games = max(1, min(chunk, EVAL_IMAGES_PER_PASS // per_game))
        corrects, sums = [], []  # per pass, on the device: read once after the last pass
        for lo in range(0, n_games, games):
            part = {k: v[lo:lo + games] for k, v in params.items()}
            if grouped is not None:
                logits = grouped.grouped_logits(part, x if shared else torch.stack(list(x[lo:lo + games])),
                                                shared=shared)
                labels = y.expand(logits.shape[0], -1) if shared else torch.stack(list(y[lo:lo + games]))
            elif shared:
                logits = vmap(forward, in_dims=(0, None))(part, x)
                labels = y.expand(logits.shape[0], -1)
            else:
                logits = vmap(forward, in_dims=(0, 0))(part, torch.stack(list(x[lo:lo + games])))
                labels = torch.stack(list(y[lo:lo + games]))
            ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
            corrects.append(correct_predictions(logits, labels).sum(dim=1))
            sums.append(ce.sum(dim=1))
        # One transfer for all passes (a read per pass made the host wait for each pass on an accelerator
        # before it could launch the next). float64 holds the int64 counts and the float32 sums exactly, so
        # this is Server.evaluate's Python division of the correct count and of the float32 loss sum.
        counts, totals = torch.stack([torch.cat(corrects).double(), torch.cat(sums).double()]).tolist()
        accuracy = [c / per_game for c in counts]
        losses = [t / per_game for t in totals]
    return accuracy, losses


__all__ = [
    "CLIENT_POSITIONS_PER_PASS", "EVAL_IMAGES_PER_PASS", "GROUPED_MAX_POSITIONS", "ClientUpdates", "aggregate_many",
    "average_buffers_many", "benign_updates", "benign_updates_unchecked", "check_labels", "check_protocol",
    "client_updates", "evaluate_many",
    "signature", "stack_buffers", "stack_parameters", "supports", "unpack",
]

"""The model base class, the task loss, and BatchNorm handling.

Every LeakGym model is ``body -> [PRECODE bottleneck] -> head``:

* ``body`` maps normalised images ``(N, C, H, W)`` to flat features ``(N, D)``;
* ``bottleneck`` is ``None`` or a :class:`~leakgym.models.precode.VariationalBottleneck`;
* ``head`` is the ``nn.Linear(D, num_classes)`` classifier.

Parameters are registered in that order, so ``model.named_parameters()`` lists body parameters
(``body.*``), then bottleneck parameters (``bottleneck.*``), then the head (``head.*``). Every update
in LeakGym is a ``dict[str, Tensor]`` keyed by these names, and ``torch.func.functional_call`` works on
every model. Models without BatchNorm (LeNet, and any model built without BN) can also be
``torch.func.vmap``-ed over parameters and inputs; PRECODE's sampling uses ``torch.randn_like`` and
therefore needs ``vmap(..., randomness="different")`` (or ``"same"``).

BatchNorm handling
------------------
ConvNet, MLP and ResNet-18 contain BatchNorm. Clients compute their updates in **train** mode, so
BN normalises with the statistics of the private batch (this is what makes BN statistics leak, and
what attacks that know ``bn_stats`` exploit). Running statistics are updated as a side effect of a
train-mode forward, but not when :func:`task_loss` is given ``params``: it then runs on copies of the
buffers, because ``torch.func.grad`` forbids in-place updates of captured tensors. A batch of a
single example cannot be normalised by its own statistics (``BatchNorm1d`` raises on one sample,
``BatchNorm2d`` would normalise each channel by one image's spatial statistics), so for batch size 1
the BN layers must be in **eval** mode: use :func:`bn_eval_if_single` around the update computation.
``vmap`` over a BN model in train mode is not supported by torch (in-place running-stat updates on
batched values); put the BN layers in eval mode or use BN-free models for vmapped work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from leakgym.data.spec import DatasetSpec
from leakgym.models.precode import (
    DEFAULT_PRECODE_BETA,
    DEFAULT_PRECODE_DIM,
    VariationalBottleneck,
    check_precode_beta,
)


class LeakGymModel(nn.Module):
    """Base class: ``body`` (images -> flat features), optional PRECODE ``bottleneck``, ``head``.

    Subclasses build their ``body`` (ending in a flatten) and call this initialiser with it and its
    output dimension ``feature_dim``; the bottleneck and head are created here.

    Attributes:
        spec: the :class:`~leakgym.data.spec.DatasetSpec` the model was built for.
        body: feature extractor, ``(N, C, H, W) -> (N, feature_dim)``.
        bottleneck: ``None`` or the PRECODE :class:`VariationalBottleneck`.
        head: the classifier ``nn.Linear(feature_dim, num_classes)``.
        precode_beta: weight of the KL term in :func:`task_loss` (0.0 without a bottleneck).
        min_image_size: smallest image side the architecture accepts (class attribute).
    """

    min_image_size: int = 1

    def __init__(self, spec: DatasetSpec, body: nn.Module, feature_dim: int, *,
                 precode: bool = False, precode_dim: int | None = None,
                 precode_beta: float = DEFAULT_PRECODE_BETA) -> None:
        super().__init__()
        check_spec_for(type(self), spec)
        check_precode_beta(precode_beta)
        self.spec = spec
        self.body = body
        self.register_module("bottleneck", None)
        self.head = nn.Linear(feature_dim, spec.num_classes)
        self.precode_beta = 0.0
        if precode:
            self.insert_bottleneck(precode_dim=precode_dim, precode_beta=precode_beta)

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def insert_bottleneck(self, *, precode_dim: int | None = None,
                          precode_beta: float = DEFAULT_PRECODE_BETA) -> None:
        """Insert a freshly initialised PRECODE bottleneck before the head (in place)."""
        if self.bottleneck is not None:
            raise ValueError(f"{type(self).__name__} already has a PRECODE bottleneck")
        precode_beta = check_precode_beta(precode_beta)
        dim = DEFAULT_PRECODE_DIM if precode_dim is None else int(precode_dim)
        ref = self.head.weight
        # ``bottleneck`` was registered (as None) before ``head``, so parameter order stays
        # body -> bottleneck -> head.
        self.bottleneck = VariationalBottleneck(self.feature_dim, dim).to(ref.device, ref.dtype)
        self.precode_beta = float(precode_beta)

    def backbone_features(self, x: Tensor) -> Tensor:
        """Body output ``(N, D)``: the representation *entering* the bottleneck (or the head)."""
        return self.body(x)

    def features(self, x: Tensor) -> Tensor:
        """Representation fed to the head ``(N, D)``; after the PRECODE bottleneck when present."""
        h = self.body(x)
        if self.bottleneck is not None:
            h, _ = self.bottleneck(h)
        return h

    def forward(self, x: Tensor, return_kl: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits ``(N, num_classes)``, or ``(logits, kl)`` with ``return_kl=True``.

        ``kl`` is the bottleneck's unweighted KL term (0-dim), or a 0-dim zero without PRECODE.
        """
        h = self.body(x)
        if self.bottleneck is not None:
            h, kl = self.bottleneck(h)
        else:
            kl = h.new_zeros(())
        logits = self.head(h)
        return (logits, kl) if return_kl else logits


def check_spec_for(model_cls: type, spec: DatasetSpec) -> None:
    """Validate that ``spec`` describes images ``model_cls`` can process."""
    if spec.channels < 1:
        raise ValueError(f"spec.channels={spec.channels} must be >= 1")
    if spec.num_classes < 2:
        raise ValueError(f"spec.num_classes={spec.num_classes} must be >= 2")
    min_size = getattr(model_cls, "min_image_size", 1)
    if spec.image_size < min_size:
        raise ValueError(
            f"{model_cls.__name__} needs images of at least {min_size}x{min_size}; "
            f"spec {spec.name!r} has image_size={spec.image_size}"
        )


def task_loss(model: nn.Module, x: Tensor, y: Tensor, params: dict[str, Tensor] | None = None) -> Tensor:
    """The client's training objective: mean cross-entropy, plus ``beta * KL`` for PRECODE.

    Args:
        model: a :class:`LeakGymModel`.
        x: normalised images ``(N, C, H, W)``.
        y: hard labels ``int64 (N,)`` or soft labels ``float (N, num_classes)`` (rows are
            probability vectors; used by Mixup/InstaHide-style encodings).
        params: optional ``dict`` of parameters (and optionally buffers) by name, evaluated with
            ``torch.func.functional_call``; parameters missing from it fall back to the module's own.
            Buffers missing from it are used as copies, so a functional call is side-effect free:
            BN running statistics of the module are *not* updated (pass buffers in ``params`` to
            control them; under ``torch.func.grad`` close over them rather than differentiating
            with respect to them). Without ``params``, a train-mode call updates them as usual.

    Returns:
        0-dim tensor ``CE + precode_beta * KL`` (PPP paper Eq. 3); ``CE`` alone without PRECODE.
        Works under ``torch.func.grad`` / ``vmap`` (no data-dependent Python control flow).
    """
    if x.dim() != 4:
        raise ValueError(f"x must be (N, C, H, W), got shape {tuple(x.shape)}")
    n = x.shape[0]
    if y.dtype in (torch.int64, torch.int32):
        if y.shape != (n,):
            raise ValueError(f"hard labels must have shape ({n},), got {tuple(y.shape)}")
        y = y.long()
    elif y.is_floating_point():
        num_classes = model.head.out_features
        if y.shape != (n, num_classes):
            raise ValueError(f"soft labels must have shape ({n}, {num_classes}), got {tuple(y.shape)}")
    else:
        raise ValueError(f"labels must be int64 (N,) or float (N, num_classes), got dtype {y.dtype}")
    if params is None:
        logits, kl = model(x, return_kl=True)
    else:
        # Buffers missing from ``params`` are passed as fresh copies: BatchNorm in train mode updates
        # its running statistics in place, which torch.func transforms forbid on captured tensors;
        # the copies absorb the update, so a functional call never changes the module.
        tensors = {name: buf.clone() for name, buf in model.named_buffers() if name not in params}
        tensors.update(params)
        logits, kl = functional_call(model, tensors, (x,), {"return_kl": True})
    loss = F.cross_entropy(logits, y)
    if getattr(model, "bottleneck", None) is not None:
        loss = loss + model.precode_beta * kl
    return loss


class BatchNormInputStatistics:
    """Forward pre-hooks on every BatchNorm layer of ``model`` recording the batch ``(mean, var)`` of its
    input, per channel, in layer order, between :meth:`start` and :meth:`stop`.

    :meth:`stop` returns them; inside a ``vmap``/``grad`` transform they come out as ordinary (batched,
    differentiable) outputs of the transformed function. ``unbiased``: the variance BN's running
    statistics use (True) or the one it normalises with (False). Users: the attack engine's BN prior
    (GradInversion) and the batched FL clients' running statistics (:mod:`leakgym.fl.batched`).
    ``enabled=False`` installs no hooks and records nothing. :meth:`close` removes the hooks.
    """

    def __init__(self, model: nn.Module, *, unbiased: bool, enabled: bool = True) -> None:
        self.unbiased = unbiased
        self.enabled = enabled
        self._stats: list[tuple[Tensor, Tensor]] | None = None
        bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self._handles = [m.register_forward_pre_hook(self._hook) for m in bns] if enabled else []

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        if self._stats is None:
            return
        h = inputs[0]
        dims = [0, *range(2, h.dim())]
        self._stats.append((h.mean(dim=dims), h.var(dim=dims, unbiased=self.unbiased)))

    def start(self) -> None:
        self._stats = [] if self.enabled else None

    def stop(self) -> tuple[tuple[Tensor, Tensor], ...]:
        stats = tuple(self._stats or ())
        self._stats = None
        return stats

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def has_batchnorm(model: nn.Module) -> bool:
    """True if ``model`` contains any BatchNorm layer."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@contextlib.contextmanager
def in_mode(model: nn.Module, training: bool) -> Iterator[nn.Module]:
    """``model`` in train (``training=True``) or eval mode inside, every submodule back in its own
    previous mode after, also on an exception (``model.train(was_training)`` reset all submodules to the
    top-level mode: a layer a caller held in eval mode, e.g. by :func:`bn_eval_if_single`, came back in
    train mode)."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield model
    finally:
        for m, mode in saved:
            m.training = mode


@contextlib.contextmanager
def bn_eval_if_single(model: nn.Module, batch_size: int) -> Iterator[nn.Module]:
    """Context manager: put BatchNorm layers in eval mode while ``batch_size == 1``.

    A single example cannot be normalised by batch statistics (see the module docstring). Inside the
    ``with`` block, BN layers use their running statistics when ``batch_size == 1``; on exit every BN
    layer's previous ``training`` flag is restored. For ``batch_size > 1`` nothing changes. The rest
    of the model (e.g. PRECODE sampling) keeps its mode.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.training for m in bns]
    try:
        if batch_size == 1:
            for m in bns:
                m.eval()
        yield model
    finally:
        for m, mode in zip(bns, saved):
            m.train(mode)

"""A model under N parameter sets at once: the one entry point of its two batched forms.

Row ``r`` of ``R`` rows is the model with its own parameter set ``params[name][r]`` (and buffers
``buffers[name][r]``) on its own input ``x[r]``. Three callers compute such rows: the attack engine's dummy
updates (:class:`~leakgym.attacks.engine.problems.UpdateSimulator`, a row per problem and restart), the FL
clients of a vector of games (:func:`~leakgym.fl.batched.benign_updates`, a row per client) and DCS²'s
concealed samples (:func:`~leakgym.defenses.dcs2.dcs2_gradients`, a row per sample). The per-row losses
(:func:`batched_loss`) or logits (:func:`batched_forward`) take one of two forms, chosen by the call's
arguments -- nothing is set on the model, and no form outlives its call:

* **row-wise** (``rowwise=`` the model's :class:`~leakgym.models.rowwise.RowwiseForward`, from
  :meth:`RowwiseForward.of(model, batch, image_shape) <leakgym.models.rowwise.RowwiseForward.of>`, which is
  None for any model but a plain layer stack with small convolutions, i.e. DLG's LeNet on 16x16 digits with
  one image per row): batched tensor operations without vmap, a convolution an unfold and a batched matrix
  product with each row's weight (measured in :mod:`leakgym.models.rowwise`: 1 row 2.44 -> 1.23 ms, 24 rows
  9.16 -> 6.46 ms per forward + gradient + matching backward against the vmap form);
* **vmap** (``rowwise=None``): ``torch.func.vmap`` of the model's own forward (``functional_call``), inside
  which every ``F.conv2d`` with a small unfolded input is an unfold and a matrix product
  (:class:`~leakgym.models.convolution.UnfoldedConvolutions`, ``unfold=True``; a per-row weight would make it
  a grouped convolution whose double backward loops over the rows -- measured in
  :mod:`leakgym.models.convolution`: 27.9 -> 18.1 ms per engine iteration at 64 rows).

Both compute the same mathematics (to float rounding: ``tests/test_engine_rowwise.py``,
``tests/test_engine_convolution.py``). The caller picks the row-wise form once (:meth:`RowwiseForward.of`
checks the model's layers and hooks) and passes it to every call. :func:`vmapped` is the vmap form of any
per-row function, for callers whose row is more than one forward pass: the engine's ``vmap(grad)`` of
larger models, and its rows with PRECODE noise and BatchNorm statistics.

On a CPU the vmap form stops paying for large models (:func:`vmap_pays_off`): the engine's dummy updates and
DCS²'s synthesis, which differentiate every row twice, then compute their rows one after another.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torch.func import functional_call, vmap

from leakgym.models.base import task_loss
from leakgym.models.convolution import UnfoldedConvolutions
from leakgym.models.rowwise import RowwiseForward

#: On a CPU, a model with more parameters than this is not worth a vmap over rows that are differentiated
#: twice (:func:`vmap_pays_off`). Measured (one thread, 32x32 images, one image a row; vmap form against the
#: same rows one after another) for the engine's Inverting Gradients, ms per problem and iteration, and for
#: DCS²'s synthesis, ms per client for 3 steps:
#:
#: * the CIFAR ConvNet (width 16, 0.19 M parameters): engine at 16 rows 16.1 vs 19.4, DCS² at 8 clients 86.9
#:   vs 117.0 -- vmap pays;
#: * the ConvNet at width 64 (2.9 M): engine at 8 rows 186.6 vs 188.1, DCS² at 4 clients 1,010 vs 997 -- even;
#: * ResNet-18 (11.2 M): engine at 8 rows 342-344 vs 220, 2 rows 157-182 vs 180, DCS² at 4 clients 1,852 vs
#:   1,440 -- vmap loses, more so the more rows it holds (every row a copy of every weight and its gradients).
#:
#: CENSOR's trial evaluations (forward passes only) are even for ResNet-18 (4 clients, 5 trials: 1,729 vs
#: 1,755 ms a client) and keep their vmap form.
CPU_VMAP_MAX_PARAMETERS = 2_000_000


def vmap_pays_off(model: nn.Module) -> bool:
    """Whether rows of ``model`` that are differentiated twice should be vmapped on the model's device: always
    on an accelerator, and on a CPU for models of at most :data:`CPU_VMAP_MAX_PARAMETERS` parameters (the
    measurements there); otherwise the caller computes its rows one after another."""
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu":
        return True
    return sum(p.numel() for p in params) <= CPU_VMAP_MAX_PARAMETERS


def vmapped(fn: Callable, rows: int, in_dims=0, *, unfold: bool = True) -> Callable:
    """``torch.func.vmap(fn, in_dims, randomness="error")`` over ``rows`` rows, whose calls compute every small
    ``F.conv2d`` as :func:`~leakgym.models.convolution.unfolded_conv2d` (``unfold``; ``rows`` decides the unfold
    as a matrix product, :func:`~leakgym.models.convolution.takes_matrix`): the vmap form of
    :func:`batched_forward`, for any per-row function."""
    batched = vmap(fn, in_dims=in_dims, randomness="error")
    if not unfold:
        return batched

    def call(*args):
        with UnfoldedConvolutions(rows):
            return batched(*args)

    return call


def _with_shared(params: dict[str, Tensor], shared: dict[str, Tensor] | None, rows: int) -> dict[str, Tensor]:
    """``params`` and, for the row-wise form, ``shared`` expanded to ``rows`` rows (views, no copies)."""
    return params if not shared else {**{n: t.expand(rows, *t.shape) for n, t in shared.items()}, **params}


def batched_forward(model: nn.Module, params: dict[str, Tensor], x: Tensor, buffers: dict[str, Tensor] | None = None,
                    *, shared: dict[str, Tensor] | None = None, rowwise: RowwiseForward | None = None,
                    unfold: bool = True, features: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Logits ``(R, B, classes)`` of ``model`` under ``R`` parameter sets: row ``r`` is
    ``functional_call(model, {**shared, **buffers[.][r], **params[.][r]}, (x[r],))``.

    Args:
        params, buffers: name -> ``(R, *shape)``; ``shared``: name -> ``(*shape)``, the same for every row.
        x: ``(R, B, C, H, W)``.
        rowwise: the model's row-wise form (module docstring), or None for the vmap form.
        unfold: in the vmap form, small convolutions as unfold + matrix product.
        features: also return the head's input ``(R, B, D)`` (a :class:`~leakgym.models.LeakGymModel`'s
            ``head``; DCS²'s latent ``f(x)``).
    """
    if rowwise is not None:
        logits, h = rowwise.logits(_with_shared({**(buffers or {}), **params}, shared, x.shape[0]), x)
        return (logits, h) if features else logits
    constants = shared or {}
    seen: list[Tensor] = []

    def row(p: dict[str, Tensor], b: dict[str, Tensor], xr: Tensor):
        logits = functional_call(model, {**constants, **b, **p}, (xr,))
        return (logits, seen.pop()) if features else logits

    hook = model.head.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) if features else None
    try:
        return vmapped(row, x.shape[0], unfold=unfold)(params, buffers or {}, x)
    finally:
        if hook is not None:
            hook.remove()


def batched_loss(model: nn.Module, params: dict[str, Tensor], x: Tensor, y: Tensor,
                 buffers: dict[str, Tensor] | None = None, *, shared: dict[str, Tensor] | None = None,
                 rowwise: RowwiseForward | None = None, unfold: bool = True) -> Tensor:
    """``(R,)`` task losses of ``model`` under ``R`` parameter sets: row ``r`` is
    :func:`~leakgym.models.task_loss` of the model with parameter set ``r`` on ``x[r]`` ``(R, B, C, H, W)``,
    ``y[r]`` (hard labels ``(R, B)`` or label distributions ``(R, B, K)``). Arguments as :func:`batched_forward`."""
    if rowwise is not None:
        return rowwise(_with_shared({**(buffers or {}), **params}, shared, x.shape[0]), x, y)
    constants = shared or {}

    def row(p: dict[str, Tensor], b: dict[str, Tensor], xr: Tensor, yr: Tensor) -> Tensor:
        return task_loss(model, xr, yr, params={**constants, **b, **p})

    return vmapped(row, x.shape[0], unfold=unfold)(params, buffers or {}, x, y)


__all__ = ["CPU_VMAP_MAX_PARAMETERS", "batched_forward", "batched_loss", "vmap_pays_off", "vmapped"]

"""A plain model's loss with one parameter set per row, as batched tensor operations (no vmap).

The row-wise form of :func:`leakgym.models.parameter_sets.batched_forward` and
:func:`~leakgym.models.parameter_sets.batched_loss` (their ``rowwise=`` argument), the entry point its
callers use; the number of rows is the input's first dimension.

The attack engine's rows each own their parameters (:class:`~leakgym.attacks.engine.problems.UpdateSimulator`
with per-row leaves). Its general form evaluates the model under ``torch.func.vmap`` with
``functional_call``; every layer call then pays vmap's and the functional call's Python wrappers and
every operation the batching rules' dispatch -- on LeNet 16x16 about half of an engine iteration
at one row. For a model that is a plain stack of layers, :class:`RowwiseForward` computes the same
loss directly: a convolution is an unfold and a batched matrix product with the row's weight
(:func:`~leakgym.models.convolution.rowwise_conv2d`), a linear layer one ``baddbmm``, an
activation itself, and the cross-entropy per row. What vmap computes is the same mathematics, so
per-row gradients of every order are the same up to float rounding (test:
``tests/test_engine_rowwise.py`` against the vmap form). Measured, forward + dummy gradient + matching
backward on digits LeNet, one CPU thread: 1 row 2.44 -> 1.23 ms, 12 rows 5.72 -> 3.72 ms, 24 rows
9.16 -> 6.46 ms.

It takes a :class:`~leakgym.models.base.LeakGymModel` whose ``forward`` is the base class's, without
PRECODE bottleneck, buffers or hooks, whose body is an ``nn.Sequential`` of exactly these layer types:
``Conv2d`` (as :func:`~leakgym.models.convolution.expressible`), ``Linear``, ``Flatten``
(default dims), ``Sigmoid``, ``ReLU``, ``Tanh``, ``Identity`` -- DLG's LeNet. Any other model (BatchNorm,
pooling, PRECODE, ResNet, a subclass with its own forward, a layer whose ``forward`` was replaced on the
object, a hooked module or hooks on every module) keeps the vmap form:
:meth:`RowwiseForward.of` returns None. Like the vmap form's unfolded convolutions, the form pays only
while every convolution's unfolded input per row is small (:meth:`RowwiseForward.fits`; the engine
checks the same bound in its simulator): digits LeNet with one image per row, not the 28x28 or 32x32
LeNets, nor batches of 8 digits. For the 28x28 LeNet (MNIST, Fashion-MNIST) the form would pay for a
game alone and lose for a vector: Inverting Gradients per engine iteration, one CPU thread, at 1 / 4 /
8 / 16 / 32 / 64 rows, 5.4 / 6.4 / 8.1 / 11.0 / 17.7 / 31.8 ms with vmap, 2.6 / 4.3 / 6.6 / 12.5 /
23.3 / 51.1 ms row-wise. Choosing the form by the number of rows would give a game alone and the same
game in a vector different kernels, and their trajectories must be equal on a CPU; so the bound stays.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import torch.nn.modules.module as module_module
from torch import Tensor, nn

from leakgym.models.base import LeakGymModel
from leakgym.models.convolution import (
    UNFOLD_MAX_ENTRIES,
    conv_output_size,
    expressible,
    grouped_conv2d,
    rowwise_conv2d,
    takes_matrix,
)

_ACTIVATIONS: dict[type, Callable[[Tensor], Tensor]] = {
    nn.Sigmoid: torch.sigmoid, nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.Identity: lambda t: t}


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _hooked(module: nn.Module) -> bool:
    return any(bool(getattr(module, name, None)) for name in _HOOKS)


def _global_hooks() -> bool:
    """Whether hooks for every module are registered (``torch.nn.modules.module.register_module_forward_hook``
    and its kin): the vmap form runs them, the row-wise form would not."""
    return any(bool(getattr(module_module, f"_global{name}", None)) for name in _HOOKS)


def _own_forward(module: nn.Module) -> bool:
    """Whether ``module`` has a ``forward`` of its own instance (set on the object, not its class)."""
    return "forward" in vars(module)


class RowwiseForward:
    """``(params, x, y) -> (R,)`` task losses of ``R`` rows, row ``r`` with its own parameters.

    ``params``: parameter name -> ``(R, *shape)``; ``x``: ``(R, B, C, H, W)``; ``y``: hard labels
    ``(R, B)`` or label distributions ``(R, B, K)``. Row ``r``'s loss is ``task_loss`` of the model with
    ``params[.][r]`` on ``x[r], y[r]`` (the mean cross-entropy over its ``B`` images).
    """

    def __init__(self, layers: list[tuple[nn.Module, str]]) -> None:
        self.layers = layers

    @classmethod
    def of(cls, model: nn.Module, batch: int | None = None,
           image_shape: tuple[int, ...] | None = None) -> RowwiseForward | None:
        """The row-wise form of ``model``, or None where it takes the vmap form (module docstring) -- or,
        given ``batch`` and ``image_shape``, where it does not :meth:`fits` batches of that size."""
        if not isinstance(model, LeakGymModel) or type(model).forward is not LeakGymModel.forward:
            return None
        if model.bottleneck is not None or type(model.body) is not nn.Sequential or type(model.head) is not nn.Linear:
            return None
        if any(True for _ in model.buffers()) or _global_hooks() \
                or any(_hooked(m) or _own_forward(m) for m in model.modules()):
            return None
        layers = [(m, f"body.{name}") for name, m in model.body.named_children()] + [(model.head, "head")]
        for m, _ in layers:
            kind = type(m)
            if kind is nn.Conv2d and expressible(m):
                continue
            if kind is nn.Linear or kind in _ACTIVATIONS:
                continue
            if kind is nn.Flatten and m.start_dim == 1 and m.end_dim == -1:
                continue
            return None
        form = cls(layers)
        return None if batch is not None and not form.fits(batch, image_shape) else form

    def fits(self, batch: int, image_shape: tuple[int, ...]) -> bool:
        """Whether every convolution's unfolded input per row (``B * C * kh * kw * L``) stays within
        :data:`~leakgym.models.convolution.UNFOLD_MAX_ENTRIES` for batches of ``batch`` images: beyond
        it the unfold's memory traffic costs more than vmap's per-operation overhead (measured for 256
        digits clients of 8 images each, one CPU thread: 205 ms row-wise, 107 ms vmapped)."""
        c, h, w = image_shape
        for m, _ in self.layers:
            if type(m) is nn.Conv2d:
                (kh, kw), (sh, sw), (ph, pw), (dh, dw) = m.kernel_size, m.stride, m.padding, m.dilation
                h, w = conv_output_size(h, kh, sh, ph, dh), conv_output_size(w, kw, sw, pw, dw)
                if batch * c * kh * kw * h * w > UNFOLD_MAX_ENTRIES:
                    return False
                c = m.out_channels
        return True

    def __call__(self, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        rows, batch = x.shape[0], x.shape[1]
        logits, _ = self.logits(params, x)
        target = y.reshape(rows * batch, *y.shape[2:])
        if not target.is_floating_point():
            target = target.long()  # class indices, as task_loss takes them
        return F.cross_entropy(logits.reshape(rows * batch, -1), target, reduction="none").reshape(rows, batch).mean(1)

    def logits(self, params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        """``(R, B, classes)`` logits and ``(R, B, D)`` features (the head's input) of every row."""
        h = x
        for m, name in self.layers[:-1]:  # the body
            h = self._layer(m, name, params, h)
        head, name = self.layers[-1]
        return self._layer(head, name, params, h), h

    def plain_logits(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """Logits of the model with one parameter set ``params`` (no row dimension) on ``x (B, C, H, W)``,
        each layer by the functional kernel its module's forward calls (``F.conv2d``, ``F.linear``, the
        activation): the values of ``functional_call(model, params, (x,))`` bit for bit, without the module
        calls and the reparametrisation around them (the CPU evaluation loop of
        :func:`~leakgym.fl.batched.evaluate_many`)."""
        h = x
        for m, name in self.layers:
            kind = type(m)
            if kind is nn.Conv2d:
                h = F.conv2d(h, *_weights(m, name, params), m.stride, m.padding, m.dilation, m.groups)
            elif kind is nn.Linear:
                h = F.linear(h, *_weights(m, name, params))
            elif kind is nn.Flatten:
                h = h.flatten(1, -1)
            else:
                h = _ACTIVATIONS[kind](h)
        return h

    def grouped_logits(self, params: dict[str, Tensor], x: Tensor, *, shared: bool) -> Tensor:
        """``(N, B, classes)`` logits of ``N`` models (``params``: name -> ``(N, *shape)``) on their images
        without a Python loop over the models: ``x`` is one set ``(B, C, H, W)`` for every model (``shared``)
        or one per model ``(N, B, C, H, W)``.

        Every convolution of the ``N`` models is one grouped ``F.conv2d`` (``groups=N``,
        :func:`~leakgym.models.convolution.grouped_conv2d`: first-order gradients only) on activations laid
        out ``(B, N * C, H, W)``; a first convolution of a shared set is one unfold of the images and one
        matrix product with all ``N`` weights (``(N * O, C*kh*kw)`` by ``(B, C*kh*kw, L)``; as a grouped
        convolution it is the slowest layer); a linear layer one ``baddbmm`` over the models. The values
        equal :meth:`plain_logits` of each model to float rounding (other kernels, other summation
        orders), not bit for bit. Used by :func:`leakgym.fl.batched.evaluate_many` on a CPU for small
        held-out sets (see there), and by :meth:`grouped_loss`."""
        n_models = next(iter(params.values())).shape[0]
        batch = x.shape[0] if shared else x.shape[1]
        # h is either "grouped" (B, N * C, H, W) -- what a grouped convolution takes -- or "rows" (N, B, ...)
        grouped, h = False, x
        first = True
        for m, name in self.layers:
            kind = type(m)
            if kind is nn.Conv2d:
                weight, bias = _weights(m, name, params)
                out_ch = weight.shape[1]
                if first and shared:  # one unfold of the shared images, one product with every weight
                    cols = F.unfold(h, m.kernel_size, m.dilation, m.padding, m.stride)  # (B, C*kh*kw, L)
                    out = torch.matmul(weight.reshape(n_models * out_ch, -1), cols)  # (B, N * O, L)
                    if bias is not None:
                        out = out + bias.reshape(1, n_models * out_ch, 1)
                    height, width = (conv_output_size(size, k, s, p, d) for size, k, s, p, d in zip(
                        h.shape[-2:], m.kernel_size, m.stride, m.padding, m.dilation))
                    h = out.reshape(batch, n_models * out_ch, height, width)
                else:
                    if not grouped:  # rows (N, B, C, H, W) -> (B, N * C, H, W)
                        h = h.transpose(0, 1).reshape(batch, -1, *h.shape[-2:])
                    h = grouped_conv2d(h, weight, bias, m.stride, m.padding, m.dilation)
                grouped = True
            elif kind is nn.Linear:  # on the last dimension, as nn.Linear
                if first and shared:
                    h = h.expand(n_models, *h.shape)
                elif grouped:  # (B, N * C, H, W) -> (N, B, C, H, W)
                    h = h.reshape(batch, n_models, -1, *h.shape[-2:]).transpose(0, 1)
                grouped = False
                weight, bias = _weights(m, name, params)
                flat = h.reshape(n_models, -1, h.shape[-1])
                out = flat @ weight.transpose(1, 2) if bias is None \
                    else torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))
                h = out.reshape(*h.shape[:-1], out.shape[-1])
            elif kind is nn.Flatten:
                if first and shared:
                    h = h.expand(n_models, *h.shape)
                if grouped:  # (B, N * C, H, W) -> (N, B, C * H * W)
                    h = h.reshape(batch, n_models, -1).transpose(0, 1)
                else:
                    h = h.reshape(n_models, batch, -1)
                grouped = False
            else:
                h = _ACTIVATIONS[kind](h)
                continue  # elementwise: the shared images stay shared
            first = False
        if first and shared:  # activations only
            h = h.expand(n_models, *h.shape)
        elif grouped:
            h = h.reshape(batch, n_models, -1, *h.shape[-2:]).transpose(0, 1)
        return h

    def grouped_loss(self, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        """``(R,)`` task losses of ``R`` rows, as :meth:`__call__` (same arguments), computed in the grouped
        form of :meth:`grouped_logits` (one set per row): its first-order gradients are each row's own,
        every convolution a :func:`~leakgym.models.convolution.grouped_conv2d`. The FL clients' form on a
        CPU where :meth:`fits` is false (:func:`leakgym.fl.batched.benign_updates`); equal to the vmapped
        clients to rounding."""
        rows, batch = x.shape[0], x.shape[1]
        logits = self.grouped_logits(params, x, shared=False)
        target = y.reshape(rows * batch, *y.shape[2:])
        if not target.is_floating_point():
            target = target.long()  # class indices, as task_loss takes them
        return F.cross_entropy(logits.reshape(rows * batch, -1), target, reduction="none").reshape(rows, batch).mean(1)

    def _layer(self, m: nn.Module, name: str, params: dict[str, Tensor], h: Tensor) -> Tensor:
        """Layer ``m`` (called ``name``) of every row: ``h (R, B, ...)`` -> ``(R, B, ...)``."""
        kind = type(m)
        if kind is nn.Conv2d:
            geometry = (m.kernel_size, m.stride, m.padding, m.dilation)
            return rowwise_conv2d(h, *_weights(m, name, params), *geometry[1:],  # the rows: h's first dimension
                                  via_matrix=takes_matrix(h[0], *geometry, h.shape[0]))
        if kind is nn.Linear:  # on the last dimension, as nn.Linear: (R, B, ..., in) -> (R, B, ..., out)
            weight, bias = _weights(m, name, params)
            flat = h.reshape(h.shape[0], -1, h.shape[-1])
            out = flat @ weight.transpose(1, 2) if bias is None \
                else torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))
            return out.reshape(*h.shape[:-1], out.shape[-1])
        if kind is nn.Flatten:
            return h.reshape(h.shape[0], h.shape[1], -1)
        return _ACTIVATIONS[kind](h)


def _weights(m: nn.Module, name: str, params: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
    """Layer ``m``'s (called ``name``) weight and bias (None without one) in ``params``."""
    return params[f"{name}.weight"], params[f"{name}.bias"] if m.bias is not None else None


__all__ = ["RowwiseForward"]

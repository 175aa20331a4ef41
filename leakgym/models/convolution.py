"""Convolutions as unfold + matrix product, for the engine's vmapped double backward.

Why not ``F.conv2d``: under ``torch.func.vmap`` with a weight per row (every row of the engine owns
its parameters), a convolution becomes one grouped convolution with ``groups = rows``. Its forward
and first backward are single kernels, but ATen's double backward
(``_convolution_double_backward`` in ``aten/src/ATen/native/Convolution.cpp``) computes the weight
and input terms for ``groups > 1`` in a C++ *loop over the groups*: one convolution per row and
layer, on every device (on a GPU, one kernel launch each). Measured on LeNet 16x16 with one CPU thread, 64
rows: 4,064 convolution calls in 20 engine iterations, half of the time.

:func:`unfolded_conv2d` computes the same convolution as ``F.unfold`` (im2col) followed by one
matrix product, whose derivatives of every order are again unfold/fold and (batched) matrix products,
so the rows stay one computation: per engine iteration on LeNet 16x16, 1 thread (dummy gradient and
double backward), 4.4 -> 2.9 ms for one row, 27.9 -> 18.1 ms for 64 rows (``leakgym bench attacks``
has the engine-level numbers). Results equal ``F.conv2d`` to float32 rounding (test:
``tests/test_engine_convolution.py``). The price is memory and arithmetic: the unfolded input is
``k*k`` times the input, kept for the backward passes, and a matrix product over it is slower than a
convolution kernel once the layer is not tiny. So a layer uses it only while its unfolded input per
row (``B * C * kh * kw * L`` entries, ``L`` output positions) is at most :data:`UNFOLD_MAX_ENTRIES`.
Measured per engine iteration (Inverting Gradients, one CPU thread, 16 rows, unfold everywhere vs
``F.conv2d`` everywhere): LeNet 16x16 at B = 1 (<= 4,800 entries per layer) 9.7 vs 17.0 ms; LeNet at
B = 4 (~19,000) 26.2 vs 19.6 ms; ConvNet 32x32 at B = 1 (27,648 to 147,456) 829 vs 403 ms. The
threshold sits between. It was measured on a CPU only; on a GPU the per-row loop costs a kernel
launch per row and layer, which likely moves the break-even point up (not measured: no GPU was lent).

Inside a ``with`` :class:`UnfoldedConvolutions` block (a torch function mode, entered by the vmap form of
:mod:`leakgym.models.parameter_sets` around its call: the engine's vectorised path, DCS²'s synthesis)
every small ``F.conv2d`` call is :func:`unfolded_conv2d`; nothing is set on the model, and the same
model called outside the block (the engine's reference sequential path) keeps ``F.conv2d``.
:func:`rowwise_conv2d` is the same computation for all rows at once without vmap, for models evaluated
in :mod:`~leakgym.models.rowwise` form. Calls it cannot express exactly (groups > 1, string padding,
unbatched input) stay ``F.conv2d``.

**The unfold itself, as a matrix product.** ``F.unfold`` is ATen's ``im2col``, which loops over the
batch: on a CPU one plain C loop per image (its backward ``col2im`` too; at 24 rows they were the two
costliest kernels of a LeNet iteration, a quarter of it), and on a GPU one *kernel launch* per image
(``im2col_out_cuda_template`` in ``aten/src/ATen/native/cuda/Im2Col.cu``: ``for (elt = 0; elt <
batch_size; elt++)``) -- the same per-row launches the unfold path exists to avoid, moved from the
convolution's double backward into the unfold. For an input of ``H x W`` positions the unfold is also
one product with a constant 0/1 matrix :func:`unfold_matrix` (``H*W x kh*kw*L``; column ``(k, l)``
holds a single 1 at the input position that kernel offset ``k`` reads for output position ``l``, none
where it reads padding), whose derivatives of every order are products with it or its transpose: one
GEMM for all rows, on every device. Values are exactly ``F.unfold``'s for finite inputs (one
non-zero term per column; a non-finite entry makes its own row's columns NaN, as a diverged row is
anyway). It costs ``H*W`` times the arithmetic of the copy, so it is taken (:func:`takes_matrix`, for the
rows of the call) where that pays: on a CPU for inputs of at most :data:`MATRIX_MAX_POSITIONS` positions and at least
:data:`MATRIX_MIN_ROWS` rows, on other devices whenever the matrix stays under
:data:`MATRIX_MAX_ENTRIES`. Measured (LeNet 16x16, one CPU thread): forward + double backward alone,
24 rows 6.7 -> 5.9 ms, 48 rows 11.8 -> 9.2 ms, one row 2.4 -> 2.5 ms (hence the row threshold); a whole
Inverting Gradients engine iteration, 24 rows 10.6 -> 7.6 ms, 48 rows 22.0 -> 15.1 ms. With the
row-wise form (:mod:`leakgym.models.rowwise`) the matrix would pay from 6 rows (a whole IG iteration,
F.unfold vs the matrix, one thread: 8 rows 3.44 vs 3.16 ms, 12 rows 4.30 vs 3.95 ms), but its backward
sums in another order than ``col2im``, and a mixed four-strategy engine call of 6-15 rows then drifted
from the same problems alone by more than the engine tests' 1e-4 (a pixel 1.6e-4 apart): the threshold
stays at 16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair
from torch.overrides import TorchFunctionMode

UNFOLD_MAX_ENTRIES = 8192
"""Largest unfolded input per row (``B * C * kh * kw * L``) for which a layer uses :func:`unfolded_conv2d`."""
MATRIX_MAX_POSITIONS = 64
"""On a CPU: largest input (``H * W`` positions) whose unfold is a product with :func:`unfold_matrix`."""
MATRIX_MIN_ROWS = 16
"""On a CPU: fewest engine rows for which the unfold is a product with :func:`unfold_matrix`."""
MATRIX_MAX_ENTRIES = 1 << 22
"""Largest :func:`unfold_matrix` (entries) any device builds."""

_MATRICES: dict[tuple, Tensor] = {}


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of a convolution along one dimension (as ``nn.Conv2d`` documents it)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def unfold_matrix(h: int, w: int, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
                  dilation: tuple[int, int], *, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """``(h*w, kh*kw*L)`` 0/1 matrix ``U`` with ``x.reshape(n, C, h*w) @ U`` equal to ``F.unfold(x, ...)``
    reshaped to ``(n, C, kh*kw*L)`` (column ``k*L + l``: kernel offset ``k``, output position ``l``).
    Cached per shape, device and dtype (it is a constant)."""
    key = (h, w, tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), torch.device(device), dtype)
    if key not in _MATRICES:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        ho, wo = conv_output_size(h, kh, sh, ph, dh), conv_output_size(w, kw, sw, pw, dw)
        i, j, a, b = torch.meshgrid(torch.arange(kh), torch.arange(kw), torch.arange(ho), torch.arange(wo),
                                    indexing="ij")
        row, col = a * sh - ph + i * dh, b * sw - pw + j * dw  # the input position each entry reads
        inside = (row >= 0) & (row < h) & (col >= 0) & (col < w)
        column = ((i * kw + j) * (ho * wo) + a * wo + b)[inside]
        matrix = torch.zeros(h * w, kh * kw * ho * wo, dtype=dtype)
        matrix[(row * w + col)[inside], column] = 1
        _MATRICES[key] = matrix.to(device)
    return _MATRICES[key]


def _unfolded(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
              dilation: tuple[int, int], via_matrix: bool) -> tuple[Tensor, int, int]:
    """``F.unfold`` of ``x (n, C, H, W)``: ``(n, C*kh*kw, L)``, or with ``via_matrix`` the product with
    :func:`unfold_matrix` (the same values); and the output's height and width."""
    n, c, h, w = x.shape
    kh, kw = kernel
    if via_matrix:
        matrix = unfold_matrix(h, w, kernel, stride, padding, dilation, device=x.device, dtype=x.dtype)
        cols = (x.reshape(n, c, h * w) @ matrix).reshape(n, c * kh * kw, -1)
    else:
        cols = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
    return (cols, conv_output_size(h, kh, stride[0], padding[0], dilation[0]),
            conv_output_size(w, kw, stride[1], padding[1], dilation[1]))


def unfolded_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple[int, int],
                    padding: tuple[int, int], dilation: tuple[int, int], *, via_matrix: bool = False) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation)`` for ``groups=1`` and 4-D ``x``, as an
    unfold and one matrix product; the unfold is ``F.unfold``, or with ``via_matrix`` the product with
    :func:`unfold_matrix` (see the module docstring)."""
    out_ch, _, kh, kw = weight.shape
    cols, ho, wo = _unfolded(x, (kh, kw), stride, padding, dilation, via_matrix)  # (n, C*kh*kw, L)
    out = weight.reshape(out_ch, -1) @ cols  # (n, O, L)
    if bias is not None:
        out = out + bias.reshape(1, out_ch, 1)
    return out.reshape(x.shape[0], out_ch, ho, wo)


def rowwise_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple[int, int],
                   padding: tuple[int, int], dilation: tuple[int, int], *, via_matrix: bool = False) -> Tensor:
    """:func:`unfolded_conv2d` of ``R`` rows, each with its own weight, without vmap: ``x (R, B, C, H, W)``,
    ``weight (R, O, C, kh, kw)``, ``bias (R, O)`` -> ``(R, B, O, H', W')``; row ``r`` is
    ``F.conv2d(x[r], weight[r], bias[r], ...)`` (used by :class:`~leakgym.models.rowwise.RowwiseForward`)."""
    rows, batch, c, h, w = x.shape
    out_ch, _, kh, kw = weight.shape[1:]
    cols, ho, wo = _unfolded(x.reshape(rows * batch, c, h, w), (kh, kw), stride, padding, dilation, via_matrix)
    if batch == 1 and bias is not None:  # the engine's usual case: one image per row, one baddbmm
        out = torch.baddbmm(bias.reshape(rows, out_ch, 1), weight.reshape(rows, out_ch, c * kh * kw),
                            cols.reshape(rows, c * kh * kw, -1))
    else:
        out = weight.reshape(rows, 1, out_ch, c * kh * kw) @ cols.reshape(rows, batch, c * kh * kw, -1)
        if bias is not None:
            out = out + bias.reshape(rows, 1, out_ch, 1)
    return out.reshape(rows, batch, out_ch, ho, wo)


GROUPED_WEIGHT_GRAD_MAX_POSITIONS = 16
"""Largest output (``H' * W'`` positions) of a :func:`grouped_conv2d` whose weight gradient is computed as a
grouped convolution of the input with the output gradient (see there)."""


def grouped_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple[int, int],
                   padding: tuple[int, int], dilation: tuple[int, int] = (1, 1)) -> Tensor:
    """``R`` convolutions, each with its own weight, as one grouped ``F.conv2d``: ``x (B, R * C, H, W)`` (row
    ``r``'s channels ``r*C .. r*C + C - 1``), ``weight (R, O, C, kh, kw)``, ``bias (R, O)`` or None ->
    ``(B, R * O, H', W')`` (zero padding). The forward pass is ``F.conv2d(..., groups=R)``.

    First-order gradients only (no double backward; the FL clients' training). The input gradient is ATen's
    convolution backward; the weight gradient too, except where the output is small (at most
    :data:`GROUPED_WEIGHT_GRAD_MAX_POSITIONS` positions): there it is itself one grouped convolution, of
    the input (batch and channels swapped, ``(C, R * B, H, W)``) with the output gradient as the kernel
    (``(R * O, B, H', W')``, dilated by the stride), whose ``kh x kw`` first outputs are
    ``dW[r, o, c]`` (with a dilation ``d``: its stride is ``d``). The same sums in another order (equal to rounding). ATen's weight gradient of a grouped
    convolution ran at a third of its forward's speed there; measured for 256 rows of 8 images, 12 -> 12
    channels, 5x5 kernels, one CPU thread: 4x4 -> 4x4 10.8 -> 3.9 ms, 8x8 -> 4x4 (stride 2) 11.0 -> 8.3
    ms; with larger outputs it lost (16x16 -> 8x8: 3.0 -> 9.1 ms; 14x14 -> 7x7: 27.7 -> 27.3 ms).
    """
    rows, out_ch = weight.shape[:2]
    flat_bias = None if bias is None else bias.reshape(rows * out_ch)
    return _GroupedConv2d.apply(x, weight.reshape(rows * out_ch, *weight.shape[2:]), flat_bias, tuple(stride),
                                tuple(padding), tuple(dilation), rows)


class _GroupedConv2d(torch.autograd.Function):
    """:func:`grouped_conv2d` with its weight (``(R * O, C, kh, kw)``) already flat."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups, bias is not None)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups, has_bias = ctx.geometry
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = has_bias and ctx.needs_input_grad[2]
        grad = grad.contiguous()
        small = grad.shape[-2] * grad.shape[-1] <= GROUPED_WEIGHT_GRAD_MAX_POSITIONS
        # The bias gradient is a sum of the output gradient: ATen's, of a grouped convolution on a CPU, computes
        # the weight gradient along (measured: the bias alone cost what the weight did).
        gx, gw, _ = torch.ops.aten.convolution_backward(
            grad, x, weight, None, list(stride), list(padding), list(dilation), False, [0, 0], groups,
            [need_x, need_w and not small, False])
        if need_w and small:
            gw = _grouped_weight_grad(x, grad, weight.shape, stride, padding, dilation, groups)
        gb = grad.sum((0, 2, 3)) if need_b else None
        return gx, gw, gb, None, None, None, None


def _grouped_weight_grad(x: Tensor, grad: Tensor, shape: torch.Size, stride: tuple[int, int],
                         padding: tuple[int, int], dilation: tuple[int, int], groups: int) -> Tensor:
    """The weight gradient of ``F.conv2d(x, w, None, stride, padding, dilation, groups)`` (``w`` of
    ``shape``) given the output gradient ``grad``, as one grouped convolution (:func:`grouped_conv2d`)."""
    batch, _, h, w = x.shape
    rows_out, channels, kh, kw = shape
    out_ch = rows_out // groups
    ho, wo = grad.shape[-2:]
    xt = x.reshape(batch, groups, channels, h, w).permute(2, 1, 0, 3, 4).reshape(channels, groups * batch, h, w)
    kernel = grad.reshape(batch, groups, out_ch, ho, wo).permute(1, 2, 0, 3, 4).reshape(rows_out, batch, ho, wo)
    out = F.conv2d(xt, kernel, None, dilation, padding, stride, groups)  # (C, R * O, >= kh, >= kw)
    out = out[:, :, :kh, :kw].reshape(channels, groups, out_ch, kh, kw)
    return out.permute(1, 2, 0, 3, 4).reshape(rows_out, channels, kh, kw)


def expressible(module: nn.Conv2d) -> bool:
    """Whether :func:`unfolded_conv2d` computes exactly what ``module`` does."""
    return module.groups == 1 and module.padding_mode == "zeros" and not isinstance(module.padding, str)


def _entries(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
             dilation: tuple[int, int]) -> int:
    """Entries of the unfolded input of a convolution with this geometry applied to ``x`` ``(B, C, H, W)``."""
    b, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    return b * c * kh * kw * conv_output_size(h, kh, sh, ph, dh) * conv_output_size(w, kw, sw, pw, dw)


def unfolded_entries(module: nn.Conv2d, x: Tensor) -> int:
    """Entries of the unfolded input of ``module`` applied to ``x`` ``(B, C, H, W)``."""
    return _entries(x, module.kernel_size, module.stride, module.padding, module.dilation)


def takes_matrix(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
                 dilation: tuple[int, int], rows: int) -> bool:
    """Whether the unfold of ``x`` (one row's input) by a convolution of this geometry is the product with
    :func:`unfold_matrix` when ``rows`` rows are computed at once (module docstring)."""
    b, c, h, w = x.shape
    if x.device.type == "cpu":
        return h * w <= MATRIX_MAX_POSITIONS and rows >= MATRIX_MIN_ROWS
    return h * w * (_entries(x, kernel, stride, padding, dilation) // max(b * c, 1)) <= MATRIX_MAX_ENTRIES  # H*W x kh*kw*L


def _conv2d_arguments(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                      dilation=1, groups: int = 1) -> tuple:
    """``F.conv2d``'s arguments, by name (as a caller may pass them)."""
    return input, weight, bias, stride, padding, dilation, groups


class UnfoldedConvolutions(TorchFunctionMode):
    """While entered (``with UnfoldedConvolutions(rows): ...``), every ``F.conv2d`` call that
    :func:`unfolded_conv2d` expresses exactly (``groups=1``, numeric padding, a 4-D input -- per row, inside
    ``vmap``) on an input whose unfolded size is at most ``max_entries`` computes :func:`unfolded_conv2d`
    instead, its unfold the matrix product where :func:`takes_matrix` says so for ``rows`` rows.

    A torch function mode: it intercepts the calls made inside the ``with`` block, whatever module makes
    them, and changes no module -- the vmap form of :func:`leakgym.models.parameter_sets.batched_forward`
    enters it around its call. ``nn.Conv2d`` with a non-zero padding mode pads first and calls
    ``F.conv2d`` without padding, which is expressible too. Every torch call of the block passes through
    the mode's Python handler, which costs a little; measured against the former form (a forward replaced
    on the layers, switched on by a flag; the same values bit for bit), one CPU thread on a loaded 2-core
    machine: LeNet 16x16 at 24 rows, vmapped forward + gradient + double backward, 6.15 vs 6.47 ms (best
    of 40; medians 7.99 vs 8.22 ms); a whole Inverting Gradients iteration of the PRECODE LeNet (vmap form)
    at 24 rows 48.0 vs 46.4 ms (best of 5), within the noise. The unfold saves far more than that in the
    double backward (module docstring); the row-wise form does not enter the mode.
    """

    def __init__(self, rows: int, max_entries: int = UNFOLD_MAX_ENTRIES) -> None:
        super().__init__()
        self.rows = rows
        self.max_entries = max_entries

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.conv2d:
            x, weight, bias, stride, padding, dilation, groups = _conv2d_arguments(*args, **kwargs)
            if groups == 1 and not isinstance(padding, str) and x.dim() == 4:
                geometry = (tuple(weight.shape[-2:]), _pair(stride), _pair(padding), _pair(dilation))
                if _entries(x, *geometry) <= self.max_entries:
                    return unfolded_conv2d(x, weight, bias, *geometry[1:],
                                           via_matrix=takes_matrix(x, *geometry, self.rows))
        return func(*args, **kwargs)


__all__ = ["GROUPED_WEIGHT_GRAD_MAX_POSITIONS", "MATRIX_MAX_ENTRIES", "MATRIX_MAX_POSITIONS", "MATRIX_MIN_ROWS",
           "UNFOLD_MAX_ENTRIES", "UnfoldedConvolutions", "conv_output_size", "expressible", "grouped_conv2d",
           "rowwise_conv2d", "takes_matrix", "unfold_matrix", "unfolded_conv2d", "unfolded_entries"]

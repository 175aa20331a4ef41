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

:class:`UnfoldedConvolutions` makes the ``nn.Conv2d`` layers of the engine's private model copy use
it while switched on (the vectorised path); the reference sequential path keeps ``F.conv2d``.
Layers it cannot express exactly (groups > 1, string padding, non-zero padding modes, unbatched
input) keep their own forward.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

UNFOLD_MAX_ENTRIES = 8192
"""Largest unfolded input per row (``B * C * kh * kw * L``) for which a layer uses :func:`unfolded_conv2d`."""


def unfolded_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: tuple[int, int],
                    padding: tuple[int, int], dilation: tuple[int, int]) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation)`` for ``groups=1`` and 4-D ``x``, as
    ``F.unfold`` and one matrix product."""
    n, _, h, w = x.shape
    out_ch, _, kh, kw = weight.shape
    cols = F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)  # (n, C*kh*kw, L)
    out = weight.reshape(out_ch, -1) @ cols  # (n, O, L)
    if bias is not None:
        out = out + bias.reshape(1, out_ch, 1)
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return out.reshape(n, out_ch, ho, wo)


def expressible(module: nn.Conv2d) -> bool:
    """Whether :func:`unfolded_conv2d` computes exactly what ``module`` does."""
    return module.groups == 1 and module.padding_mode == "zeros" and not isinstance(module.padding, str)


def unfolded_entries(module: nn.Conv2d, x: Tensor) -> int:
    """Entries of the unfolded input of ``module`` applied to ``x`` ``(B, C, H, W)``."""
    b, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = module.kernel_size, module.stride, module.padding, module.dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return b * c * kh * kw * ho * wo


class UnfoldedConvolutions:
    """While :attr:`on`, the expressible ``nn.Conv2d`` layers of ``model`` compute :func:`unfolded_conv2d`
    on inputs whose unfolded size is at most ``max_entries`` (per row, inside ``vmap``).

    The layers' ``forward`` is replaced on this (private) model only and reads ``module.weight`` and
    ``module.bias`` at call time, so ``torch.func.functional_call`` parameters reach it. :meth:`close`
    restores the class's forward.
    """

    def __init__(self, model: nn.Module, max_entries: int = UNFOLD_MAX_ENTRIES) -> None:
        self.on = False
        self.max_entries = max_entries
        self.modules = [m for m in model.modules() if isinstance(m, nn.Conv2d) and expressible(m)]
        for m in self.modules:
            m.forward = self._forward_of(m)

    def _forward_of(self, module: nn.Conv2d):
        native = type(module).forward

        def forward(x: Tensor) -> Tensor:
            if not self.on or x.dim() != 4 or unfolded_entries(module, x) > self.max_entries:
                return native(module, x)
            return unfolded_conv2d(x, module.weight, module.bias, module.stride, module.padding, module.dilation)

        return forward

    def close(self) -> None:
        for m in self.modules:
            del m.forward  # the class's own forward again


__all__ = ["UNFOLD_MAX_ENTRIES", "UnfoldedConvolutions", "expressible", "unfolded_conv2d", "unfolded_entries"]

"""The arithmetic floor of a computation: its matrix-product operations over the device's measured GEMM rate.

A benchmark row says how fast something ran; this module says how fast it could run. Count the
floating-point operations of the matrix products and convolutions a computation performs
(:func:`count_matrix_flops`), divide by the rate at which this device multiplies large float32 matrices
(:func:`gemm_rate`), and the result is a time no version of the same arithmetic beats by much on this
device. Measured time over that floor is the gap left to close, and a floor near the measured time says
that the remaining lever is less arithmetic, not faster code.

What is counted: :class:`torch.utils.flop_counter.FlopCounterMode`'s formulas (matrix products and
convolutions, forward and backward, two operations per multiply-add), with one correction. Its formula
for ``aten.convolution_backward`` counts the weight gradient of a grouped convolution as if the
convolution were ungrouped, ``groups`` times too many operations (torch 2.14: the input, as the
"weights" of the gradient's own convolution, keeps all its channels); the vector env's convolutions are
grouped over the games, so a host-bound digits step at N = 256 read 227 GFLOP instead of about 7.
:func:`_convolution_backward_flops` counts each requested gradient at its forward's operations (every
product of an input and a weight entry appears once in the output, once in the input gradient and once
in the weight gradient, grouped or not, transposed or not).

What is not counted: elementwise work (activations, the optimisers, the summaries), copies and
reductions. They take time too, so the floor is a lower bound, and a rate far below the GEMM rate can
also mean small, badly shaped products (a 12-channel convolution runs under half of it on a CPU).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from math import prod

import torch
from torch.utils.flop_counter import FlopCounterMode

from leakgym.devices import synchronize

GEMM_SIZE = {"cpu": 1024, "cuda": 4096}
"""Side of the square float32 products :func:`gemm_rate` times, by device type (1024 elsewhere)."""


def _convolution_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                                _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """``aten.convolution_backward``: the forward's operations once per requested gradient (input, weight)."""
    # (a transposed convolution's forward runs over its input's positions, a plain one over its output's)
    positions = (x_shape if transposed else grad_out_shape)[2:]
    forward = 2 * x_shape[0] * prod(positions) * prod(w_shape)  # w: (O, C / groups, *kernel); transposed (C, O / groups, *kernel)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


class MatrixFlops:
    """What :func:`count_matrix_flops` counted: :attr:`total` operations, and :meth:`by_operator`."""

    def __init__(self, mode: FlopCounterMode) -> None:
        self._mode = mode

    @property
    def total(self) -> int:
        return int(self._mode.get_total_flops())

    def by_operator(self) -> dict[str, int]:
        """Operations per ATen operator (``"convolution"``, ``"convolution_backward"``, ``"bmm"``, ...)."""
        counts = self._mode.get_flop_counts().get("Global", {})
        return {str(getattr(op, "__name__", op)).split(".")[0]: int(n) for op, n in counts.items()}


class _NoModules:
    """A module tracker that tracks nothing, for :class:`FlopCounterMode`: every count goes to ``"Global"``,
    the only total read here. FlopCounterMode's own tracker (``torch.utils.module_tracker.ModuleTracker``)
    hooks every module's inputs for the backward pass, and that hook fails inside ``torch.autograd.grad``
    when a module's input is a leaf ("A leaf node was passed to _will_engine_execute_node but we are
    currently running autograd.grad()"): DCS²'s reference synthesis (:func:`~leakgym.defenses.dcs2.dcs2_gradient`,
    the concealed samples through the model) failed that way in ``leakgym bench env``'s counted step."""

    parents = frozenset({"Global"})

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


@contextlib.contextmanager
def count_matrix_flops() -> Iterator[MatrixFlops]:
    """``with count_matrix_flops() as flops: ...``: the matrix-product and convolution operations of the
    block, its backward passes included (read ``flops.total`` after the block). Every operator call goes
    through Python while it counts, so never time a counted block. No per-module split is kept
    (:class:`_NoModules`). The attack engine evaluates eagerly in the block: a CUDA graph's replay
    (:mod:`leakgym.attacks.engine.replay`) runs its kernels without dispatching them, unseen by the count."""
    from leakgym.attacks.engine.replay import eager_evaluations

    mode = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward:
                                                          _convolution_backward_flops})
    mode.mod_tracker = _NoModules()  # (FlopCounterMode's attribute; its __enter__/__exit__ and counts use it)
    with eager_evaluations(), mode:
        yield MatrixFlops(mode)


def gemm_rate(device: str | torch.device = "cpu", *, size: int | None = None, repeats: int = 10) -> float:
    """Floating-point operations per second of a square float32 matrix product on ``device`` (median of
    ``repeats`` timed products after two untimed ones; CUDA synchronised around each), with the process's
    torch thread count: the rate the arithmetic floor divides by."""
    device = torch.device(device)
    n = size if size is not None else GEMM_SIZE.get(device.type, 1024)
    if n < 1 or repeats < 1:
        raise ValueError(f"size={n}, repeats={repeats}; allowed: integers >= 1")
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device)
    b = torch.randn(n, n, generator=g, device=device)
    out = torch.empty(n, n, device=device)
    times = []
    for i in range(repeats + 2):
        synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


__all__ = ["GEMM_SIZE", "MatrixFlops", "count_matrix_flops", "gemm_rate"]

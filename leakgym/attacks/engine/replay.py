"""An engine iteration's evaluation, captured once as a CUDA graph and replayed.

On a GPU a step of many small games is bound by the host launching kernels, not by arithmetic
(``docs/results/bench_env_gpu.md``): with random attacker actions at N = 256 the attack dispatches some
113,000 operators a vector step, about 16 µs of host time each, for kernels that take a few µs on the device.
Most of an iteration's operators are its evaluation: the simulated updates of the working rows, the
objective, and the double backward to the rows' variables (:func:`~leakgym.attacks.engine.matching.run_joint_matching`).
Between two exits of problems at their budgets that evaluation repeats with the same shapes and the same
tensors (the variables are updated in place by the optimisers), so it can be recorded once as a CUDA graph
(``torch.cuda.CUDAGraph``, the "whole network capture" of the PyTorch CUDA semantics notes) and replayed:
one launch for the whole evaluation, the optimiser step and the bookkeeping stay eager.

:class:`IterationGraphs` runs one configuration of the working rows as

1. an eager evaluation on a side stream (the warm-up the notes ask for: cuBLAS workspaces and lazily made
   caches exist before capture),
2. at the next iteration, the capture and a first replay,
3. replays until the configuration changes (a problem leaves, a run stops stepping).

Only a configuration expected to last at least :data:`MIN_ITERATIONS` iterations is captured. The graph's
outputs are static tensors, overwritten by the next replay: the engine reads them within the iteration
(its optimisers and bookkeeping copy what they keep). Replays run the kernels of the captured evaluation
on the same inputs, so a problem's result is the eager engine's as far as CUDA's kernels are deterministic
(atomics-based backward kernels are not). ``tests/test_engine_replay.py`` checks the engine's use of the
graphs exactly on any device, with a stand-in that recomputes and overwrites the outputs in place, and the
real graphs against the eager engine on a GPU (``cuda``; to 1e-2, the tolerance of the engine's other GPU
comparisons).

Not captured (the evaluation runs eagerly): a CPU or MPS device, an evaluation that draws random numbers
(PRECODE's bottleneck noise, EOT samples: the engine's per-problem generators are not registered with a
graph), and any configuration whose capture fails (an operator that waits for the host, a capture from another
thread): the engine call then goes on eagerly with a warning naming the error.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch

#: capture an engine iteration's evaluation as a CUDA graph where it can be (set False to compare with the
#: eager engine; read at every engine call)
CUDA_GRAPHS = True
#: the fewest iterations a configuration of the working rows must be expected to last to be captured:
#: the warm-up and the capture each cost about one eager evaluation of host time
MIN_ITERATIONS = 8

_STREAMS: dict[int, Any] = {}


def _side_stream(device: torch.device):
    """One side stream per CUDA device for the warm-ups and captures of this process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


class CudaGraphs:
    """The CUDA form: warm-up and capture on a side stream, replays on the caller's stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = _side_stream(device)

    def warm_up(self, evaluate: Callable[[], Any]) -> Any:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = evaluate()
        current.wait_stream(self.stream)
        return out

    def capture(self, evaluate: Callable[[], Any]) -> tuple[Any, Any]:
        """``(graph, outputs)``: the outputs hold their values only after :meth:`replay`. The low-level
        ``capture_begin``/``capture_end`` pair, not the ``torch.cuda.graph`` context, which synchronises the
        device, runs the garbage collector and empties the allocator's cache on entry."""
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            graph.capture_begin()
            try:
                out = evaluate()
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:
                    pass  # the capture was invalidated by the error raised above
                raise
            graph.capture_end()
        current.wait_stream(self.stream)
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()


@contextlib.contextmanager
def eager_evaluations() -> Iterator[None]:
    """While open, engine calls that start evaluate eagerly (:data:`CUDA_GRAPHS` off, restored on every way
    out): for what must see every operator, such as a count of the arithmetic (a replay dispatches none)."""
    module = sys.modules[__name__]
    saved = module.CUDA_GRAPHS
    module.CUDA_GRAPHS = False
    try:
        yield
    finally:
        module.CUDA_GRAPHS = saved


class IterationGraphs:
    """The evaluations of one engine call: eager, or captured and replayed per configuration (see the module
    docstring). ``backend`` is the device's form (:class:`CudaGraphs`), or None for eager evaluations."""

    def __init__(self, backend: Any | None) -> None:
        self.backend = backend
        self.key: Hashable | None = None
        self.graph: Any = None
        self.outputs: Any = None
        self.warmed = False
        self.captures = 0
        self.replays = 0

    @classmethod
    def for_device(cls, device: torch.device, *, random: bool) -> IterationGraphs:
        """Captures for a CUDA device and an evaluation without random draws while :data:`CUDA_GRAPHS`, else eager."""
        use = CUDA_GRAPHS and torch.device(device).type == "cuda" and not random
        return cls(CudaGraphs(torch.device(device)) if use else None)

    def run(self, key: Hashable, evaluate: Callable[[], Any], remaining: int) -> Any:
        """``evaluate()``'s outputs for the configuration ``key``, expected to last ``remaining`` more
        iterations including this one."""
        if self.backend is None:
            return evaluate()
        if key != self.key:  # a new configuration: drop the old graph (its memory pool goes with it)
            self.key, self.graph, self.outputs, self.warmed = key, None, None, False
            if remaining < MIN_ITERATIONS:
                return evaluate()
            self.warmed = True
            return self.backend.warm_up(evaluate)
        if self.graph is None:
            if not self.warmed:
                return evaluate()
            try:
                self.graph, self.outputs = self.backend.capture(evaluate)
            except RuntimeError as e:
                warnings.warn(f"the attack engine could not capture an iteration as a CUDA graph ({e}); "
                              "this engine call goes on eagerly", RuntimeWarning, stacklevel=3)
                self.backend, self.graph, self.outputs = None, None, None
                return evaluate()
            self.captures += 1
        self.backend.replay(self.graph)
        self.replays += 1
        return self.outputs

    def close(self) -> None:
        self.key, self.graph, self.outputs = None, None, None


__all__ = ["CUDA_GRAPHS", "MIN_ITERATIONS", "CudaGraphs", "IterationGraphs", "eager_evaluations"]

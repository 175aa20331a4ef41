"""The engine's evaluations captured as CUDA graphs and replayed (:mod:`leakgym.attacks.engine.replay`).

A replay reruns the captured kernels on the tensors they were captured with and overwrites the captured
outputs in place. On any device, :class:`Recomputing` stands in for the CUDA form with that contract: a
capture evaluates once and poisons its outputs (they hold values only after a replay), and a replay
evaluates again and writes the values into the captured outputs. The engine must then compute exactly what
it computes eagerly: a stale output, a graph kept across a change of the working rows or a consumer holding a
graph's output across iterations changes the numbers. On a GPU the real graphs are checked against the eager
engine (``cuda`` tests).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from torch.utils._pytree import tree_leaves

from leakgym.attacks import build_attack
from leakgym.attacks.engine import (
    reconstruct_jointly,
    replay,
    run_joint_matching,
)
from leakgym.attacks.engine.replay import IterationGraphs
from leakgym.optim.randomness import BatchedGenerator


class Recomputing:
    """A CUDA graph's contract on any device (see the module docstring)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.warm_ups = 0

    def warm_up(self, evaluate):
        self.warm_ups += 1
        return evaluate()

    def capture(self, evaluate):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        out = evaluate()
        with torch.no_grad():
            for t in tree_leaves(out):
                t.fill_(math.nan)
        return (evaluate, out), out

    def replay(self, graph):
        evaluate, out = graph
        new = evaluate()
        with torch.no_grad():
            for kept, value in zip(tree_leaves(out), tree_leaves(new), strict=True):
                kept.copy_(value)


@pytest.fixture
def recorded(monkeypatch):
    """The engine calls' IterationGraphs, each with a :class:`Recomputing` backend (``make(fail)``)."""
    made = []

    def install(fail: bool = False):
        def for_device(device, *, random):
            graphs = IterationGraphs(None if random else Recomputing(fail))
            made.append(graphs)
            return graphs
        monkeypatch.setattr(IterationGraphs, "for_device", staticmethod(for_device))
        monkeypatch.setattr(replay, "MIN_ITERATIONS", 3)
        return made
    return install


def _parts(digits, counts):
    """Inverting Gradients-like (Adam, cosine, TV, decay, budgets 6/16), GradInversion-like (Adam, L2, l2
    prior, group consistency, 2 restarts, budget 10) and DLG (L-BFGS, soft labels, budget 24). The first two
    share one Adam run. The working rows change after 6, 10 and 16 iterations; at iteration 16 the Adam run
    is evaluated without stepping while the DLG run after it steps on (the same rows, other gradients)."""
    from engine_problems import three_parts

    return three_parts(digits, counts, ig_budgets=(6, 16), gi_budget=10, dlg_budget=24)


def _same(got, expected):
    for a, b in zip(got, expected, strict=True):
        for name in ("images", "matching_loss", "total_loss", "history", "best_restart"):
            x, y = getattr(a, name), getattr(b, name)
            assert torch.equal(torch.nan_to_num(x, nan=-7.0), torch.nan_to_num(y, nan=-7.0)), name
        assert (a.soft_labels is None) == (b.soft_labels is None)
        if a.soft_labels is not None:
            assert torch.equal(a.soft_labels, b.soft_labels)
        assert a.budgets == b.budgets


def _run(digits, problems):
    counts = [2, 1, 2]
    return run_joint_matching(problems, _parts(digits, counts),
                              generator=BatchedGenerator.from_seeds([10, 11, 12, 13, 14], "cpu"))


def test_replayed_evaluations_compute_what_the_eager_engine_computes(digits, recorded):
    from engine_problems import single_image_problems

    ps, _, _ = single_image_problems(digits, 5)
    eager = _run(digits, ps)
    made = recorded()
    replayed = _run(digits, ps)
    _same(replayed, eager)
    (graphs,) = made
    # every configuration of at least MIN_ITERATIONS was warmed up, captured and replayed
    assert graphs.backend.warm_ups >= 3 and graphs.captures >= 3 and graphs.replays >= 10
    assert graphs.graph is None and graphs.outputs is None  # closed with the engine call


def test_a_configuration_too_short_to_pay_off_is_not_captured(digits, recorded, monkeypatch):
    from engine_problems import single_image_problems

    ps, _, _ = single_image_problems(digits, 5)
    made = recorded()
    monkeypatch.setattr(replay, "MIN_ITERATIONS", 100)
    eager_like = _run(digits, ps)
    assert made[0].captures == made[0].replays == made[0].backend.warm_ups == 0
    monkeypatch.setattr(replay, "CUDA_GRAPHS", False)
    _same(eager_like, _run(digits, ps))


def test_a_failed_capture_goes_on_eagerly_with_a_warning(digits, recorded):
    from engine_problems import single_image_problems

    ps, _, _ = single_image_problems(digits, 5)
    eager = _run(digits, ps)
    made = recorded(fail=True)
    with pytest.warns(RuntimeWarning, match="could not capture an iteration as a CUDA graph.*capturing"):
        got = _run(digits, ps)
    _same(got, eager)
    assert made[0].captures == 0 and made[0].backend is None


#: one Adam run (Inverting Gradients, prior-init, GradInversion) and one L-BFGS run (DLG): at MIN_ITERATIONS = 3
#: iterations 0-16 (replays at 1-16) and 21-23 (replays at 22-23) are captured; the configurations between are
#: too short, and at 24 the Adam run evaluates without stepping
SETTINGS = [("inverting-gradients", {"iterations": 24, "tv": 1e-4}), ("dlg", {"iterations": 20}),
            ("prior-init", {"iterations": 16, "restarts": 2}), ("gradinversion", {"iterations": 18}),
            ("inverting-gradients", {"iterations": 24, "restarts": 2})]


@pytest.fixture(scope="module")
def victims(digit_victims):
    return digit_victims(len(SETTINGS), known=lambda i: i % 2 == 1)


def test_attacks_of_one_call_reconstruct_the_same_with_replays(victims, recorded):
    """The attacks' own entry point: labels inferred or optimised, restarts, the game's strategies."""
    attacks = [build_attack(name, **options) for name, options in SETTINGS]
    updates, knowledges = [v[0] for v in victims], [v[1] for v in victims]
    eager = reconstruct_jointly(attacks, updates, knowledges, seeds=list(range(len(SETTINGS))))
    made = recorded()
    got = reconstruct_jointly(attacks, updates, knowledges, seeds=list(range(len(SETTINGS))))
    assert made[0].captures == 2 and made[0].replays == 16 + 2
    for a, b in zip(got, eager):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        assert a.history == b.history and a.final_loss == b.final_loss


def test_only_a_cuda_device_captures():
    assert IterationGraphs.for_device(torch.device("cpu"), random=False).backend is None
    graphs = IterationGraphs(None)
    assert graphs.run("k", lambda: 3, remaining=1000) == 3 and graphs.captures == 0


@pytest.mark.cuda
def test_cuda_graphs_compute_what_the_eager_engine_computes(victims, cuda_device, monkeypatch):
    """The real graphs on a GPU against the eager engine on the same GPU. No capture may fail (its warning is
    an error here)."""
    attacks = [build_attack(name, **options) for name, options in SETTINGS]
    moved = [(u.to(cuda_device), dataclasses.replace(k, model=copy.deepcopy(k.model).to(cuda_device)))
             for u, k in victims]
    updates, knowledges = [m[0] for m in moved], [m[1] for m in moved]
    seeds = list(range(len(SETTINGS)))
    monkeypatch.setattr(replay, "MIN_ITERATIONS", 3)
    made = []
    real = IterationGraphs.for_device

    def counting(device, *, random):
        graphs = real(device, random=random)
        made.append(graphs)
        return graphs
    monkeypatch.setattr(IterationGraphs, "for_device", staticmethod(counting))
    monkeypatch.setattr(replay, "CUDA_GRAPHS", False)
    eager = reconstruct_jointly(attacks, updates, knowledges, seeds=seeds)
    monkeypatch.setattr(replay, "CUDA_GRAPHS", True)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        graphed = reconstruct_jointly(attacks, updates, knowledges, seeds=seeds)
    assert made[0].backend is None and made[-1].captures == 2 and made[-1].replays == 16 + 2
    for i, (a, b) in enumerate(zip(graphed, eager)):
        # The same kernels on the same inputs; CUDA's atomics-based backward kernels can round differently
        # from run to run, and signed Adam steps can turn that into a step of lr on a pixel: the tolerance of
        # the engine's other GPU comparisons. A stale or misplaced replay differs by far more.
        torch.testing.assert_close(a.images, b.images, rtol=1e-2, atol=1e-2, msg=f"problem {i} ({SETTINGS[i][0]})")
        assert torch.equal(a.labels.cpu(), b.labels.cpu()) and len(a.history) == len(b.history)


def test_a_count_of_the_arithmetic_sees_every_operator():
    """A replay dispatches no operator: the bench's arithmetic floor counts an eager step (graphs back after)."""
    from leakgym.bench.arithmetic import count_matrix_flops

    assert replay.CUDA_GRAPHS
    with pytest.raises(KeyError), count_matrix_flops():
        assert replay.CUDA_GRAPHS is False
        raise KeyError("out")
    assert replay.CUDA_GRAPHS is True

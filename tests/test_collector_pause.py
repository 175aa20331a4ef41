"""A round runs with Python's cyclic garbage collector paused (:func:`leakgym.game.round.collector_paused`):
the pause is undone on every way out, and a round leaves no reference cycles behind it for the
collector to find later."""

from __future__ import annotations

import gc

import gymnasium as gym
import numpy as np
import pytest
import torch

import leakgym  # noqa: F401  (registers the ids)
from leakgym.envs import RoundError
from leakgym.game import round as round_module
from leakgym.game.round import collector_paused

MENU = {"strategies": ["inverting-gradients", "dlg", "prior-init", "gradinversion"], "iterations": [2, 3],
        "restarts": [1, 2]}


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_pause_ends_on_every_way_out(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("a failing round")
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # a collector the caller had turned off stays off


def test_overlapping_pauses_end_when_the_last_one_leaves(collector_on):
    first, second = collector_paused(), collector_paused()  # two threads' rounds, say
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first round ends while the second still runs
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def _round_garbage(env, actions) -> list:
    """The unreachable objects left by one step of ``env``: collected with the collector off during the
    step (as a round pauses it), found by one collection after it."""
    gc.collect()
    gc.disable()
    try:
        env.step(actions)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        gc.collect()


CYCLE_CASES = [("attacker", True, "lenet"), ("attacker", False, "lenet"), ("defender", True, "lenet"),
               ("attacker", True, "convnet")]


@pytest.mark.parametrize("role, batch_clients, model", CYCLE_CASES)
def test_a_round_leaves_no_reference_cycles(cheap_overrides, collector_on, role, batch_clients, model):
    _check_no_cycles(cheap_overrides, role, batch_clients, model, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("role, batch_clients, model", CYCLE_CASES)
def test_a_round_on_cuda_leaves_no_reference_cycles(cheap_overrides, collector_on, role, batch_clients, model):
    """The device paths differ (vectorised evaluation, no CPU grouped forms): the same check on a GPU."""
    _check_no_cycles(cheap_overrides, role, batch_clients, model, "cuda")


def _check_no_cycles(cheap_overrides, role, batch_clients, model, device):
    overrides = dict(cheap_overrides, **MENU, model=model) if role == "attacker" else dict(cheap_overrides, model=model)
    env = gym.make_vec("LeakGym-Digits-v0", num_envs=3, role=role, opponent="random", batch_clients=batch_clients,
                       device=device, **overrides)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    nvec = env.single_action_space.nvec
    for _ in range(2):
        garbage = _round_garbage(env, rng.integers(0, nvec, size=(3, len(nvec))))
        # torch.func's vmap/grad leave small cycles of their own pytree helpers; anything of the round's,
        # or any tensor, would wait in memory for the next collection after the round
        ours = [type(o).__qualname__ for o in garbage
                if isinstance(o, torch.Tensor) or type(o).__module__.split(".")[0] in ("leakgym", "envs", "agents")]
        assert ours == []
    env.close()


def test_a_step_leaves_the_collector_on_also_when_it_fails(cheap_overrides, collector_on, monkeypatch):
    env = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none", **cheap_overrides)
    env.reset(seed=0)
    zeros = np.zeros((2, len(env.single_action_space.nvec)), np.int64)
    env.step(zeros)
    assert gc.isenabled()
    with pytest.raises(ValueError):
        env.step(np.full_like(zeros, 99))
    assert gc.isenabled()

    def fails(*args, **kwargs):
        assert not gc.isenabled()  # the phases do run paused
        raise RuntimeError("scoring on fire")

    monkeypatch.setattr(round_module, "score", fails)
    with pytest.raises(RoundError, match="scoring on fire"):
        env.step(zeros)
    assert gc.isenabled()
    env.close()

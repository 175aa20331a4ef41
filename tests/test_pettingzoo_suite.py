"""PettingZoo's own test suite on the versioned module ``leakgym.envs.leakgym_v0``, in full."""

import functools
import types

import numpy as np
import pytest
from pettingzoo.test import (
    api_test,
    max_cycles_test,
    parallel_api_test,
    parallel_seed_test,
    render_test,
    seed_test,
)

from leakgym.envs import leakgym_v0


@pytest.fixture
def cheap_module(cheap_overrides, tmp_path):
    """``leakgym_v0`` with cheap scenario overrides (and a temporary png folder) bound; the episode length
    as PettingZoo's ``max_cycles`` (which its max_cycles test passes again: one of the two is refused)."""
    bound = dict(cheap_overrides, render_dir=tmp_path / "renders")
    bound["max_cycles"] = bound.pop("rounds")
    return types.SimpleNamespace(
        env=functools.partial(leakgym_v0.env, **bound),
        parallel_env=functools.partial(leakgym_v0.parallel_env, **bound),
        raw_env=functools.partial(leakgym_v0.raw_env, **bound),
    )


def test_metadata_name_is_the_module():
    assert leakgym_v0.parallel_env().metadata["name"] == "leakgym_v0" == leakgym_v0.__name__.rsplit(".", 1)[1]


@pytest.mark.parametrize("flat", [False, True])
def test_api(cheap_module, flat):
    api_test(cheap_module.env(flat_actions=flat), num_cycles=4)
    parallel_api_test(cheap_module.parallel_env(flat_actions=flat), num_cycles=4)


def test_seeds(cheap_module):
    seed_test(cheap_module.env, num_cycles=3)
    parallel_seed_test(cheap_module.parallel_env, num_cycles=3)


def test_max_cycles(cheap_module):
    max_cycles_test(cheap_module)


def test_render(cheap_module):
    render_test(cheap_module.env)


def test_rgb_frames_have_one_size_whatever_the_round_and_batch(cheap_overrides):
    sizes = set()
    for batch_size in (1, 4):
        e = leakgym_v0.parallel_env(render_mode="rgb_array", **dict(cheap_overrides, batch_size=batch_size))
        e.reset(seed=0)
        sizes.add(e.render().shape)
        for _ in range(2):
            e.step({a: e.action_space(a).sample() for a in e.agents})
            sizes.add(e.render().shape)
    assert len(sizes) == 1


def test_state_space_holds_the_state(cheap_module):
    e = cheap_module.parallel_env()
    e.reset(seed=0)
    assert e.state_space.contains(e.state())
    e.step({a: e.action_space(a).sample() for a in e.agents})
    assert e.state_space.contains(e.state())


def test_flat_actions_decode_to_the_multidiscrete_ones(cheap_module):
    flat = cheap_module.parallel_env(flat_actions=True)
    multi = cheap_module.parallel_env()
    for e in (flat, multi):
        e.reset(seed=4)
    nvec = {a: multi.action_space(a).nvec for a in multi.agents}
    actions = {a: np.array([n - 1 for n in nvec[a]]) for a in multi.agents}
    flat_actions = {a: int(np.ravel_multi_index(tuple(actions[a]), tuple(nvec[a]))) for a in actions}
    assert flat.action_space("attacker").n == int(np.prod(nvec["attacker"]))
    out_flat, out_multi = flat.step(flat_actions), multi.step(actions)
    for a in ("attacker", "defender"):
        np.testing.assert_array_equal(out_flat[0][a], out_multi[0][a])
        assert out_flat[1][a] == out_multi[1][a]
    with pytest.raises(ValueError, match=r"attacker flat action .*allowed range 0\.\."):
        flat.step({"attacker": flat.action_space("attacker").n, "defender": 0})

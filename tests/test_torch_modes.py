"""The caller's torch modes (no_grad, inference_mode, a float64 default dtype, a default device) change nothing a game or
the library computes, and are the caller's again afterwards (leakgym.devices)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from leakgym.attacks import AttackerKnowledge, InvertingGradients
from leakgym.data import dataset_spec
from leakgym.defenses import DefenseConfig, apply_defense
from leakgym.devices import library_modes
from leakgym.envs import parallel_env
from leakgym.fl import batched as fl_batched
from leakgym.fl.client import compute_update
from leakgym.fl.rounds import aggregate_round
from leakgym.models import build_model

SPEC = dataset_spec("digits", image_size=16)
ACTIONS = [{"defender": np.array([1, 2, 1, 0, 1, 0]), "attacker": np.array([0, 1, 0, 1])},
           {"defender": np.array([0, 0, 0, 0, 0, 0]), "attacker": np.array([1, 0, 0, 0])}]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


CALLER_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                "float64": lambda: default_dtype(torch.float64), "default_device": lambda: torch.device("meta")}


def _play(overrides, mode=contextlib.nullcontext) -> list:
    """Build, reset and play two rounds under ``mode``; what the env returned."""
    out = []
    with mode():
        env = parallel_env("digits", **overrides)
        out.append(env.reset(seed=3))
        for actions in ACTIONS:
            out.append(env.step(actions))
    return out


def _numbers(value):
    """The numbers in an env's return value, flattened (dicts by key, arrays and scalars as they are)."""
    if isinstance(value, dict):
        return [x for k in sorted(value, key=str) for x in [k, *_numbers(value[k])]]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, np.ndarray):
        return [value.dtype.str, *value.ravel().tolist()]
    return [value]


@pytest.mark.parametrize("mode", sorted(CALLER_MODES))
def test_a_game_plays_the_same_trajectory_whatever_the_callers_torch_modes(mode, cheap_overrides):
    """Under no_grad and inference_mode a round failed ('element 0 of tensors does not require grad'); under a
    float64 default dtype the env could not be built (float input against double bias)."""
    reference = _play(cheap_overrides)
    grad, dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    with CALLER_MODES[mode]():
        inside = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype())
        got = _play(cheap_overrides)
        assert (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype()) == inside
    assert (torch.is_grad_enabled(), torch.get_default_dtype()) == (grad, dtype)
    assert _numbers(got) == _numbers(reference)


def test_the_library_entry_points_compute_the_same_under_the_callers_modes():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1, 1, 16, 16, generator=g), torch.tensor([3])
    public_x, public_y = torch.rand(4, 1, 16, 16, generator=g), torch.tensor([0, 1, 2, 3])
    model = build_model("lenet", SPEC, seed=0)
    attack = InvertingGradients(InvertingGradients.Config(iterations=3, restarts=1))

    models = [model, build_model("lenet", SPEC, seed=1)]
    params, xs, ys = fl_batched.stack_parameters(models), torch.randn(2, 1, 3, 1, 16, 16, generator=g), torch.tensor([[[1, 2, 3]]] * 2)

    def run():
        update = compute_update(model, x, y)
        benign = fl_batched.benign_updates(model, params, xs, ys)
        clients = fl_batched.client_updates(models, [x, x], [y, y])
        victims = [compute_update(m, x, y) for m in models]
        kept = aggregate_round(model, params, None, victims, xs, ys, kind="gradient", local_steps=1, local_lr=0.1,
                               server_lr=0.1).kept
        defended, _ = apply_defense(model, x, y, DefenseConfig(noise_sigma=0.01, dcs2_lambda_g=0.5, dcs2_steps=2),
                                    seed=1, public_x=public_x, public_y=public_y)
        result = attack.reconstruct(defended, AttackerKnowledge(model=model, spec=SPEC, batch_size=1), seed=2)
        return [update.tensors, defended.tensors, result.images, benign.tensors, clients[0].tensors, params, kept]

    reference = run()
    for name, mode in CALLER_MODES.items():
        with mode():
            got = run()
            built = build_model("lenet", SPEC, seed=0)
        # float32 parameters that train; on the caller's default device, as torch's modules are built
        assert all(p.dtype == torch.float32 and not p.is_inference() for p in built.parameters())
        assert {p.device.type for p in built.parameters()} == {"meta" if name == "default_device" else "cpu"}
        for want, have in zip(reference, got):
            if isinstance(want, dict):
                assert all(torch.equal(want[k], have[k]) for k in want)
            else:
                assert want == have if isinstance(want, list) else torch.equal(want, have)


def test_library_modes_give_the_callers_modes_back_on_an_exception():
    with torch.no_grad(), default_dtype(torch.float64), torch.device("meta"):
        with pytest.raises(KeyError), library_modes():
            assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
            assert torch.empty(0).device.type == "cpu"
            raise KeyError("x")
        assert not torch.is_grad_enabled() and torch.get_default_dtype() == torch.float64
        assert torch.empty(0).device.type == "meta"


def test_inputs_made_under_inference_mode_are_taken_as_normal_tensors():
    """torch refuses to save an inference tensor for backward: a client's batch made under inference_mode
    failed compute_update and apply_defense, inside the mode or after it."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 1, 16, 16, generator=g), torch.tensor([3, 1])
    model = build_model("lenet", SPEC, seed=0)
    with torch.inference_mode():
        xi, yi = x.clone(), y.clone()
    assert xi.is_inference()
    for mode in (contextlib.nullcontext, torch.inference_mode):
        with mode():
            update = compute_update(model, xi, yi)
            defended, _ = apply_defense(model, xi, y=yi, config=DefenseConfig(noise_sigma=0.01), seed=1)
        assert all(torch.equal(update.tensors[k], v) for k, v in compute_update(model, x, y).tensors.items())
        want, _ = apply_defense(model, x, y, DefenseConfig(noise_sigma=0.01), seed=1)
        assert all(torch.equal(defended.tensors[k], v) for k, v in want.tensors.items())


@pytest.mark.parametrize("mode", ["no_grad", "float64", "default_device"])
def test_the_reproduction_harness_computes_the_same_under_the_callers_modes(mode):
    """Under a float64 default dtype the joint attack engine (reconstruct_all) drew float64 starting images and
    the grid's numbers changed silently; under no_grad it failed; under a default device the victims' indices
    were drawn there."""
    from leakgym.data import federated_split, load_dataset
    from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, measure_utility, run_grid

    scale = Scale(images=1, iterations=3, utility_rounds=2, utility_eval_every=1)
    split = federated_split(load_dataset("digits", image_size=16), num_clients=4, seed=0)

    def run():
        cells = run_grid([DefenseRow("none")], [AttackColumn("ig", "inverting-gradients")], scale, split=split,
                         progress=False, lpips=False)
        utility = measure_utility(DefenseRow("none"), scale, split=split, progress=False)
        return cells[("none", "ig")].per_image, {k: v for k, v in utility.items() if k != "wall_s"}

    reference = run()
    with CALLER_MODES[mode]():
        got = run()
    assert got == reference


def test_datasets_load_the_same_under_a_default_device():
    """load_digits_split drew its shuffles on the default device (meta: indices out of bounds)."""
    from leakgym.data import load_dataset

    want = load_dataset("digits", image_size=16)
    with torch.device("meta"):
        got = load_dataset("digits", image_size=16)
    assert torch.equal(got.train_x, want.train_x) and torch.equal(got.test_y, want.test_y)


def test_a_malicious_servers_model_is_prepared_the_same_under_the_callers_modes():
    """Subclasses' prepare_model run in the library's modes too (imprint's under a default device failed)."""
    from leakgym.attacks import build_attack

    model = build_model("lenet", SPEC, seed=0)
    public = torch.rand(16, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    attack = build_attack("imprint")
    want = attack.prepare_model(model, SPEC, public_x=public).state_dict()
    for mode in CALLER_MODES.values():
        with mode():
            got = attack.prepare_model(model, SPEC, public_x=public).state_dict()
        assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_paper_reproduction_gives_the_callers_thread_count_back(tmp_path):
    """run_paper computes on one torch thread (its results say so) and used to leave the caller on one."""
    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.runner import run_paper

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_paper(paper_spec("dcs2"), seeds=(0,), images=1, out=None, utility=False, progress=False,
                  scale_overrides={"iterations": 2, "eval_size": 50})
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_a_game_copied_under_inference_mode_plays_like_the_original_and_unpickling_there_is_refused(cheap_overrides):
    """The copy's bank held inference tensors: its first round failed, and the restore after it too."""
    import copy
    import pickle

    env = parallel_env("digits", **cheap_overrides)
    env.reset(seed=3)
    blob = pickle.dumps(env)
    with torch.inference_mode():
        twin = copy.deepcopy(env)
        with pytest.raises(ValueError, match="unpickled under torch.inference_mode"):
            pickle.loads(blob)
    assert _numbers(twin.step(ACTIONS[0])) == _numbers(env.step(ACTIONS[0]))


def test_n_games_updates_take_stacks_and_jobs_made_under_inference_mode():
    """Inference tensors inside a dict (the stacked parameters) or a dataclass (a LocalTraining job) were passed
    as they were: 'Setting requires_grad=True on inference tensor', 'cannot be saved for backward'."""
    from leakgym.fl.client import LocalTraining, compute_updates

    models = [build_model("lenet", SPEC, seed=s) for s in range(2)]
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(2, 1, 3, 1, 16, 16, generator=g), torch.tensor([[[1, 2, 3]]] * 2)

    def run():
        params = fl_batched.stack_parameters(models)
        benign = fl_batched.benign_updates(models[0], params, xs, ys)
        kept = aggregate_round(models[0], params, None, [compute_update(m, xs[i, 0], ys[i, 0]) for i, m in
                                                         enumerate(models)], xs, ys, kind="gradient", local_steps=1,
                               local_lr=0.1, server_lr=0.1).state
        jobs = compute_updates([LocalTraining(models[0], xs[0, 0].clone(), ys[0, 0].clone())])
        return [benign.tensors, kept, jobs[0].tensors]

    want = run()
    with torch.inference_mode():
        got = run()
    for a, b in zip(want, got):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_model_is_built_on_the_cpu_from_its_seed_and_moved_whatever_the_default_device():
    """Under a meta default device an explicit device='cpu' failed ('Cannot copy out of meta tensor')."""
    want = build_model("lenet", SPEC, seed=0).state_dict()
    with torch.device("meta"):
        got = build_model("lenet", SPEC, seed=0, device="cpu").state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.cuda
def test_a_seeded_model_is_the_same_under_a_cuda_default_device():
    """Built on the default CUDA device, the seed (which seeds the CPU generator) had no effect, and the
    caller's CUDA generator moved."""
    want = build_model("lenet", SPEC, seed=0).state_dict()
    state = torch.cuda.get_rng_state()
    with torch.device("cuda"):
        got = build_model("lenet", SPEC, seed=0).state_dict()
    assert torch.equal(torch.cuda.get_rng_state(), state)
    assert all(got[k].device.type == "cuda" and torch.equal(got[k].cpu(), want[k]) for k in want)

"""FedAvg's local optimiser (leakgym.fl.optim): SGD with momentum / weight decay and Adam, the same in the
plain client (torch.optim on a copy), the stacked cohort (torch.optim on stacked parameters), the vmapped
and the row-wise batched clients (the hand-written elementwise step); the default is the old plain SGD
bit for bit; the scenario's fields are validated and reach every client of a game."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_batched_fl import never_alone

from leakgym.data import dataset_spec
from leakgym.fl import batched
from leakgym.fl.client import LocalTraining, compute_update, compute_updates
from leakgym.fl.optim import PLAIN_SGD, LocalOptimizer, scheduled_lr
from leakgym.models import build_model

SPEC = dataset_spec("digits", image_size=16)
OPTIMIZERS = {
    "sgd-momentum-wd": LocalOptimizer("sgd", momentum=0.9, weight_decay=5e-3),
    "adam": LocalOptimizer("adam"),
    "adam-wd": LocalOptimizer("adam", weight_decay=1e-2),
}


def _batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_functional_step_is_torch_optims_on_stacked_tensors(name):
    """LocalOptimizer.step over 5 steps (float64, stacked (3, 4, 5) tensors: three clients) equals
    torch.optim.SGD / torch.optim.Adam stepping the same tensors with the same gradients."""
    opt = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(1)
    params = {"w": torch.randn(3, 4, 5, dtype=torch.float64, generator=g),
              "b": torch.randn(3, 5, dtype=torch.float64, generator=g)}
    grads = [{n: torch.randn(p.shape, dtype=torch.float64, generator=g) for n, p in params.items()} for _ in range(5)]
    leaves = {n: p.clone() for n, p in params.items()}
    reference = opt.torch_optimizer(list(leaves.values()), lr=0.01)
    current, state = params, opt.init(params)
    for t, grad in enumerate(grads):
        for n, leaf in leaves.items():
            leaf.grad = grad[n].clone()
        reference.step()
        current, state = opt.step(current, grad, state, 0.01, t + 1)
    for n, start in params.items():
        torch.testing.assert_close(current[n], leaves[n], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(current[n], start)


def test_adams_first_step_moves_every_weight_by_the_learning_rate():
    """An independent check of the Adam path: its first step is ``lr * g / (|g| + eps)``, i.e. ``lr`` times the
    gradient's sign wherever the gradient is not tiny -- whatever the gradient's size (SGD would move by
    ``lr * g``)."""
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(4)
    upd = compute_update(model, x, y, kind="model_delta", local_steps=1, local_lr=1e-3, optimizer=LocalOptimizer("adam"))
    grad = compute_update(model, x, y)
    for n, delta in upd.tensors.items():
        big = grad.tensors[n].abs() > 1e-4
        torch.testing.assert_close(delta[big], 1e-3 * grad.tensors[n][big].sign(), rtol=1e-3, atol=1e-9)
    assert upd.metadata["local_optimizer"] == "adam" and upd.local_lr == 1e-3


@pytest.mark.parametrize("vectorise", [None, True, False])  # the form by batch and device, vmap, the loop
@pytest.mark.parametrize("b", [1, 4])  # 1: the row-wise clients; 4: the grouped ones (on a CPU)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_batched_clients_take_the_plain_clients_optimiser_steps(digits, name, b, vectorise):
    """benign_updates (the row-wise LeNet rows for a batch of one, else the grouped ones on a CPU; vmapped with
    vectorise=True, one client after another with False) and client_updates equal
    compute_update (torch.optim on the client's copy) for each client, after 3 local steps. In float64: Adam
    divides by the root of the squared gradient, which turns float32 rounding of a near-zero gradient entry
    into a step of up to lr (measured: 2e-6 on one entry of 3,600 in float32)."""
    opt = OPTIMIZERS[name]
    spec = digits.spec
    models = [build_model("lenet", spec, seed=s).double() for s in range(2)]
    x = spec.normalize(digits.train_x[: 2 * 2 * b]).reshape(2, 2, b, *spec.shape).double()
    y = digits.train_y[: 2 * 2 * b].reshape(2, 2, b)
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind="model_delta", local_steps=3,
                                 local_lr=0.01, optimizer=opt, vectorise=vectorise)
    plain = compute_update(models[0], x[0, 0], y[0, 0], kind="model_delta", local_steps=3, local_lr=0.01)
    for n in range(2):
        for k in range(2):
            ref = compute_update(models[n], x[n, k], y[n, k], kind="model_delta", local_steps=3, local_lr=0.01,
                                 optimizer=opt)
            for name_, t in ref.tensors.items():
                torch.testing.assert_close(out.tensors[name_][n, k], t, rtol=1e-9, atol=1e-11)
    # the optimiser is used: the update differs from plain SGD's
    assert any(not torch.allclose(out.tensors[k][0, 0], t, atol=1e-6) for k, t in plain.tensors.items())
    each = batched.client_updates(models, [x[0, 0], x[1, 0]], [y[0, 0], y[1, 0]], kind="model_delta", local_steps=3,
                                  local_lr=0.01, optimizer=opt)
    for n, upd in enumerate(each):
        assert upd.metadata["local_optimizer"] == opt.describe()
        for name_, t in upd.tensors.items():
            torch.testing.assert_close(t, out.tensors[name_][n, 0], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_stacked_cohort_takes_the_optimisers_steps_of_each_client_alone(name):
    """compute_updates(batched=True): the cohort's torch.optim on stacked parameters equals each client's own
    torch.optim on its copy (float64, as above); clients of another optimiser do not join the cohort."""
    opt = OPTIMIZERS[name]
    jobs = []
    for s in range(3):
        x, y = _batch(2, seed=s)
        jobs.append(LocalTraining(build_model("lenet", SPEC, seed=s).double(), x.double(), y, kind="model_delta", local_steps=3,
                                  local_lr=0.01, optimizer=opt))
    jobs.append(dataclasses.replace(jobs[0], optimizer=None))  # plain SGD: its own cohort (a lone client)
    alone = compute_updates(jobs, batched=False)
    together = compute_updates(jobs, batched=True)
    for a, b in zip(together, alone):
        assert a.metadata == b.metadata
        for n, t in b.tensors.items():
            torch.testing.assert_close(a.tensors[n], t, rtol=1e-9, atol=1e-11)
    assert not torch.allclose(alone[0].flat(), alone[3].flat())


def test_the_default_optimiser_is_the_old_plain_sgd_bit_for_bit(digits):
    """optimizer=None, PLAIN_SGD and LocalOptimizer() give identical bits on every path, and no metadata mark."""
    model = build_model("lenet", SPEC, seed=3)
    x, y = _batch(3, seed=3)
    runs = [compute_update(model, x, y, kind="model_delta", local_steps=3, local_lr=0.05, optimizer=o)
            for o in (None, PLAIN_SGD, LocalOptimizer("sgd", momentum=0.0))]
    for other in runs[1:]:
        assert other.metadata == {} and all(torch.equal(other.tensors[n], t) for n, t in runs[0].tensors.items())
    spec = digits.spec
    models = [build_model("lenet", spec, seed=s) for s in range(2)]
    xb = spec.normalize(digits.train_x[:8]).reshape(2, 1, 4, *spec.shape)
    yb = digits.train_y[:8].reshape(2, 1, 4)
    a, b = (batched.benign_updates(models[0], batched.stack_parameters(models), xb, yb, kind="model_delta",
                                   local_steps=2, local_lr=0.05, optimizer=o) for o in (None, LocalOptimizer()))
    assert all(torch.equal(a.tensors[n], t) for n, t in b.tensors.items())


def test_sgd_momentum_and_weight_decay_follow_their_formulas():
    """Two local steps of SGD with momentum mu and weight decay wd, written out by hand from the gradients of
    the plain client: b1 = g1 + wd w0, w1 = w0 - lr b1; b2 = mu b1 + g2 + wd w1, w2 = w1 - lr b2."""
    from leakgym.models import task_loss

    model = build_model("lenet", SPEC, seed=2)
    x, y = _batch(3, seed=2)
    mu, wd, lr = 0.9, 0.01, 0.05
    upd = compute_update(model, x, y, kind="model_delta", local_steps=2, local_lr=lr,
                         optimizer=LocalOptimizer("sgd", momentum=mu, weight_decay=wd))
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}

    def grad(w):
        leaves = {n: t.clone().requires_grad_(True) for n, t in w.items()}
        gs = torch.autograd.grad(task_loss(model, x, y, params=leaves), list(leaves.values()))
        return dict(zip(leaves, gs))

    g1 = grad(w0)
    b1 = {n: g1[n] + wd * w0[n] for n in w0}
    w1 = {n: w0[n] - lr * b1[n] for n in w0}
    g2 = grad(w1)
    b2 = {n: mu * b1[n] + g2[n] + wd * w1[n] for n in w0}
    w2 = {n: w1[n] - lr * b2[n] for n in w0}
    for n, start in w0.items():
        torch.testing.assert_close(upd.tensors[n], start - w2[n], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"name": "rmsprop"}, r"local_optimizer='rmsprop'; allowed: sgd, adam"),
    ({"momentum": 1.0}, r"local_momentum=1.0; allowed range \[0, 1\)"),
    ({"momentum": -0.1}, r"local_momentum=-0.1"),
    ({"weight_decay": math.nan}, r"local_weight_decay=nan"),
    ({"name": "adam", "momentum": 0.9}, r"local_momentum=0.9 with local_optimizer='adam'"),
    ({"name": "adam", "betas": (0.9, 1.0)}, r"betas\[1\]=1.0"),
    ({"name": "adam", "eps": 0.0}, r"eps=0.0"),
])
def test_bad_optimiser_settings_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalOptimizer(**kwargs)


def test_an_optimiser_needs_fedavg_and_is_checked_before_training():
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(2)
    with pytest.raises(ValueError, match=r"optimizer='adam' with kind='gradient'"):
        compute_update(model, x, y, optimizer=LocalOptimizer("adam"))
    with pytest.raises(ValueError, match=r"optimizer='adam' with kind='gradient'"):
        batched.benign_updates(model, batched.stack_parameters([model]), x[None, None], y[None, None],
                               optimizer=LocalOptimizer("adam"))
    with pytest.raises(ValueError, match="optimizer='adam'; allowed: a leakgym.fl.optim.LocalOptimizer"):
        compute_update(model, x, y, kind="model_delta", optimizer="adam")


def test_scheduled_lr():
    assert scheduled_lr(0.1, "constant", 7, 10) == 0.1
    assert scheduled_lr(0.1, "exponential", 3, 10, decay=0.5) == pytest.approx(0.0125)
    assert scheduled_lr(0.1, "cosine", 0, 10) == pytest.approx(0.1)
    assert scheduled_lr(0.1, "cosine", 5, 10) == pytest.approx(0.05)
    assert 0 < scheduled_lr(0.1, "cosine", 9, 10) < 0.003
    with pytest.raises(ValueError, match=r"local_lr_schedule='linear'; allowed: constant, exponential, cosine"):
        scheduled_lr(0.1, "linear", 0, 10)
    with pytest.raises(ValueError, match=r"round=10; allowed: integers in \[0, 9\]"):
        scheduled_lr(0.1, "cosine", 10, 10)
    with pytest.raises(ValueError, match=r"local_lr_decay=0.0"):
        scheduled_lr(0.1, "exponential", 1, 10, decay=0.0)


# -- the scenario's fields -------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "match"), [
    ({"local_optimizer": "adam"}, r"local_optimizer='adam' needs update_kind='model_delta'"),
    ({"update_kind": "model_delta", "local_optimizer": "lbfgs"}, r"local_optimizer='lbfgs'; allowed: sgd, adam"),
    ({"update_kind": "model_delta", "local_momentum": 1.5}, r"local_momentum=1.5; allowed: finite numbers in \[0, 1\)"),
    ({"update_kind": "model_delta", "local_weight_decay": -1}, r"local_weight_decay=-1"),
    ({"update_kind": "model_delta", "local_optimizer": "adam", "local_momentum": 0.9},
     r"local_momentum=0.9 with local_optimizer='adam'"),
    ({"update_kind": "model_delta", "local_lr_schedule": "step"}, r"local_lr_schedule='step'; allowed: constant"),
    ({"update_kind": "model_delta", "local_lr_decay": 0.9}, r"local_lr_decay=0.9 with local_lr_schedule='constant'"),
    ({"update_kind": "model_delta", "local_lr_schedule": "exponential", "local_lr_decay": 0.0},
     r"local_lr_decay=0.0; allowed: finite numbers in \(0, 1\]"),
])
def test_scenario_fl_fields_are_validated_at_construction(overrides, match):
    from leakgym.game.scenario import Scenario

    with pytest.raises(ValueError, match=match):
        Scenario(**overrides)


def test_a_game_trains_every_client_with_the_scenarios_optimiser_and_schedule(cheap_overrides, monkeypatch):
    """A FedAvg game with Adam and an exponential schedule: the victim's and the benign clients' training
    get the scenario's optimiser and the round's learning rate (local_lr * decay ** round), on every path
    (the client loop, the pipeline's, the batched benign clients)."""
    import numpy as np

    import leakgym.fl.client as client_module
    from leakgym.defenses import pipeline
    from leakgym.envs import parallel_env

    seen = []
    for module in (client_module, pipeline):
        real = module.compute_updates
        monkeypatch.setattr(module, "compute_updates", lambda jobs, *a, _real=real, **k: seen.extend(
            (j.optimizer, j.local_lr, "job") for j in jobs) or _real(jobs, *a, **k))
    for name in ("benign_updates", "client_updates"):
        real = getattr(batched, name)
        monkeypatch.setattr(batched, name, lambda *a, _real=real, _name=name, **k: seen.append(
            (k["optimizer"], k["local_lr"], _name)) or _real(*a, **k))
    overrides = {**cheap_overrides, "update_kind": "model_delta", "local_steps": 2, "local_lr": 0.01,
                 "local_optimizer": "adam", "local_lr_schedule": "exponential", "local_lr_decay": 0.5, "rounds": 3}
    env = parallel_env("digits", **overrides)
    env.reset(seed=0)
    for _ in range(2):
        env.step({a: np.zeros(env.action_space(a).shape, dtype=np.int64) for a in env.agents})
    assert sorted({lr for _, lr, _ in seen}) == pytest.approx([0.005, 0.01])
    assert {o for o, _, _ in seen} == {LocalOptimizer("adam")}
    assert "job" in {path for *_, path in seen}


def test_the_batched_aggregation_takes_the_scenarios_optimiser_as_the_game_by_game_one(cheap_overrides, monkeypatch):
    """Three FedAvg rounds (Adam, cosine schedule) of three games through the batched aggregation
    (leakgym.fl.rounds: the batched benign clients) equal the game-by-game one; the models move away from
    plain SGD's."""
    import numpy as np

    from leakgym.envs import load_scenario
    from leakgym.game import round as game_round
    from leakgym.game.batch import GameBatch

    def games(**extra):
        batch = GameBatch(load_scenario("digits", **dict(cheap_overrides, num_clients=3, update_kind="model_delta",
                                                         local_steps=2, local_lr=0.01, rounds=4, **extra)), 3)
        for i in range(3):
            batch.reset(i, seed=20 + i)
        return batch

    def defended(batch):
        sc, rows = batch.scenario, [0, 1, 2]
        zero = (np.zeros(len(sc.defender_nvec), np.int64), np.zeros(len(sc.attacker_nvec), np.int64))
        return game_round.defend(batch, rows, game_round.plan(batch, rows, [zero] * 3), batch_clients=False)

    extra = {"local_optimizer": "adam", "local_lr_schedule": "cosine"}
    loop, batch, sgd = games(**extra), games(**extra), games()
    never_alone(monkeypatch, batch)
    for _ in range(3):
        d_loop, d_batch, d_sgd = defended(loop), defended(batch), defended(sgd)
        assert d_loop[0].update.metadata["local_optimizer"] == "adam"
        game_round.aggregate(loop, [0, 1, 2], d_loop, batch_clients=False)
        game_round.aggregate(sgd, [0, 1, 2], d_sgd, batch_clients=False)
        game_round.aggregate(batch, [0, 1, 2], d_batch, batch_clients=True)
    for i in range(3):
        for (_, pa), (_, pb), (_, pc) in zip(loop.model(i).state_dict().items(), batch.model(i).state_dict().items(),
                                             sgd.model(i).state_dict().items()):
            torch.testing.assert_close(pa, pb, rtol=1e-4, atol=2e-5)
        first = [next(iter(g.model(i).parameters())) for g in (loop, sgd)]
        assert not torch.allclose(*first, atol=1e-5)


def test_scenario_fl_fields_come_from_toml_and_cli_strings():
    """Per-scenario defaults: a scenario file (TOML) sets the protocol; CLI/RLlib strings are coerced like TOML
    values; the defaults are plain SGD at a constant rate (local_optimizer() is None: the clients' default)."""
    import tomllib

    from leakgym.game.scenario import Scenario, local_optimizer, round_local_lr

    text = """
update_kind = "model_delta"
local_steps = 5
local_lr = 1e-3
local_optimizer = "sgd"
local_momentum = 0.9
local_weight_decay = 5e-4
local_lr_schedule = "exponential"
local_lr_decay = 0.5
"""
    sc = Scenario.from_dict(tomllib.loads(text))
    assert local_optimizer(sc) == LocalOptimizer("sgd", momentum=0.9, weight_decay=5e-4)
    assert round_local_lr(sc, 2) == pytest.approx(2.5e-4)
    strings = Scenario(update_kind="model_delta", local_momentum="0.9", local_weight_decay="0",
                       local_lr_decay="1")
    assert (strings.local_momentum, strings.local_weight_decay) == (0.9, 0.0)
    default = Scenario()
    assert local_optimizer(default) is None and round_local_lr(default, 5) == default.local_lr


def _steps_equal_torch_optim(device) -> None:
    """Five steps of every LocalOptimizer against torch.optim on one float32 tensor, compared bit for bit."""
    from leakgym.fl.optim import LocalOptimizer

    gen = torch.Generator(device=device).manual_seed(0)
    for opt in (LocalOptimizer("sgd", momentum=0.9), LocalOptimizer("sgd", weight_decay=0.01),
                LocalOptimizer("sgd", momentum=0.9, weight_decay=0.01), LocalOptimizer("adam"),
                LocalOptimizer("adam", weight_decay=0.01)):
        start = torch.randn(1000, generator=gen, device=device)
        leaf = start.clone().requires_grad_(True)
        reference = opt.torch_optimizer([leaf], lr=0.05)
        params, state = {"w": start.clone()}, opt.init({"w": start})
        for t in range(1, 6):
            grad = torch.randn(1000, generator=gen, device=device)
            leaf.grad = grad.clone()
            reference.step()
            params, state = opt.step(params, {"w": grad}, state, 0.05, t)
            assert torch.equal(params["w"], leaf.detach()), (opt.describe(), t)


def test_a_step_is_torch_optims_bit_for_bit():
    """LocalOptimizer.step runs torch.optim's own kernels out of place (add with alpha, lerp, addcmul, addcdiv)."""
    _steps_equal_torch_optim("cpu")


@pytest.mark.cuda
def test_a_step_is_torch_optims_bit_for_bit_on_cuda(cuda_device):
    _steps_equal_torch_optim(cuda_device)


@pytest.mark.cuda
def test_the_local_optimisers_run_on_cuda(digits, cuda_device):
    """Adam and SGD with momentum on a CUDA device: the state is created on the parameters' device, and the
    batched clients equal the plain ones (float64, as on the CPU)."""
    spec = digits.spec
    models = [build_model("lenet", spec, seed=s, device=cuda_device).double() for s in range(2)]
    x = spec.normalize(digits.train_x[:8]).reshape(2, 1, 4, *spec.shape).to(cuda_device).double()
    y = digits.train_y[:8].reshape(2, 1, 4).to(cuda_device)
    for opt in OPTIMIZERS.values():
        out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind="model_delta",
                                     local_steps=3, local_lr=0.01, optimizer=opt)
        for n, m in enumerate(models):
            ref = compute_update(m, x[n, 0], y[n, 0], kind="model_delta", local_steps=3, local_lr=0.01, optimizer=opt)
            for name, t in ref.tensors.items():
                assert t.device.type == "cuda"
                torch.testing.assert_close(out.tensors[name][n, 0], t, rtol=1e-7, atol=1e-9)

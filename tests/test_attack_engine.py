"""The batched gradient-matching engine: vectorised == sequential, L-BFGS, protocols, bookkeeping."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch

from leakgym.attacks.base import AttackerKnowledge
from leakgym.attacks.dlg import DLG
from leakgym.attacks.engine import (
    MatchingObjective,
    PerProblem,
    ProblemSet,
    Schedule,
    run_gradient_matching,
)
from leakgym.attacks.engine.objective import ragged_group_consistency
from leakgym.attacks.gradinversion import GradInversion
from leakgym.attacks.inverting_gradients import InvertingGradients
from leakgym.attacks.losses import group_consistency
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss
from leakgym.optim import BatchedAdam, BatchedLBFGS
from leakgym.optim.adam import decay_milestones, decayed_rates


def gradient_update(model, x, y) -> SharedUpdate:
    grads = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
    return SharedUpdate({n: g.detach() for (n, _), g in zip(model.named_parameters(), grads)},
                        batch_size=len(y))


def problems_for(model_or_models, digits, n: int, b: int):
    spec = digits.spec
    models = model_or_models if isinstance(model_or_models, list) else [model_or_models] * n
    updates, knowledges = [], []
    for i in range(n):
        device = next(models[i].parameters()).device  # the data follows the model (CPU or CUDA)
        x = spec.normalize(digits.train_x[i * b:(i + 1) * b]).to(device)
        y = digits.train_y[i * b:(i + 1) * b].to(device)
        updates.append(gradient_update(models[i], x, y))
        knowledges.append(AttackerKnowledge(model=models[i], spec=spec, batch_size=b, labels=y))
    return updates, knowledges


def run_both(updates, knowledges, objective, schedule, seed=0, dtype=torch.float32):
    labels = torch.stack([k.labels for k in knowledges])
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors), labels=labels, dtype=dtype)
    shape = (len(updates), schedule.restarts, knowledges[0].batch_size, *knowledges[0].spec.shape)
    init = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    fast = run_gradient_matching(ps, objective, schedule, init, vectorize=True)
    slow = run_gradient_matching(ps, objective, schedule, init, vectorize=False)
    return ps, fast, slow


def test_vectorised_equals_sequential_lenet_shared_model(digits):
    """LeNet, 3 victims x 2 restarts, batch 1, shared parameters: vmap path == Python loop."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=3, b=1)
    schedule = Schedule(iterations=5, restarts=2, signed=True, boxed=True, lr_decay=True)
    ps, fast, slow = run_both(updates, knowledges, MatchingObjective(tv=1e-4), schedule)
    assert not ps.batched
    torch.testing.assert_close(fast.history, slow.history, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fast.images, slow.images, rtol=1e-4, atol=1e-4)
    assert torch.equal(fast.best_restart, slow.best_restart)


def test_problems_share_parameters_only_when_every_model_holds_the_same_values(digits):
    """ProblemSet.batched: distinct model objects with equal values share one copy of the parameters;
    a difference in any parameter, the first or a later one, makes them per problem."""
    model = build_model("lenet", digits.spec, seed=0)
    updates, knowledges = problems_for([model, copy.deepcopy(model), copy.deepcopy(model)], digits, n=3, b=1)
    labels = torch.stack([k.labels for k in knowledges])

    def batched():
        return ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors), labels=labels).batched

    assert not batched()
    first, *_, last = (p for _, p in knowledges[2].model.named_parameters())
    with torch.no_grad():
        last[0] += 1.0  # a later parameter only (the first one still agrees)
    assert batched()
    with torch.no_grad():
        last[0] -= 1.0
        first.view(-1)[0] += 1.0
    assert batched()


@pytest.mark.parametrize(
    ("arch", "rtol"),
    [
        # MLP: BatchNorm, no pooling: both paths agree to float64 precision.
        ("mlp", 1e-9),
        # ConvNet (BatchNorm + ReLU + max-pooling): losses agree to 4e-5 relative after one step, and a
        # few pixels (mean abs. difference < 1e-3) take the opposite Adam step. The dummy
        # updates agree to 1e-14, the image gradients (double backward) to ~2e-6 relative; the
        # difference is absent without pooling, so we attribute it to the batched and looped
        # max-pool kernels choosing different subgradients at ties (windows of ReLU zeros).
        ("convnet", 1e-3),
    ],
)
def test_vectorised_equals_sequential_bn_train_mode_per_problem_parameters(digits, arch, rtol):
    """BatchNorm in train mode (batch 2), *different* parameters per problem, L2 + l2 prior, float64."""
    models = []
    for s in range(3):
        torch.manual_seed(s)
        models.append(build_model(arch, digits.spec).train())
    updates, knowledges = problems_for(models, digits, n=3, b=2)
    schedule = Schedule(iterations=2, restarts=1, lr=0.05)
    ps, fast, slow = run_both(updates, knowledges, MatchingObjective(distance="l2", l2=1e-3), schedule,
                              dtype=torch.float64)
    assert ps.batched
    torch.testing.assert_close(fast.history, slow.history, rtol=rtol, atol=0.0)
    # Mean absolute pixel difference (ConvNet: a few pixels take an opposite Adam step of 0.05).
    assert float((fast.images - slow.images).abs().mean()) <= rtol


def test_batch_of_problems_equals_problems_one_at_a_time(digits):
    """reconstruct_batch(us, ks, seed=s)[i] == reconstruct(us[i], ks[i], seed=s + i) (seeded, CPU)."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=3, b=1)
    attack = InvertingGradients(iterations=8, restarts=2)
    together = attack.reconstruct_batch(updates, knowledges, seed=5)
    for i, (u, k) in enumerate(zip(updates, knowledges)):
        alone = attack.reconstruct(u, k, seed=5 + i)
        torch.testing.assert_close(together[i].images, alone.images, rtol=1e-4, atol=1e-4)
        assert together[i].history["matching_loss"] == pytest.approx(alone.history["matching_loss"], rel=1e-4)
        assert together[i].cost.iterations == 8 and together[i].cost.restarts == 2
        assert len(together[i].history["matching_loss"]) == 8
        assert together[i].cost.wall_time_s > 0


def quadratics(seed: int, p: int, d: int):
    """``(hess, b, x0)``: P random strictly convex quadratics ``0.5 x'Hx - b'x`` and starting points."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(p, d, d, generator=g, dtype=torch.float64)
    hess = a @ a.transpose(1, 2) + 0.5 * torch.eye(d, dtype=torch.float64)
    return hess, torch.randn(p, d, generator=g, dtype=torch.float64), torch.randn(p, d, generator=g, dtype=torch.float64)


def torch_lbfgs(hess, b, x0, *, lr: float, iterations: int, history_size: int) -> torch.Tensor:
    """``torch.optim.LBFGS`` (no line search, no early exit) on one quadratic, ``iterations`` evaluations."""
    x = x0.clone().requires_grad_(True)
    ref = torch.optim.LBFGS([x], lr=lr, max_iter=iterations, history_size=history_size, tolerance_grad=0,
                            tolerance_change=0)

    def closure():
        ref.zero_grad()
        val = 0.5 * x @ hess @ x - b @ x
        val.backward()
        return val

    ref.step(closure)
    return x.detach()


def test_batched_lbfgs_follows_torch_lbfgs_per_problem():
    """Three independent quadratics optimised together follow torch.optim.LBFGS run on each alone."""
    hess, b, x0 = quadratics(0, 3, 5)
    x = x0.clone()
    opt = BatchedLBFGS([x], lr=0.5, history_size=4)
    for _ in range(12):
        opt.step([(hess @ x.unsqueeze(-1)).squeeze(-1) - b])
    for i in range(3):
        expected = torch_lbfgs(hess[i], b[i], x0[i], lr=0.5, iterations=12, history_size=4)
        torch.testing.assert_close(x[i], expected, rtol=1e-8, atol=1e-10)


def test_batched_lbfgs_rejected_pairs_are_inert():
    """On a non-convex function some steps have y.s <= 0: torch.optim.LBFGS skips those pairs, the
    batched L-BFGS stores them as zero pairs (histories stay aligned across problems). With a memory
    that never fills, both take the same steps -- the zero pairs contribute nothing to the compact
    representation's H g."""
    g = torch.Generator().manual_seed(3)
    p, d = 3, 4
    freq = torch.rand(p, d, generator=g, dtype=torch.float64) + 0.5
    x0 = torch.randn(p, d, generator=g, dtype=torch.float64)

    def grad(x, f):  # f(x) = sum cos(f x) + 0.05 |x|^2
        return -f * torch.sin(f * x) + 0.1 * x

    x = x0.clone()
    opt = BatchedLBFGS([x], lr=0.5, history_size=100)
    for _ in range(15):
        opt.step([grad(x, freq)])
    assert bool((torch.diagonal(opt._sy, dim1=1, dim2=2) == 0).any()), "no pair was rejected: the test tests nothing"
    for i in range(p):
        xi = x0[i].clone().requires_grad_(True)
        ref = torch.optim.LBFGS([xi], lr=0.5, max_iter=15, history_size=100, tolerance_grad=0, tolerance_change=0)

        def closure(i=i, xi=xi, ref=ref):
            ref.zero_grad()
            val = torch.cos(freq[i] * xi).sum() + 0.05 * xi.pow(2).sum()
            val.backward()
            return val

        ref.step(closure)
        torch.testing.assert_close(x[i], xi.detach(), rtol=1e-8, atol=1e-10)


def test_fedavg_model_difference_is_simulated_exactly(digits):
    """At the true image, the unrolled 3-step local training reproduces the victim's model difference."""
    spec = digits.spec
    torch.manual_seed(0)
    model = build_model("lenet", spec)
    x = spec.normalize(digits.train_x[:1])
    y = digits.train_y[:1]
    local = copy.deepcopy(model)
    opt = torch.optim.SGD(local.parameters(), lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        task_loss(local, x, y).backward()
        opt.step()
    delta = {n: p0.detach() - p1.detach()
             for (n, p0), (_, p1) in zip(model.named_parameters(), local.named_parameters())}
    update = SharedUpdate(delta, kind="model_delta", batch_size=1, local_steps=3, local_lr=0.05)
    k = AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y)
    ps = ProblemSet.from_updates([update], [k], names=list(delta), labels=y.reshape(1, 1),
                                 dtype=torch.float64)
    at_truth = run_gradient_matching(ps, MatchingObjective(distance="l2"), Schedule(iterations=1, lr=1e-9),
                                     x.reshape(1, 1, 1, *spec.shape))
    target_sq = sum(float(t.double().pow(2).sum()) for t in delta.values())
    assert float(at_truth.history[0, 0]) < 1e-10 * target_sq
    elsewhere = run_gradient_matching(ps, MatchingObjective(distance="l2"), Schedule(iterations=1, lr=1e-9),
                                      torch.zeros(1, 1, 1, *spec.shape))
    assert float(elsewhere.history[0, 0]) > 1e-3 * target_sq


def test_restart_with_lowest_matching_loss_is_returned(digits):
    """One restart starts at the truth: it has the lowest loss and must be the one returned."""
    spec = digits.spec
    torch.manual_seed(0)
    model = build_model("lenet", spec)
    updates, knowledges = problems_for(model, digits, n=1, b=1)
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                 labels=knowledges[0].labels.reshape(1, 1))
    truth = spec.normalize(digits.train_x[:1])
    init = torch.randn(1, 3, 1, *spec.shape, generator=torch.Generator().manual_seed(0))
    init[0, 1] = truth
    out = run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=2, restarts=3, lr=1e-6), init)
    assert int(out.best_restart[0]) == 1
    assert float(out.matching_loss[0]) < 1e-5


def test_dtype_and_device_parameters(digits):
    """float64 computation on an explicit CPU device returns float64 images on that device."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=1, b=1)
    res = InvertingGradients(iterations=2, dtype="float64", device="cpu").reconstruct(updates[0], knowledges[0])
    assert res.images.dtype == torch.float64 and res.images.device.type == "cpu"
    assert res.images.shape == (1, *digits.spec.shape)


@pytest.mark.parametrize(
    "bad",
    [{"iterations": 0}, {"restarts": 0}, {"optimizer": "sgd"}, {"lr": 0.0}, {"history_size": 0}],
)
def test_schedule_validation(bad):
    kwargs = {"iterations": 1} | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        Schedule(**kwargs)


@pytest.mark.parametrize(
    "bad", [{"distance": "l1"}, {"tv": -1.0}, {"eot_samples": 0}, {"layer_weights": "cubic"}]
)
def test_objective_validation(bad):
    with pytest.raises(ValueError):
        MatchingObjective(**bad)


def lenet_problem_set(digits, n: int) -> ProblemSet:
    """n single-image problems on one LeNet, labels known."""
    torch.manual_seed(0)
    updates, knowledges = problems_for(build_model("lenet", digits.spec), digits, n=n, b=1)
    return ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                   labels=torch.stack([k.labels for k in knowledges]))


def test_init_shape_is_checked(digits):
    ps = lenet_problem_set(digits, 2)
    with pytest.raises(ValueError, match="init has shape"):
        run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=1), torch.zeros(1, 1, 1, 1, 16, 16))


def test_engine_leaves_its_model_copy_clean(digits):
    """BN-statistics hooks are removed after a run, so repeated runs on one ProblemSet do not pile them up."""
    torch.manual_seed(0)
    model = build_model("convnet", digits.spec).train()
    updates, knowledges = problems_for(model, digits, n=1, b=2)
    stats = [(torch.zeros(m.num_features), torch.ones(m.num_features))
             for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    knowledges[0].bn_stats = stats
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                 labels=knowledges[0].labels.reshape(1, 2), use_bn_stats=True)
    init = torch.zeros(1, 1, 2, *digits.spec.shape)
    first = run_gradient_matching(ps, MatchingObjective(bn=1.0), Schedule(iterations=1), init)
    assert not any(m._forward_pre_hooks for m in ps.model.modules())
    second = run_gradient_matching(ps, MatchingObjective(bn=1.0), Schedule(iterations=1), init)
    assert torch.equal(first.total_loss, second.total_loss)


# -- per-problem budgets, restarts, step sizes and TV weights ---------------------------------------
#: Vectorised rows vs the same problem alone (as tests/test_attacks_seeds.py: rounding of batched kernels).
VECTORISED_TOL = {"rtol": 1e-4, "atol": 1e-4}


def assert_same(a, b, tol):
    """Same reconstruction: bit for bit (``tol=None``) or within ``tol``; same labels and cost."""
    assert torch.equal(a.labels, b.labels)
    assert (a.cost.iterations, a.cost.restarts) == (b.cost.iterations, b.cost.restarts)
    assert len(a.history["matching_loss"]) == len(b.history["matching_loss"]) == a.cost.iterations
    if tol is None:
        assert torch.equal(a.images, b.images)
        assert a.history == b.history and a.final_loss == b.final_loss
    else:
        torch.testing.assert_close(a.images, b.images, **tol)
        assert a.history["matching_loss"] == pytest.approx(b.history["matching_loss"], rel=tol["rtol"], abs=tol["atol"])


def mixed_configs(attack, overrides):
    return [dataclasses.replace(attack.config, **o) for o in overrides]


@pytest.mark.parametrize("vectorize", [False, True])
def test_budget_20_beside_60_and_150_equals_alone(digits, vectorize):
    """Inverting Gradients (signed Adam, LR decay, box): a problem with budget 20 batched with budgets
    60 and 150, other TV weights and step sizes, gets its result alone and is charged 20 iterations."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=4, b=1)
    attack = InvertingGradients(iterations=20, restarts=1, tv=1e-4)
    attack.vectorize = vectorize
    overrides = [{}, {"iterations": 60, "tv": 0.0}, {"iterations": 150, "tv": 1e-2, "lr": 0.05},
                 {"iterations": 60, "restarts": 2}]
    configs = mixed_configs(attack, overrides)
    seeds = [3, 4, 5, 6]
    together = attack.reconstruct_batch(updates, knowledges, seeds=seeds, configs=configs)
    for i, c in enumerate(configs):
        alone = InvertingGradients(c)
        alone.vectorize = vectorize
        assert_same(together[i], alone.reconstruct(updates[i], knowledges[i], seed=seeds[i]),
                    None if not vectorize else VECTORISED_TOL)
    assert [r.cost.iterations for r in together] == [20, 60, 150, 60]
    assert [r.cost.restarts for r in together] == [1, 1, 1, 2]
    assert [r.cost.units for r in together] == [20, 60, 150, 120]


def test_dlg_lbfgs_per_problem_budget_and_step_length(digits):
    """L-BFGS (DLG, joint soft labels): problems leave the batch at their own budget, with their own
    step length; the sequential path equals each problem alone bit for bit."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=3, b=1)
    knowledges = [dataclasses.replace(k, labels=None) for k in knowledges]
    attack = DLG(iterations=4, restarts=1)
    configs = mixed_configs(attack, [{}, {"iterations": 9, "lr": 0.5}, {"iterations": 6, "restarts": 2}])
    for vectorize, tol in ((False, None), (True, VECTORISED_TOL)):
        attack.vectorize = vectorize
        together = attack.reconstruct_batch(updates, knowledges, seeds=[1, 2, 3], configs=configs)
        for i, c in enumerate(configs):
            alone = DLG(c)
            alone.vectorize = vectorize
            assert_same(together[i], alone.reconstruct(updates[i], knowledges[i], seed=i + 1), tol)


def test_gradinversion_mixed_restarts_form_their_own_groups(digits):
    """GradInversion's group consistency over each victim's own restarts (1, 2 or 3 of them)."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=3, b=1)
    attack = GradInversion(iterations=5, restarts=2)
    attack.vectorize = False
    configs = mixed_configs(attack, [{}, {"restarts": 1, "iterations": 3}, {"restarts": 3, "tv": 0.0}])
    together = attack.reconstruct_batch(updates, knowledges, seeds=[7, 8, 9], configs=configs)
    for i, c in enumerate(configs):
        alone = GradInversion(c)
        alone.vectorize = False
        assert_same(together[i], alone.reconstruct(updates[i], knowledges[i], seed=7 + i), None)


def test_ragged_group_consistency_matches_uniform_groups():
    x = torch.randn(6, 2, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    torch.testing.assert_close(ragged_group_consistency(x, index, torch.tensor([2, 2, 2])),
                               group_consistency(x, 2), rtol=0, atol=1e-7)
    ragged = ragged_group_consistency(x, torch.tensor([0, 1, 1, 1, 2, 2]), torch.tensor([1, 3, 2]))
    assert ragged[0] == 0  # a group of one restart adds nothing
    torch.testing.assert_close(ragged[1:4], group_consistency(x[1:4], 3), rtol=0, atol=1e-7)


def test_configs_may_differ_only_in_per_problem_fields(digits):
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=2, b=1)
    attack = InvertingGradients(iterations=2)
    bad = mixed_configs(attack, [{}, {"signed": False}])
    with pytest.raises(ValueError, match=r"configs\[1\] differs .* outside the per-problem fields"):
        attack.reconstruct_batch(updates, knowledges, configs=bad)
    with pytest.raises(ValueError, match="got 1 configs for 2 problems"):
        attack.reconstruct_batch(updates, knowledges, configs=bad[:1])
    with pytest.raises(ValueError, match=r"configs\[0\] is a DLGConfig"):
        attack.reconstruct_batch(updates, knowledges, configs=[DLG().config, attack.config])


def test_batched_adam_is_torch_adam_with_multistep_decay_per_row():
    """Rows with budgets 1, 5 and 20 (milestones at 3/8, 5/8, 7/8 of their own budget) and their own
    step sizes follow torch.optim.Adam + MultiStepLR run on each row alone, bit for bit."""
    g = torch.Generator().manual_seed(0)
    budgets, lrs = [1, 5, 20], [0.1, 0.05, 0.2]
    x0 = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    grads = [torch.randn(3, 4, 5, generator=g, dtype=torch.float64).sign() for _ in range(20)]
    x = x0.clone()
    marks = [decay_milestones(t) for t in budgets]
    opt = BatchedAdam([x], lr=torch.tensor([decayed_rates(lr, m) for lr, m in zip(lrs, marks)], dtype=torch.float64),
                      milestones=torch.tensor(marks))
    rows = [0, 1, 2]
    finals = {}
    for it in range(20):
        opt.step([grads[it][rows]])
        done = [r for r in rows if budgets[r] == it + 1]
        for r in done:
            finals[r] = x[rows.index(r)].clone()
        if done:
            keep = torch.tensor([r not in done for r in rows])
            rows = [r for r in rows if r not in done]
            if rows:
                x = x[keep].clone()
                opt.keep(keep, [x])
    for r in range(3):
        ref = x0[r].clone().requires_grad_(True)
        ref_opt = torch.optim.Adam([ref], lr=lrs[r])
        sched = torch.optim.lr_scheduler.MultiStepLR(ref_opt, milestones=marks[r], gamma=0.1)
        for it in range(budgets[r]):
            ref.grad = grads[it][r].clone()
            ref_opt.step()
            sched.step()
        assert torch.equal(finals[r], ref.detach()), r


def test_batched_lbfgs_keeps_the_state_of_the_remaining_problems():
    """Problems leaving a BatchedLBFGS (keep) do not disturb the others, which follow torch's L-BFGS."""
    hess, b, x0 = quadratics(1, 3, 4)
    x = x0.clone()
    lrs = [0.5, 0.3, 0.7]
    opt = BatchedLBFGS([x], lr=torch.tensor(lrs, dtype=torch.float64), history_size=3)
    alive = [0, 1, 2]
    for it in range(10):
        opt.step([(hess[alive] @ x.unsqueeze(-1)).squeeze(-1) - b[alive]])
        if it == 3:  # problem 1 leaves after 4 iterations
            keep = torch.tensor([True, False, True])
            x = x[keep].clone()
            opt.keep(keep, [x])
            alive = [0, 2]
    for row, i in enumerate(alive):
        expected = torch_lbfgs(hess[i], b[i], x0[i], lr=lrs[i], iterations=10, history_size=3)
        torch.testing.assert_close(x[row], expected, rtol=1e-8, atol=1e-10)


def test_per_problem_settings_are_validated(digits):
    ps = lenet_problem_set(digits, 2)
    init = [torch.zeros(1, 1, *digits.spec.shape), torch.zeros(2, 1, *digits.spec.shape)]
    with pytest.raises(ValueError, match=r"PerProblem.iterations\[1\]=0"):
        run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=1), init,
                              per_problem=PerProblem(iterations=[1, 0], restarts=[1, 2]))
    with pytest.raises(ValueError, match="init has shapes"):
        run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=1), init,
                              per_problem=PerProblem(restarts=[1, 1]))
    with pytest.raises(ValueError, match="PerProblem.tv has 1 values for 2 problems"):
        run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=1), init,
                              per_problem=PerProblem(restarts=[1, 2], tv=[0.1]))
    out = run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=1), init,
                                per_problem=PerProblem(iterations=[2, 5], restarts=[1, 2]))
    assert out.budgets == [2, 5] and out.restart_counts == [1, 2] and out.iterations == 5
    assert out.history.shape == (5, 2) and torch.isnan(out.history[2:, 0]).all()
    assert torch.isfinite(out.history[:, 1]).all()


@pytest.mark.cuda
def test_per_problem_budgets_on_cuda(digits, cuda_device):
    """Mixed budgets, restarts and TV weights on a GPU: everything stays on the device, each problem is
    charged its own budget and gets its result alone (to the TF32 tolerance of cuDNN)."""
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec).to(cuda_device)
    updates, knowledges = problems_for(model, digits, n=3, b=1)
    updates = [u.to(cuda_device) for u in updates]
    knowledges = [dataclasses.replace(k, labels=k.labels.to(cuda_device)) for k in knowledges]
    attack = InvertingGradients(iterations=4)
    configs = mixed_configs(attack, [{}, {"iterations": 9, "tv": 0.0}, {"iterations": 6, "restarts": 2, "lr": 0.05}])
    together = attack.reconstruct_batch(updates, knowledges, seeds=[1, 2, 3], configs=configs)
    assert [r.cost.units for r in together] == [4, 9, 12]
    for i, c in enumerate(configs):
        assert together[i].images.device.type == "cuda"
        alone = InvertingGradients(c).reconstruct(updates[i], knowledges[i], seed=i + 1)
        torch.testing.assert_close(together[i].images, alone.images, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("flat_max", [2**24, 0])
@pytest.mark.parametrize("distance", ["l2", "cosine"])
@pytest.mark.parametrize("scheme", ["equal", "exp", {"a": 0.5, "c": 2.0}])
def test_gradient_distance_equals_its_per_layer_formula(distance, scheme, flat_max):
    """Both forms (all layers as one matrix, and layer by layer: flat_max=0) are the papers' per-layer sum:
    DLG Eq. 4 (l2) and Inverting Gradients Eq. 4 with layer weights (cosine); 2 victims x 3 restarts; a
    weight-0 layer is out."""
    from leakgym.attacks.losses import gradient_distance, layer_weights

    g = torch.Generator().manual_seed(0)
    shapes = {"a": (4, 3), "b": (5,), "c": (2, 2, 3)}
    targets = {k: torch.randn(2, *s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    dummy = {k: torch.randn(6, *s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    w = layer_weights(list(shapes), scheme)
    got = gradient_distance(dummy, targets, w, distance=distance, flat_max=flat_max)
    want = []
    for row in range(6):
        victim = row // 3
        terms = [(w[k], dummy[k][row].flatten(), targets[k][victim].flatten()) for k in shapes]
        if distance == "l2":
            want.append(sum(wk * (d - t).pow(2).sum() for wk, d, t in terms))
        else:
            dot = sum(wk * (d * t).sum() for wk, d, t in terms)
            norms = (sum(wk * d.pow(2).sum() for wk, d, _ in terms).sqrt()
                     * sum(wk * t.pow(2).sum() for wk, _, t in terms).sqrt())
            want.append(1 - dot / norms)
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-12, atol=1e-12)


def _flat_case(scheme, restarts, device="cpu"):
    from leakgym.attacks.losses import FlatWeights, layer_weights, target_sq_norms

    g = torch.Generator().manual_seed(1)
    shapes = {"a": (4, 3), "b": (5,), "c": (2, 2, 3)}
    targets = {k: torch.randn(2, *s, generator=g, dtype=torch.float64).to(device) for k, s in shapes.items()}
    w = layer_weights(list(shapes), scheme)
    names = [k for k in shapes if w[k] != 0]
    flat_w = FlatWeights(targets, w, names, dtype=torch.float64, device=torch.device(device))
    t = torch.cat([targets[k].reshape(2, -1) for k in names], dim=1)
    dummy = torch.randn(2 * restarts, t.shape[1], generator=g, dtype=torch.float64).to(device)
    return dummy, t, flat_w, target_sq_norms(targets, w)


@pytest.mark.parametrize("restarts", [1, 3])
@pytest.mark.parametrize("distance", ["l2", "cosine"])
@pytest.mark.parametrize("scheme", ["equal", {"a": 0.5, "c": 2.0}])
def test_the_written_out_backward_of_the_flat_distance_is_autograds(distance, scheme, restarts):
    """matrix_distance's hand-written backward (_FlatDistance) against autograd's backward of the same
    forward, with one scale and with per-entry weights, one and three restarts; a zero dummy row (the
    cosine's clamps bind) included; its values are bit for bit the autograd path's; gradcheck passes."""
    from leakgym.attacks.losses import _FlatDistance, _matrix_distance, matrix_distance

    dummy, t, flat_w, norms = _flat_case(scheme, restarts)
    dummy[0] = 0.0
    upstream = torch.linspace(-1.0, 2.0, dummy.shape[0], dtype=torch.float64)
    mine = dummy.clone().requires_grad_(True)
    got = matrix_distance(mine, t, flat_w, distance=distance, target_norm_sq=norms)
    assert got.grad_fn is not None and "_FlatDistance" in type(got.grad_fn).__name__
    (grad,) = torch.autograd.grad((got * upstream).sum(), mine)
    ref_in = dummy.clone().requires_grad_(True)
    want = _matrix_distance(ref_in, t, flat_w, distance, norms)[0]
    (want_grad,) = torch.autograd.grad((want * upstream).sum(), ref_in)
    assert torch.equal(got.detach(), want.detach())
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(grad).all()
    probe = (dummy + 0.3).requires_grad_(True)  # away from the clamps: finite differences apply
    assert torch.autograd.gradcheck(lambda x: _FlatDistance.apply(x, t, flat_w, distance, norms), (probe,))


@pytest.mark.cuda
@pytest.mark.parametrize("distance", ["l2", "cosine"])
def test_the_written_out_backward_of_the_flat_distance_on_cuda(cuda_device, distance):
    """The same comparison on CUDA (float64 there too): autograd's backward and the written-out one."""
    from leakgym.attacks.losses import _matrix_distance, matrix_distance

    dummy, t, flat_w, norms = _flat_case({"a": 0.5, "c": 2.0}, 3, device=cuda_device)
    mine, ref = dummy.clone().requires_grad_(True), dummy.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(matrix_distance(mine, t, flat_w, distance=distance, target_norm_sq=norms).sum(), mine)
    (want,) = torch.autograd.grad(_matrix_distance(ref, t, flat_w, distance, norms)[0].sum(), ref)
    assert grad.device.type == "cuda"
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


def test_the_flat_distance_takes_autograds_backward_when_the_targets_need_a_gradient():
    """Targets that need a gradient (a caller differentiating with respect to the victim's update) get
    autograd's path, whose gradient reaches them."""
    from leakgym.attacks.losses import matrix_distance

    dummy, t, flat_w, _ = _flat_case("equal", 1)
    t = t.clone().requires_grad_(True)
    out = matrix_distance(dummy.requires_grad_(True), t, flat_w, distance="l2", target_norm_sq=None)
    assert "_FlatDistance" not in type(out.grad_fn).__name__
    (grad_t,) = torch.autograd.grad(out.sum(), t)
    assert grad_t.abs().sum() > 0


def test_the_cosine_distance_of_an_all_zero_dummy_gradient_has_a_finite_gradient():
    """1 - <g, t> / (|g| |t|) at g = 0: the value was guarded (1) but sqrt's backward at 0 gave NaN, so a
    problem reaching a zero dummy gradient was stuck (reset to its best iterate every step)."""
    from leakgym.attacks.losses import gradient_distance

    targets = {"w": torch.tensor([[1.0, 2.0, 3.0]]).repeat(2, 1)}
    dummy = torch.tensor([[0.0, 0.0, 0.0], [0.5, -1.0, 2.0]], requires_grad=True)
    loss = gradient_distance({"w": dummy}, targets, {"w": 1.0}, distance="cosine")
    assert loss[0].item() == 1.0
    (grad,) = torch.autograd.grad(loss.sum(), dummy)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("restarts", [1, 3])
@pytest.mark.parametrize("distance", ["l2", "cosine"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_flat_distance_in_victim_blocks_is_bit_for_bit_the_one_pass(monkeypatch, distance, restarts, dtype):
    """_FlatDistance's cache-sized victim blocks on a CPU (CACHE_BLOCK_ENTRIES made small here): values and
    gradients equal bit for bit to the one pass over the whole matrix, for block sizes that do and do not
    divide the victims, a zero dummy row included. Two torch threads and rows longer than torch's grain
    (32,768 entries): a block of one row would have its sum split over the threads, so none has one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _check_victim_blocks(monkeypatch, distance, restarts, dtype)
    finally:
        torch.set_num_threads(threads)


def _check_victim_blocks(monkeypatch, distance, restarts, dtype):
    from leakgym.attacks import losses
    from leakgym.attacks.losses import FlatWeights, _victim_blocks, matrix_distance

    g = torch.Generator().manual_seed(3)
    n, d = 11, 40013
    t = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    dummy = (torch.randn(n * restarts, d, generator=g, dtype=torch.float64) * 3).to(dtype)
    dummy[1] = 0.0
    targets = {"a": t[:, :40000], "b": t[:, 40000:]}
    flat_w = FlatWeights(targets, {"a": 0.7, "b": 0.7}, ["a", "b"], dtype=dtype, device=torch.device("cpu"))
    norms = 0.7 * t.pow(2).sum(dim=1)
    upstream = torch.linspace(-1.0, 2.0, n * restarts, dtype=dtype)

    def run():
        x = dummy.clone().requires_grad_(True)
        out = matrix_distance(x, t, flat_w, distance=distance, target_norm_sq=norms)
        (grad,) = torch.autograd.grad((out * upstream).sum(), x)
        return out.detach(), grad

    monkeypatch.setattr(losses, "CACHE_BLOCK_ENTRIES", 2**40)
    assert _victim_blocks(dummy, t, flat_w) is None
    want = run()
    for victims_per_block in (1, 2, 4, 5):
        monkeypatch.setattr(losses, "CACHE_BLOCK_ENTRIES", victims_per_block * restarts * d)
        blocks = _victim_blocks(dummy, t, flat_w)
        if victims_per_block * restarts < 2:
            assert blocks is None  # one row alone: its sum may be split over threads
            continue
        assert blocks[0].start == 0 and blocks[-1].stop == n
        assert all(a.stop == b.start for a, b in itertools.pairwise(blocks))
        assert min((b.stop - b.start) * restarts for b in blocks) >= 2 and len(blocks) > 1
        got = run()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # per-entry weights: the matrix-vector product's kernel depends on the row count, so one pass
    weighted = FlatWeights(targets, {"a": 0.5, "b": 2.0}, ["a", "b"], dtype=dtype, device=torch.device("cpu"))
    assert _victim_blocks(dummy, t, weighted) is None


@pytest.mark.cuda
def test_the_flat_distance_makes_one_pass_on_cuda(monkeypatch, cuda_device):
    """Victim blocks are a CPU cache measure: on a GPU the distance stays one pass (one kernel per operation),
    however small the block bound."""
    from leakgym.attacks import losses
    from leakgym.attacks.losses import _victim_blocks

    dummy, t, flat_w, _ = _flat_case("equal", 3, device=cuda_device)
    monkeypatch.setattr(losses, "CACHE_BLOCK_ENTRIES", dummy.shape[0] // t.shape[0] * dummy.shape[1])  # a victim a block
    assert _victim_blocks(dummy.cpu(), t.cpu(), flat_w) is not None  # the same matrices block on the CPU
    assert _victim_blocks(dummy, t, flat_w) is None


def test_a_vector_env_plays_the_same_rounds_with_and_without_victim_blocks(monkeypatch, cheap_overrides):
    """16 digits games, random attacker actions over Inverting Gradients (cosine) and DLG (l2): observations,
    rewards and infos bit for bit equal whether _FlatDistance passes in victim blocks (of 5 LeNet updates
    here) or in one pass."""
    import gymnasium as gym
    import numpy as np

    import leakgym.envs  # noqa: F401  (registers the gym ids)
    from leakgym.attacks import losses

    calls = []
    real = losses._victim_blocks
    monkeypatch.setattr(losses, "_victim_blocks", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])

    def play(block_entries):
        monkeypatch.setattr(losses, "CACHE_BLOCK_ENTRIES", block_entries)
        vec = gym.make_vec("LeakGym-Digits-v0", num_envs=16, **dict(cheap_overrides, iterations=[1], rounds=5))
        vec.action_space.seed(5)
        out = [vec.reset(seed=11)[0]]
        for _ in range(3):
            obs, reward, _, _, info = vec.step(vec.action_space.sample())
            out += [obs, reward, *(v for k, v in sorted(info.items()) if isinstance(v, np.ndarray))]
        vec.close()
        return out

    one_pass = play(2**40)
    assert calls and not any(calls)
    calls.clear()
    blocked = play(5 * 13078)  # LeNet's matched parameters on digits: 13,078
    assert any(b is not None and len(b) > 1 for b in calls)
    assert len(blocked) == len(one_pass)
    for a, b in zip(one_pass, blocked):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")

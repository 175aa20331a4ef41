"""The batched gradient-matching engine: vectorised == sequential, L-BFGS, protocols, bookkeeping."""

from __future__ import annotations

import copy

import pytest
import torch

from leakgym.attacks.base import AttackerKnowledge
from leakgym.attacks.engine import (
    BatchedLBFGS,
    MatchingObjective,
    ProblemSet,
    Schedule,
    run_gradient_matching,
)
from leakgym.attacks.inverting_gradients import InvertingGradients
from leakgym.data import load_dataset
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", image_size=16)


def gradient_update(model, x, y) -> SharedUpdate:
    grads = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
    return SharedUpdate({n: g.detach() for (n, _), g in zip(model.named_parameters(), grads)},
                        batch_size=len(y))


def problems_for(model_or_models, digits, n: int, b: int):
    spec = digits.spec
    models = model_or_models if isinstance(model_or_models, list) else [model_or_models] * n
    updates, knowledges = [], []
    for i in range(n):
        x = spec.normalize(digits.train_x[i * b:(i + 1) * b])
        y = digits.train_y[i * b:(i + 1) * b]
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


def test_batched_lbfgs_follows_torch_lbfgs_per_problem():
    """Three independent quadratics optimised together follow torch.optim.LBFGS run on each alone."""
    g = torch.Generator().manual_seed(0)
    p, d = 3, 5
    a = torch.randn(p, d, d, generator=g, dtype=torch.float64)
    hess = a @ a.transpose(1, 2) + 0.5 * torch.eye(d, dtype=torch.float64)
    b = torch.randn(p, d, generator=g, dtype=torch.float64)
    x0 = torch.randn(p, d, generator=g, dtype=torch.float64)

    def loss(x, i):
        return 0.5 * x @ hess[i] @ x - b[i] @ x

    x = x0.clone()
    opt = BatchedLBFGS([x], lr=0.5, history_size=4)
    for _ in range(12):
        grads = (hess @ x.unsqueeze(-1)).squeeze(-1) - b
        opt.step([grads])
    for i in range(p):
        xi = x0[i].clone().requires_grad_(True)
        ref = torch.optim.LBFGS([xi], lr=0.5, max_iter=12, history_size=4, tolerance_grad=0,
                                tolerance_change=0)

        def closure(ref=ref, xi=xi, i=i):
            ref.zero_grad()
            val = loss(xi, i)
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


def test_init_shape_is_checked(digits):
    torch.manual_seed(0)
    model = build_model("lenet", digits.spec)
    updates, knowledges = problems_for(model, digits, n=2, b=1)
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                 labels=torch.stack([k.labels for k in knowledges]))
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

"""Batched federated rounds (leakgym.fl.batched, leakgym.fl.rounds, the aggregate phase of leakgym.game.round) equal the game-by-game loop.

Exactness (CPU, float32, one thread): aggregation is bit-identical to ``Server.aggregate``. Client
gradients and evaluation forward passes are vmapped (a convolution over N games is a grouped
convolution), so they equal the loop to rounding: measured on a 2-core x86 CPU for LeNet on digits,
at most 2e-7 absolute per gradient entry and 2e-7 relative in the test loss after three rounds;
``FL_TOL`` leaves a margin of 50x. Everything drawn from the games' generators is identical.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from leakgym.envs import load_scenario
from leakgym.fl import batched
from leakgym.fl.client import compute_update
from leakgym.fl.server import Server
from leakgym.game import round as game_round
from leakgym.game.batch import GameBatch
from leakgym.models import build_model
from leakgym.models.rowwise import RowwiseForward

FL_TOL = {"rtol": 1e-5, "atol": 1e-5}
CUDA_TOL = {"rtol": 1e-3, "atol": 1e-3}  # TF32 convolutions
# BatchNorm divides by the batch's standard deviation, which magnifies float32 rounding: for a batch of
# three digits the float32 compute_update itself is 1.7e-3 away from float64 (gradient entries up to 37),
# while the batched and looped paths agree to 5e-12 in float64. The client tests therefore run in
# float64 (F64_TOL); the three-round game test in float32 allows that rounding (BN_TOL, measured <= 9e-5).
F64_TOL = {"rtol": 1e-9, "atol": 1e-9}
BN_TOL = {"rtol": 1e-3, "atol": 5e-4}
F64_CUDA_TOL = {"rtol": 1e-8, "atol": 1e-8}  # float64 on CUDA: other kernels, other summation orders


def games_and_batches(digits, n=3, k=2, b=4, device="cpu", arch="lenet"):
    spec = digits.spec
    models = [build_model(arch, spec, seed=s, device=device) for s in range(n)]
    if arch != "lenet":  # BatchNorm: distinct running statistics per game
        with torch.no_grad():
            for s, m in enumerate(models):
                for name, buf in m.named_buffers():
                    if buf.is_floating_point():
                        noise = torch.rand(buf.shape, generator=torch.Generator().manual_seed(s))
                        buf.add_(0.1 * (s + 1) * noise.to(buf.device))
    x = spec.normalize(digits.train_x[: n * k * b]).reshape(n, k, b, *spec.shape).to(device)
    y = digits.train_y[: n * k * b].reshape(n, k, b).to(device)
    return models, x, y


@pytest.mark.parametrize("b", [1, 4])  # 1: the row-wise clients (leakgym.models.rowwise); 4: vmap
@pytest.mark.parametrize(("kind", "steps"), [("gradient", 1), ("model_delta", 3)])
def test_benign_updates_equal_compute_update(digits, kind, steps, b):
    models, x, y = games_and_batches(digits, b=b)
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind=kind, local_steps=steps,
                                 local_lr=0.05)
    for n, m in enumerate(models):
        for k in range(x.shape[1]):
            ref = compute_update(m, x[n, k], y[n, k], kind=kind, local_steps=steps, local_lr=0.05)
            for name, t in ref.tensors.items():
                torch.testing.assert_close(out.tensors[name][n, k], t, **FL_TOL)
    assert out.buffers is None


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize(("kind", "steps"), [("gradient", 1), ("model_delta", 2)])
def test_lenet_clients_take_the_rowwise_form_and_equal_the_vmapped_clients(digits, monkeypatch, kind, steps, soft):
    """DLG's LeNet with one image per client: the clients are rows of leakgym.models.rowwise (no vmap);
    their updates equal the vmapped grad's (the form switched off), with hard and with soft (Mixup)
    labels. With four images per client the unfolded convolutions are too large: the grouped form (next test)."""
    from leakgym.models.rowwise import RowwiseForward

    models, x, y = games_and_batches(digits, b=1)
    if soft:
        y = torch.softmax(torch.randn(*y.shape, 10, generator=torch.Generator().manual_seed(0)), dim=-1)
    params = batched.stack_parameters(models)
    calls = []
    real = RowwiseForward.__call__
    monkeypatch.setattr(RowwiseForward, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    rows = batched.benign_updates(models[0], params, x, y, kind=kind, local_steps=steps, local_lr=0.05)
    assert len(calls) == steps
    vmapped = batched.benign_updates(models[0], params, x, y, kind=kind, local_steps=steps, local_lr=0.05,
                                     vectorise=True)
    assert len(calls) == steps
    for name, t in vmapped.tensors.items():
        assert rows.tensors[name].shape == t.shape and not rows.tensors[name].requires_grad
        torch.testing.assert_close(rows.tensors[name], t, **FL_TOL)
    monkeypatch.undo()
    monkeypatch.setattr(RowwiseForward, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    models, x, y = games_and_batches(digits, b=4)
    assert not RowwiseForward.of(models[0]).fits(4, tuple(digits.spec.shape))
    batched.benign_updates(models[0], batched.stack_parameters(models), x, y)
    assert len(calls) == steps


@pytest.mark.parametrize("optimizer", [None, "adam"])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize(("kind", "steps"), [("gradient", 1), ("model_delta", 2)])
def test_lenet_clients_of_larger_batches_take_the_grouped_form_and_equal_the_vmapped_clients(
        digits, monkeypatch, kind, steps, soft, optimizer):
    """DLG's LeNet with four images per client on a CPU: the clients are rows of the grouped form
    (RowwiseForward.grouped_loss: grouped convolutions, the weight gradient of the 4x4 outputs as a grouped
    convolution); every client's update equals the vmapped grad's (the form switched off) and compute_update's,
    hard and soft labels, plain SGD and Adam, K = 2 clients per game (each its own row)."""
    from leakgym.fl.optim import LocalOptimizer
    from leakgym.models.rowwise import RowwiseForward

    if optimizer is not None and kind == "gradient":
        pytest.skip("FedSGD has no local optimiser")
    opt = None if optimizer is None else LocalOptimizer(name=optimizer)
    models, x, y = games_and_batches(digits, b=4)
    if soft:
        y = torch.softmax(torch.randn(*y.shape, 10, generator=torch.Generator().manual_seed(0)), dim=-1)
    tol = FL_TOL
    if opt is not None:  # Adam's first steps divide by |g|: float32 rounding of a tiny entry shows (2e-4 rel.)
        models, x, y, tol = [m.double() for m in models], x.double(), (y.double() if soft else y), F64_TOL
    params = batched.stack_parameters(models)
    calls = []
    real = RowwiseForward.grouped_loss
    monkeypatch.setattr(RowwiseForward, "grouped_loss", lambda self, *a: calls.append(1) or real(self, *a))
    grouped = batched.benign_updates(models[0], params, x, y, kind=kind, local_steps=steps, local_lr=0.05,
                                     optimizer=opt)
    assert len(calls) == steps
    vmapped = batched.benign_updates(models[0], params, x, y, kind=kind, local_steps=steps, local_lr=0.05,
                                     optimizer=opt, vectorise=True)
    assert len(calls) == steps
    monkeypatch.undo()
    for name, t in vmapped.tensors.items():
        assert grouped.tensors[name].shape == t.shape and not grouped.tensors[name].requires_grad
        torch.testing.assert_close(grouped.tensors[name], t, **tol)
    for n, m in enumerate(models):
        for k in range(x.shape[1]):
            ref = compute_update(m, x[n, k], y[n, k], kind=kind, local_steps=steps, local_lr=0.05, optimizer=opt)
            for name, t in ref.tensors.items():
                torch.testing.assert_close(grouped.tensors[name][n, k], t, **tol)
    assert not torch.allclose(grouped.tensors["head.weight"][0, 0], grouped.tensors["head.weight"][0, 1])


def test_the_rowwise_form_fits_small_unfolded_convolutions_only():
    """LeNet on 16x16 digits: one image per row fits UNFOLD_MAX_ENTRIES (largest layer 4,800 entries),
    four do not (19,200); 32x32 RGB images do not fit even one at a time (19,200 at the first layer)."""
    from leakgym.data import DatasetSpec
    from leakgym.models.rowwise import RowwiseForward

    spec = DatasetSpec(name="d", channels=1, image_size=16, num_classes=10, mean=(0.5,), std=(0.25,))
    form = RowwiseForward.of(build_model("lenet", spec))
    assert form.fits(1, (1, 16, 16)) and not form.fits(4, (1, 16, 16))
    assert not form.fits(1, (3, 32, 32))
    # RowwiseForward.of with a batch: the form where it fits, None where it does not
    model = build_model("lenet", spec)
    assert RowwiseForward.of(model, 1, (1, 16, 16)) is not None and RowwiseForward.of(model, 4, (1, 16, 16)) is None


@pytest.mark.parametrize("arch", ["convnet", "resnet18", "mlp", "lenet"])
@pytest.mark.parametrize(("kind", "steps", "b"), [("gradient", 1, 4), ("model_delta", 2, 3), ("gradient", 1, 1)])
def test_clients_one_after_another_are_compute_update_bit_for_bit(digits, arch, kind, steps, b):
    """The CPU's form for BatchNorm models (and any model with vectorise=False): each client is task_loss under
    its game's parameters and torch.autograd.grad, BatchNorm updating a copy of the game's running statistics
    in place -- the kernels compute_update runs on its private copy, so the updates and the statistics are
    its own bit for bit, in float32."""
    models, x, y = games_and_batches(digits, n=2, k=2, b=b, arch=arch)
    buffers = batched.stack_buffers(models) if arch != "lenet" else None
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind=kind, local_steps=steps,
                                 local_lr=0.05, buffers=buffers, vectorise=None if arch != "lenet" else False)
    for n, m in enumerate(models):
        for k in range(2):
            ref = compute_update(m, x[n, k], y[n, k], kind=kind, local_steps=steps, local_lr=0.05)
            got = batched.unpack(out, n, k, kind=kind, batch_size=b, local_steps=steps, local_lr=0.05, model=m)
            assert got.tensors.keys() == ref.tensors.keys()
            assert all(torch.equal(got.tensors[name], t) for name, t in ref.tensors.items())
            if arch == "lenet":  # no BatchNorm, no statistics
                assert got.buffers is None
            else:
                assert got.buffers.keys() == ref.buffers.keys()
                assert all(torch.equal(got.buffers[name], t) for name, t in ref.buffers.items())


@pytest.mark.parametrize("arch", ["convnet", "mlp"])
@pytest.mark.parametrize("optimizer", [{"name": "sgd", "momentum": 0.9}, {"name": "sgd", "weight_decay": 0.01},
                                       {"name": "adam"}, {"name": "adam", "weight_decay": 0.01}],
                         ids=["momentum", "weight-decay", "adam", "adam-weight-decay"])
def test_clients_one_after_another_are_compute_update_bit_for_bit_with_every_optimiser(digits, arch, optimizer):
    """Found in an audit: the one-after-another clients took their steps as g + wd * w and w - lr * g, where
    torch.optim (compute_update's client) adds with alpha, a fused product on a CPU; the last bits differed, and
    BatchNorm on batches of 3 made that 1.6e-3 (weight decay) and 2.9e-2 (Adam) after three steps."""
    from leakgym.fl.optim import LocalOptimizer

    opt = LocalOptimizer(**optimizer)
    models, x, y = games_and_batches(digits, n=2, k=2, b=3, arch=arch)
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind="model_delta", local_steps=3,
                                 local_lr=0.05, buffers=batched.stack_buffers(models) or None, vectorise=False,
                                 optimizer=opt)
    for n, m in enumerate(models):
        for k in range(2):
            ref = compute_update(m, x[n, k], y[n, k], kind="model_delta", local_steps=3, local_lr=0.05, optimizer=opt)
            got = batched.unpack(out, n, k, kind="model_delta", batch_size=3, local_steps=3, local_lr=0.05, model=m)
            assert all(torch.equal(got.tensors[name], t) for name, t in ref.tensors.items())


@pytest.mark.parametrize("vectorise", [None, True])  # a CPU's own form (one client after another), vmap
@pytest.mark.parametrize("arch", ["convnet", "mlp"])
@pytest.mark.parametrize(("kind", "steps", "b"), [("gradient", 1, 4), ("model_delta", 2, 3), ("gradient", 1, 1)])
def test_benign_updates_with_batchnorm_equal_compute_update(digits, monkeypatch, arch, kind, steps, b, vectorise):
    """BatchNorm models (float64): every client's update and its running statistics after its local steps
    are what compute_update gives (train-mode BN for b > 1, the running statistics for a batch of one), in
    both forms: on a CPU the clients train one after another unless vectorise=True asks for vmap."""
    models, x, y = games_and_batches(digits, n=2, k=2, b=b, arch=arch)
    models, x = [m.double() for m in models], x.double()
    calls = []
    real = batched.vmap
    monkeypatch.setattr(batched, "vmap", lambda *a, **k: calls.append(1) or real(*a, **k))
    before = {n: t.clone() for n, t in models[0].state_dict().items()}
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind=kind, local_steps=steps,
                                 local_lr=0.05, buffers=batched.stack_buffers(models), vectorise=vectorise)
    assert bool(calls) == (vectorise is True)
    assert all(torch.equal(t, before[n]) for n, t in models[0].state_dict().items())  # never modified
    for n, m in enumerate(models):
        for k in range(2):
            ref = compute_update(m, x[n, k], y[n, k], kind=kind, local_steps=steps, local_lr=0.05)
            for name, t in ref.tensors.items():
                torch.testing.assert_close(out.tensors[name][n, k], t, **F64_TOL)
            got = batched.unpack(out, n, k, kind=kind, batch_size=b, local_steps=steps, local_lr=0.05, model=m)
            assert got.buffers.keys() == ref.buffers.keys()
            for name, t in ref.buffers.items():
                torch.testing.assert_close(got.buffers[name], t, **F64_TOL)
            moved = any(not torch.equal(t, dict(m.named_buffers())[name]) for name, t in ref.buffers.items())
            assert moved == (b > 1)
    with pytest.raises(ValueError, match="buffers="):
        batched.benign_updates(models[0], batched.stack_parameters(models), x, y)


@pytest.mark.parametrize(("kind", "steps"), [("gradient", 1), ("model_delta", 2)])
def test_client_updates_are_compute_update_of_each_game(digits, kind, steps):
    """The victims' clean updates of a vector step: game i's entry is compute_update(model_i, x_i, y_i) to
    rounding, with the same SharedUpdate fields; fails if games are swapped or a batch is mixed up."""
    models, x, y = games_and_batches(digits, n=3, k=1, b=2)
    xs, ys = list(x[:, 0]), list(y[:, 0])
    out = batched.client_updates(models, xs, ys, kind=kind, local_steps=steps, local_lr=0.05)
    for m, xi, yi, u in zip(models, xs, ys, out):
        ref = compute_update(m, xi, yi, kind=kind, local_steps=steps, local_lr=0.05)
        assert (u.kind, u.batch_size, u.local_steps, u.local_lr) == (ref.kind, ref.batch_size, ref.local_steps,
                                                                      ref.local_lr)
        assert u.tensors.keys() == ref.tensors.keys()
        for name, t in ref.tensors.items():
            torch.testing.assert_close(u.tensors[name], t, **FL_TOL)
    assert not torch.allclose(out[0].tensors["head.weight"], out[1].tensors["head.weight"])
    with pytest.raises(ValueError, match="one architecture"):
        batched.client_updates([models[0], build_model("mlp", digits.spec)], xs[:2], ys[:2])


@pytest.mark.parametrize("b", [1, 2])
def test_client_updates_of_batchnorm_models_carry_their_running_statistics(digits, b):
    models, x, y = games_and_batches(digits, n=3, k=1, b=b, arch="convnet")
    models, x = [m.double() for m in models], x.double()
    out = batched.client_updates(models, list(x[:, 0]), list(y[:, 0]))
    for m, xi, yi, u in zip(models, x[:, 0], y[:, 0], out):
        ref = compute_update(m, xi, yi)
        for name, t in ref.tensors.items():
            torch.testing.assert_close(u.tensors[name], t, **F64_TOL)
        assert u.buffers.keys() == ref.buffers.keys()
        for name, t in ref.buffers.items():
            torch.testing.assert_close(u.buffers[name], t, **F64_TOL)


def test_aggregate_many_is_server_aggregate_bit_for_bit(digits):
    models, x, y = games_and_batches(digits, n=3, k=2)
    updates = [[compute_update(m, x[n, k], y[n, k]) for k in range(2)] for n, m in enumerate(models)]
    victims = [compute_update(m, x[n, 0, :1], y[n, 0, :1]) for n, m in enumerate(models)]
    victims[1].metadata["skipped"] = True  # game 1's victim sent nothing
    params = batched.stack_parameters(models)
    slots = [{name: torch.stack([v.tensors[name] for v in victims]) for name in params}]
    slots += [{name: torch.stack([updates[n][k].tensors[name] for n in range(3)]) for name in params} for k in range(2)]
    weights = torch.tensor([[0.0 if v.metadata.get("skipped") else 1.0, 4.0, 4.0] for v in victims])
    new = batched.aggregate_many(params, slots, weights, step=0.1)
    for n, m in enumerate(models):
        server = Server(copy.deepcopy(m), lr=0.1, eval_x=x[0, 0], eval_y=y[0, 0])
        server.aggregate([victims[n], *updates[n]])
        for name, p in server.model.named_parameters():
            assert torch.equal(new[name][n], p.detach()), (n, name)


def test_average_buffers_many_is_server_aggregate_bit_for_bit(digits):
    """BN running statistics: the example-weighted mean over the updates that carry them, skipped ones out."""
    models, x, y = games_and_batches(digits, n=3, k=2, arch="convnet")
    updates = [[compute_update(m, x[n, k], y[n, k]) for k in range(2)] for n, m in enumerate(models)]
    victims = [compute_update(m, x[n, 0, :2], y[n, 0, :2]) for n, m in enumerate(models)]
    victims[1].metadata["skipped"] = True
    buffers = batched.stack_buffers(models)
    slots = [{name: torch.stack([u.buffers[name] for u in us]) for name in buffers}
             for us in [victims, *([updates[n][k] for n in range(3)] for k in range(2))]]
    weights = torch.tensor([[0.0 if v.metadata.get("skipped") else 2.0, 4.0, 4.0] for v in victims])
    new = batched.average_buffers_many(buffers, slots, weights)
    for n, m in enumerate(models):
        server = Server(copy.deepcopy(m), lr=0.1, eval_x=x[0, 0], eval_y=y[0, 0])
        server.aggregate([victims[n], *updates[n]])
        for name, buf in server.model.named_buffers():
            if buf.is_floating_point():
                assert torch.equal(new[name][n], buf), (n, name)
                assert not torch.equal(buf, dict(m.named_buffers())[name])


@pytest.mark.parametrize(("arch", "b", "optimizer"), [("lenet", 1, None), ("convnet", 2, "adam"), ("convnet", 1, None)])
def test_client_updates_unpack_each_game_as_unpack_does(digits, arch, b, optimizer):
    """client_updates' SharedUpdates (one unbind per name) are unpack's of the same benign_updates output:
    the same views of the stacks, fields, BN buffers with num_batches_tracked, and optimizer metadata."""
    from leakgym.fl.optim import LocalOptimizer

    opt = None if optimizer is None else LocalOptimizer(name=optimizer)
    kind, steps = ("model_delta", 2) if opt is not None else ("gradient", 1)
    models, x, y = games_and_batches(digits, n=3, k=1, b=b, arch=arch)
    params = batched.stack_parameters(models)
    buffers = batched.stack_buffers(models) or None
    out = batched.benign_updates(models[0], params, x, y, kind=kind, local_steps=steps, local_lr=0.05,
                                 buffers=buffers, optimizer=opt)
    got = batched._unpack_games(out, models, [b] * 3, kind=kind, local_steps=steps, local_lr=0.05, optimizer=opt)
    for i, (m, u) in enumerate(zip(models, got)):
        want = batched.unpack(out, i, 0, kind=kind, batch_size=b, local_steps=steps, local_lr=0.05, model=m,
                              optimizer=opt)
        assert (u.kind, u.batch_size, u.local_steps, u.local_lr, u.metadata) == (
            want.kind, want.batch_size, want.local_steps, want.local_lr, want.metadata)
        for mine, theirs in ((u.tensors, want.tensors), (u.buffers or {}, want.buffers or {})):
            assert list(mine) == list(theirs)
            for name, t in theirs.items():
                assert torch.equal(mine[name], t), (i, name)
                assert mine[name].data_ptr() == t.data_ptr() or not t.is_floating_point(), (i, name)  # views
        assert (u.buffers is None) == (want.buffers is None) == (arch == "lenet")
    if opt is not None:
        assert got[0].metadata["local_optimizer"] == opt.describe()
    if arch == "convnet":
        counts = [u.buffers[n] for u in got for n, t in u.buffers.items() if not t.is_floating_point()]
        assert counts and all(int(c) == (steps if b > 1 else 0) + int(c0) for c, c0 in zip(
            counts, [t for m in models for t in m.buffers() if not t.is_floating_point()]))


@pytest.mark.parametrize("arch", ["lenet", "convnet"])
def test_aggregation_with_every_game_the_same_weights_is_server_aggregate_bit_for_bit(digits, arch):
    """The usual round (no victim skipped: one weight row for every game) takes aggregate_many's path
    without gathers; parameters and BN statistics are still Server.aggregate's bit for bit."""
    models, x, y = games_and_batches(digits, n=3, k=2, arch=arch)
    updates = [[compute_update(m, x[n, k], y[n, k]) for k in range(2)] for n, m in enumerate(models)]
    victims = [compute_update(m, x[n, 0, :2], y[n, 0, :2]) for n, m in enumerate(models)]
    params = batched.stack_parameters(models)
    slots = [{name: torch.stack([u.tensors[name] for u in us]) for name in params}
             for us in [victims, *([updates[n][k] for n in range(3)] for k in range(2))]]
    weights = torch.tensor([[2.0, 4.0, 4.0]] * 3)
    new = batched.aggregate_many(params, slots, weights, step=0.1)
    buffers = batched.stack_buffers(models)
    new_buffers = batched.average_buffers_many(buffers, [{name: torch.stack([u.buffers[name] for u in us])
                                                          for name in buffers}
                                                         for us in [victims, *([updates[n][k] for n in range(3)]
                                                                               for k in range(2))]], weights)
    for n, m in enumerate(models):
        server = Server(copy.deepcopy(m), lr=0.1, eval_x=x[0, 0], eval_y=y[0, 0])
        server.aggregate([victims[n], *updates[n]])
        for name, p in server.model.named_parameters():
            assert torch.equal(new[name][n], p.detach()), (n, name)
            assert not torch.equal(p, dict(m.named_parameters())[name])
        for name, buf in server.model.named_buffers():
            if buf.is_floating_point():
                assert torch.equal(new_buffers[name][n], buf), (n, name)
    assert set(new_buffers) == set(buffers) and (arch == "lenet") == (not buffers)


@pytest.mark.parametrize("vectorise", [None, True, False])
def test_evaluate_many_equals_server_evaluate(digits, vectorise):
    models, _, _ = games_and_batches(digits, n=3)
    spec = digits.spec
    ex, ey = spec.normalize(digits.test_x[:100]), digits.test_y[:100]
    acc, loss = batched.evaluate_many(models[0], batched.stack_parameters(models), ex, ey, chunk=2,
                                      vectorise=vectorise)
    per_game = batched.evaluate_many(models[0], batched.stack_parameters(models), [ex] * 3, [ey] * 3,
                                     vectorise=vectorise)
    for n, m in enumerate(models):
        a, lo = Server(m, lr=0.1, eval_x=ex, eval_y=ey).evaluate()
        assert acc[n] == a and per_game[0][n] == a
        assert loss[n] == pytest.approx(lo, rel=FL_TOL["rtol"]) and per_game[1][n] == pytest.approx(lo, rel=1e-5)


def test_evaluate_many_on_a_cpu_takes_the_plain_layers_of_lenet(digits, monkeypatch):
    """DLG's LeNet is evaluated by its layers' functional kernels (RowwiseForward.plain_logits): every
    game's accuracy and loss are exactly those of the functional_call loop (and Server.evaluate's, to
    the rounding of its loss sum)."""
    from leakgym.models.rowwise import RowwiseForward

    models, _, _ = games_and_batches(digits, n=3)
    ex, ey = digits.spec.normalize(digits.test_x[:100]), digits.test_y[:100]
    calls = []
    real = RowwiseForward.plain_logits
    monkeypatch.setattr(RowwiseForward, "plain_logits", lambda self, p, x: calls.append(1) or real(self, p, x))
    acc, loss = batched.evaluate_many(models[0], batched.stack_parameters(models), ex, ey, vectorise=False)
    assert len(calls) == 3
    # A parameter left out of ``params`` comes from the module, as functional_call takes it.
    partial = {k: v for k, v in batched.stack_parameters(models).items() if k != "head.bias"}
    partly = batched.evaluate_many(models[0], partial, ex, ey, vectorise=False)
    assert len(calls) == 3
    monkeypatch.setattr(RowwiseForward, "of", classmethod(lambda cls, model, *fit: None))
    assert batched.evaluate_many(models[0], batched.stack_parameters(models), ex, ey, vectorise=False) == (acc, loss)
    assert batched.evaluate_many(models[0], partial, ex, ey, vectorise=False) == partly
    for n, m in enumerate(models):
        a, lo = Server(m, lr=0.1, eval_x=ex, eval_y=ey).evaluate()
        assert acc[n] == a and loss[n] == pytest.approx(lo, rel=FL_TOL["rtol"])


@pytest.mark.parametrize("shared", [True, False])
def test_small_held_out_sets_take_the_grouped_form_on_a_cpu(digits, monkeypatch, shared):
    """LeNet with at most GROUPED_MAX_POSITIONS pixels per game (12 digits: 3,072) is evaluated a pass of games
    at a time (RowwiseForward.grouped_logits): every game's accuracy equals Server.evaluate's and its loss to
    rounding -- with a held-out set per game, its own; passes bounded by ``chunk`` and EVAL_IMAGES_PER_PASS;
    a diverged game scores 0 without touching the others of its pass. vectorise=False keeps the loop."""
    from leakgym.models.rowwise import RowwiseForward

    models, _, _ = games_and_batches(digits, n=5)
    with torch.no_grad():
        next(models[3].parameters()).fill_(float("nan"))
    spec, params = digits.spec, batched.stack_parameters(models)
    sets = [(spec.normalize(digits.test_x[12 * i: 12 * i + 12]), digits.test_y[12 * i: 12 * i + 12]) for i in range(5)]
    x, y = (sets[0][0], sets[0][1]) if shared else ([s[0] for s in sets], [s[1] for s in sets])
    sizes, real = [], RowwiseForward.grouped_logits

    def counting(self, p, xb, *, shared):
        sizes.append(next(iter(p.values())).shape[0])
        return real(self, p, xb, shared=shared)

    monkeypatch.setattr(RowwiseForward, "grouped_logits", counting)
    acc, loss = batched.evaluate_many(models[0], params, x, y, chunk=2)
    assert sizes == [2, 2, 1]
    for n, m in enumerate(models):
        ex, ey = sets[0] if shared else sets[n]
        a, lo = Server(m, lr=0.1, eval_x=ex, eval_y=ey).evaluate()
        if n == 3:
            assert acc[n] == a == 0.0 and not np.isfinite(loss[n]) and not np.isfinite(lo)
            continue
        assert acc[n] == a and loss[n] == pytest.approx(lo, rel=FL_TOL["rtol"])
    assert len(set(loss)) == 5
    sizes.clear()
    monkeypatch.setattr(batched, "EVAL_IMAGES_PER_PASS", 30)  # 2 games of 12 images per pass
    np.testing.assert_array_equal(batched.evaluate_many(models[0], params, x, y), (acc, loss))  # NaN == NaN
    assert sizes == [2, 2, 1]
    sizes.clear()
    looped = batched.evaluate_many(models[0], params, x, y, vectorise=False)
    assert sizes == [] and looped[0] == acc and looped[1] == pytest.approx(loss, rel=FL_TOL["rtol"], nan_ok=True)
    # more pixels per game than the bound: one game at a time
    monkeypatch.setattr(batched, "GROUPED_MAX_POSITIONS", 11 * 16 * 16)
    np.testing.assert_array_equal(batched.evaluate_many(models[0], params, x, y), looped)
    assert sizes == []


def test_small_held_out_sets_of_batchnorm_models_use_each_games_statistics(digits, monkeypatch):
    """A BatchNorm ConvNet is no plain layer stack: small held-out sets keep the loop on a CPU, with each
    game's running statistics."""
    from leakgym.models.rowwise import RowwiseForward

    monkeypatch.setattr(RowwiseForward, "grouped_logits", lambda *a, **k: pytest.fail("grouped form taken"))
    models, _, _ = games_and_batches(digits, n=3, arch="convnet")
    ex, ey = digits.spec.normalize(digits.test_x[:12]), digits.test_y[:12]
    acc, loss = batched.evaluate_many(models[0], batched.stack_parameters(models), ex, ey,
                                      buffers=batched.stack_buffers(models))
    for n, m in enumerate(models):
        a, lo = Server(m, lr=0.1, eval_x=ex, eval_y=ey).evaluate()
        assert acc[n] == a and loss[n] == pytest.approx(lo, rel=1e-5)
    assert len(set(loss)) == 3


@pytest.mark.parametrize("shared", [True, False])
def test_evaluate_many_bounds_the_images_of_a_vectorised_pass(digits, monkeypatch, shared):
    """A pass holds every layer's activations of all its images (32 CIFAR ConvNets x 1,000 images peaked
    at 29 GB on an H100): with at most 250 images per pass, 100 images per game make passes of 2 games,
    and 300 images (more than the bound) passes of one game; the results do not change."""
    models, _, _ = games_and_batches(digits, n=3)
    params = batched.stack_parameters(models)
    sizes, real_vmap = [], batched.vmap

    def counting_vmap(fn, in_dims):
        def run(part, xb):
            sizes.append(next(iter(part.values())).shape[0])
            return real_vmap(fn, in_dims=in_dims)(part, xb)
        return run

    for n_images, expected in ((100, [2, 1]), (300, [1, 1, 1])):
        ex, ey = digits.spec.normalize(digits.test_x[:n_images]), digits.test_y[:n_images]
        x, y = (ex, ey) if shared else ([ex] * 3, [ey] * 3)
        one_pass = batched.evaluate_many(models[0], params, x, y, vectorise=True)
        monkeypatch.setattr(batched, "EVAL_IMAGES_PER_PASS", 250)
        monkeypatch.setattr(batched, "vmap", counting_vmap)
        sizes.clear()
        bounded = batched.evaluate_many(models[0], params, x, y, vectorise=True)
        monkeypatch.undo()
        assert sizes == expected
        assert bounded[0] == one_pass[0] and bounded[1] == pytest.approx(one_pass[1], rel=1e-6)


@pytest.mark.parametrize("grouped", [True, False])
def test_evaluate_many_reads_its_results_once_whatever_its_passes(digits, monkeypatch, grouped):
    """On an accelerator a read of a result makes the host wait for the device: the passes' counts and
    loss sums stay on the device and come to the host in one read after the last pass (two reads per
    pass before), with the same values as passes of every size."""
    models, _, _ = games_and_batches(digits, n=3)
    params = batched.stack_parameters(models)
    ex, ey = digits.spec.normalize(digits.test_x[:16]), digits.test_y[:16]
    vectorise = None if grouped else True  # None on a CPU: LeNet's grouped form for 16 small images
    one_pass = batched.evaluate_many(models[0], params, ex, ey, vectorise=vectorise)
    reads, real_tolist = [], torch.Tensor.tolist

    def counting_tolist(self):
        reads.append(tuple(self.shape))
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    per_game = batched.evaluate_many(models[0], params, ex, ey, chunk=1, vectorise=vectorise)
    monkeypatch.undo()
    assert reads == [(2, 3)]
    assert per_game[0] == one_pass[0] and per_game[1] == pytest.approx(one_pass[1], rel=1e-6)


@pytest.mark.cuda
def test_evaluate_many_on_cuda_waits_for_the_device_once(digits, cuda_device):
    """Passes of one game each: the host reads the results once, not once per pass (sync debug mode
    counts each wait for the device)."""
    import warnings

    models, _, _ = games_and_batches(digits, n=4)
    params = {k: v.to(cuda_device) for k, v in batched.stack_parameters(models).items()}
    model = models[0].to(cuda_device)
    ex, ey = digits.spec.normalize(digits.test_x[:40]).to(cuda_device), digits.test_y[:40].to(cuda_device)

    def waits(chunk):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batched.evaluate_many(model, params, ex, ey, chunk=chunk)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    assert waits(1) == waits(4) >= 1


@pytest.mark.parametrize("vectorise", [True, False])
def test_a_diverged_model_scores_zero_accuracy(digits, vectorise):
    """NaN weights give NaN logits, whose arg-max is an index all the same (the first NaN): such a
    model used to score the share of that class (~10%), which rewarded a defender for an accuracy the
    model does not have. Server.evaluate and evaluate_many count non-finite logits as wrong."""
    models, _, _ = games_and_batches(digits, n=2)
    with torch.no_grad():
        next(models[1].parameters()).fill_(float("nan"))
    ex, ey = digits.spec.normalize(digits.test_x[:100]), digits.test_y[:100]
    a, lo = Server(models[1], lr=0.1, eval_x=ex, eval_y=ey).evaluate()
    assert a == 0.0 and not np.isfinite(lo)
    acc, loss = batched.evaluate_many(models[0], batched.stack_parameters(models), ex, ey, vectorise=vectorise)
    assert acc[1] == 0.0 and not np.isfinite(loss[1])
    assert acc[0] == Server(models[0], lr=0.1, eval_x=ex, eval_y=ey).evaluate()[0] > 0.0


@pytest.mark.parametrize("vectorise", [True, False])
def test_evaluate_many_uses_each_games_batchnorm_statistics(digits, vectorise):
    models, _, _ = games_and_batches(digits, n=3, arch="convnet")
    ex, ey = digits.spec.normalize(digits.test_x[:64]), digits.test_y[:64]
    acc, loss = batched.evaluate_many(models[0], batched.stack_parameters(models), ex, ey,
                                      buffers=batched.stack_buffers(models), vectorise=vectorise)
    for n, m in enumerate(models):
        a, lo = Server(m, lr=0.1, eval_x=ex, eval_y=ey).evaluate()
        assert acc[n] == pytest.approx(a, abs=1 / 64) and loss[n] == pytest.approx(lo, rel=1e-4)
    assert len(set(loss)) == 3


def test_supports_deterministic_models_with_at_most_batchnorm_state(digits):
    spec = digits.spec
    assert batched.supports(build_model("lenet", spec))
    assert batched.supports(build_model("convnet", spec))  # BatchNorm running statistics: handled
    assert not batched.supports(build_model("lenet", spec, precode=True))  # samples from the global RNG
    cumulative = build_model("convnet", spec)
    next(m for m in cumulative.modules() if isinstance(m, torch.nn.BatchNorm2d)).momentum = None
    assert not batched.supports(cumulative)  # a cumulative average is not the formula batched.py applies
    with pytest.raises(ValueError, match="dropout, a PRECODE bottleneck"):
        model = build_model("lenet", spec, precode=True)
        batched.benign_updates(model, batched.stack_parameters([model]), torch.zeros(1, 1, 2, *spec.shape),
                               torch.zeros(1, 1, 2, dtype=torch.int64))


def _games(cheap_overrides, n, **extra):
    games = GameBatch(load_scenario("digits", **dict(cheap_overrides, num_clients=3, **extra)), n)
    for i in range(n):
        # the game seeds a parallel env reset with seed 20 + i plays (this test's seeds before leakgym.game):
        # a ConvNet game seeded 21 directly has a BatchNorm channel that amplifies the batched kernels'
        # rounding to 1e-3 in a round (measured the same before leakgym.game)
        games.reset(i, seed=int(np.random.default_rng(20 + i).integers(2**31 - 1)))
    return games


def _defended(games, skip=()):
    sc, rows = games.scenario, list(range(games.size))
    zero = (np.zeros(len(sc.defender_nvec), np.int64), np.zeros(len(sc.attacker_nvec), np.int64))
    out = game_round.defend(games, rows, game_round.plan(games, rows, [zero] * games.size), batch_clients=False)
    for i in skip:
        out[i].update.metadata["skipped"] = True
    return out


def never_alone(monkeypatch, games):
    """The batched aggregation of ``games`` must not fall back to the client-by-client path (also used by
    tests/test_fl_optim.py)."""
    real = game_round._aggregate_alone

    def guarded(batch, *args, **kwargs):
        if batch is games:
            pytest.fail("the batched aggregation fell back to the game-by-game path")
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(game_round, "_aggregate_alone", guarded)


@pytest.mark.parametrize(("model", "eval_size"), [("lenet", 32), ("lenet", 16), ("convnet", 32)])
def test_the_batched_aggregation_equals_the_game_by_game_one(cheap_overrides, model, eval_size, monkeypatch):
    """Three rounds of three games: same draws, same rounds; models (BN running statistics included) and
    test losses equal to rounding. LeNet on 16 held-out digits is evaluated in the grouped form on a CPU
    (GROUPED_MAX_POSITIONS), on 32 one game at a time."""
    cheap_overrides["eval_size"] = eval_size
    loop, batch = _games(cheap_overrides, 3, model=model), _games(cheap_overrides, 3, model=model)
    never_alone(monkeypatch, batch)  # (BatchNorm included)
    grouped = []  # the evaluations in the grouped form (no_grad; the clients' grouped_loss trains with grad)
    real = RowwiseForward.grouped_logits
    monkeypatch.setattr(RowwiseForward, "grouped_logits", lambda self, *a, **k: (
        None if torch.is_grad_enabled() else grouped.append(1)) or real(self, *a, **k))
    rows = [0, 1, 2]
    for _ in range(3):
        d_loop, d_batch = _defended(loop, skip=(1,)), _defended(batch, skip=(1,))
        game_round.aggregate(loop, rows, d_loop, batch_clients=False)
        game_round.aggregate(batch, rows, d_batch, batch_clients=True)
        for i, d in enumerate(d_batch):
            assert loop.round[i] == batch.round[i]
            assert loop.rngs[i].bit_generator.state == batch.rngs[i].bit_generator.state
            assert loop.accuracy[i] == batch.accuracy[i]
            tol = FL_TOL if model == "lenet" else BN_TOL
            assert batch.test_loss[i] == pytest.approx(loop.test_loss[i], rel=tol["rtol"])
            for (name, pa), (_, pb) in zip(loop.model(i).state_dict().items(), batch.model(i).state_dict().items()):
                torch.testing.assert_close(pa, pb, **tol)
            assert d.timings["fl_s"] > 0
    assert bool(grouped) == (model == "lenet" and eval_size == 16)


def test_the_batched_aggregation_leaves_the_victim_out_of_a_parameter_its_update_lacks(cheap_overrides):
    """A victim's update that lacks a parameter (here the head's bias): that game's mean over the name
    leaves the victim out (Server.aggregate's per-name rule), with the benign clients pooled or not."""
    loop, batch = _games(cheap_overrides, 2), _games(cheap_overrides, 2)
    for _ in range(2):
        d_loop, d_batch = _defended(loop), _defended(batch)
        for d in (d_loop[0], d_batch[0]):
            del d.update.tensors["head.bias"]
        game_round.aggregate(loop, [0, 1], d_loop, batch_clients=False)
        game_round.aggregate(batch, [0, 1], d_batch, batch_clients=True)
        for i in range(2):
            assert loop.accuracy[i] == batch.accuracy[i]
            for (name, pa), (_, pb) in zip(loop.model(i).state_dict().items(), batch.model(i).state_dict().items()):
                torch.testing.assert_close(pa, pb, **FL_TOL)


@pytest.mark.cuda
def test_batched_fl_on_cuda(digits, cuda_device):
    models, x, y = games_and_batches(digits, device=str(cuda_device))
    params = batched.stack_parameters(models)
    out = batched.benign_updates(models[0], params, x, y)
    assert all(t.device.type == "cuda" for t in out.tensors.values())
    ref = compute_update(models[1], x[1, 1], y[1, 1])
    for name, t in ref.tensors.items():
        torch.testing.assert_close(out.tensors[name][1, 1], t, **CUDA_TOL)
    ex, ey = x[0, 0], y[0, 0]
    acc, loss = batched.evaluate_many(models[0], params, ex, ey)
    a, lo = Server(models[2], lr=0.1, eval_x=ex, eval_y=ey).evaluate()
    assert acc[2] == pytest.approx(a, abs=0.05) and loss[2] == pytest.approx(lo, rel=1e-3)
    slots = [{n: t[:, 0] for n, t in out.tensors.items()}]
    new = batched.aggregate_many(params, slots, torch.ones(3, 1), step=0.1)
    assert all(t.device.type == "cuda" for t in new.values())
    victims = batched.client_updates(models, list(x[:, 0]), list(y[:, 0]))
    ref = compute_update(models[2], x[2, 0], y[2, 0])
    for name, t in ref.tensors.items():
        assert victims[2].tensors[name].device.type == "cuda"
        torch.testing.assert_close(victims[2].tensors[name], t, **CUDA_TOL)


@pytest.mark.cuda
def test_rowwise_clients_on_cuda(digits, cuda_device):
    """One image per client: LeNet's clients are row-wise on CUDA too, and equal compute_update there."""
    models, x, y = games_and_batches(digits, b=1, device=str(cuda_device))
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, kind="model_delta",
                                 local_steps=2, local_lr=0.05)
    for n, m in enumerate(models):
        ref = compute_update(m, x[n, 1], y[n, 1], kind="model_delta", local_steps=2, local_lr=0.05)
        for name, t in ref.tensors.items():
            assert out.tensors[name].device.type == "cuda"
            torch.testing.assert_close(out.tensors[name][n, 1], t, **CUDA_TOL)


@pytest.mark.cuda
def test_batched_fl_with_batchnorm_on_cuda(digits, cuda_device, monkeypatch):
    """ConvNet clients (train-mode BN, running statistics) and evaluation with per-game statistics on CUDA,
    in float64 as the CPU client tests: in float32 the TF32 convolutions' rounding, magnified by BatchNorm's
    division by a batch of four's deviation, put the two paths 0.04 apart (measured on an H200). On an
    accelerator the clients are vmapped (a CPU trains them one after another)."""
    models, x, y = games_and_batches(digits, n=2, device=str(cuda_device), arch="convnet")
    models, x = [m.double() for m in models], x.double()
    buffers = batched.stack_buffers(models)
    calls = []
    real = batched.vmap
    monkeypatch.setattr(batched, "vmap", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = batched.benign_updates(models[0], batched.stack_parameters(models), x, y, buffers=buffers)
    assert calls
    assert all(t.device.type == "cuda" for t in [*out.tensors.values(), *out.buffers.values()])
    ref = compute_update(models[1], x[1, 0], y[1, 0])
    got = batched.unpack(out, 1, 0, kind="gradient", batch_size=x.shape[2], local_steps=1, local_lr=0.1,
                         model=models[1])
    for name, t in [*ref.tensors.items(), *ref.buffers.items()]:
        torch.testing.assert_close((got.tensors | got.buffers)[name], t, **F64_CUDA_TOL)
    acc, loss = batched.evaluate_many(models[0], batched.stack_parameters(models), x[0, 0], y[0, 0], buffers=buffers)
    a, lo = Server(models[1], lr=0.1, eval_x=x[0, 0], eval_y=y[0, 0]).evaluate()
    assert loss[1] == pytest.approx(lo, rel=1e-3) and acc[1] == pytest.approx(a, abs=1 / 8)


def test_server_and_benign_updates_check_their_numbers(digits):
    """Found in review: Server took lr=nan/inf and an empty held-out set (ZeroDivisionError at the first
    evaluation); benign_updates took local_lr=-0.1, which compute_update refuses."""
    model = build_model("lenet", digits.spec)
    ex, ey = digits.spec.normalize(digits.test_x[:8]), digits.test_y[:8]
    for lr in (float("nan"), float("inf"), 0.0, True):
        with pytest.raises(ValueError, match=r"server lr=.*allowed range \(0, inf\)"):
            Server(model, lr=lr, eval_x=ex, eval_y=ey)
    with pytest.raises(ValueError, match="needs >= 1 image and one label per image; got 0 images"):
        Server(model, lr=0.1, eval_x=ex[:0], eval_y=ey[:0])
    models, xs, ys = games_and_batches(digits, n=2)
    with pytest.raises(ValueError, match=r"local_lr=-0.1; allowed range \(0, inf\)"):
        batched.benign_updates(models[0], batched.stack_parameters(models), xs, ys, kind="model_delta",
                               local_steps=1, local_lr=-0.1)


def test_batchnorm_settings_are_part_of_the_signature(digits):
    """The stateless copy behind benign_updates was cached by class and parameter shapes only: a ConvNet
    whose BatchNorm eps differs from the cached one's was computed with the cached eps (gradients off by
    up to 3.6, helper review). Its submodules' settings are part of the signature now."""
    models, x, y = games_and_batches(digits, n=2, k=1, b=3, arch="convnet")
    batched.benign_updates(models[0], batched.stack_parameters(models), x, y,
                           buffers=batched.stack_buffers(models))  # fills the cache
    other = [copy.deepcopy(m) for m in models]
    for m in other:
        for layer in m.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.eps = 0.5
    assert batched.signature(other[0]) != batched.signature(models[0])
    out = batched.benign_updates(other[0], batched.stack_parameters(other), x, y, buffers=batched.stack_buffers(other))
    for n, m in enumerate(other):
        ref = compute_update(m, x[n, 0], y[n, 0])
        for name, t in ref.tensors.items():
            torch.testing.assert_close(out.tensors[name][n, 0], t, **BN_TOL)


def test_aggregation_weights_are_checked_and_a_zero_weight_leaves_its_update_out(digits):
    """Server.aggregate summed 0 * NaN into the mean and took negative weights; aggregate_many dropped a
    negative weight silently. Both refuse weights that are not finite and >= 0, and leave a 0 out."""
    from leakgym.fl.update import SharedUpdate

    models, _, _ = games_and_batches(digits, n=1)
    model = models[0]
    ex, ey = digits.spec.normalize(digits.test_x[:8]), digits.test_y[:8]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    good = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
    poisoned = {n: torch.full_like(p, float("nan")) for n, p in model.named_parameters()}
    updates = [SharedUpdate(tensors=good, batch_size=2), SharedUpdate(tensors=poisoned, batch_size=3)]
    server = Server(model, lr=0.1, eval_x=ex, eval_y=ey)
    server.aggregate(updates, weights=[2.0, 0.0])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.equal(p, before[n] - 0.1 * 0.5) for n, p in model.named_parameters())
    for bad in ([1.0, -1.0], [1.0, float("nan")], [float("inf"), 1.0]):
        with pytest.raises(ValueError, match=r"aggregation weights .*; allowed: finite numbers >= 0"):
            server.aggregate(updates, weights=bad)
        stacked = {n: p.detach().unsqueeze(0) for n, p in model.named_parameters()}
        slots = [{n: t.unsqueeze(0) for n, t in u.tensors.items()} for u in updates]
        with pytest.raises(ValueError, match=r"aggregation weights .*; allowed: finite numbers >= 0"):
            batched.aggregate_many(stacked, slots, torch.tensor([bad], dtype=torch.float64), step=0.1)


def test_evaluation_keeps_every_submodules_mode_and_takes_sets_of_any_size(digits):
    """Server.evaluate and evaluate_many restored the top-level mode only (a BatchNorm layer held in eval
    mode came back in train mode, also after an exception); the vectorised evaluate_many stacked the
    per-game held-out sets and failed when their sizes differed; an empty set divided by zero."""
    models, _, _ = games_and_batches(digits, n=2, arch="convnet")
    model = models[0]
    ex, ey = digits.spec.normalize(digits.test_x[:20]), digits.test_y[:20]
    model.train()
    held = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    held.eval()
    modes = [m.training for m in model.modules()]
    Server(model, lr=0.1, eval_x=ex, eval_y=ey).evaluate()
    assert [m.training for m in model.modules()] == modes
    with pytest.raises(IndexError):
        Server(model, lr=0.1, eval_x=ex, eval_y=ey.clone().fill_(99)).evaluate()
    assert [m.training for m in model.modules()] == modes
    params, buffers = batched.stack_parameters(models), batched.stack_buffers(models)
    for vectorise in (False, True):
        acc, loss = batched.evaluate_many(model, params, [ex, ex[:5]], [ey, ey[:5]], buffers=buffers,
                                          vectorise=vectorise)
        assert [m.training for m in model.modules()] == modes
        for i, (xs, ys) in enumerate(((ex, ey), (ex[:5], ey[:5]))):
            a, lo = Server(models[i], lr=0.1, eval_x=xs, eval_y=ys).evaluate()
            assert acc[i] == pytest.approx(a) and loss[i] == pytest.approx(lo, rel=1e-5)
        with pytest.raises(ValueError, match="every held-out set needs >= 1 image"):
            batched.evaluate_many(model, params, [ex, ex[:0]], [ey, ey[:0]], buffers=buffers, vectorise=vectorise)
    with pytest.raises(ValueError, match="batch_size=0; allowed: integers >= 1"):
        Server(model, lr=0.1, eval_x=ex, eval_y=ey).evaluate(batch_size=0)


def test_client_arguments_and_labels_are_checked_before_training(digits):
    """compute_update took local_lr=inf (a non-finite update), local_steps=True and batch_size=2.7 (recorded
    as 2), and labels outside the classes reached cross-entropy (an IndexError; on a GPU a device-side
    assert that ends the CUDA context)."""
    model = build_model("lenet", digits.spec)
    x, y = digits.spec.normalize(digits.train_x[:2]), digits.train_y[:2]
    for kwargs, message in (({"kind": "model_delta", "local_lr": float("inf")}, r"local_lr=inf; allowed range"),
                            ({"kind": "model_delta", "local_steps": True}, "local_steps=True; allowed"),
                            ({"batch_size": 2.7}, "batch_size=2.7; allowed: integers >= 1"),
                            ({"batch_size": 0}, "batch_size=0; allowed")):
        with pytest.raises(ValueError, match=message):
            compute_update(model, x, y, **kwargs)
    for labels, span in (([3, 10], "3..10"), ([3, -1], "-1..3")):
        with pytest.raises(ValueError, match=rf"client 0: labels span {span}; allowed: 0..9"):
            compute_update(model, x, torch.tensor(labels))


def test_one_protocol_per_aggregation_and_detached_updates_own_their_buffers(digits):
    """Server.aggregate took the server step from the first update's kind, whatever the others' were;
    SharedUpdate.detached() shared its BN buffers with the original."""
    from leakgym.fl.update import SharedUpdate

    model = build_model("lenet", digits.spec)
    zeros = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    server = Server(model, lr=0.1, eval_x=digits.spec.normalize(digits.test_x[:4]), eval_y=digits.test_y[:4])
    with pytest.raises(ValueError, match=r"updates of kinds \['gradient', 'model_delta'\] in one aggregation"):
        server.aggregate([SharedUpdate(tensors=zeros), SharedUpdate(tensors=zeros, kind="model_delta", local_lr=0.1)])
    update = SharedUpdate(tensors=zeros, buffers={"bn.running_mean": torch.zeros(3)})
    copy_ = update.detached()
    update.buffers["bn.running_mean"].add_(1.0)
    assert torch.equal(copy_.buffers["bn.running_mean"], torch.zeros(3))


@pytest.mark.parametrize(("kind", "steps"), [("gradient", 1), ("model_delta", 2)])
def test_benign_updates_in_passes_of_a_few_games_equal_one_pass(digits, monkeypatch, kind, steps):
    """The vmapped clients (vectorise=True; an accelerator's form for them) run at most CLIENT_POSITIONS_PER_PASS
    image positions per pass (the CIFAR ConvNet's clients held about 370 MB per game): BatchNorm ConvNets (float64, running statistics included) in passes of
    one and of two games give what one pass gives, in game order."""
    models, x, y = games_and_batches(digits, n=3, arch="convnet")
    models, x = [m.double() for m in models], x.double()
    params, buffers = batched.stack_parameters(models), batched.stack_buffers(models)

    def run():
        return batched.benign_updates(models[0], params, x, y, kind=kind, local_steps=steps, local_lr=0.05,
                                      buffers=buffers, vectorise=True)

    whole = run()
    positions = x.shape[1] * x.shape[2] * x.shape[-2] * x.shape[-1]
    calls = []
    real = batched.vmap
    monkeypatch.setattr(batched, "vmap", lambda *a, **k: calls.append(1) or real(*a, **k))
    for games in (1, 2):
        monkeypatch.setattr(batched, "CLIENT_POSITIONS_PER_PASS", games * positions)
        calls.clear()
        parts = run()
        assert len(calls) == 2 * -(-3 // games)  # (two vmaps per pass: clients, then games)
        for name in whole.tensors:
            torch.testing.assert_close(parts.tensors[name], whole.tensors[name], **F64_TOL)
        for name in whole.buffers:
            torch.testing.assert_close(parts.buffers[name], whole.buffers[name], **F64_TOL)

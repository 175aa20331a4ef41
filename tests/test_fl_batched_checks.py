"""The N-game client updates and rounds (leakgym.fl.batched.benign_updates, client_updates,
leakgym.fl.rounds.aggregate_round) check their arguments as compute_update does, and aggregate_round
aggregates what Server.aggregate aggregates, BatchNorm statistics a victim sent for some layers only
included. Found by an audit."""

from __future__ import annotations

import copy

import pytest
import torch

from leakgym.data.spec import DatasetSpec
from leakgym.fl import batched
from leakgym.fl.client import compute_update
from leakgym.fl.rounds import aggregate_round
from leakgym.fl.server import Server
from leakgym.models import build_model

SPEC = DatasetSpec("digits", 1, 16, 10, (0.5,), (0.5,))


def _batches(n: int, k: int, b: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, b, *SPEC.shape, generator=g), torch.randint(0, 10, (n, k, b), generator=g)


def _round(models, victims, x, y, **kwargs):
    buffers = batched.stack_buffers(models) or None
    return aggregate_round(models[0], batched.stack_parameters(models), buffers, victims, x, y, kind="gradient",
                           local_steps=1, local_lr=0.1, server_lr=0.3, models=models, **kwargs)


@pytest.mark.parametrize("arch", ["lenet", "convnet"])
@pytest.mark.parametrize("label", [-100, -1, 10])
def test_labels_outside_the_classes_are_refused_on_every_path(arch, label):
    """-100 (cross-entropy's ignore index) left the example out of the row-wise clients and not of the vmapped
    ones (different updates for one input); 10 and -1 were a bare IndexError (on a GPU a device-side assert)."""
    width = 4 if arch == "lenet" else 2
    models = [build_model(arch, SPEC, width=width, seed=s) for s in range(3)]
    params, buffers = batched.stack_parameters(models), batched.stack_buffers(models) or None
    x, y = _batches(3, 2, 4)
    y[2, 1, 3] = label
    span = f"{min(label, int(y[2, 1].min()))}..{max(label, int(y[2, 1].max()))}"
    message = rf"game 2, client 1: labels span {span}; allowed: 0..9"
    for vectorise in (None, True, False):
        with pytest.raises(ValueError, match=message):
            batched.benign_updates(models[0], params, x, y, buffers=buffers, vectorise=vectorise)
    with pytest.raises(ValueError, match=message):
        _round(models, [compute_update(m, x[i, 0], _batches(3, 2, 4)[1][i, 0]) for i, m in enumerate(models)], x, y)
    with pytest.raises(ValueError, match=rf"game 2, client 0: labels span {span}; allowed: 0..9"):
        batched.client_updates(models, list(x[:, 1]), list(y[:, 1]))
    with pytest.raises(ValueError, match=r"client 0: labels span"):  # the one-client check, for comparison
        compute_update(models[2], x[2, 1], y[2, 1])


def test_the_labels_of_all_games_are_checked_in_one_reduction(monkeypatch):
    """One min/max over the stacked labels of every game and client (one host read per call; on a GPU no
    synchronisation per game), also when the games' training runs in several passes."""
    calls = []
    check = batched.check_labels

    def spy(labelled, where):
        calls.append([tuple(y.shape) for _, y in labelled])
        return check(labelled, where)

    monkeypatch.setattr(batched, "check_labels", spy)
    monkeypatch.setattr(batched, "CLIENT_POSITIONS_PER_PASS", 2 * 2 * 16 * 16)  # two games a pass
    models = [build_model("convnet", SPEC, width=2, seed=s) for s in range(5)]
    x, y = _batches(5, 2, 2)
    batched.benign_updates(models[0], batched.stack_parameters(models), x, y, buffers=batched.stack_buffers(models),
                           vectorise=True)
    assert calls == [[(5, 2, 2)]]
    calls.clear()
    soft = torch.softmax(torch.randn(5, 2, 2, 10), dim=-1)  # soft labels: nothing to check, nothing read
    batched.benign_updates(models[0], batched.stack_parameters(models), x, soft, buffers=batched.stack_buffers(models))
    assert calls == [[(5, 2, 2, 10)]]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "model_delta", "local_steps": True}, "local_steps=True; allowed: integers >= 1"),  # 1 step
    ({"kind": "model_delta", "local_lr": True}, r"local_lr=True; allowed range \(0, inf\)"),  # lr 1
    ({"local_lr": True}, r"local_lr=True; allowed range \(0, inf\)"),
    ({"kind": "model_delta", "local_steps": 2.0}, "local_steps=2.0; allowed: integers >= 1"),
    ({"kind": "model_delta", "local_lr": float("nan")}, r"local_lr=nan; allowed range \(0, inf\)"),
    ({"kind": "model_delta", "local_lr": "0.1"}, r"local_lr='0.1'; allowed range \(0, inf\)"),  # a TypeError
    ({"local_steps": 2}, "local_steps=2 with kind='gradient'; FedSGD takes exactly 1 step"),
    ({"kind": "fedprox"}, "kind='fedprox'; allowed: 'gradient', 'model_delta'"),
    ({"optimizer": "adam", "kind": "model_delta"}, "optimizer='adam'; allowed: a leakgym.fl.optim.LocalOptimizer"),
])
def test_the_protocol_is_checked_as_compute_update_checks_it(kwargs, message):
    """benign_updates took local_steps=True and local_lr=True (as 1), which compute_update refuses: one check
    (leakgym.fl.batched.check_protocol) with compute_update's message, on every N-game path."""
    models = [build_model("lenet", SPEC, width=4, seed=s) for s in range(2)]
    x, y = _batches(2, 1, 3)
    with pytest.raises(ValueError) as plain:
        compute_update(models[0], x[0, 0], y[0, 0], **kwargs)
    assert plain.match(message)
    with pytest.raises(ValueError) as many:
        batched.benign_updates(models[0], batched.stack_parameters(models), x, y, **kwargs)
    assert str(many.value) == str(plain.value)
    with pytest.raises(ValueError) as each:
        batched.client_updates(models, list(x[:, 0]), list(y[:, 0]), **kwargs)
    assert str(each.value) == str(plain.value)
    kwargs = {"kind": "gradient", "local_steps": 1, "local_lr": 0.1, **kwargs}
    with pytest.raises(ValueError) as rounds:
        aggregate_round(models[0], batched.stack_parameters(models), None,
                        [compute_update(m, x[i, 0], y[i, 0]) for i, m in enumerate(models)], x, y, server_lr=0.3,
                        models=models, **kwargs)
    assert str(rounds.value) == str(plain.value)


def test_a_victim_with_some_batchnorm_statistics_is_aggregated_as_server_aggregate_does():
    """aggregate_round raised KeyError('body.bn1.running_mean') when a victim's update carried the statistics
    of some BatchNorm layers only; Server.aggregate averages each statistic over the updates that carry it."""
    models = [build_model("convnet", SPEC, width=2, seed=s) for s in range(4)]
    with torch.no_grad():  # distinct running statistics per game
        for s, m in enumerate(models):
            for buf in m.buffers():
                if buf.is_floating_point():
                    buf.add_(0.1 * (s + 1))
    x, y = _batches(4, 2, 3, seed=1)
    vx, vy = _batches(4, 1, 3, seed=2)
    victims = [compute_update(m, vx[i, 0], vy[i, 0]) for i, m in enumerate(models)]
    victims[0].buffers = {n: t for n, t in victims[0].buffers.items() if n.startswith("body.bn0.")}  # some layers
    victims[1].buffers = {n: t for n, t in victims[1].buffers.items() if not n.startswith("body.bn3.")}
    victims[2].buffers = None  # none
    expected = copy.deepcopy(models)
    for i, m in enumerate(expected):
        server = Server(m, lr=0.3, eval_x=x[0, 0], eval_y=y[0, 0])
        server.aggregate([victims[i]] + [compute_update(m, x[i, k], y[i, k]) for k in range(2)])
    result = _round(models, victims, x, y)
    assert result.kept == [0, 1, 2, 3] and not result.alone
    for i, m in enumerate(expected):
        state = dict(m.named_parameters()) | {n: b for n, b in m.named_buffers() if b.is_floating_point()}
        assert set(result.state) == set(state)
        for name, t in state.items():
            assert torch.equal(result.state[name][i], t), (i, name)  # bit for bit (the CPU's looped clients)


def test_numpy_numbers_are_protocol_numbers():
    """local_lr=np.float32(0.1) and local_steps=np.int64(2) were refused with a message saying numbers are allowed
    (benign_updates took the float before its check was shared)."""
    import numpy as np

    models = [build_model("lenet", SPEC, width=4, seed=s) for s in range(2)]
    x, y = _batches(2, 1, 3)
    kwargs = {"kind": "model_delta", "local_steps": np.int64(2), "local_lr": np.float32(0.1)}
    want = compute_update(models[0], x[0, 0], y[0, 0], kind="model_delta", local_steps=2, local_lr=float(np.float32(0.1)))
    got = compute_update(models[0], x[0, 0], y[0, 0], **kwargs)
    assert all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors)
    batched.benign_updates(models[0], batched.stack_parameters(models), x, y, **kwargs)

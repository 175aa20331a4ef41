"""compute_update: FedSGD gradient, FedAvg model delta, per-step transforms, no mutation of the model."""

from __future__ import annotations

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.fl.client import compute_update
from leakgym.models import build_model, task_loss

SPEC = dataset_spec("digits", image_size=16)


def _batch(n: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_fedsgd_gradient_equals_autograd_and_model_untouched():
    model = build_model("lenet", SPEC, seed=0)
    model.eval()
    x, y = _batch()
    before = _state(model)
    upd = compute_update(model, x, y)
    loss = task_loss(model, x, y)
    ref = torch.autograd.grad(loss, list(model.parameters()))
    assert upd.kind == "gradient" and upd.batch_size == 3 and upd.buffers is None
    assert list(upd.tensors) == [n for n, _ in model.named_parameters()]
    for (name, _), g in zip(model.named_parameters(), ref):
        torch.testing.assert_close(upd.tensors[name], g, rtol=0, atol=0)
    assert not model.training  # mode restored (the work happened on a copy)
    for k, v in _state(model).items():
        assert torch.equal(v, before[k]), k


def test_fedavg_delta_equals_manual_sgd_steps():
    model = build_model("lenet", SPEC, seed=1)
    x, y = _batch(4, seed=1)
    upd = compute_update(model, x, y, kind="model_delta", local_steps=3, local_lr=0.05)
    manual = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    w0 = {n: p.detach().clone() for n, p in manual.items()}
    for _ in range(3):
        loss = task_loss(model, x, y, params=manual)
        grads = torch.autograd.grad(loss, list(manual.values()))
        manual = {n: (p - 0.05 * g).detach().requires_grad_(True) for (n, p), g in zip(manual.items(), grads)}
    assert upd.kind == "model_delta" and upd.local_steps == 3 and upd.local_lr == 0.05
    for n, w in w0.items():
        torch.testing.assert_close(upd.tensors[n], w - manual[n].detach(), rtol=1e-5, atol=1e-7)


def test_batchnorm_model_buffers_shared_but_model_untouched_and_single_example_works():
    model = build_model("convnet", SPEC, seed=0)
    before = _state(model)
    x, y = _batch(1)
    upd = compute_update(model, x, y)  # B = 1: BN must run on running statistics (eval) not fail
    assert upd.buffers is not None and set(before) >= set(upd.buffers)
    x2, y2 = _batch(4)
    upd2 = compute_update(model, x2, y2)
    # B = 4 trains BN with batch statistics: the shared running mean moved, the model's did not.
    name = next(k for k in upd2.buffers if k.endswith("running_mean"))
    assert not torch.equal(upd2.buffers[name], before[name])
    for k, v in _state(model).items():
        assert torch.equal(v, before[k]), k


def test_gradient_transform_is_called_every_local_step_with_current_model():
    model = build_model("lenet", SPEC, seed=2)
    x, y = _batch(2)
    seen = []

    def halve(work, xb, yb, grad, *, step):
        seen.append((step, float(next(work.parameters()).detach().sum())))
        return {k: 0.5 * v for k, v in grad.items()}

    full = compute_update(model, x, y, kind="model_delta", local_steps=1, local_lr=0.1)
    half = compute_update(model, x, y, kind="model_delta", local_steps=1, local_lr=0.1, gradient_transform=halve)
    for k in full.tensors:
        torch.testing.assert_close(half.tensors[k], 0.5 * full.tensors[k])
    seen.clear()
    compute_update(model, x, y, kind="model_delta", local_steps=3, gradient_transform=halve)
    assert [s for s, _ in seen] == [0, 1, 2]
    assert len({v for _, v in seen}) == 3  # the working model moves between steps


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "delta"}, "kind='delta'"),
        ({"local_steps": 0, "kind": "model_delta"}, "local_steps=0"),
        ({"local_steps": 2}, "FedSGD takes exactly 1 step"),
        ({"local_lr": 0.0, "kind": "model_delta"}, "local_lr=0.0"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(kwargs, match):
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(2)
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        compute_update(model, x, y, **kwargs)


# --- several clients: compute_updates, client by client or as one vmapped cohort ---------------------
def _clients(arch: str, n: int, batch: int, *, soft: bool = False, device: str = "cpu") -> list:
    from leakgym.fl.client import LocalTraining

    jobs = []
    for i in range(n):
        model = build_model(arch, SPEC, seed=i, device=device, **({"width": 4} if arch == "convnet" else {}))
        if arch == "convnet":  # each client's own running statistics, as after some rounds
            stats = torch.Generator().manual_seed(90 + i)
            with torch.no_grad():
                for m in model.modules():
                    if isinstance(m, torch.nn.BatchNorm2d):
                        m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=stats) - 0.5)
                        m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=stats))
        model.eval()  # a server's model between rounds: the cohort must train it in train mode
        x, y = _batch(batch, seed=10 + i)
        if soft:
            y = torch.softmax(torch.randn(batch, 10, generator=torch.Generator().manual_seed(i)), dim=-1)
        jobs.append(LocalTraining(model, x.to(device), y.to(device)))
    return jobs


def _modes(model: torch.nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("arch, batch, soft", [("lenet", 2, False), ("lenet", 3, True), ("convnet", 1, False)])
@pytest.mark.parametrize("kind, steps", [("gradient", 1), ("model_delta", 3)])
def test_a_cohort_of_clients_trains_as_one_vmapped_computation_equal_to_each_alone(monkeypatch, arch, batch, soft,
                                                                                    kind, steps):
    """Clients of one architecture (LeNet; the BatchNorm ConvNet with a batch of one, BN on each client's
    running statistics; soft Mixup labels) train as one cohort: no per-client gradient or model copy, and
    every update -- FedSGD, FedAvg with a per-step transform that reads the model it is given -- equals the
    client-by-client computation to float32 rounding; the callers' models keep parameters and modes."""
    import dataclasses

    import leakgym.fl.client as client_module
    from leakgym.fl.client import compute_updates

    jobs = [dataclasses.replace(j, kind=kind, local_steps=steps, local_lr=0.05)
            for j in _clients(arch, 4, batch, soft=soft)]
    states, modes = [_state(j.model) for j in jobs], [_modes(j.model) for j in jobs]
    seen = {True: [], False: []}

    def transform(batched):
        def shrink(clients, models, xs, ys, grads, *, step):
            out = []
            for i, m, g in zip(clients, models, grads):
                bn_training = [b.training for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)]
                seen[batched].append((i, step, m.training, bn_training))
                scale = 1.0 / (1.0 + float(sum(p.detach().abs().sum() for p in m.parameters())))  # reads the model
                out.append({k: v * (0.5 + scale) for k, v in g.items()})
            return out
        return shrink

    alone = compute_updates(jobs, transform(False), batched=False)
    per_client = []
    real = client_module.batch_gradient
    monkeypatch.setattr(client_module, "batch_gradient", lambda *a: per_client.append(1) or real(*a))
    together = compute_updates(jobs, transform(True), batched=True)
    assert per_client == []  # one vmapped computation per step, not a gradient per client
    assert seen[True] == seen[False]  # the transform sees the same clients, steps and modes
    for a, b in zip(together, alone):
        assert (a.kind, a.batch_size, a.local_steps, a.local_lr) == (b.kind, b.batch_size, b.local_steps, b.local_lr)
        for name, t in b.tensors.items():
            torch.testing.assert_close(a.tensors[name], t, rtol=1e-4, atol=1e-6)
        assert (a.buffers is None) == (b.buffers is None)
        for name, t in (b.buffers or {}).items():
            assert torch.equal(a.buffers[name], t), name
    for j, state, mode in zip(jobs, states, modes):
        assert all(torch.equal(v, state[k]) for k, v in _state(j.model).items()) and _modes(j.model) == mode


def test_clients_a_cohort_cannot_take_train_on_their_own_copies(monkeypatch):
    """BatchNorm in train mode (batches > 1 couple their examples), PRECODE (draws from each client's RNG
    stream), different architectures and a lone client keep the exact client-by-client path."""
    import leakgym.fl.client as client_module
    from leakgym.fl.client import LocalTraining, compute_update, compute_updates

    per_client = []
    real = client_module.batch_gradient
    monkeypatch.setattr(client_module, "batch_gradient", lambda *a: per_client.append(1) or real(*a))
    bn = _clients("convnet", 2, 3)
    precode = [LocalTraining(build_model("mlp", SPEC, precode=True, width=16, seed=i), *_batch(2, seed=i))
               for i in range(2)]
    mixed = [_clients("lenet", 1, 2)[0], LocalTraining(build_model("mlp", SPEC, width=16, seed=0), *_batch(2))]
    for jobs in (bn, precode, mixed, _clients("lenet", 1, 2)):
        per_client.clear()
        out = compute_updates(jobs, batched=True)
        assert len(per_client) == len(jobs)
        if jobs is not precode:  # (PRECODE draws from the global RNG: its reference needs the same stream)
            for job, update in zip(jobs, out):
                ref = compute_update(job.model, job.x, job.y)
                assert all(torch.equal(update.tensors[n], t) for n, t in ref.tensors.items())


@pytest.mark.cuda
def test_a_cohort_trains_on_cuda(cuda_device):
    from leakgym.fl.client import compute_updates

    jobs = _clients("convnet", 3, 1, device="cuda")
    together = compute_updates(jobs, batched=True)
    alone = compute_updates(jobs, batched=False)
    for a, b in zip(together, alone):
        for name, t in b.tensors.items():
            assert a.tensors[name].device.type == "cuda"
            torch.testing.assert_close(a.tensors[name], t, rtol=1e-3, atol=1e-5)


def test_stacked_clients_read_their_labels_once_not_at_every_local_step(monkeypatch):
    """compute_updates checks its jobs once; each local step of a stacked cohort went through benign_updates'
    checks again (a host read of the labels per step: a device synchronisation each on a GPU)."""
    from leakgym.fl import batched as fl_batched
    from leakgym.fl.client import LocalTraining, compute_updates

    reads = []
    real = fl_batched.check_labels
    monkeypatch.setattr(fl_batched, "check_labels", lambda *a: reads.append(1) or real(*a))
    jobs = [LocalTraining(job.model, job.x, job.y, kind="model_delta", local_steps=3, local_lr=0.1)
            for job in _clients("lenet", 2, 3)]
    compute_updates(jobs, batched=True)
    assert len(reads) == 1

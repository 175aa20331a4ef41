"""DCS² (leakgym.defenses.dcs2): synthesis (Eq. 9), mixing (Eq. 10), projection (Eq. 11-12).

Leakage against the reference attack: ``test_method_checks.py`` and ``test_paper_claims.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from leakgym.data import federated_split, load_dataset
from leakgym.defenses.dcs2 import dcs2_gradient, project_gradient
from leakgym.models import build_model, task_loss

PAPER = {"lambda_g": 0.7, "lambda_x": 0.01, "lambda_z": 0.01, "epsilon": 0.01, "num_concealed": 1, "lr": 0.1}


@pytest.fixture(scope="module")
def digits():
    split = federated_split(load_dataset("digits", image_size=16), num_clients=4, seed=0)
    spec = split.spec
    return spec, split.clients[0][0], split.clients[0][1], spec.normalize(split.public_x), split.public_y


def _grad(model, x, y) -> dict[str, torch.Tensor]:
    names = [n for n, _ in model.named_parameters()]
    gs = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
    return {n: g.detach() for n, g in zip(names, gs)}


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in d.values()]).double()


def test_projection_matches_a_numerical_qp_solution():
    """Eq. 11 solved by scipy (SLSQP) agrees with the closed form max(0, -<g,g_c>/<g,g>)."""
    g = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    g_c = torch.tensor([-3.0, 0.5, 2.0, 1.0], dtype=torch.float64)
    assert float(g @ g_c) < 0
    proj, projected, v = project_gradient(g, g_c)
    assert projected and v > 0
    res = minimize(lambda z: 0.5 * np.sum((g_c.numpy() - z) ** 2), g_c.numpy(), method="SLSQP",
                   constraints=[{"type": "ineq", "fun": lambda z: g.numpy() @ z}])
    np.testing.assert_allclose(proj.numpy(), res.x, atol=1e-6)
    assert float(g @ proj) >= -1e-12
    # No projection when the constraint already holds.
    same, projected, _ = project_gradient(g, -g_c)
    assert not projected and torch.equal(same, -g_c)


def test_projection_triggers_and_the_shared_gradient_keeps_a_non_negative_inner_product(digits):
    """With a model that already fits the batch, the concealed samples' (random-label) gradient
    outweighs the sensitive one and Eq. 10 points against it (<g, g_c> < 0, measured -0.03);
    the shared gradient then satisfies <g, g^_c> >= 0 (exactly 0 up to float32 rounding)."""
    spec, xu, yu, _, _ = digits
    x, y = spec.normalize(xu[:2]), yu[:2]
    model = build_model("lenet", spec, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad()
        task_loss(model, x, y).backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    g = _grad(model, x, y)
    shared, det = dcs2_gradient(model, x, y, g, **{**PAPER, "lambda_g": 1.0}, steps=0, start="random",
                                public_x=None, public_y=None, generator=torch.Generator().manual_seed(0))
    assert det["projected"] and det["dot"] < 0
    gv, sv = _flat(g), _flat(shared)
    assert float(gv @ sv) >= -1e-6 * float(gv.norm() * sv.norm())
    assert set(shared) == set(g) and all(shared[n].shape == g[n].shape for n in g)


def test_concealed_samples_are_far_in_pixels_and_close_in_gradient(digits):
    """Paper setting, mixup start, 200 Adam steps (paper: 1000) on two digits.

    Measured: gradient cosine of the concealed batch to the sensitive batch 0.51 (mixup start) ->
    0.60; mean pixel L2 (normalised space) 10.5 -> 100.5, i.e. ~6x the norm of the sensitive images
    themselves (16.2); relative latent distance 0.21; shared-vs-clean gradient cosine 0.94."""
    spec, xu, yu, px, py = digits
    x, y = spec.normalize(xu[:2]), yu[:2]
    model = build_model("lenet", spec, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = _grad(model, x, y)
    _shared, det = dcs2_gradient(model, x, y, g, **PAPER, steps=200, start="mixup", public_x=px, public_y=py,
                                generator=torch.Generator().manual_seed(0))
    assert det["gradient_cosine"] > 0.55 and det["gradient_cosine"] > det["gradient_cosine_init"] + 0.05
    x_norm = float(x.flatten(1).norm(dim=1).mean())
    assert det["pixel_distance"] > 2 * x_norm and det["pixel_distance"] > det["pixel_distance_init"]
    assert not det["projected"] and det["shared_cosine"] > 0.9
    assert det["concealed_x"].shape == x.shape and det["augmented_batch_size"] == 4
    # The model is not modified and no .grad is left behind.
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None


def test_bn_buffers_are_restored():
    from leakgym.data import dataset_spec

    spec = dataset_spec("digits", image_size=16)
    model = build_model("convnet", spec, width=4, seed=0).train()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, *spec.shape, generator=gen), torch.tensor([0, 1, 2])
    g = _grad(model, x, y)  # (updates the running statistics itself, in train mode)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    dcs2_gradient(model, x, y, g, **PAPER, steps=2, start="random", public_x=None,
                  public_y=None, generator=gen)
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n


@pytest.mark.parametrize(
    "bad, match",
    [({"lambda_g": 1.5}, "lambda_g"), ({"num_concealed": 0}, "num_concealed"), ({"start": "zeros"}, "start"),
     ({"start": "public"}, "public_x"), ({"lr": 0.0}, "lr")],
)
def test_bad_arguments_raise(bad, match):
    from leakgym.data import dataset_spec

    spec = dataset_spec("digits", image_size=16)
    model = build_model("lenet", spec, seed=0)
    x, y = torch.zeros(1, *spec.shape), torch.tensor([0])
    kwargs = {**PAPER, "steps": 1, "start": "random", "public_x": None, "public_y": None,
              "generator": torch.Generator(), **bad}
    with pytest.raises(ValueError, match=match):
        dcs2_gradient(model, x, y, _grad(model, x, y), **kwargs)


def test_the_latent_term_reuses_the_loss_forward_pass_and_gives_the_same_gradient(digits, monkeypatch):
    """Speed-up: without BatchNorm or PRECODE, Eq. 9's latent term f(x~_c) is taken from the loss's own
    forward pass (the head's input) instead of a second ``model.features`` pass; the result equals the
    two-pass computation up to float32 summation order (measured: 2e-6 relative on the shared gradient)."""
    import leakgym.defenses.dcs2 as dcs2_module

    spec, xu, yu, px, py = digits
    x, y = spec.normalize(xu[:4]), yu[:4]
    model = build_model("lenet", spec, seed=0)
    g = _grad(model, x, y)
    calls = []
    features = model.features
    monkeypatch.setattr(model, "features", lambda inp: calls.append(len(inp)) or features(inp))

    def run():
        calls.clear()
        out = dcs2_gradient(model, x, y, g, **PAPER, steps=30, start="mixup", public_x=px, public_y=py,
                            generator=torch.Generator().manual_seed(0))
        return out, len(calls)

    (one, det1), n_one = run()
    monkeypatch.setattr(dcs2_module, "has_batchnorm", lambda m: True)  # forces the separate forward pass
    (two, det2), n_two = run()
    assert n_one == 1 and n_two == 1 + 30 + 2  # the sensitive batch only vs. also every objective evaluation
    a, b = _flat(one), _flat(two)
    assert float((a - b).norm() / b.norm()) < 1e-5
    for key in ("gradient_cosine", "pixel_distance", "latent_distance", "objective", "shared_cosine"):
        assert det1[key] == pytest.approx(det2[key], rel=1e-4), key
    assert det1["projected"] == det2["projected"]


def _clients(spec, px, py, sizes, seeds=None):
    """LeNet clients with their own models, batch sizes, num_concealed, step sizes, weights and starts."""
    out = []
    for i, b in enumerate(sizes):
        model = build_model("lenet", spec, seed=(seeds or range(len(sizes)))[i])
        gen = torch.Generator().manual_seed(10 + i)
        x, y = torch.randn(b, *spec.shape, generator=gen), torch.randint(0, 10, (b,), generator=gen)
        settings = {**PAPER, "lambda_g": 0.3 + 0.2 * i, "lambda_x": 0.01 * (i + 1), "lambda_z": 0.02 / (i + 1),
                    "epsilon": 0.01 * i, "num_concealed": 1 + i % 2, "lr": 0.1 / (i + 1), "steps": 12,
                    "start": ("mixup", "random", "public")[i % 3], "public_x": px, "public_y": py}
        out.append((model, x, y, _grad(model, x, y), settings))
    return out


def test_batched_synthesis_equals_one_client_at_a_time(digits):
    """dcs2_gradients (K clients as one computation per step, one row per concealed sample, the means of
    Eq. 9 as sums weighted 1 / M_k) gives each client what dcs2_gradient gives it alone: own model, batch
    size, num_concealed, step size, Eq. 9 weights, start point and lambda_g. Float32 rounding only
    (measured ~1e-6)."""
    from leakgym.defenses.dcs2 import dcs2_gradients

    spec, _, _, px, py = digits
    clients = _clients(spec, px, py, sizes=(1, 3, 2, 1))
    batched = dcs2_gradients(*(list(t) for t in zip(*clients)),
                             [torch.Generator().manual_seed(100 + i) for i in range(len(clients))])
    for i, ((model, x, y, g, settings), (shared, det)) in enumerate(zip(clients, batched)):
        alone, ref = dcs2_gradient(model, x, y, g, **settings, generator=torch.Generator().manual_seed(100 + i))
        assert det["concealed_x"].shape == ref["concealed_x"].shape == (x.shape[0] * settings["num_concealed"],
                                                                          *spec.shape)
        torch.testing.assert_close(det["concealed_x"], ref["concealed_x"], rtol=1e-4, atol=1e-4)
        assert torch.equal(det["concealed_y"], ref["concealed_y"])
        for n, t in alone.items():
            torch.testing.assert_close(shared[n], t, rtol=1e-4, atol=1e-6)
        for key in ("gradient_cosine", "gradient_cosine_init", "pixel_distance", "pixel_distance_init",
                    "latent_distance", "objective", "shared_cosine"):
            assert det[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), (i, key)
        assert det["projected"] == ref["projected"] and det["augmented_batch_size"] == ref["augmented_batch_size"]
        # the synthesis moved the concealed samples towards the sensitive gradient (Eq. 9 was minimised)
        assert det["gradient_cosine"] > det["gradient_cosine_init"]


def test_batched_synthesis_of_lenet_is_rowwise_and_equals_the_vmap_form(digits, monkeypatch):
    """LeNet's concealed samples are synthesised with leakgym.models.rowwise (no vmap): every step's forward
    pass is one row-wise call, and the results equal those of the vmap form (switched off) to rounding."""
    from leakgym.defenses.dcs2 import dcs2_gradients
    from leakgym.models.rowwise import RowwiseForward

    spec, _, _, px, py = digits
    clients = _clients(spec, px, py, sizes=(1, 2, 1))
    calls = []
    real = RowwiseForward.logits
    monkeypatch.setattr(RowwiseForward, "logits", lambda self, *a: calls.append(1) or real(self, *a))

    def run():
        return dcs2_gradients(*(list(t) for t in zip(*clients)),
                              [torch.Generator().manual_seed(7 + i) for i in range(len(clients))])

    rows = run()
    assert len(calls) == clients[0][4]["steps"] + 2  # the start, every step, the final evaluation
    monkeypatch.setattr(RowwiseForward, "of", classmethod(lambda cls, model, *fit: None))
    vmapped = run()
    assert len(calls) == clients[0][4]["steps"] + 2
    for (a, da), (b, db) in zip(rows, vmapped):
        torch.testing.assert_close(da["concealed_x"], db["concealed_x"], rtol=1e-4, atol=1e-4)
        for n, t in b.items():
            torch.testing.assert_close(a[n], t, rtol=1e-4, atol=1e-6)
        assert da["objective"] == pytest.approx(db["objective"], rel=1e-4, abs=1e-5)


def test_batched_synthesis_rejects_mixed_steps_and_architectures(digits):
    from leakgym.defenses.dcs2 import dcs2_gradients

    spec, _, _, px, py = digits
    clients = _clients(spec, px, py, sizes=(1, 1))
    clients[1][4]["steps"] = 13
    with pytest.raises(ValueError, match="steps=13"):
        dcs2_gradients(*(list(t) for t in zip(*clients)), [torch.Generator(), torch.Generator()])
    clients = _clients(spec, px, py, sizes=(1, 1))
    bn = build_model("convnet", spec, width=4, seed=0)
    with pytest.raises(ValueError, match="client 1's model"):
        dcs2_gradients([clients[0][0], bn], [c[1] for c in clients], [c[2] for c in clients],
                       [clients[0][3], _grad(bn, clients[1][1], clients[1][2])], [c[4] for c in clients],
                       [torch.Generator(), torch.Generator()])


def _contexts(models, spec, px, py, config):
    """``ctx(i)``: client i's DefenseContext (on a CPU, seed i, its own generator)."""
    from leakgym.defenses.registry import DefenseContext

    def ctx(i):
        return DefenseContext(name="dcs2", config=config, model=models[i], spec=spec, device=torch.device("cpu"),
                              seed=i, generator=torch.Generator().manual_seed(i), public_x=px, public_y=py)

    return ctx


def _batched_calls(monkeypatch):
    """``(calls, dcs2_gradients)``: the client count of every later dcs2_gradients call, and the real function."""
    import leakgym.defenses.dcs2 as dcs2_module

    calls = []
    original = dcs2_module.dcs2_gradients
    monkeypatch.setattr(dcs2_module, "dcs2_gradients", lambda m, *a: calls.append(len(m)) or original(m, *a))
    return calls, original


def test_the_defense_batches_plain_models_and_runs_the_others_one_by_one(digits, monkeypatch):
    """DCS2.apply_many: the LeNet clients go through one dcs2_gradients call; a BatchNorm model goes
    through dcs2_gradient, and its result is exactly what apply gives it alone."""
    from leakgym.defenses import DefenseConfig
    from leakgym.defenses.registry import DEFENSES

    spec, _, _, px, py = digits
    clients = _clients(spec, px, py, sizes=(1, 2, 1))
    bn = build_model("convnet", spec, width=4, seed=0).train()
    xb, yb = clients[1][1], clients[1][2]
    models = [clients[0][0], clients[1][0], bn, clients[2][0]]
    xs, ys = [clients[0][1], xb, xb, clients[2][1]], [clients[0][2], yb, yb, clients[2][2]]
    grads = [clients[0][3], clients[1][3], _grad(bn, xb, yb), clients[2][3]]
    config = DefenseConfig(dcs2_lambda_g=0.5, dcs2_steps=5)

    ctx = _contexts(models, spec, px, py, config)
    calls, _ = _batched_calls(monkeypatch)
    defense = DEFENSES["dcs2"]
    together = defense.apply_many([ctx(i) for i in range(4)], models, xs, ys, grads, step=0)
    assert calls == [3]
    alone, _ = defense.apply(ctx(2), bn, xb, yb, grads[2], step=0)
    assert all(torch.equal(together[2][0][n], t) for n, t in alone.items())
    for i in (0, 1, 3):
        single, _ = defense.apply(ctx(i), models[i], xs[i], ys[i], grads[i], step=0)
        for n, t in single.items():
            torch.testing.assert_close(together[i][0][n], t, rtol=1e-4, atol=1e-6)


def test_large_models_on_a_cpu_are_synthesised_one_by_one(digits, monkeypatch):
    """On a CPU the vmap form does not pay for a model above CPU_VMAP_MAX_PARAMETERS (ResNet-18's synthesis:
    1,440 ms a client one by one against 1,852 batched): DCS2 then runs every client through dcs2_gradient,
    in a vector step as alone, and the result is what the batched form gives, to float32 rounding. Below the
    bound the clients stay one dcs2_gradients call. dcs2_gradients itself still takes such models."""
    import leakgym.defenses.dcs2 as dcs2_module
    from leakgym.defenses import DefenseConfig
    from leakgym.defenses.registry import DEFENSES
    from leakgym.models import parameter_sets

    spec, _, _, px, py = digits
    clients = _clients(spec, px, py, sizes=(1, 2, 1))
    models, xs, ys, grads = ([c[k] for c in clients] for k in range(4))
    config = DefenseConfig(dcs2_lambda_g=0.5, dcs2_steps=5)

    ctx = _contexts(models, spec, px, py, config)
    calls, original = _batched_calls(monkeypatch)
    defense = DEFENSES["dcs2"]
    batched = defense.apply_many([ctx(i) for i in range(3)], models, xs, ys, grads, step=0)
    assert calls == [3] and dcs2_module.synthesised_together(models[0])
    calls.clear()
    size = sum(p.numel() for p in models[0].parameters())
    monkeypatch.setattr(parameter_sets, "CPU_VMAP_MAX_PARAMETERS", size - 1)
    assert dcs2_module.batchable(models[0]) and not dcs2_module.synthesised_together(models[0])
    one_by_one = defense.apply_many([ctx(i) for i in range(3)], models, xs, ys, grads, step=0)
    alone = defense.apply(ctx(1), models[1], xs[1], ys[1], grads[1], step=0)
    assert calls == []
    assert all(torch.equal(one_by_one[1][0][n], t) for n, t in alone[0].items())
    for (got, _), (ref, _) in zip(one_by_one, batched):
        for n, t in ref.items():
            torch.testing.assert_close(got[n], t, rtol=1e-4, atol=1e-6)
    assert len(original(models[:1], xs[:1], ys[:1], grads[:1], [clients[0][4]], [torch.Generator()])) == 1


def test_batchnorm_in_eval_mode_is_batched_with_each_clients_running_statistics(digits, eval_bn_convnets):
    """A victim with a batch of one trains with BatchNorm in eval mode (running statistics), where the
    examples do not couple: its synthesis joins the batched computation, each client's concealed
    samples normalised with that client's own statistics, and gives what dcs2_gradient gives it alone
    (float32 rounding). BatchNorm in train mode still runs alone; no model's statistics change."""
    from leakgym.defenses.dcs2 import batchable, dcs2_gradients

    spec, _, _, px, py = digits
    models = eval_bn_convnets(spec, 3)
    assert batchable(models[0]) and not batchable(build_model("convnet", spec, width=4).train())
    before = [{n: b.clone() for n, b in m.named_buffers()} for m in models]
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(1, *spec.shape, generator=gen) for _ in models]
    ys = [torch.randint(0, 10, (1,), generator=gen) for _ in models]
    grads = [_grad(m, x, y) for m, x, y in zip(models, xs, ys)]
    settings = [{**PAPER, "num_concealed": 1 + i % 2, "steps": 12, "start": "mixup", "public_x": px, "public_y": py}
                for i in range(len(models))]
    together = dcs2_gradients(models, xs, ys, grads, settings, [torch.Generator().manual_seed(i) for i in range(3)])
    for i, (model, (shared, det)) in enumerate(zip(models, together)):
        alone, ref = dcs2_gradient(model, xs[i], ys[i], grads[i], **settings[i],
                                   generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(det["concealed_x"], ref["concealed_x"], rtol=1e-4, atol=1e-4)
        for n, t in alone.items():
            torch.testing.assert_close(shared[n], t, rtol=1e-4, atol=1e-6)
        assert det["objective"] == pytest.approx(ref["objective"], rel=1e-4), i
        assert all(torch.equal(b, before[i][n]) for n, b in model.named_buffers())


@pytest.mark.cuda
def test_batched_synthesis_on_cuda_matches_one_client_at_a_time(digits):
    """On CUDA: every tensor and generator on the device; the batched synthesis matches the one-client
    path within 1e-3 (shape-dependent kernels and TF32 change the rounding)."""
    from leakgym.defenses.dcs2 import dcs2_gradients

    spec, _, _, px, py = digits
    dev = torch.device("cuda")
    clients = []
    for model, x, y, g, settings in _clients(spec, px.to(dev), py.to(dev), sizes=(1, 2, 3)):
        model = model.to(dev)
        clients.append((model, x.to(dev), y.to(dev), {n: t.to(dev) for n, t in g.items()}, settings))
    batched = dcs2_gradients(*(list(t) for t in zip(*clients)),
                             [torch.Generator(dev).manual_seed(100 + i) for i in range(len(clients))])
    for i, ((model, x, y, g, settings), (shared, det)) in enumerate(zip(clients, batched)):
        alone, _ = dcs2_gradient(model, x, y, g, **settings, generator=torch.Generator(dev).manual_seed(100 + i))
        for n, t in alone.items():
            assert shared[n].device.type == "cuda"
            torch.testing.assert_close(shared[n], t, rtol=1e-3, atol=1e-5)


@pytest.mark.cuda
def test_eval_mode_batchnorm_synthesis_on_cuda_matches_one_client_at_a_time(digits, eval_bn_convnets):
    """On CUDA, BatchNorm in eval mode: each client's running statistics stay on the device and the batched
    synthesis matches the one-client path within 1e-3."""
    from leakgym.defenses.dcs2 import dcs2_gradients

    spec, _, _, px, py = digits
    dev = torch.device("cuda")
    models = [m.to(dev) for m in eval_bn_convnets(spec, 2)]
    xs = [torch.randn(1, *spec.shape, device=dev) for _ in models]
    ys = [torch.tensor([i], device=dev) for i in range(len(models))]
    grads = [_grad(m, x, y) for m, x, y in zip(models, xs, ys)]
    settings = [{**PAPER, "steps": 8, "start": "mixup", "public_x": px.to(dev), "public_y": py.to(dev)}] * 2
    together = dcs2_gradients(models, xs, ys, grads, settings, [torch.Generator(dev).manual_seed(i) for i in range(2)])
    for i, (shared, _) in enumerate(together):
        alone, _ = dcs2_gradient(models[i], xs[i], ys[i], grads[i], **settings[i],
                                 generator=torch.Generator(dev).manual_seed(i))
        for n, t in alone.items():
            assert shared[n].device.type == "cuda"
            torch.testing.assert_close(shared[n], t, rtol=1e-3, atol=1e-5)


def test_frozen_parameters_are_not_shared_and_keep_each_clients_value(digits):
    """A client shares its trainable parameters only (compute_update); DCS² raised on a model with a frozen
    layer ("clean_grad lacks ..."), and the batched training (stacks of the trainable parameters) took
    client 0's frozen values for every client. Now the frozen layer is left out of the shared update, and
    models with one train client by client (fl.batched.supports), each with its own frozen values."""
    from leakgym.defenses import DefenseCall, DefenseConfig, apply_defense, apply_defense_many

    spec, x, y, px, py = digits
    calls = []
    for i in range(3):
        model = build_model("lenet", spec, seed=i)  # different frozen values per client
        model.body.conv1.weight.requires_grad_(False)
        calls.append(DefenseCall(model, spec.normalize(x[i:i + 1]), y[i:i + 1],
                                 DefenseConfig(dcs2_lambda_g=0.7, dcs2_steps=5), seed=20 + i, public_x=px, public_y=py))
    together = apply_defense_many(calls, batch_defenses=True)
    for c, (upd, _) in zip(calls, together):
        assert "body.conv1.weight" not in upd.tensors
        alone, _ = apply_defense(c.model, c.x, c.y, c.config, seed=c.seed, public_x=px, public_y=py)
        assert set(alone.tensors) == set(upd.tensors)
        for name, t in alone.tensors.items():
            torch.testing.assert_close(upd.tensors[name], t, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("encoding", [{"mixup_k": 2}, {"instahide_k": 2}])
def test_dcs2_with_a_mixup_encoding_is_refused_when_configured(encoding):
    """DCS² needs the client's hard labels (Eq. 9); a Mixup/InstaHide client's are soft. The config was
    accepted and every round then failed with an error about label shapes."""
    from leakgym.defenses import DefenseConfig

    with pytest.raises(ValueError, match=r"dcs2_lambda_g=0.5 with (mixup|instahide)_k=2: .*use one of them"):
        DefenseConfig(dcs2_lambda_g=0.5, **encoding)
    DefenseConfig(dcs2_lambda_g=0.0, **encoding)  # DCS² off: fine


@pytest.mark.parametrize("field", ["dcs2_lr", "dcs2_lambda_x", "dcs2_lambda_z", "dcs2_epsilon"])
def test_dcs2_settings_that_overflow_the_synthesis_are_refused(field):
    """At 1e30-1e39 the synthesis overflowed and the client sent a NaN update without an error."""
    from leakgym.defenses import DefenseConfig
    from leakgym.defenses.dcs2 import DCS2_SETTING_MAX

    with pytest.raises(ValueError, match=rf"{field}=1e\+30; allowed range .*1e\+06\]"):
        DefenseConfig(**{field: 1e30})
    DefenseConfig(**{field: DCS2_SETTING_MAX})


def test_a_zero_gradient_gives_finite_dcs2_details(digits):
    """A client whose clean gradient is exactly zero (a saturated softmax): the shared cosine was 0/0 = NaN."""
    spec, x, y, px, py = digits
    model = build_model("lenet", spec, seed=0)
    xs, ys = spec.normalize(x[:1]), y[:1]
    zero = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    shared, info = dcs2_gradient(model, xs, ys, zero, **{**PAPER, "lambda_g": 0.5}, steps=2, start="random",
                                 public_x=px, public_y=py, generator=torch.Generator().manual_seed(0))
    assert all(bool(torch.isfinite(t).all()) for t in shared.values())
    assert all(np.isfinite(v) for v in info.values() if isinstance(v, float))

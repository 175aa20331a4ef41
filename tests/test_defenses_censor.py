"""CENSOR (Algorithm 1): orthogonal, norm-matched, loss-reducing candidates; fallbacks; Eq. 11 subspace."""

from __future__ import annotations

import copy

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.defenses import DefenseCall, DefenseConfig, apply_defense, apply_defense_many
from leakgym.defenses.censor import censor_gradient, example_bases, example_gradients, orthogonal_candidate
from leakgym.fl.client import compute_update
from leakgym.fl.server import Server
from leakgym.models import build_model, task_loss

SPEC = dataset_spec("digits", image_size=16)


def _setup(seed: int = 0):
    model = build_model("lenet", SPEC, seed=seed)
    g = torch.Generator().manual_seed(seed)
    return model, torch.randn(2, 1, 16, 16, generator=g), torch.tensor([3, 8])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def test_shared_gradient_is_orthogonal_layer_by_layer_norm_matched_and_lowers_the_loss():
    model, x, y = _setup()
    clean = compute_update(model, x, y).tensors
    upd, rep = apply_defense(model, x, y, DefenseConfig(censor_trials=20, censor_step=0.1), seed=0)
    info = rep.details["censor"][0]
    assert info["chosen_trial"] >= 0, info  # measured: trial 19 of 20 is the best at seed 0
    worst = max(abs(_cos(upd.tensors[n], clean[n])) for n in clean)
    assert worst < 1e-4, worst  # measured max |cos| = 1.0e-8 (float64 projection, float32 storage)
    for n in clean:
        torch.testing.assert_close(upd.tensors[n].norm(), clean[n].norm(), rtol=1e-5, atol=0)
    theta = {n: p.detach() for n, p in model.named_parameters()}
    with torch.no_grad():
        l0 = float(task_loss(model, x, y))
        l1 = float(task_loss(model, x, y, params={n: theta[n] - 0.1 * upd.tensors[n] for n in theta}))
    assert l1 < l0 and l1 == min(info["trial_losses"]) == info["best_loss"]
    assert info["initial_loss"] == l0 and len(info["trial_losses"]) == 20


def test_candidates_are_orthogonal_even_for_a_single_layer_and_zero_layers_stay_zero():
    g = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "z": torch.zeros(3)}
    cand = orthogonal_candidate(g, torch.Generator().manual_seed(0))
    assert abs(float((cand["w"] * g["w"]).sum())) < 1e-5
    assert torch.equal(cand["z"], torch.zeros(3))
    torch.testing.assert_close(cand["w"].norm(), g["w"].norm())


def test_falls_back_to_the_original_gradient_by_default_as_algorithm_1_line_11():
    """The default is Algorithm 1 as written (issue 36): G* = G0 when no trial improves; 'zeros' on request."""
    model, x, y = _setup(1)
    grad = compute_update(model, x, y).tensors
    # A step of 1e3 along a random direction of the gradient's size wrecks the loss every time.
    best, info = censor_gradient(model, x, y, grad, trials=5, step=1e3, generator=torch.Generator().manual_seed(0))
    assert info["chosen_trial"] == -1 and all(l > info["initial_loss"] for l in info["trial_losses"])
    assert info["sent"] == "original" and all(torch.equal(best[n], grad[n]) for n in grad)
    assert DefenseConfig().censor_fallback == "original" == DefenseConfig.preset("censor").censor_fallback
    upd, rep = apply_defense(model, x, y, DefenseConfig(censor_trials=5, censor_step=1e3))
    assert rep.fidelity == pytest.approx(1.0)
    zeros, _ = censor_gradient(model, x, y, grad, trials=5, step=1e3, generator=torch.Generator().manual_seed(0),
                               fallback="zeros")
    assert all(torch.count_nonzero(t) == 0 for t in zeros.values())
    upd, rep = apply_defense(model, x, y, DefenseConfig.preset("censor-zeros").replace(censor_trials=5,
                                                                                         censor_step=1e3))
    assert rep.fidelity == 0.0 and all(torch.count_nonzero(t) == 0 for t in upd.tensors.values())


# --- fallbacks (Algorithm 1 line 11 and the two alternatives) -----------------------------------
@pytest.mark.parametrize("fallback", ["original", "zeros", "skip"])
def test_each_fallback_sends_what_it_says_when_no_trial_improves(fallback):
    model, x, y = _setup(1)
    clean = compute_update(model, x, y).tensors
    # A step of 1e3 along a random direction of the gradient's size wrecks the loss every time.
    cfg = DefenseConfig(censor_trials=5, censor_step=1e3, censor_fallback=fallback)
    upd, rep = apply_defense(model, x, y, cfg, seed=0)
    (info,) = rep.details["censor"]
    assert info["sent"] == fallback and info["chosen_trial"] == -1
    assert all(l > info["initial_loss"] for l in info["trial_losses"]) and info["best_loss"] == info["initial_loss"]
    if fallback == "original":  # the paper's G* = G0: the clean gradient itself
        assert all(torch.equal(upd.tensors[n], clean[n]) for n in clean)
        assert rep.fidelity == pytest.approx(1.0) and "skipped" not in upd.metadata
    else:
        assert all(torch.count_nonzero(t) == 0 for t in upd.tensors.values()) and rep.fidelity == 0.0
        assert upd.metadata.get("skipped", False) is (fallback == "skip")
        assert rep.details.get("skipped", False) is (fallback == "skip")


def test_an_improving_candidate_is_sent_whatever_the_fallback():
    model, x, y = _setup()
    sent = {}
    for fallback in ("original", "zeros", "skip"):
        upd, rep = apply_defense(model, x, y, DefenseConfig(censor_trials=20, censor_fallback=fallback), seed=0)
        assert rep.details["censor"][0]["sent"] == "candidate" and "skipped" not in upd.metadata
        sent[fallback] = upd.tensors
    for n in sent["zeros"]:
        assert torch.equal(sent["original"][n], sent["zeros"][n]) and torch.equal(sent["skip"][n], sent["zeros"][n])


def test_the_server_leaves_skipped_updates_out_of_the_aggregate():
    model, x, y = _setup(1)
    skipped, _ = apply_defense(model, x, y, DefenseConfig(censor_trials=2, censor_step=1e3, censor_fallback="skip"))
    assert skipped.metadata["skipped"] is True
    honest = compute_update(model, x, y)
    honest.tensors = {n: t + 1.0 for n, t in honest.tensors.items()}  # a non-zero update to aggregate

    def after(updates):
        server = Server(copy.deepcopy(model), lr=0.5, eval_x=x, eval_y=y)
        server.aggregate(updates)
        return {n: p.detach().clone() for n, p in server.model.named_parameters()}

    start = {n: p.detach() for n, p in model.named_parameters()}
    alone, with_skipped = after([honest]), after([skipped, honest])
    assert all(torch.equal(alone[n], with_skipped[n]) for n in alone)
    assert not all(torch.equal(alone[n], start[n]) for n in alone)  # the honest update did move the model
    only_skipped = after([skipped])
    assert all(torch.equal(only_skipped[n], start[n]) for n in start)


# --- subspaces: Algorithm 1's layer-wise one and Eq. 11's per-example one ----------------------
def _layer_cos(a: dict, b: dict) -> float:
    """Largest |cosine| between a and b over the layers where both are non-zero."""
    worst = 0.0
    for n, t in a.items():
        if t.norm() > 0 and b[n].norm() > 0:
            worst = max(worst, abs(_cos(t, b[n])))
    return worst


def test_samples_candidates_are_orthogonal_to_every_examples_gradient_layer_by_layer():
    model = build_model("lenet", SPEC, seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 1, 16, 16, generator=g), torch.tensor([3, 8, 1, 3])
    grad = compute_update(model, x, y).tensors
    per_example = example_gradients(model.train(), x, y)
    for n in grad:  # rows of the per-example Jacobian average to the batch gradient
        torch.testing.assert_close(per_example[n].mean(0), grad[n], rtol=1e-4, atol=1e-6)
    examples = [{n: per_example[n][j] for n in grad} for j in range(4)]

    samples = orthogonal_candidate(grad, torch.Generator().manual_seed(1), example_bases(grad, per_example))
    layer = orthogonal_candidate(grad, torch.Generator().manual_seed(1))
    assert max(_layer_cos(samples, e) for e in examples) < 1e-5  # measured ~1e-8
    assert _layer_cos(samples, grad) < 1e-5 and _layer_cos(layer, grad) < 1e-5
    # Algorithm 1's layer-wise candidate avoids the batch gradient only, not each example's.
    assert max(_layer_cos(layer, e) for e in examples) > 1e-2
    for n in grad:
        torch.testing.assert_close(samples[n].norm(), grad[n].norm(), rtol=1e-5, atol=0)


def test_samples_subspace_through_the_pipeline_and_a_layer_spanned_by_the_examples():
    model, x, y = _setup()
    cfg = DefenseConfig(censor_trials=20, censor_subspace="samples")
    upd, rep = apply_defense(model, x, y, cfg, seed=0)
    assert rep.details["censor"][0]["sent"] == "candidate" and rep.details["censor"][0]["subspace"] == "samples"
    per_example = example_gradients(copy.deepcopy(model).train(), x, y)
    for j in range(x.shape[0]):
        assert _layer_cos(upd.tensors, {n: per_example[n][j] for n in per_example}) < 1e-5
    # Three examples whose gradients span a 3-entry layer leave no orthogonal direction in it.
    grad = {"b": torch.tensor([1.0, 0.0, 0.0]), "w": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])}
    rows = {"b": torch.eye(3), "w": torch.randn(3, 5, generator=torch.Generator().manual_seed(0))}
    cand = orthogonal_candidate(grad, torch.Generator().manual_seed(0), example_bases(grad, rows))
    assert torch.equal(cand["b"], torch.zeros(3)) and cand["w"].norm() > 0


def test_samples_bases_leave_out_rounding_so_candidates_do_not_depend_on_it():
    """G0 is the mean of the examples' gradients (a deterministic model): the span has N directions, not
    N + 1. A basis of all N + 1 vectors held a direction made of float32 rounding, so moving the gradient
    by its rounding (1e-7, as a vmapped computation does) moved the candidate by 5%; now it stays put."""
    model = build_model("lenet", SPEC, seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 1, 16, 16, generator=g), torch.tensor([3, 8, 1, 3])
    grad = compute_update(model, x, y).tensors
    per_example = example_gradients(model.train(), x, y)
    bases = example_bases(grad, per_example)
    assert bases["body.conv1.weight"].shape[1] == 4  # N = 4 examples, G0 in their span
    assert bases["head.bias"].shape[1] == 4  # and in 10 entries (the softmax's bias gradients sum to 0)
    jitter = torch.Generator().manual_seed(1)
    moved = {n: t * (1 + 1e-7 * torch.randn(t.shape, generator=jitter)) for n, t in grad.items()}
    a = orthogonal_candidate(grad, torch.Generator().manual_seed(2), bases)
    b = orthogonal_candidate(moved, torch.Generator().manual_seed(2), example_bases(moved, per_example))
    for n in grad:
        torch.testing.assert_close(b[n], a[n], rtol=1e-4, atol=1e-6 * float(a[n].abs().max()))


def test_near_duplicate_examples_keep_their_directions_in_the_samples_basis():
    """Eight near-duplicate images: their gradients are nearly parallel, the largest singular value of the
    unit columns is sqrt(8). A tolerance scaled by it dropped genuine directions (candidate cosines 2.4e-5
    with the examples' gradients); the absolute one keeps them."""
    model = build_model("lenet", SPEC, seed=0)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 1, 16, 16, generator=g)
    x, y = base + 3e-4 * torch.randn(8, 1, 16, 16, generator=g), torch.full((8,), 3)
    grad = compute_update(model, x, y).tensors
    per_example = example_gradients(model.train(), x, y)
    cand = orthogonal_candidate(grad, torch.Generator().manual_seed(1), example_bases(grad, per_example))
    worst = max(abs(_cos(cand[n], per_example[n][j].double())) for n in grad for j in range(8))
    assert worst < 5e-6  # measured 9e-7


def test_per_example_gradients_with_batchnorm_in_train_mode_average_to_the_batch_gradient():
    model = build_model("convnet", SPEC, width=4, seed=0).train()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 1, 16, 16, generator=g), torch.tensor([0, 4, 9])
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    per_example = example_gradients(model, x, y)
    grad = compute_update(model, x, y).tensors
    for n in grad:
        torch.testing.assert_close(per_example[n].mean(0), grad[n], rtol=1e-4, atol=1e-6)
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())  # running stats untouched


# --- speed-ups keep the numbers ---------------------------------------------------------------------
def _reference_censor(model, x, y, grad, *, trials, step, generator, fallback, subspace):
    """Algorithm 1 written out naively, as before the speed-ups: the float64 gradient recomputed per trial,
    the global RNG forked and fully re-seeded (``torch.manual_seed``) around every loss evaluation."""
    from leakgym.defenses.censor import _loss_at

    theta = {n: p.detach() for n, p in model.named_parameters()}
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))

    def evaluate(params):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return _loss_at(model, x, y, params)

    bases = None
    if subspace == "samples":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            bases = example_bases(grad, example_gradients(model, x, y))
    initial = evaluate(theta)
    best = {n: g.clone() for n, g in grad.items()} if fallback == "original" else \
        {n: torch.zeros_like(g) for n, g in grad.items()}
    best_loss, chosen, losses = initial, -1, []
    for t in range(trials):
        cand = orthogonal_candidate(grad, generator, bases)
        loss_t = evaluate({n: theta[n] - step * cand[n] for n in theta})
        losses.append(loss_t)
        if loss_t < best_loss:
            best_loss, best, chosen = loss_t, cand, t
    return best, {"sent": "candidate" if chosen >= 0 else fallback, "chosen_trial": chosen, "initial_loss": initial,
                  "best_loss": best_loss, "trial_losses": losses, "subspace": subspace}


@pytest.mark.parametrize("precode", [False, True])
@pytest.mark.parametrize("subspace", ["layer", "samples"])
def test_censor_gradient_equals_the_naive_algorithm_bit_for_bit(precode, subspace):
    """censor_gradient forks the global RNG once, re-seeds only the CPU generator per evaluation and computes
    each layer's float64 gradient once per call: the same candidates, losses and choice as the naive loop,
    bit for bit, also for PRECODE, whose forward samples from the global RNG."""
    outcomes = set()
    for seed, step in ((0, 0.1), (1, 0.1), (2, 5.0)):
        model = build_model("lenet", SPEC, seed=seed, precode=precode).train()
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(4, 1, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        grad = compute_update(model, x, y).tensors
        for fallback in ("original", "skip"):
            kw = {"trials": 8, "step": step, "fallback": fallback, "subspace": subspace}
            before = torch.get_rng_state()
            fast, info = censor_gradient(model, x, y, grad, generator=torch.Generator().manual_seed(seed), **kw)
            assert torch.equal(torch.get_rng_state(), before)  # the caller's global RNG is untouched
            ref, ref_info = _reference_censor(model, x, y, grad, generator=torch.Generator().manual_seed(seed), **kw)
            assert info == ref_info
            assert all(torch.equal(fast[n], ref[n]) for n in ref)
            outcomes.add(info["sent"])
    # Both branches are exercised; with PRECODE no per-example-orthogonal trial lowers the loss (measured:
    # at every step from 1e-3 to 0.1 each trial raises it), so only the fallbacks occur there.
    assert outcomes == ({"original", "skip"} if precode and subspace == "samples" else {"candidate", "original", "skip"})


def test_batched_trials_of_several_clients_equal_one_client_at_a_time():
    """censor_gradients (every client's T + 1 loss evaluations as rows of one vmapped forward pass) gives
    each client censor_gradient's result: its own model, batch size, trials, step and fallback. The
    candidates are drawn the same way (bit-identical); the losses agree to float32 rounding, so the same
    trial is chosen."""
    from leakgym.defenses.censor import censor_gradients

    clients = []
    for i, (b, trials, step, fallback) in enumerate([(1, 5, 0.1, "original"), (3, 7, 0.05, "zeros"), (2, 1, 0.2, "skip"),
                                                     (2, 20, 0.1, "zeros")]):
        model, x, _ = _setup(seed=i)
        g = torch.Generator().manual_seed(20 + i)
        x, y = torch.randn(b, 1, 16, 16, generator=g), torch.randint(0, 10, (b,), generator=g)
        settings = {"trials": trials, "step": step, "fallback": fallback, "subspace": "layer"}
        clients.append((model, x, y, compute_update(model, x, y).tensors, settings))
    together = censor_gradients(*(list(t) for t in zip(*clients)),
                                [torch.Generator().manual_seed(i) for i in range(len(clients))])
    chosen = []
    for i, ((model, x, y, grad, settings), (update, info)) in enumerate(zip(clients, together)):
        alone, ref = censor_gradient(model, x, y, grad, **settings, generator=torch.Generator().manual_seed(i))
        assert info["chosen_trial"] == ref["chosen_trial"] and info["sent"] == ref["sent"], i
        assert info["initial_loss"] == pytest.approx(ref["initial_loss"], rel=1e-6)
        assert info["trial_losses"] == pytest.approx(ref["trial_losses"], rel=1e-6)
        assert all(torch.equal(update[n], t) for n, t in alone.items()), i
        chosen.append(info["chosen_trial"])
    assert any(c >= 0 for c in chosen)  # some trial lowered a client's loss


def test_censor_batches_plain_models_and_keeps_one_client_exact(monkeypatch):
    import leakgym.defenses.censor as censor_module

    calls = []
    original = censor_module.censor_gradients
    monkeypatch.setattr(censor_module, "censor_gradients", lambda m, *a: calls.append(len(m)) or original(m, *a))
    configs = [DefenseConfig(censor_trials=4), DefenseConfig(censor_trials=6, censor_fallback="original"),
               DefenseConfig(censor_trials=3, censor_subspace="samples")]
    calls_in = []
    for i, cfg in enumerate(configs):
        model, x, y = _setup(seed=i)
        calls_in.append(DefenseCall(model, x, y, cfg, seed=30 + i))
    together = apply_defense_many(calls_in)
    assert calls == [2]  # the two layer-subspace clients; the samples-subspace one runs alone
    for c, (upd, rep) in zip(calls_in, together):
        alone, alone_rep = apply_defense(c.model, c.x, c.y, c.config, seed=c.seed)
        assert rep.details["censor"][0]["chosen_trial"] == alone_rep.details["censor"][0]["chosen_trial"]
        for n, t in alone.tensors.items():
            torch.testing.assert_close(upd.tensors[n], t, rtol=1e-6, atol=1e-7)



def test_batchnorm_in_eval_mode_joins_the_batched_trials_with_each_clients_statistics(eval_bn_convnets):
    """A victim with a batch of one evaluates its trials with BatchNorm in eval mode (running statistics):
    its trials join the vmapped computation, each row with its client's statistics, and choose what
    censor_gradient chooses alone; BatchNorm in train mode keeps the one-client path."""
    from leakgym.defenses.censor import batchable, censor_gradients

    models = eval_bn_convnets(SPEC, 3)
    assert batchable(models[0], "layer") and not batchable(build_model("convnet", SPEC, width=4).train(), "layer")
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(1, 1, 16, 16, generator=gen) for _ in models]
    ys = [torch.randint(0, 10, (1,), generator=gen) for _ in models]
    clients = [(m, x, y, compute_update(m, x, y).tensors, {"trials": 8, "step": 0.1, "fallback": "zeros"})
               for m, x, y in zip(models, xs, ys)]
    together = censor_gradients(*(list(t) for t in zip(*clients)), [torch.Generator().manual_seed(i) for i in range(3)])
    for i, ((model, x, y, grad, settings), (update, info)) in enumerate(zip(clients, together)):
        alone, ref = censor_gradient(model, x, y, grad, **settings, generator=torch.Generator().manual_seed(i))
        assert info["chosen_trial"] == ref["chosen_trial"], i
        assert info["trial_losses"] == pytest.approx(ref["trial_losses"], rel=1e-5)
        assert all(torch.equal(update[n], t) for n, t in alone.items()), i


@pytest.mark.cuda
def test_batched_trials_on_cuda_choose_what_one_client_chooses():
    from leakgym.defenses.censor import censor_gradients

    dev = torch.device("cuda")
    clients = []
    for i, b in enumerate((1, 3, 2)):
        model, _, _ = _setup(seed=i)
        model = model.to(dev)
        g = torch.Generator().manual_seed(20 + i)
        x, y = torch.randn(b, 1, 16, 16, generator=g).to(dev), torch.randint(0, 10, (b,), generator=g).to(dev)
        clients.append((model, x, y, compute_update(model, x, y).tensors,
                        {"trials": 6, "step": 0.1, "fallback": "zeros", "subspace": "layer"}))
    together = censor_gradients(*(list(t) for t in zip(*clients)),
                                [torch.Generator(dev).manual_seed(i) for i in range(3)])
    for i, ((model, x, y, grad, settings), (update, info)) in enumerate(zip(clients, together)):
        alone, ref = censor_gradient(model, x, y, grad, **settings, generator=torch.Generator(dev).manual_seed(i))
        assert info["trial_losses"] == pytest.approx(ref["trial_losses"], rel=1e-4)
        assert next(iter(update.values())).device.type == "cuda"
        if info["chosen_trial"] != ref["chosen_trial"]:
            # a different choice only where the two best trials tie within the losses' tolerance
            # (trial -1: no trial beat the initial loss, the fallback was sent)
            def loss_of(chosen, details=ref):
                return details["initial_loss"] if chosen < 0 else details["trial_losses"][chosen]

            a, b = loss_of(info["chosen_trial"]), loss_of(ref["chosen_trial"])
            assert a == pytest.approx(b, rel=1e-4), (i, info["chosen_trial"], ref["chosen_trial"], ref["trial_losses"])
        else:
            torch.testing.assert_close(update, alone, rtol=1e-4, atol=1e-6)


def test_batched_trials_in_chunks_equal_one_chunk(monkeypatch):
    """Large models evaluate the rows in chunks (bounded memory): the result does not change."""
    import leakgym.defenses.censor as censor_module

    clients = []
    for i in range(2):
        model, x, y = _setup(seed=i)
        clients.append((model, x, y, compute_update(model, x, y).tensors,
                        {"trials": 4, "step": 0.1, "fallback": "zeros", "subspace": "layer"}))

    def run():
        return censor_module.censor_gradients(*(list(t) for t in zip(*clients)),
                                              [torch.Generator().manual_seed(i) for i in range(2)])

    whole = run()
    monkeypatch.setattr(censor_module, "ROW_ENTRIES", 1)  # one image row per call
    chunked = run()
    for (u1, i1), (u2, i2) in zip(whole, chunked):
        assert i1["trial_losses"] == pytest.approx(i2["trial_losses"], rel=1e-6)
        assert i1["chosen_trial"] == i2["chosen_trial"]

"""apply_defense: identity without defense, canonical composition order, report fields, FedAvg."""

from __future__ import annotations

import pytest
import torch

from leakgym.data import dataset_spec
from leakgym.defenses import DefenseCall, DefenseConfig, DefenseReport, apply_defense, apply_defense_many
from leakgym.defenses.perturbation import add_noise, clip_norm, global_norm
from leakgym.defenses.pipeline import derived_generator
from leakgym.defenses.sparsification import density, prune_smallest, top_k
from leakgym.fl.client import compute_update
from leakgym.models import build_model, task_loss

SPEC = dataset_spec("digits", image_size=16)


def _batch(n: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_no_defense_shares_the_clean_gradient_exactly():
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch()
    upd, rep = apply_defense(model, x, y, DefenseConfig())
    ref = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
    for (name, _), g in zip(model.named_parameters(), ref):
        assert torch.equal(upd.tensors[name], g), name
    assert isinstance(rep, DefenseReport)
    assert rep.applied == [] and rep.fidelity == 1.0 and rep.overhead_s == 0.0
    assert rep.details["examples_used"] == 2 and upd.batch_size == 2 and upd.kind == "gradient"


def test_update_side_composition_follows_canonical_order_exactly():
    """prune -> top-k -> clip -> noise, reproduced by hand from the clean gradient with the same generators."""
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(3)
    cfg = DefenseConfig(noise_sigma=1e-3, clip=0.5, topk=0.2, prune=0.5)
    upd, rep = apply_defense(model, x, y, cfg, seed=7)
    assert rep.applied == ["prune", "topk", "clip", "noise"]
    clean = compute_update(model, x, y).tensors
    manual, _ = clip_norm(top_k(prune_smallest(clean, 0.5), 0.2), 0.5)
    manual = add_noise(manual, 1e-3, generator=derived_generator(7, "noise"))
    for name in clean:
        torch.testing.assert_close(upd.tensors[name], manual[name], rtol=0, atol=0)
    assert density(upd.tensors) == 1.0  # noise comes last, so nothing stays pruned
    assert 0.0 < rep.fidelity < 1.0 and rep.overhead_s >= 0.0
    assert rep.details["clip"]["factor"] < 1.0 and rep.details["topk"]["density"] <= 0.2 + 1e-4


def test_update_side_defenses_compute_the_gradient_once_and_use_a_given_clean_update(monkeypatch):
    """With update-side defenses only, the shared update is the clean one post-processed: one gradient
    computation, not two (bit-identical to recomputing it). A clean update passed in (the vector env's
    batched victims) is used as is: no gradient is computed, and a different one changes the result."""
    from leakgym.defenses import pipeline

    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(3)
    cfg = DefenseConfig(noise_sigma=1e-3, prune=0.5)
    calls = []
    real, real_many = pipeline.compute_update, pipeline.compute_updates
    monkeypatch.setattr(pipeline, "compute_update", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(pipeline, "compute_updates",
                        lambda jobs, *a, **k: calls.extend([1] * len(jobs)) or real_many(jobs, *a, **k))
    upd, rep = apply_defense(model, x, y, cfg, seed=3)
    assert len(calls) == 1 and rep.overhead_s >= 0.0
    clean = compute_update(model, x, y)
    manual = add_noise(prune_smallest(clean.tensors, 0.5), 1e-3, generator=derived_generator(3, "noise"))
    assert all(torch.equal(upd.tensors[n], manual[n]) for n in manual)
    calls.clear()
    given, rep2 = apply_defense(model, x, y, cfg, seed=3, clean=clean, clean_seconds=0.01)
    assert calls == [] and all(torch.equal(given.tensors[n], upd.tensors[n]) for n in manual)
    assert rep2.fidelity == pytest.approx(rep.fidelity, abs=1e-6)
    assert all(torch.equal(clean.tensors[n], compute_update(model, x, y).tensors[n]) for n in manual)  # not modified
    other = compute_update(model, *_batch(3, seed=1))
    moved, _ = apply_defense(model, x, y, cfg, seed=3, clean=other)
    assert not torch.equal(moved.tensors["head.weight"], upd.tensors["head.weight"])
    # an input-side defense recomputes (OASIS trains on more images) and still uses the given clean update
    calls.clear()
    apply_defense(model, x, y, DefenseConfig(oasis=1), seed=3, clean=clean)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="clean"):
        apply_defense(model, x, y, cfg, clean=compute_update(model, x, y, kind="model_delta"))


def test_input_per_step_and_update_side_stages_compose_with_report_details():
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(2)
    cfg = DefenseConfig(oasis=1 | 8, censor_trials=4, soteria=0.5, topk=0.5)
    upd, rep = apply_defense(model, x, y, cfg, seed=3)
    assert rep.applied == ["oasis", "censor", "soteria", "topk"]
    assert upd.batch_size == 2  # declared B: the client does not tell the server about OASIS copies
    assert rep.details["examples_used"] == 2 * (1 + 3 + 1)
    assert rep.details["declared_batch_size"] == 2
    assert len(rep.details["censor"]) == 1 and {"chosen_trial", "initial_loss", "best_loss", "trial_losses"} <= set(
        rep.details["censor"][0]
    )
    assert rep.details["soteria"]["pruned_units"] == 96  # floor(0.5 * 192) LeNet representation units
    assert abs(rep.fidelity) < 0.5  # CENSOR's update is (layer-wise) orthogonal to the clean one


def test_model_and_global_rng_are_untouched_and_results_reproducible():
    model = build_model("lenet", SPEC, seed=0, precode=True)  # PRECODE samples from the global RNG
    x, y = _batch(2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    cfg = DefenseConfig(ppp="ng", ppp_sigma=0.1, oasis=2)
    a, rep_a = apply_defense(model, x, y, cfg, seed=5)
    assert torch.equal(torch.get_rng_state(), rng)
    b, rep_b = apply_defense(model, x, y, cfg, seed=5)
    c, _ = apply_defense(model, x, y, cfg, seed=6)
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert not all(torch.equal(a.tensors[k], c.tensors[k]) for k in a.tensors)
    assert rep_a.fidelity == rep_b.fidelity
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    _clean_a, rep = apply_defense(model, x, y, None, seed=5)
    assert rep.fidelity == 1.0  # with PRECODE too: clean and "defended" runs share the seeded draws


def test_fedavg_pipeline_no_defense_equals_compute_update_and_clip_bounds_the_delta():
    model = build_model("lenet", SPEC, seed=4)
    x, y = _batch(3)
    upd, rep = apply_defense(model, x, y, None, update_kind="model_delta", local_steps=2, local_lr=0.05)
    ref = compute_update(model, x, y, kind="model_delta", local_steps=2, local_lr=0.05)
    assert rep.fidelity == 1.0 and upd.kind == "model_delta" and upd.local_steps == 2
    assert all(torch.equal(upd.tensors[k], ref.tensors[k]) for k in ref.tensors)
    clipped, rep = apply_defense(model, x, y, DefenseConfig(clip=1e-3), update_kind="model_delta",
                                 local_steps=2, local_lr=0.05)
    assert float(global_norm(clipped.tensors)) == pytest.approx(1e-3, rel=1e-5)
    assert rep.fidelity == pytest.approx(1.0, abs=1e-6)  # clipping rescales only


def test_mixup_encoding_through_the_pipeline_trains_on_soft_labels():
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(4)
    upd, rep = apply_defense(model, x, y, DefenseConfig(mixup_k=2), seed=1)
    assert rep.applied == ["mixup"] and rep.details["examples_used"] == 4 and upd.batch_size == 4
    mixing = rep.details["mixup"]["mixing_matrix"]
    x_enc = torch.einsum("ij,jchw->ichw", mixing, x)
    y_soft = mixing @ torch.nn.functional.one_hot(y, 10).float()
    ref = compute_update(model, x_enc, y_soft)
    for k in ref.tensors:
        torch.testing.assert_close(upd.tensors[k], ref.tensors[k])


def test_bad_inputs_raise_value_errors():
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(2)
    with pytest.raises(ValueError, match="config must be a DefenseConfig"):
        apply_defense(model, x, y, {"noise_sigma": 0.1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="y has 1 entries but x has 2 images"):
        apply_defense(model, x, y[:1])
    with pytest.raises(ValueError, match="public_x and public_y must be given together"):
        apply_defense(model, x, y, public_x=torch.rand(3, 1, 16, 16))
    with pytest.raises(ValueError, match="PRECODE bottleneck"):
        apply_defense(model, x, y, DefenseConfig(ppp="gc"))


def test_apply_defense_many_equals_apply_defense_call_by_call():
    """Seven clients (different models, batches, seeds and defenses: update-side only, with a step
    defense, none, with and without a given clean update): each result is its own apply_defense's.
    Prune and clip run as one batched computation over the clients that use them (bit-identical)."""
    configs = [DefenseConfig(prune=0.5), DefenseConfig(prune=0.5, noise_sigma=0.01), DefenseConfig(clip=0.1),
               DefenseConfig(), DefenseConfig(prune=0.9, clip=0.5), DefenseConfig(dcs2_lambda_g=0.5, dcs2_steps=3,
                                                                                 prune=0.5),
               DefenseConfig(prune=0.5, clip=1e6)]
    calls = []
    for i, cfg in enumerate(configs):
        model = build_model("lenet", SPEC, seed=i)
        x, y = _batch(2, seed=i)
        clean = compute_update(model, x, y) if i % 2 == 0 else None
        g = torch.Generator().manual_seed(50 + i)
        public_x, public_y = torch.rand(8, 1, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
        calls.append(DefenseCall(model, x, y, cfg, seed=100 + i, clean=clean, clean_seconds=0.01,
                                 public_x=public_x, public_y=public_y))
    together = apply_defense_many(calls)
    for i, (c, (upd, rep)) in enumerate(zip(calls, together)):
        alone, alone_rep = apply_defense(c.model, c.x, c.y, c.config, seed=c.seed, clean=c.clean,
                                         clean_seconds=c.clean_seconds, public_x=c.public_x, public_y=c.public_y)
        assert rep.applied == alone_rep.applied
        for name, t in alone.tensors.items():
            assert torch.equal(upd.tensors[name], t), (i, name)
        assert rep.fidelity == pytest.approx(alone_rep.fidelity, abs=1e-12)
        for key in ("prune", "clip", "noise"):
            if key in alone_rep.details:
                assert rep.details[key] == alone_rep.details[key], (i, key)
    assert together[3][1].applied == [] and together[3][1].fidelity == 1.0
    assert together[0][1].details["prune"]["density"] == pytest.approx(0.5, abs=0.01)
    assert together[2][1].details["clip"]["factor"] < 1.0 and together[6][1].details["clip"]["factor"] == 1.0


@pytest.mark.parametrize("encoding", [{"mixup_k": 2}, {"instahide_k": 2}])
def test_a_step_defense_groups_hard_and_soft_label_clients_apart(encoding):
    """CENSOR (and DCS²) batch a group's clients by concatenating their labels: a Mixup/InstaHide
    client trains on soft (B, K) labels, a plain one on hard (B,) labels. Put in one group, they
    crashed apply_defense_many although each ran alone."""
    configs = [DefenseConfig(censor_trials=2), DefenseConfig(censor_trials=2, **encoding), DefenseConfig(censor_trials=2)]
    calls = []
    for i, cfg in enumerate(configs):
        x, y = _batch(4, seed=i)
        calls.append(DefenseCall(build_model("lenet", SPEC, seed=i), x, y, cfg, seed=10 + i))
    together = apply_defense_many(calls)
    for c, (upd, rep) in zip(calls, together):
        alone, alone_rep = apply_defense(c.model, c.x, c.y, c.config, seed=c.seed)
        assert rep.applied == alone_rep.applied
        for name, t in alone.tensors.items():
            torch.testing.assert_close(upd.tensors[name], t, rtol=1e-5, atol=1e-6)


def test_update_defenses_batch_over_clients_only_through_apply_many(monkeypatch):
    """The update stage calls each update-side defense once for all its clients (not once per client)."""
    from leakgym.defenses.registry import DEFENSES

    seen = []
    prune = DEFENSES["prune"]
    original = type(prune).apply_many
    monkeypatch.setattr(type(prune), "apply_many", lambda self, ctxs, *a: seen.append(len(ctxs)) or original(self, ctxs, *a))
    calls = [DefenseCall(build_model("lenet", SPEC, seed=i), *_batch(2, seed=i), DefenseConfig(prune=0.5), seed=i)
             for i in range(4)]
    apply_defense_many(calls)
    assert seen == [4]


def test_a_global_rng_stream_resumes_where_it_stopped_and_restores_the_caller():
    from leakgym.defenses.registry import GlobalRngStream, seeded_global_rng

    with seeded_global_rng(7, torch.device("cpu")):
        expected = torch.randn(6)
    torch.manual_seed(123)
    outside = torch.get_rng_state()
    a, b = GlobalRngStream(7, torch.device("cpu")), GlobalRngStream(8, torch.device("cpu"))
    parts = []
    for _ in range(3):  # interleaved with another stream
        with a:
            parts.append(torch.randn(2))
        with b:
            torch.randn(5)
        assert torch.equal(torch.get_rng_state(), outside)
    assert torch.equal(torch.cat(parts), expected)
    with seeded_global_rng(9, torch.device("cpu")):
        expected = torch.randn(6)
    c = GlobalRngStream(9, torch.device("cpu"))
    with c:  # nested blocks of one stream continue it
        first = torch.randn(2)
        with c:
            second = torch.randn(2)
        third = torch.randn(2)
    assert torch.equal(torch.cat([first, second, third]), expected) and torch.equal(torch.get_rng_state(), outside)


@pytest.mark.parametrize("batch_defenses", [True, False])
@pytest.mark.parametrize("kind, steps", [("gradient", 1), ("model_delta", 3)])
def test_lock_step_training_gives_each_precode_client_its_own_update_exactly(kind, steps, batch_defenses):
    """Step defenses on PRECODE models (their forward samples from the global RNG): the clients are trained
    in lock-step, yet each one draws from its own stream, so every update equals its own apply_defense
    bit for bit -- FedSGD and FedAvg, CENSOR and DCS² (which runs these models one by one)."""
    configs = [DefenseConfig(censor_trials=3), DefenseConfig(dcs2_lambda_g=0.5, dcs2_steps=2, dcs2_start="random"),
               DefenseConfig(censor_trials=2, dcs2_lambda_g=0.7, dcs2_steps=2, dcs2_start="random"), DefenseConfig(oasis=1)]
    calls = []
    for i, cfg in enumerate(configs):
        model = build_model("mlp", SPEC, precode=True, width=32, seed=i).train()
        calls.append(DefenseCall(model, *_batch(2, seed=i), cfg, seed=40 + i, update_kind=kind, local_steps=steps,
                                 local_lr=0.05))
    together = apply_defense_many(calls, batch_defenses=batch_defenses)
    for i, (c, (upd, rep)) in enumerate(zip(calls, together)):
        alone, alone_rep = apply_defense(c.model, c.x, c.y, c.config, seed=c.seed, update_kind=kind,
                                         local_steps=steps, local_lr=0.05)
        assert rep.applied == alone_rep.applied
        for name, t in alone.tensors.items():
            assert torch.equal(upd.tensors[name], t), (i, name)
    assert len(together[2][1].details["censor"]) == steps == len(together[2][1].details["dcs2"])


@pytest.mark.cuda
def test_a_global_rng_stream_resumes_on_cuda():
    from leakgym.defenses.registry import GlobalRngStream, seeded_global_rng

    dev = torch.device("cuda")
    # The same draws as one block makes: on CUDA (Philox) three randn(2) are not one randn(6) -- each call
    # advances the generator's offset by a whole round -- so the stream is compared call for call.
    with seeded_global_rng(7, dev):
        expected = torch.cat([torch.randn(2, device=dev) for _ in range(3)])
    outside = torch.cuda.get_rng_state(dev)
    a, b = GlobalRngStream(7, dev), GlobalRngStream(8, dev)
    parts = []
    for _ in range(3):
        with a:
            parts.append(torch.randn(2, device=dev))
        with b:
            torch.randn(5, device=dev)
        assert torch.equal(torch.cuda.get_rng_state(dev), outside)
    assert torch.equal(torch.cat(parts), expected)


def test_victims_with_a_batch_of_one_batch_their_batchnorm_models_step_defenses(monkeypatch):
    """ConvNet (BatchNorm) victims with a batch of one (the CIFAR scenarios) train with BatchNorm in eval
    mode: their DCS² syntheses and CENSOR trials are one batched computation each, with each game's
    own running statistics, equal to the call-by-call pipeline to float32 rounding."""
    import leakgym.defenses.censor as censor_module
    import leakgym.defenses.dcs2 as dcs2_module

    sizes = []
    for module, name in ((dcs2_module, "dcs2_gradients"), (censor_module, "censor_gradients")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda m, *a, _f=original, _n=name: sizes.append((_n, len(m))) or _f(m, *a))
    config = DefenseConfig(dcs2_lambda_g=0.5, dcs2_steps=4, censor_trials=3)
    calls = []
    for i in range(3):
        model = build_model("convnet", SPEC, width=4, seed=i)
        stats = torch.Generator().manual_seed(90 + i)
        with torch.no_grad():  # each game's own statistics, as after some rounds of training
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=stats) - 0.5)
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=stats))
        x, y = _batch(1, seed=i)
        g = torch.Generator().manual_seed(70 + i)
        calls.append(DefenseCall(model, x, y, config, seed=200 + i, public_x=torch.rand(8, 1, 16, 16, generator=g),
                                 public_y=torch.randint(0, 10, (8,), generator=g)))
    together = apply_defense_many(calls, batch_defenses=True)
    assert sizes == [("dcs2_gradients", 3), ("censor_gradients", 3)]
    alone = apply_defense_many(calls, batch_defenses=False)
    for (upd, rep), (ref, ref_rep) in zip(together, alone):
        assert rep.details["censor"][0]["chosen_trial"] == ref_rep.details["censor"][0]["chosen_trial"]
        for name, t in ref.tensors.items():
            torch.testing.assert_close(upd.tensors[name], t, rtol=1e-4, atol=1e-5)


def test_a_call_normalises_the_public_split_only_when_a_defense_reads_it(monkeypatch):
    """Noise and pruning never read the public split: a call with them does not normalise it (73 ms for
    CIFAR-10's 5,000 public images, paid on every defended call before), and its update is bit-identical
    with and without the split passed. Add a reader (DCS² with its 'mixup' start) and the split is normalised
    once for the call. Which defense gets it: tests/test_defenses_devices.py."""
    from leakgym.data.spec import DatasetSpec

    sizes = []
    normalize = DatasetSpec.normalize
    monkeypatch.setattr(DatasetSpec, "normalize", lambda self, t: sizes.append(t.shape[0]) or normalize(self, t))
    model = build_model("lenet", SPEC, seed=0)
    x, y = _batch(2)
    g = torch.Generator().manual_seed(4)
    public_x, public_y = torch.rand(12, 1, 16, 16, generator=g), torch.randint(0, 10, (12,), generator=g)
    config = DefenseConfig(noise_sigma=1e-3, prune=0.5)
    with_split, _ = apply_defense(model, x, y, config, seed=2, public_x=public_x, public_y=public_y)
    assert 12 not in sizes
    without, _ = apply_defense(model, x, y, config, seed=2)
    for name, t in without.tensors.items():
        assert torch.equal(with_split.tensors[name], t), name
    apply_defense(model, x, y, config.replace(dcs2_lambda_g=0.5, dcs2_steps=2), seed=2, public_x=public_x,
                  public_y=public_y)
    assert sizes.count(12) == 1

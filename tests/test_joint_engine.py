"""One engine call for several strategies: parts with their own objective, optimiser and labels.

A vector step with random attacker actions hands the engine Inverting Gradients, prior-init and
GradInversion problems (Adam, cosine or L2, different priors) beside DLG problems (L-BFGS, L2, soft
labels optimised jointly). :func:`run_joint_matching` simulates all their rows together; every part
must still compute exactly what it computes in an engine call of its own (the sequential path is
bit-identical, the vectorised one equal to the kernels' rounding).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from engine_problems import VECTORISED_TOL, single_image_problems, three_parts

from leakgym.attacks import AttackerKnowledge, build_attack
from leakgym.attacks.engine import (
    MatchingObjective,
    PerProblem,
    ProblemSet,
    Schedule,
    reconstruct_jointly,
    run_gradient_matching,
    run_joint_matching,
)
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss
from leakgym.optim.randomness import BatchedGenerator


def _parts(digits, counts):
    """Inverting-Gradients-like (budgets 3/6), GradInversion-like and DLG parts (:func:`three_parts`)."""
    return three_parts(digits, counts)


def _subset(ps: ProblemSet, lo: int, hi: int, *, labels: bool) -> ProblemSet:
    pick = (lambda t: t[lo:hi]) if ps.batched else (lambda t: t)
    return dataclasses.replace(
        ps, free={k: pick(t) for k, t in ps.free.items()}, fixed={k: pick(t) for k, t in ps.fixed.items()},
        targets={k: t[lo:hi] for k, t in ps.targets.items()}, local_lr=ps.local_lr[lo:hi],
        labels=ps.labels[lo:hi] if labels else None)


@pytest.mark.parametrize("vectorize", [False, True])
def test_each_part_computes_what_it_computes_alone(digits, vectorize):
    counts = [2, 1, 2]
    ps, _, _ = single_image_problems(digits, sum(counts))
    parts = _parts(digits, counts)
    seeds = [10, 11, 12, 13, 14]
    joint = run_joint_matching(ps, parts, generator=BatchedGenerator.from_seeds(seeds, "cpu"), vectorize=vectorize)
    assert len(joint) == 3
    lo = 0
    for part, out in zip(parts, joint):
        hi = lo + part.problems
        optimise = bool(part.optimise_labels)
        alone = run_gradient_matching(
            _subset(ps, lo, hi, labels=not optimise), part.objective, part.schedule, part.init,
            generator=BatchedGenerator.from_seeds(seeds[lo:hi], "cpu"), vectorize=vectorize,
            label_init=part.label_init, per_problem=part.per_problem)
        assert out.budgets == alone.budgets and out.restart_counts == alone.restart_counts
        if vectorize:
            torch.testing.assert_close(out.images, alone.images, **VECTORISED_TOL)
            torch.testing.assert_close(out.history, alone.history, equal_nan=True, **VECTORISED_TOL)
        else:
            assert torch.equal(out.images, alone.images)
            assert torch.equal(out.history.isnan(), alone.history.isnan())
            assert torch.equal(out.history.nan_to_num(), alone.history.nan_to_num())
        if optimise:
            torch.testing.assert_close(out.soft_labels, alone.soft_labels, **VECTORISED_TOL)
        lo = hi


def test_parts_do_not_borrow_each_others_objective(digits):
    """Sabotage check: swapping the first two parts' objectives changes their results."""
    counts = [2, 1, 2]
    ps, _, _ = single_image_problems(digits, sum(counts))
    parts = _parts(digits, counts)
    seeds = [10, 11, 12, 13, 14]
    right = run_joint_matching(ps, parts, generator=BatchedGenerator.from_seeds(seeds, "cpu"))
    swapped = [dataclasses.replace(parts[0], objective=parts[1].objective), *parts[1:]]
    wrong = run_joint_matching(ps, swapped, generator=BatchedGenerator.from_seeds(seeds, "cpu"))
    assert not torch.allclose(right[0].images, wrong[0].images, **VECTORISED_TOL)
    torch.testing.assert_close(right[2].images, wrong[2].images, **VECTORISED_TOL)


def test_parts_sharing_an_optimiser_run_as_one(digits, monkeypatch):
    """The Adam parts (cosine + TV + sign steps + decay beside L2 + priors, plain steps) share one run:
    one objective evaluation, best-iterate update and optimiser step per iteration; DLG's L-BFGS part
    and a part that simulates a defense (EOT) run on their own. Results per part: the test above."""
    from leakgym.attacks.engine import matching

    made = []

    class Counting(matching._Run):
        def __init__(self, problems, members, generator):
            made.append([part.schedule.optimizer for part, _ in members])
            super().__init__(problems, members, generator)

    monkeypatch.setattr(matching, "_Run", Counting)
    counts = [2, 1, 2]
    ps, _, _ = single_image_problems(digits, sum(counts) + 1)
    ig, gi, dlg = _parts(digits, counts)
    eot = dataclasses.replace(
        ig, problems=1, init=ig.init[:1], per_problem=None,
        objective=dataclasses.replace(ig.objective, simulate_defense=lambda grads, generator: grads))
    out = run_joint_matching(ps, [ig, dlg, gi, eot], generator=BatchedGenerator.from_seeds(range(6), "cpu"))
    assert made == [["adam", "adam"], ["lbfgs"], ["adam"]]
    assert [o.images.shape[0] for o in out] == [2, 2, 1, 1]  # results in the callers' part order
    assert [o.budgets for o in out] == [[3, 6], [5, 5], [4], [6]]


def test_parts_are_validated(digits):
    ps, _, _ = single_image_problems(digits, 3)
    parts = _parts(digits, [1, 1, 1])
    with pytest.raises(ValueError, match="add up to the ProblemSet's 3"):
        run_joint_matching(ps, parts[:2])
    with pytest.raises(ValueError, match="add up"):
        run_joint_matching(ps, [])
    unlabelled, _, _ = single_image_problems(digits, 3, labels=False)
    with pytest.raises(ValueError, match="known labels needs a ProblemSet built with labels"):
        run_joint_matching(unlabelled, [dataclasses.replace(parts[0], optimise_labels=False), *parts[1:]])


@pytest.fixture(scope="module")
def victims(digit_victims):
    # Every other victim's labels are unknown: Inverting Gradients infers them, DLG optimises them.
    return digit_victims(6, known=lambda i: i % 2 == 1)


SETTINGS = [("inverting-gradients", {"iterations": 8, "tv": 1e-4}), ("dlg", {"iterations": 6}),
            ("prior-init", {"iterations": 5, "restarts": 2}), ("gradinversion", {"iterations": 7}),
            ("dlg", {"iterations": 4, "restarts": 2}), ("inverting-gradients", {"iterations": 10, "restarts": 2})]


def test_four_strategies_in_one_call_match_each_attack_alone(victims):
    attacks = [build_attack(name, **options) for name, options in SETTINGS]
    updates, knowledges = [v[0] for v in victims], [v[1] for v in victims]
    seeds = [100 + i for i in range(len(victims))]
    together = reconstruct_jointly(attacks, updates, knowledges, seeds=seeds)
    for i, attack in enumerate(attacks):
        alone = attack.reconstruct(updates[i], knowledges[i], seed=seeds[i])
        assert together[i].cost.iterations == alone.cost.iterations == SETTINGS[i][1]["iterations"]
        assert together[i].cost.restarts == alone.cost.restarts
        assert torch.equal(together[i].labels, alone.labels)
        torch.testing.assert_close(together[i].images, alone.images, **VECTORISED_TOL)
        assert together[i].cost.wall_time_s > 0


def test_only_plain_optimisation_attacks_join(victims):
    update, knowledge = victims[1]
    with pytest.raises(ValueError, match=r"attacks\[1\] \(MixupDecoding\) cannot share"):
        reconstruct_jointly([build_attack("inverting-gradients"), build_attack("mixup-decoding")],
                            [update, update], [knowledge, knowledge], seeds=[0, 1])
    with pytest.raises(ValueError, match="give one of each per problem"):
        reconstruct_jointly([build_attack("dlg")], [update, update], [knowledge, knowledge], seeds=[0, 1])
    with pytest.raises(ValueError, match=r"seeds\[0\]=-1"):
        reconstruct_jointly([build_attack("dlg")], [update], [knowledge], seeds=[-1])


def test_problems_simulated_as_whole_updates_run_in_passes_on_a_cpu(digit_victims, monkeypatch):
    """On a CPU, problems whose updates the engine simulates as whole updates (the ConvNet: convolutions too
    large for the unfolded form) run in engine calls of at most CPU_POSITIONS_PER_PASS image positions, whole
    problems each: every result (images, labels, budget, restarts) is what one call gives, to the vectorised
    kernels' rounding, in job order. The per-row form (LeNet) stays one call past the bound, and so does every
    device but a CPU's (the cuda case below)."""
    from leakgym.attacks.engine import optimization

    victims = digit_victims(5, known=lambda i: i != 1, arch="convnet")
    settings = [("inverting-gradients", {"iterations": 4}), ("dlg", {"iterations": 3}),
                ("prior-init", {"iterations": 3, "restarts": 2}), ("inverting-gradients", {"iterations": 2}),
                ("dlg", {"iterations": 2, "restarts": 2})]
    attacks = [build_attack(name, **options) for name, options in settings]
    calls = []
    real = optimization.run_joint_matching
    monkeypatch.setattr(optimization, "run_joint_matching",
                        lambda problems, parts, **kw: calls.append(
                            sum(sum(p.per_problem.restarts) for p in parts)) or real(problems, parts, **kw))

    def run(victims):
        return reconstruct_jointly(attacks, [v[0] for v in victims], [v[1] for v in victims], seeds=[7, 8, 9, 10, 11])

    whole = run(victims)
    assert calls == [7]  # 7 rows of 256 positions: one call
    calls.clear()
    monkeypatch.setattr(optimization, "CPU_POSITIONS_PER_PASS", 2 * 16 * 16)  # two rows of one digit a pass
    passes = run(victims)
    assert sum(calls) == 7 and len(calls) == 4 and max(calls) <= 2
    for a, b in zip(passes, whole):
        assert (a.cost.iterations, a.cost.restarts) == (b.cost.iterations, b.cost.restarts)
        assert torch.equal(a.labels, b.labels)
        torch.testing.assert_close(a.images, b.images, **VECTORISED_TOL)
    calls.clear()
    run(digit_victims(5, known=lambda i: i != 1))  # LeNet: the per-row form
    assert calls == [7]
    # A large model's rows hold a copy of every parameter each: CPU_PARAMETERS_PER_PASS bounds a pass too.
    monkeypatch.setattr(optimization, "CPU_POSITIONS_PER_PASS", 1 << 20)
    monkeypatch.setattr(optimization, "CPU_PARAMETERS_PER_PASS",
                        3 * sum(p.numel() for p in victims[0][1].model.parameters()))
    calls.clear()
    thirds = run(victims)
    assert calls == [3, 2, 2]  # rows: both IG problems and the first DLG one; the second DLG one; prior-init
    for a, b in zip(thirds, whole):
        torch.testing.assert_close(a.images, b.images, **VECTORISED_TOL)


def test_a_large_model_on_a_cpu_is_simulated_row_by_row(digit_victims, monkeypatch):
    """On a CPU the vmap(grad) of a model above CPU_VMAP_MAX_PARAMETERS loses to its rows one after another
    (ResNet-18, 8 rows: 342 vs 220 ms per row and iteration): the engine computes those dummy updates with the
    loop and batches the rest. Every result (images, labels, budget, restarts) is the vmap form's, to the
    vectorised kernels' rounding. The per-row form of the LeNet is not a vmap(grad) and keeps its form."""
    from leakgym.attacks.engine.problems import UpdateSimulator
    from leakgym.models import parameter_sets

    victims = digit_victims(4, known=lambda i: i != 1, arch="convnet")
    settings = [("inverting-gradients", {"iterations": 3}), ("dlg", {"iterations": 2}),
                ("prior-init", {"iterations": 2, "restarts": 2}), ("gradinversion", {"iterations": 2})]
    attacks = [build_attack(name, **options) for name, options in settings]
    forms = []
    for name in ("vectorised", "sequential"):
        real = getattr(UpdateSimulator, name)
        monkeypatch.setattr(UpdateSimulator, name, lambda self, *a, _n=name, _f=real: forms.append(_n) or _f(self, *a))

    def run(victims, attacks=attacks):
        forms.clear()
        return reconstruct_jointly(attacks, [v[0] for v in victims], [v[1] for v in victims], seeds=[3, 4, 5, 6])

    vmap_form = run(victims)
    assert set(forms) == {"vectorised"}
    monkeypatch.setattr(parameter_sets, "CPU_VMAP_MAX_PARAMETERS",
                        sum(p.numel() for p in victims[0][1].model.parameters()) - 1)
    rows = run(victims)
    assert set(forms) == {"sequential"}
    for a, b in zip(rows, vmap_form):
        assert (a.cost.iterations, a.cost.restarts) == (b.cost.iterations, b.cost.restarts)
        assert torch.equal(a.labels, b.labels)
        torch.testing.assert_close(a.images, b.images, **VECTORISED_TOL)
    monkeypatch.setattr(parameter_sets, "CPU_VMAP_MAX_PARAMETERS", 0)
    run(digit_victims(4), attacks[:2] * 2)  # LeNet: the per-row form
    assert set(forms) == {"vectorised"}


def test_the_row_by_row_form_refuses_a_model_that_draws_from_the_global_rng(digit_victims, monkeypatch):
    """The CPU's row-by-row form keeps the vectorised form's guarantee that a problem's random numbers are its
    own: a model whose forward draws from torch's global RNG (dropout) is refused as vmap refuses it."""
    from leakgym.models import parameter_sets

    update, knowledge = digit_victims(1, arch="convnet")[0]
    model = copy.deepcopy(knowledge.model)
    model.body.add_module("dropout", torch.nn.Dropout(0.5))
    knowledge = dataclasses.replace(knowledge, model=model)
    monkeypatch.setattr(parameter_sets, "CPU_VMAP_MAX_PARAMETERS", 0)
    with pytest.raises(ValueError, match="global RNG"):
        reconstruct_jointly([build_attack("inverting-gradients", iterations=1)], [update], [knowledge], seeds=[0])


@pytest.mark.cuda
def test_whole_update_problems_stay_one_call_on_cuda(digit_victims, cuda_device, monkeypatch):
    """The CPU's passes are a CPU measure: on a GPU the ConvNet problems past CPU_POSITIONS_PER_PASS are one call."""
    from leakgym.attacks.engine import optimization

    moved = [(u.to(cuda_device), dataclasses.replace(k, model=copy.deepcopy(k.model).to(cuda_device)))
             for u, k in digit_victims(3, arch="convnet")]
    calls = []
    real = optimization.run_joint_matching
    monkeypatch.setattr(optimization, "run_joint_matching",
                        lambda problems, parts, **kw: calls.append(problems.n) or real(problems, parts, **kw))
    monkeypatch.setattr(optimization, "CPU_POSITIONS_PER_PASS", 16 * 16)
    out = reconstruct_jointly([build_attack("inverting-gradients", iterations=2)] * 3, [m[0] for m in moved],
                              [m[1] for m in moved], seeds=[1, 2, 3])
    assert calls == [3] and all(r.images.device.type == "cuda" for r in out)


@pytest.mark.cuda
def test_a_large_model_keeps_the_vmap_form_on_cuda(digit_victims, cuda_device, monkeypatch):
    """CPU_VMAP_MAX_PARAMETERS is a CPU's bound: on a GPU the engine and DCS² vmap a model of any size."""
    from leakgym.attacks.engine.problems import UpdateSimulator
    from leakgym.defenses.dcs2 import synthesised_together
    from leakgym.models import parameter_sets

    moved = [(u.to(cuda_device), dataclasses.replace(k, model=copy.deepcopy(k.model).to(cuda_device)))
             for u, k in digit_victims(2, arch="convnet")]
    monkeypatch.setattr(parameter_sets, "CPU_VMAP_MAX_PARAMETERS", 0)
    forms = []
    real = UpdateSimulator.sequential
    monkeypatch.setattr(UpdateSimulator, "sequential", lambda self, *a: forms.append(1) or real(self, *a))
    out = reconstruct_jointly([build_attack("inverting-gradients", iterations=2)] * 2, [m[0] for m in moved],
                              [m[1] for m in moved], seeds=[1, 2])
    assert forms == [] and all(r.images.device.type == "cuda" for r in out)
    model = copy.deepcopy(moved[0][1].model).eval()
    assert synthesised_together(model) and not synthesised_together(copy.deepcopy(model).cpu())


@pytest.mark.cuda
def test_four_strategies_in_one_call_on_cuda(victims, cuda_device):
    """The joint call on a GPU: every tensor and generator on the device, each problem its own budget."""
    attacks = [build_attack(name, **options) for name, options in SETTINGS]
    moved = [(u.to(cuda_device), dataclasses.replace(k, model=copy.deepcopy(k.model).to(cuda_device)))
             for u, k in victims]
    out = reconstruct_jointly(attacks, [m[0] for m in moved], [m[1] for m in moved], seeds=list(range(len(moved))))
    for r in out:
        assert r.images.device.type == "cuda" and torch.isfinite(r.images).all()
    cpu = reconstruct_jointly(attacks, [v[0] for v in victims], [v[1] for v in victims], seeds=list(range(len(moved))))
    for a, b in zip(out, cpu):
        assert a.cost.iterations == b.cost.iterations


def _victim(digits, i, spec=None, **model_kwargs):
    spec = spec or digits.spec
    model = build_model("lenet", spec, seed=i, **model_kwargs).train()
    x, y = spec.normalize(digits.train_x[i:i + 1]), digits.train_y[i:i + 1]
    grads = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
    update = SharedUpdate({k: g.detach() for (k, _), g in zip(model.named_parameters(), grads)}, batch_size=1)
    return update, AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y)


def test_problems_that_differ_beyond_parameter_shapes_do_not_share_a_call(digits):
    """Found in review: the engine copies the first problem's model and box, so problems with another
    PRECODE KL weight, or a dataset of the same shape with other normalisation statistics, were
    optimised with the first one's; and EOT attacks with different simulators shared one part (the
    part key held a closure's address, which the next closure may reuse). Each must equal itself alone."""
    from leakgym.attacks.engine.optimization import _part_key

    ig = build_attack("inverting-gradients", iterations=4)
    pairs = [
        (_victim(digits, 0, precode=True, precode_beta=0.5), _victim(digits, 1, precode=True, precode_beta=1e-3)),
        (_victim(digits, 0), _victim(digits, 1, spec=dataclasses.replace(digits.spec, mean=(0.9,), std=(0.05,)))),
    ]
    for first, second in pairs:
        alone = ig.reconstruct_batch([second[0]], [second[1]], seeds=[7])[0]
        joint = ig.reconstruct_batch([first[0], second[0]], [first[1], second[1]], seeds=[3, 7])[1]
        torch.testing.assert_close(joint.images, alone.images, rtol=1e-4, atol=1e-4)
    quiet, noisy = (build_attack("eot", iterations=4, noise_std=s, eot_samples=2) for s in (0.0, 5.0))
    assert _part_key(quiet, False) != _part_key(noisy, False)
    problems = [_victim(digits, i) for i in range(2)]
    alone = noisy.reconstruct(*problems[1], seed=2)
    joint = reconstruct_jointly([quiet, noisy], [p[0] for p in problems], [p[1] for p in problems], seeds=[1, 2])
    torch.testing.assert_close(joint[1].images, alone.images, rtol=1e-4, atol=1e-4)


def _update_of(model, x, y, spec):
    grads = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
    update = SharedUpdate({k: g.detach() for (k, _), g in zip(model.named_parameters(), grads)}, batch_size=1)
    return update, AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y)


def _same_results(got, expected):
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        assert a.history == b.history and a.final_loss == b.final_loss and a.cost.units == b.cost.units


def test_models_and_attacks_are_read_afresh_by_every_call(digits):
    """reconstruct_jointly reads each distinct model (parameter names, shapes, head, device) and attack
    (settings, part key) once per call, not once per problem. Two architectures in one call, attacked by
    one shared attack object, and problems of an attack that picks its own layers, must still form their
    own engine calls (each equal, bit for bit, to its problems alone); and a model one of whose layers
    changes shape between two calls must be read as it is now (a stale signature would put it with the
    old architecture, whose parameters cannot be stacked with its own)."""
    spec = digits.spec
    x, y = spec.normalize(digits.train_x[:6]), digits.train_y[:6]

    def victim(i, **kwargs):
        return _update_of(build_model("lenet", spec, seed=i, **kwargs).train(), x[i:i + 1], y[i:i + 1], spec)

    def run(attacks, problems, seeds):
        return reconstruct_jointly(attacks, [p[0] for p in problems], [p[1] for p in problems], seeds=seeds)

    ig = build_attack("inverting-gradients", iterations=3)
    skip = build_attack("layer-skipping", iterations=3, layers=("body.conv1", "head"), skip_zeros=False)
    wide, narrow, skipped = [victim(0), victim(1)], [victim(2, width=8), victim(3, width=8)], [victim(4), victim(5)]
    joint = run([ig, ig, ig, ig, skip, skip], [wide[0], narrow[0], wide[1], narrow[1], *skipped], [1, 2, 3, 4, 5, 6])
    _same_results([joint[0], joint[2]], run([ig, ig], wide, [1, 3]))
    _same_results([joint[1], joint[3]], run([ig, ig], narrow, [2, 4]))
    _same_results(joint[4:], run([skip, skip], skipped, [5, 6]))

    changed, old = victim(0), victim(1)
    run([ig, ig], [changed, old], [5, 6])
    changed[1].model.body.conv4 = torch.nn.Conv2d(12, 12, 3, padding=1)  # same names, another weight shape
    changed = _update_of(changed[1].model, x[:1], y[:1], spec)
    twin = _update_of(copy.deepcopy(changed[1].model), x[:1], y[:1], spec)
    got = run([ig, ig, ig], [changed, old, twin], [5, 6, 7])
    _same_results([got[0], got[2]], run([ig, ig], [changed, twin], [5, 7]))
    _same_results([got[1]], [ig.reconstruct(old[0], old[1], seed=6)])


def test_engine_settings_must_be_integers():
    from leakgym.optim.lbfgs import BatchedLBFGS

    with pytest.raises(ValueError, match="history_size=2.5; must be an integer >= 1"):
        Schedule(iterations=1, history_size=2.5)
    with pytest.raises(ValueError, match="history_size=2.5"):
        BatchedLBFGS([torch.zeros(1, 3)], history_size=2.5)
    with pytest.raises(ValueError, match="eot_samples=1.5; must be an integer >= 1"):
        MatchingObjective(eot_samples=1.5)
    with pytest.raises(ValueError, match=r"PerProblem.iterations\[0\]=2.7; must be an integer >= 1"):
        PerProblem(iterations=[2.7]).resolve(1, Schedule(iterations=1), MatchingObjective())

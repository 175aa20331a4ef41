"""Per-problem budgets and restarts across strategies, divergence, validation and per-problem randomness.

Every problem of a joint engine call (:func:`run_joint_matching`, :func:`reconstruct_jointly`) must get
what it gets alone with its own values in a plain :class:`Schedule` -- budget 1 beside budget 9, one
restart beside three, Inverting Gradients, prior-init, GradInversion and DLG in one call, the largest
budget a DLG (L-BFGS) one -- bit for bit on the sequential path; a row that diverges must neither
disturb the other rows nor lose its best finite iterate, and must go on from it; bad inputs must be
refused before anything is computed or drawn; and each problem's generator must be left exactly where
its own call leaves it.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from engine_problems import VECTORISED_TOL, single_image_problems

from leakgym.attacks import build_attack
from leakgym.attacks.adaptive import gaussian_noise_simulator
from leakgym.attacks.engine import (
    MatchingObjective,
    Part,
    PerProblem,
    ProblemSet,
    Schedule,
    reconstruct_jointly,
    run_gradient_matching,
    run_joint_matching,
)
from leakgym.optim import BatchedGenerator


def _one(ps: ProblemSet, i: int, *, labels: bool) -> ProblemSet:
    """Problem ``i`` alone (with or without its labels)."""
    alone = ps.subset(i)
    return alone if labels else dataclasses.replace(alone, labels=None)


def _generator(seeds) -> BatchedGenerator:
    return BatchedGenerator.from_seeds(list(seeds), "cpu")


# -- every problem of a four-strategy call equals itself alone --------------------------------------
IG = (MatchingObjective(distance="cosine", tv=1e-4), Schedule(iterations=4, signed=True, boxed=True, lr_decay=True))
GI = (MatchingObjective(distance="l2", l2=1e-4, group=0.01), Schedule(iterations=3, lr=0.05, boxed=True))
DLG = (MatchingObjective(distance="l2"), Schedule(iterations=7, optimizer="lbfgs", lr=0.5))
#: (objective and schedule, budgets, restarts, step sizes, TV weights, optimise labels) of each part: the
#: largest budget (9) is a DLG problem's, budgets 1 sit in an Adam and an L-BFGS part, one and three
#: restarts mix within parts; the prior-init-like part shares its run with the Inverting Gradients part.
MIXED = [
    (IG, [1, 4], [1, 3], [0.1, 0.05], [1e-4, 1e-2], False),
    (DLG, [9, 1], [1, 3], [0.5, 1.0], [0.0, 0.0], True),
    (IG, [2], [2], [0.1], [1e-3], False),
    (GI, [3, 2], [3, 1], [0.05, 0.02], [0.0, 1e-3], False),
]


def _mixed_parts(digits) -> list[Part]:
    g = torch.Generator().manual_seed(0)
    shape, classes = digits.spec.shape, digits.spec.num_classes
    parts = []
    for (objective, schedule), budgets, restarts, lrs, tvs, optimise in MIXED:
        parts.append(Part(
            len(budgets), objective, schedule, [torch.randn(r, 1, *shape, generator=g) for r in restarts],
            label_init=[torch.randn(r, 1, classes, generator=g) for r in restarts] if optimise else None,
            per_problem=PerProblem(iterations=budgets, restarts=restarts, lr=lrs, tv=tvs), optimise_labels=optimise))
    return parts


@pytest.mark.parametrize("vectorize", [False, True])
def test_each_problem_of_a_mixed_four_strategy_call_equals_itself_alone(digits, vectorize):
    """Problem i's images, labels, losses, best restart and history equal those of an engine call of
    its own with ``Schedule(iterations=budget_i, restarts=restarts_i, lr=lr_i)`` and TV weight ``tv_i``
    (no PerProblem); its history holds exactly ``budget_i`` finite entries, then NaN."""
    parts = _mixed_parts(digits)
    n = sum(p.problems for p in parts)
    ps = single_image_problems(digits, n)[0]
    seeds = list(range(20, 20 + n))
    joint = run_joint_matching(ps, parts, generator=_generator(seeds), vectorize=vectorize)
    i = 0
    for ((objective, schedule), budgets, restarts, lrs, tvs, optimise), part, out in zip(MIXED, parts, joint):
        assert out.budgets == budgets and out.restart_counts == restarts
        assert out.iterations == max(budgets) and out.history.shape == (max(budgets), len(budgets))
        for j in range(part.problems):
            alone = run_gradient_matching(
                _one(ps, i, labels=not optimise), dataclasses.replace(objective, tv=tvs[j]),
                dataclasses.replace(schedule, iterations=budgets[j], restarts=restarts[j], lr=lrs[j]), [part.init[j]],
                generator=_generator([seeds[i]]), vectorize=vectorize,
                label_init=[part.label_init[j]] if optimise else None)
            history = out.history[:, j]
            assert int(torch.isfinite(history).sum()) == budgets[j], (i, history)
            assert torch.isnan(history[budgets[j]:]).all(), (i, history)
            assert int(out.best_restart[j]) == int(alone.best_restart[0]), i
            got = [out.images[j], out.matching_loss[j], out.total_loss[j], history[:budgets[j]]]
            want = [alone.images[0], alone.matching_loss[0], alone.total_loss[0], alone.history[:, 0]]
            if optimise:
                got.append(out.soft_labels[j])
                want.append(alone.soft_labels[0])
            else:
                assert out.soft_labels is None
            for a, b in zip(got, want):
                if vectorize:
                    torch.testing.assert_close(a, b, **VECTORISED_TOL)
                else:
                    assert torch.equal(a, b), i
            i += 1


#: Victim i (labels known for odd i): the DLG problem at 0 optimises its labels and has the largest
#: budget; budget 1 beside 9; one restart beside three; DLG at 5 has known labels (L-BFGS, hard labels).
JOINT_SETTINGS = [("dlg", {"iterations": 9, "restarts": 3}), ("inverting-gradients", {"iterations": 1}),
                  ("gradinversion", {"iterations": 4, "restarts": 3}), ("prior-init", {"iterations": 3}),
                  ("inverting-gradients", {"iterations": 5, "restarts": 3}), ("dlg", {"iterations": 2})]


def test_reconstruct_jointly_charges_and_records_each_problem_its_own_budget(digit_victims):
    """The sequential path of one mixed call equals each attack alone bit for bit: images, labels,
    history (``budget`` finite entries), final loss and cost (its own iterations and restarts)."""
    victims = digit_victims(len(JOINT_SETTINGS), known=lambda i: i % 2 == 1)
    attacks = [build_attack(name, **options) for name, options in JOINT_SETTINGS]
    for a in attacks:
        a.vectorize = False
    updates, knowledges = [v[0] for v in victims], [v[1] for v in victims]
    seeds = [40 + i for i in range(len(victims))]
    together = reconstruct_jointly(attacks, updates, knowledges, seeds=seeds)
    for i, (attack, (_, options)) in enumerate(zip(attacks, JOINT_SETTINGS)):
        alone = attack.reconstruct(updates[i], knowledges[i], seed=seeds[i])
        budget, restarts = options["iterations"], options.get("restarts", 1)
        r = together[i]
        assert (r.cost.iterations, r.cost.restarts, r.cost.units) == (budget, restarts, budget * restarts), i
        assert (alone.cost.iterations, alone.cost.restarts) == (budget, restarts)
        history = r.history["matching_loss"]
        assert len(history) == budget and all(math.isfinite(v) for v in history), (i, history)
        assert history == alone.history["matching_loss"], i
        assert torch.equal(r.images, alone.images) and torch.equal(r.labels, alone.labels), i
        assert r.final_loss == alone.final_loss, i


# -- divergence ------------------------------------------------------------------------------------
def _poisoning(row: int, evaluation: int):
    """A defense simulator (EOT hook) that is the identity except at objective evaluation ``evaluation``
    (0-based), where it multiplies row ``row``'s simulated update by NaN: that row's loss and gradient
    become NaN (a divergence), every other row's stay as they are."""
    calls = {"n": 0}

    def simulate(grads, generator):
        k = calls["n"]
        calls["n"] += 1
        if k != evaluation:
            return grads
        out = {}
        for name, g in grads.items():
            factor = torch.ones(g.shape[0], dtype=g.dtype)
            factor[row] = math.nan
            out[name] = g * factor.view(-1, *([1] * (g.dim() - 1)))
        return out

    return simulate


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("strategy", ["adam", "lbfgs"])
def test_a_diverged_row_leaves_the_others_alone_and_goes_on_from_its_best_iterate(digits, strategy, vectorize):
    """Problem 1's loss and gradient are NaN at evaluation 3 (its step then makes its images NaN). The
    other problems' results are those of the same call without the divergence; problem 1 returns a
    finite best iterate, its later evaluations are finite again (the row restarted from its best
    iterate -- for DLG the label logits too, not only the images) and DLG improves on it afterwards."""
    iterations, poisoned = 8, 3
    optimise = strategy == "lbfgs"
    ps = single_image_problems(digits, 3, labels=not optimise)[0]
    g = torch.Generator().manual_seed(1)
    init = torch.randn(3, 1, 1, *digits.spec.shape, generator=g)
    label_init = torch.randn(3, 1, 1, digits.spec.num_classes, generator=g) if optimise else None
    if optimise:
        objective, schedule = MatchingObjective(distance="l2"), Schedule(iterations=iterations, optimizer="lbfgs", lr=0.5)
    else:
        objective, schedule = MatchingObjective(distance="cosine", tv=1e-4), Schedule(iterations=iterations, lr=0.1)

    def run(simulate):
        part = Part(3, dataclasses.replace(objective, simulate_defense=simulate), schedule, init,
                    label_init=label_init, optimise_labels=optimise)
        return run_joint_matching(ps, [part], generator=_generator([1, 2, 3]), vectorize=vectorize)[0]

    clean = run(lambda grads, generator: grads)
    out = run(_poisoning(1, poisoned))
    for i in (0, 2):
        for a, b in ((out.images[i], clean.images[i]), (out.history[:, i], clean.history[:, i]),
                     (out.matching_loss[i], clean.matching_loss[i])):
            if vectorize:
                torch.testing.assert_close(a, b, **VECTORISED_TOL)
            else:
                assert torch.equal(a, b), i
    history = out.history[:, 1]
    assert torch.equal(history[:poisoned], clean.history[:poisoned, 1])
    assert torch.isnan(history[poisoned])
    assert torch.isfinite(history[poisoned + 1:]).all(), history  # restarted, not stuck at NaN
    assert torch.isfinite(out.images[1]).all()
    best = float(out.matching_loss[1])
    assert math.isfinite(best) and best <= float(history[torch.isfinite(history)].min())
    if optimise:
        assert torch.isfinite(out.soft_labels[1]).all()
        # From its best iterate L-BFGS goes on improving (a frozen or NaN row would not).
        assert float(history[-1]) < float(history[poisoned + 1])


# -- validation before anything is computed or drawn -----------------------------------------------
@pytest.mark.parametrize(("field", "value", "match"), [
    ("iterations", 3, r"PerProblem.iterations=3; must be one value per problem"),
    ("lr", torch.tensor(0.1), r"PerProblem.lr=tensor\(0.1000\); must be one value per problem"),
    ("lr", [[0.1], [0.2]], r"PerProblem.lr\[0\]=\[0.1\]; must be a real number"),
    ("tv", ["a", 0.1], r"PerProblem.tv\[0\]='a'; must be a real number"),
    ("lr", [None, 0.1], r"PerProblem.lr\[0\]=None; must be a real number"),
    ("lr", [0.1, True], r"PerProblem.lr\[1\]=True; must be a real number"),
    ("tv", "ab", r"PerProblem.tv='ab'; must be one value per problem"),
    ("restarts", [2, -1], r"PerProblem.restarts\[1\]=-1; must be an integer >= 1"),
    ("iterations", [2, 0], r"PerProblem.iterations\[1\]=0; must be an integer >= 1"),
    ("lr", [0.1, math.inf], r"PerProblem.lr\[1\]=inf; must be finite and > 0"),
    ("restarts", [1, 2, 3], r"PerProblem.restarts has 3 values for 2 problems"),
])
def test_per_problem_values_are_refused_with_a_value_error_naming_them(field, value, match):
    with pytest.raises(ValueError, match=match):
        PerProblem(**{field: value}).resolve(2, Schedule(iterations=1), MatchingObjective())


def test_a_bad_part_is_refused_before_any_part_draws_from_the_generators(digits):
    """A DLG part without label_init draws its logits from the problems' generators; a later part with
    a bad init (or label_init) must be refused before that draw, naming the part."""
    ps = single_image_problems(digits, 2)[0]
    shape, classes = digits.spec.shape, digits.spec.num_classes
    dlg = Part(1, *DLG, torch.zeros(1, 1, 1, *shape), optimise_labels=True)
    bad_init = Part(1, *IG, torch.zeros(1, 2, 1, *shape))  # 2 restarts, the schedule says 1
    bad_labels = dataclasses.replace(dlg, label_init=torch.zeros(1, 1, 1, classes + 1))
    restarts = Part(1, *IG, [torch.zeros(3, 1, *shape)], per_problem=PerProblem(restarts=[2]))
    cases = [([dlg, bad_init], r"parts\[1\]\.init has shape \(1, 2, 1, 1, 16, 16\)"),
             ([dlg, bad_labels], r"parts\[1\]\.label_init has shape \(1, 1, 1, 11\)"),
             ([dlg, restarts], r"parts\[1\]\.init has shapes \[\(3, 1, 1, 16, 16\)\].*R_i = \[2\]")]
    for parts, match in cases:
        gen = _generator([5, 6])
        with pytest.raises(ValueError, match=match):
            run_joint_matching(ps, parts, generator=gen)
        for seed, g in zip([5, 6], gen.generators):
            assert torch.equal(torch.randn(4, generator=g), torch.randn(4, generator=torch.Generator().manual_seed(seed)))


# -- randomness: problem i's stream is its own ------------------------------------------------------
@pytest.mark.parametrize("vectorize", [False, True])
def test_each_problems_generator_ends_where_its_own_call_leaves_it(digits, vectorize):
    """EOT samples (every evaluation, final one included) and DLG's default label logits come from each
    problem's own generator: with budgets 1 to 5 and one to three restarts, after the joint call every
    generator continues exactly as after the problem's own call, and the results agree."""
    g = torch.Generator().manual_seed(2)
    shape = digits.spec.shape
    eot = Part(2, MatchingObjective(distance="cosine", simulate_defense=gaussian_noise_simulator(1e-3), eot_samples=2),
               Schedule(iterations=3), [torch.randn(r, 1, *shape, generator=g) for r in (2, 1)],
               per_problem=PerProblem(iterations=[1, 4], restarts=[2, 1]))
    dlg = Part(2, *DLG, [torch.randn(r, 1, *shape, generator=g) for r in (1, 3)],
               per_problem=PerProblem(iterations=[5, 2], restarts=[1, 3]), optimise_labels=True)
    parts = [eot, dlg]
    ps = single_image_problems(digits, 4)[0]
    seeds = [5, 6, 7, 8]
    gen = _generator(seeds)
    joint = run_joint_matching(ps, parts, generator=gen, vectorize=vectorize)
    i = 0
    for part, out in zip(parts, joint):
        for j in range(part.problems):
            mine = _generator([seeds[i]])
            pp = PerProblem(iterations=[part.per_problem.iterations[j]], restarts=[part.per_problem.restarts[j]])
            alone = run_joint_matching(_one(ps, i, labels=True), [dataclasses.replace(
                part, problems=1, init=[part.init[j]], per_problem=pp)], generator=mine, vectorize=vectorize)[0]
            assert torch.equal(torch.randn(8, generator=gen.generators[i]), torch.randn(8, generator=mine.generators[0])), i
            if vectorize:
                torch.testing.assert_close(out.images[j], alone.images[0], **VECTORISED_TOL)
            else:
                assert torch.equal(out.images[j], alone.images[0]), i
            i += 1

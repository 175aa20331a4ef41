"""Small gradient-matching problems for the engine tests (tests/test_joint_engine.py, tests/test_engine_budgets.py,
tests/test_engine_replay.py)."""

from __future__ import annotations

import torch

from leakgym.attacks import AttackerKnowledge
from leakgym.attacks.engine import MatchingObjective, Part, PerProblem, ProblemSet, Schedule
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss

#: Vectorised rows vs the same problem alone (as tests/test_attacks_seeds.py: rounding of batched kernels).
VECTORISED_TOL = {"rtol": 1e-4, "atol": 1e-4}


def single_image_problems(digits, n: int, *, labels: bool = True
                          ) -> tuple[ProblemSet, list[SharedUpdate], list[AttackerKnowledge]]:
    """n single-image problems, problem i the gradient of digit i on its own LeNet (seed i): every problem
    has its own parameters. ``labels=False``: a ProblemSet without labels (DLG optimises them)."""
    spec = digits.spec
    updates, knowledges = [], []
    for i in range(n):
        model = build_model("lenet", spec, seed=i)
        x, y = spec.normalize(digits.train_x[i:i + 1]), digits.train_y[i:i + 1]
        grads = torch.autograd.grad(task_loss(model, x, y), list(model.parameters()))
        updates.append(SharedUpdate({k: g.detach() for (k, _), g in zip(model.named_parameters(), grads)},
                                    batch_size=1))
        knowledges.append(AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y))
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                 labels=torch.stack([k.labels for k in knowledges]) if labels else None)
    return ps, updates, knowledges


def three_parts(digits, counts, *, ig_budgets=(3, 6), gi_budget: int = 4, dlg_budget: int = 5) -> list[Part]:
    """An Inverting-Gradients-like part (Adam, cosine, TV, decay; its problems' budgets ``ig_budgets``), a
    GradInversion-like part (Adam, L2 + l2 prior + group consistency, 2 restarts) and a DLG part (L-BFGS,
    L2, soft labels); ``counts``: the problems of each."""
    shape = digits.spec.shape
    g = torch.Generator().manual_seed(0)
    ig = Part(counts[0], MatchingObjective(distance="cosine", tv=1e-4),
              Schedule(iterations=max(ig_budgets), signed=True, boxed=True, lr_decay=True),
              torch.randn(counts[0], 1, 1, *shape, generator=g),
              per_problem=PerProblem(iterations=list(ig_budgets)[: counts[0]], tv=[1e-4, 1e-2][: counts[0]]))
    gi = Part(counts[1], MatchingObjective(distance="l2", l2=1e-4, group=0.01),
              Schedule(iterations=gi_budget, restarts=2, lr=0.05, boxed=True),
              torch.randn(counts[1], 2, 1, *shape, generator=g))
    dlg = Part(counts[2], MatchingObjective(distance="l2"), Schedule(iterations=dlg_budget, optimizer="lbfgs", lr=0.5),
               torch.randn(counts[2], 1, 1, *shape, generator=g),
               label_init=torch.randn(counts[2], 1, 1, digits.spec.num_classes, generator=g),
               optimise_labels=True)
    return [ig, gi, dlg]

"""Small gradient-matching problems for the engine tests (tests/test_joint_engine.py, tests/test_engine_budgets.py)."""

from __future__ import annotations

import torch

from leakgym.attacks import AttackerKnowledge
from leakgym.attacks.engine import ProblemSet
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

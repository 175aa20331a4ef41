"""The engine: P = N x R gradient-matching problems optimised as one computation per iteration.

:func:`run_gradient_matching` minimises every problem's :class:`~leakgym.attacks.engine.objective.MatchingObjective`
over its dummy images (and, for DLG, soft labels), all restarts at once:

* the dummy updates of all rows come from :class:`~leakgym.attacks.engine.problems.UpdateSimulator`;
* one outer ``torch.autograd.grad`` of ``sum_p loss_p`` differentiates through the inner gradient
  (double backward) and yields every row's image gradient, because rows never interact;
* the optimisers are per row by construction: Adam is element-wise, L-BFGS is
  :class:`~leakgym.attacks.engine.lbfgs.BatchedLBFGS`;
* a diverged row restarts from its best iterate, and each victim's restart with the lowest matching
  loss is returned.

``vectorize=False`` runs the same maths as a plain Python loop over rows with
``torch.autograd.grad(..., create_graph=True)`` -- the reference formulation of the attack papers.
It exists to check the vectorised path (tests assert both agree) and as the benchmark's baseline.

Randomness: initial images and label logits come from the caller; every draw during the run
(default label logits, PRECODE bottleneck noise, EOT samples) comes from the caller's per-problem
:class:`~leakgym.attacks.engine.randomness.BatchedGenerator`, so problem ``i``'s random numbers do not
depend on the other problems. Its floating-point results can: vectorised kernels (BLAS, oneDNN) choose
their algorithm by the batch size, so a problem's row of an N-problem batch matches the problem alone
to rounding, not bit for bit (measurements in ``tests/test_attacks_seeds.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from leakgym.attacks.base import problem_seeds
from leakgym.attacks.engine.lbfgs import BatchedLBFGS
from leakgym.attacks.engine.objective import MatchingObjective, Schedule, matching_term, objective_terms
from leakgym.attacks.engine.problems import ProblemSet, UpdateSimulator
from leakgym.attacks.engine.randomness import BatchedGenerator, canonical_device
from leakgym.attacks.losses import layer_weights, target_sq_norms


@dataclass
class MatchingOutput:
    """Engine result for N problems (best restart of each)."""

    images: Tensor
    """``(N, B, C, H, W)`` reconstructions, normalised space."""
    soft_labels: Tensor | None
    """``(N, B, num_classes)`` optimised label distributions (None when labels were given)."""
    matching_loss: Tensor
    """``(N,)`` matching loss of the returned images."""
    total_loss: Tensor
    """``(N,)`` full objective (matching loss plus weighted priors) of the returned images."""
    history: Tensor
    """``(iterations, N)`` matching loss per iteration of the returned restart."""
    best_restart: Tensor
    """``(N,)`` index of the returned restart."""
    iterations: int
    restarts: int


def run_gradient_matching(
    problems: ProblemSet,
    objective: MatchingObjective,
    schedule: Schedule,
    init: Tensor,
    *,
    generator: BatchedGenerator | None = None,
    seed: int = 0,
    vectorize: bool = True,
    label_init: Tensor | None = None,
) -> MatchingOutput:
    """Optimise dummy images for all problems and restarts at once.

    Args:
        problems: the N problems (:meth:`ProblemSet.from_updates`).
        objective: distance and priors.
        schedule: optimiser and budget; ``schedule.restarts`` must equal ``init.shape[1]``.
        init: initial images ``(N, R, B, C, H, W)`` in normalised space.
        generator: one generator per problem (on ``problems.device``) for every random draw of the
            run: label logits when ``label_init`` is omitted, PRECODE bottleneck noise and EOT
            samples; the streams continue where the caller left them.
        seed: when ``generator`` is None, problem ``i``'s generator is seeded with ``seed + i``.
        vectorize: True for the vmapped computation, False for the reference Python loop.
        label_init: ``(N, R, B, num_classes)`` initial label logits when ``problems.labels`` is None
            (DLG's joint label optimisation); standard normal from ``generator`` if omitted.

    Returns:
        :class:`MatchingOutput`; each victim's restart with the lowest matching loss of its best
        iterate (iterates are kept by lowest total objective, as in the ``breaching`` library).
    """
    n, r = problems.n, schedule.restarts
    b = problems.batch_size
    expected = (n, r, b, *problems.image_shape)
    if tuple(init.shape) != expected:
        raise ValueError(f"init has shape {tuple(init.shape)}; expected (N, R, B, C, H, W) = {expected}")
    if objective.bn > 0 and problems.bn_targets is None:
        raise ValueError("objective.bn > 0 needs a ProblemSet built with use_bn_stats=True")
    if objective.group > 0 and r < 2:
        raise ValueError(f"group consistency needs restarts >= 2; got restarts={r}")
    device, dtype = problems.device, problems.dtype
    if generator is None:
        generator = BatchedGenerator.from_seeds(problem_seeds(n, seed=seed), device)
    if generator.n != n or generator.device != canonical_device(device):
        raise ValueError(f"generator has {generator.n} generators on {generator.device}; "
                         f"expected one per problem ({n}) on {device}")
    rows = generator.with_rows(r)  # draws of P = N x R rows, restarts of problem i from its generator
    p_count = n * r
    weights = layer_weights(list(problems.targets), objective.layer_weights)
    t_norm = target_sq_norms(problems.targets, weights) if objective.distance == "cosine" else None

    x = init.to(device=device, dtype=dtype).reshape(p_count, b, *problems.image_shape).clone()
    x.requires_grad_(True)
    variables = [x]
    logits = None
    if problems.labels is None:
        if label_init is None:
            label_init = rows.randn((b, problems.num_classes), dtype=dtype)
        logits = label_init.to(device=device, dtype=dtype).reshape(p_count, b, problems.num_classes).clone()
        logits.requires_grad_(True)
        variables.append(logits)
        hard = None
    else:
        hard = problems.labels.repeat_interleave(r, dim=0)

    lower, upper = problems.lower, problems.upper

    def evaluate(need_grad: bool) -> tuple[Tensor, Tensor, list[Tensor] | None]:
        y = hard if logits is None else logits.softmax(dim=-1)
        eps = rows.randn((sim.noise_numel,), dtype=dtype) if sim.noise_numel else x.new_zeros(p_count, 0)
        dummy, stats = sim.vectorised(x, y, eps) if vectorize else sim.sequential(x, y, eps)
        matching = matching_term(objective, dummy, problems.targets, weights, t_norm, rows)
        total = objective_terms(objective, matching, x, restarts=r, bn_stats=stats, bn_targets=problems.bn_targets)
        grads = None
        if need_grad:
            grads = list(torch.autograd.grad(total.sum(), variables))
        return matching.detach(), total.detach(), grads

    if schedule.optimizer == "adam":
        opt = torch.optim.Adam(variables, lr=schedule.lr)
        milestones = [int(schedule.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)] if schedule.lr_decay else []
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    else:
        lbfgs = BatchedLBFGS(variables, lr=schedule.lr, history_size=schedule.history_size)

    history = torch.empty(schedule.iterations, p_count, dtype=dtype, device=device)
    best_total = torch.full((p_count,), math.inf, dtype=dtype, device=device)
    best_match = torch.full((p_count,), math.inf, dtype=dtype, device=device)
    best_x = x.detach().clone()
    best_logits = None if logits is None else logits.detach().clone()
    view = (-1,) + (1,) * (x.dim() - 1)

    def keep_best(matching: Tensor, total: Tensor) -> None:
        nonlocal best_x, best_logits
        better = total < best_total  # False for NaN: diverged iterates are never kept
        best_total.copy_(torch.where(better, total, best_total))
        best_match.copy_(torch.where(better, matching, best_match))
        best_x = torch.where(better.view(view), x.detach(), best_x)
        if logits is not None:
            best_logits = torch.where(better.view(-1, 1, 1), logits.detach(), best_logits)

    sim = UpdateSimulator(problems, r, record_bn=objective.bn > 0)  # closed below: it patches the model copy
    try:
        for it in range(schedule.iterations):
            matching, total, grads = evaluate(need_grad=True)
            history[it] = matching
            keep_best(matching, total)
            if schedule.optimizer == "adam":
                if schedule.signed:
                    grads[0] = grads[0].sign()
                for v, g in zip(variables, grads):
                    v.grad = g
                opt.step()
                sched.step()
            else:
                lbfgs.step(grads)
            if schedule.boxed:
                with torch.no_grad():
                    x.copy_(torch.maximum(torch.minimum(x, upper), lower))
            with torch.no_grad():
                # A diverged problem restarts from its best iterate; others are unaffected.
                bad = ~torch.isfinite(x).flatten(1).all(dim=1)
                x.copy_(torch.where(bad.view(view), best_x, x))
        matching, total, _ = evaluate(need_grad=False)
        keep_best(matching, total)
    finally:
        sim.close()

    score = best_match.reshape(n, r)
    score = torch.where(torch.isfinite(score), score, torch.full_like(score, math.inf))
    best_r = score.argmin(dim=1)
    pick = torch.arange(n, device=device) * r + best_r
    images = best_x[pick].detach()
    soft = None if best_logits is None else best_logits[pick].softmax(dim=-1)
    return MatchingOutput(
        images=images, soft_labels=soft, matching_loss=best_match[pick], total_loss=best_total[pick],
        history=history[:, pick], best_restart=best_r, iterations=schedule.iterations, restarts=r,
    )


__all__ = ["MatchingOutput", "run_gradient_matching"]

"""The engine: P = N x R gradient-matching problems optimised as one computation per iteration.

:func:`run_gradient_matching` minimises every problem's :class:`~leakgym.attacks.engine.objective.MatchingObjective`
over its dummy images (and, for DLG, soft labels), all restarts at once:

* the dummy updates of all rows come from :class:`~leakgym.attacks.engine.problems.UpdateSimulator`;
* one outer ``torch.autograd.grad`` of ``sum_p loss_p`` differentiates through the inner gradient
  (double backward) and yields every row's image gradient, because rows never interact;
* the optimisers are per row by construction: :class:`~leakgym.attacks.engine.adam.BatchedAdam`
  (``torch.optim.Adam`` with a step size and decay milestones per row) and
  :class:`~leakgym.attacks.engine.lbfgs.BatchedLBFGS`;
* a diverged row restarts from its best iterate, and each victim's restart with the lowest matching
  loss is returned;
* problems may differ in budget, restarts, step size and TV weight (:class:`~leakgym.attacks.engine.objective.PerProblem`):
  a problem with R restarts owns R rows, and a problem past its budget leaves the computation (its
  images and optimiser state freeze), so the engine runs ``max(budget)`` iterations over fewer and
  fewer rows and every problem is charged its own budget.

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

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from leakgym.attacks.base import problem_seeds
from leakgym.attacks.engine.adam import BatchedAdam, decay_milestones, decayed_rates
from leakgym.attacks.engine.lbfgs import BatchedLBFGS
from leakgym.attacks.engine.objective import (
    MatchingObjective,
    PerProblem,
    Schedule,
    matching_term,
    objective_terms,
)
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
    """``(iterations, N)`` matching loss per iteration of the returned restart; NaN past a problem's budget."""
    best_restart: Tensor
    """``(N,)`` index of the returned restart."""
    iterations: int
    """The largest budget (every problem's, without :class:`PerProblem` iterations)."""
    restarts: int
    """The largest restart count."""
    budgets: list[int] = field(default_factory=list)
    """Iterations problem ``i`` ran: its own budget."""
    restart_counts: list[int] = field(default_factory=list)
    """Restarts problem ``i`` ran."""


def _rows(init: Tensor | Sequence[Tensor], counts: list[int], tail: tuple[int, ...], what: str) -> Tensor:
    """``(N, R, *tail)`` or N tensors ``(R_i, *tail)`` -> rows ``(sum R_i, *tail)``, checked against ``counts``."""
    n = len(counts)
    if isinstance(init, Tensor):
        expected = (n, counts[0], *tail)
        if len(set(counts)) != 1 or tuple(init.shape) != expected:
            want = expected if len(set(counts)) == 1 else f"a list of {n} tensors (R_i, {', '.join(map(str, tail))})"
            raise ValueError(f"{what} has shape {tuple(init.shape)}; expected (N, R, ...) = {want}")
        return init.reshape(-1, *tail)
    parts = list(init)
    shapes = [tuple(t.shape) for t in parts]
    if len(parts) != n or any(sh != (c, *tail) for sh, c in zip(shapes, counts)):
        raise ValueError(f"{what} has shapes {shapes}; expected one (R_i, {', '.join(map(str, tail))}) per problem "
                         f"with R_i = {counts}")
    return torch.cat(parts)


def run_gradient_matching(
    problems: ProblemSet,
    objective: MatchingObjective,
    schedule: Schedule,
    init: Tensor | Sequence[Tensor],
    *,
    generator: BatchedGenerator | None = None,
    seed: int = 0,
    vectorize: bool = True,
    label_init: Tensor | Sequence[Tensor] | None = None,
    per_problem: PerProblem | None = None,
) -> MatchingOutput:
    """Optimise dummy images for all problems and restarts at once.

    Args:
        problems: the N problems (:meth:`ProblemSet.from_updates`).
        objective: distance and priors.
        schedule: optimiser and budget; ``schedule.restarts`` must equal ``init.shape[1]``.
        init: initial images ``(N, R, B, C, H, W)`` in normalised space, or (with per-problem
            restarts) a sequence of N tensors ``(R_i, B, C, H, W)``.
        generator: one generator per problem (on ``problems.device``) for every random draw of the
            run: label logits when ``label_init`` is omitted, PRECODE bottleneck noise and EOT
            samples; the streams continue where the caller left them.
        seed: when ``generator`` is None, problem ``i``'s generator is seeded with ``seed + i``.
        vectorize: True for the vmapped computation, False for the reference Python loop.
        label_init: ``(N, R, B, num_classes)`` (or N tensors ``(R_i, B, num_classes)``) initial label
            logits when ``problems.labels`` is None (DLG's joint label optimisation); standard normal
            from ``generator`` if omitted.
        per_problem: budgets, restarts, step sizes and TV weights that differ between problems
            (:class:`PerProblem`); problem ``i`` computes what it would compute alone with its own
            values. A problem past its budget is frozen and no longer computed.

    Returns:
        :class:`MatchingOutput`; each victim's restart with the lowest matching loss of its best
        iterate (iterates are kept by lowest total objective, as in the ``breaching`` library).
    """
    n, b = problems.n, problems.batch_size
    shape = tuple(problems.image_shape)
    settings = (per_problem or PerProblem()).resolve(n, schedule, objective)
    budgets, counts = settings.iterations, settings.restarts
    x0 = _rows(init, counts, (b, *shape), "init")
    if objective.bn > 0 and problems.bn_targets is None:
        raise ValueError("objective.bn > 0 needs a ProblemSet built with use_bn_stats=True")
    if objective.group > 0 and max(counts) < 2:
        # The consensus of a single restart is the restart itself: the term is identically 0.
        objective = dataclasses.replace(objective, group=0.0)
    device, dtype = problems.device, problems.dtype
    if generator is None:
        generator = BatchedGenerator.from_seeds(problem_seeds(n, seed=seed), device)
    if generator.n != n or generator.device != canonical_device(device):
        raise ValueError(f"generator has {generator.n} generators on {generator.device}; "
                         f"expected one per problem ({n}) on {device}")
    rows = generator.with_rows(counts)  # draws of P = sum R_i rows, restarts of problem i from its generator
    p_count = sum(counts)
    weights = layer_weights(list(problems.targets), objective.layer_weights)
    t_norm = target_sq_norms(problems.targets, weights) if objective.distance == "cosine" else None
    owner = torch.repeat_interleave(torch.arange(n, device=device), torch.tensor(counts, device=device))
    start = [0]
    for c in counts[:-1]:
        start.append(start[-1] + c)

    x_all = x0.to(device=device, dtype=dtype).clone()
    logits_all = None
    if problems.labels is None:
        if label_init is None:
            logits_all = rows.randn((b, problems.num_classes), dtype=dtype)
        else:
            logits_all = _rows(label_init, counts, (b, problems.num_classes), "label_init")
        logits_all = logits_all.to(device=device, dtype=dtype).clone()
    hard_all = None if problems.labels is None else problems.labels.index_select(0, owner)

    # Per-row settings, float64 for the step sizes (as the Python floats of torch.optim).
    rate_dtype = torch.float64 if device.type != "mps" else torch.float32
    if schedule.optimizer == "adam":
        milestones = [decay_milestones(t) for t in budgets] if schedule.lr_decay else [[] for _ in budgets]
        rates = torch.tensor([decayed_rates(lr, m) for lr, m in zip(settings.lr, milestones)],
                             dtype=rate_dtype, device=device).index_select(0, owner)
        marks = torch.tensor(milestones, dtype=torch.int64, device=device).index_select(0, owner) \
            if schedule.lr_decay else None
    else:
        step_lengths = torch.tensor(settings.lr, dtype=rate_dtype, device=device).index_select(0, owner)
    use_tv = any(v > 0 for v in settings.tv)
    tv_all = torch.tensor(settings.tv, dtype=dtype, device=device).index_select(0, owner) if use_tv else None
    if not use_tv:
        objective = dataclasses.replace(objective, tv=0.0)
    lower, upper = problems.lower, problems.upper

    history = torch.full((max(budgets), p_count), math.nan, dtype=dtype, device=device)
    best_total = torch.full((p_count,), math.inf, dtype=dtype, device=device)
    best_match = torch.full((p_count,), math.inf, dtype=dtype, device=device)
    best_x = x_all.clone()
    best_logits = None if logits_all is None else logits_all.clone()

    sim = UpdateSimulator(problems, counts, record_bn=objective.bn > 0)  # closed below: it patches the model copy

    class Working:
        """The rows still optimised (problems within their budget) and their per-row data."""

        def __init__(self, victims: list[int]) -> None:
            self.victims = victims
            self.all = len(victims) == n
            self.exit = min(budgets[i] for i in victims)  # the first iteration at which a problem leaves
            if self.all:
                self.rows, own = torch.arange(p_count, device=device), owner
            else:
                active = torch.zeros(n, dtype=torch.bool, device=device)
                active[torch.tensor(victims, device=device)] = True
                self.rows = torch.nonzero(active.index_select(0, owner)).squeeze(1)
                own = owner.index_select(0, self.rows)
            sim.select(own)
            self.gen = rows if self.all else rows.subset(victims)
            pick = (lambda t: t) if self.all else (lambda t: t.index_select(0, self.rows))
            self.targets = {k: t.index_select(0, own) for k, t in problems.targets.items()}
            self.t_norm = None if t_norm is None else t_norm.index_select(0, own)
            self.bn_targets = None if problems.bn_targets is None else [
                (m.index_select(0, own), v.index_select(0, own)) for m, v in problems.bn_targets]
            self.hard = None if hard_all is None else pick(hard_all)
            self.tv = None if tv_all is None else pick(tv_all)
            # Group consistency: each problem's restarts form its group (blocks of R rows, or any sizes).
            sizes = [counts[i] for i in victims]
            self.restarts = sizes[0]
            self.groups = None
            if len(set(sizes)) > 1:
                size_t = torch.tensor(sizes, device=device)
                self.groups = (torch.repeat_interleave(torch.arange(len(victims), device=device), size_t), size_t)

    def evaluate(work: Working, x: Tensor, logits: Tensor | None, need_grad: bool):
        variables = [x] if logits is None else [x, logits]
        y = work.hard if logits is None else logits.softmax(dim=-1)
        eps = work.gen.randn((sim.noise_numel,), dtype=dtype) if sim.noise_numel else x.new_zeros(x.shape[0], 0)
        dummy, stats = sim.vectorised(x, y, eps) if vectorize else sim.sequential(x, y, eps)
        matching = matching_term(objective, dummy, work.targets, weights, work.t_norm, work.gen)
        total = objective_terms(objective, matching, x, restarts=work.restarts, bn_stats=stats,
                                bn_targets=work.bn_targets, tv=work.tv, groups=work.groups)
        grads = list(torch.autograd.grad(total.sum(), variables)) if need_grad else None
        return matching.detach(), total.detach(), grads

    def keep_best(work: Working, x: Tensor, logits: Tensor | None, matching: Tensor, total: Tensor) -> None:
        if work.all:  # every row: in place, without gathering
            better = total < best_total  # False for NaN: diverged iterates are never kept
            best_total.copy_(torch.where(better, total, best_total))
            best_match.copy_(torch.where(better, matching, best_match))
            best_x.copy_(torch.where(better.view((-1,) + (1,) * (x.dim() - 1)), x.detach(), best_x))
            if logits is not None:
                best_logits.copy_(torch.where(better.view(-1, 1, 1), logits.detach(), best_logits))
            return
        idx = work.rows
        prev = best_total.index_select(0, idx)
        better = total < prev  # False for NaN: diverged iterates are never kept
        best_total.index_copy_(0, idx, torch.where(better, total, prev))
        best_match.index_copy_(0, idx, torch.where(better, matching, best_match.index_select(0, idx)))
        view = (-1,) + (1,) * (x.dim() - 1)
        best_x.index_copy_(0, idx, torch.where(better.view(view), x.detach(), best_x.index_select(0, idx)))
        if logits is not None:
            best_logits.index_copy_(0, idx, torch.where(better.view(-1, 1, 1), logits.detach(),
                                                        best_logits.index_select(0, idx)))

    work = Working(list(range(n)))
    x = x_all.requires_grad_(True)
    logits = None if logits_all is None else logits_all.requires_grad_(True)
    variables = [x] if logits is None else [x, logits]
    if schedule.optimizer == "adam":
        opt = BatchedAdam(variables, lr=rates, milestones=marks)
    else:
        opt = BatchedLBFGS(variables, lr=step_lengths, history_size=schedule.history_size)
    try:
        for it in range(max(budgets) + 1):
            going = work.victims if it < work.exit else [i for i in work.victims if budgets[i] > it]
            matching, total, grads = evaluate(work, x, logits, need_grad=bool(going))
            keep_best(work, x, logits, matching, total)  # for problems at their budget: the final iterate
            if not going:
                break
            if len(going) < len(work.victims):
                # Problems at their budget leave: no further update of their images or optimiser state.
                mask = torch.tensor([budgets[i] > it for i in work.victims for _ in range(counts[i])], device=device)
                matching, grads = matching[mask], [g[mask] for g in grads]
                x = x.detach()[mask].requires_grad_(True)
                logits = None if logits is None else logits.detach()[mask].requires_grad_(True)
                variables = [x] if logits is None else [x, logits]
                opt.keep(mask, variables)
                work = Working(going)
            if work.all:
                history[it] = matching
            else:
                history[it].index_copy_(0, work.rows, matching)
            if schedule.optimizer == "adam" and schedule.signed:
                grads[0] = grads[0].sign()
            opt.step(grads)
            with torch.no_grad():
                if schedule.boxed:
                    x.copy_(torch.maximum(torch.minimum(x, upper), lower))
                # A diverged problem restarts from its best iterate; others are unaffected.
                bad = ~torch.isfinite(x).flatten(1).all(dim=1)
                view = (-1,) + (1,) * (x.dim() - 1)
                x.copy_(torch.where(bad.view(view), best_x if work.all else best_x.index_select(0, work.rows), x))
    finally:
        sim.close()

    # Each victim's restart with the lowest matching loss (first on ties).
    r_max = max(counts)
    score = torch.full((n, r_max), math.inf, dtype=dtype, device=device)
    position = torch.arange(p_count, device=device) - torch.tensor(start, device=device).index_select(0, owner)
    found = torch.where(torch.isfinite(best_match), best_match, torch.full_like(best_match, math.inf))
    score[owner, position] = found
    best_r = score.argmin(dim=1)
    pick = torch.tensor(start, device=device) + best_r
    images = best_x[pick].detach()
    soft = None if best_logits is None else best_logits[pick].softmax(dim=-1)
    return MatchingOutput(
        images=images, soft_labels=soft, matching_loss=best_match[pick], total_loss=best_total[pick],
        history=history[:, pick], best_restart=best_r, iterations=max(budgets), restarts=r_max,
        budgets=list(budgets), restart_counts=list(counts),
    )


__all__ = ["MatchingOutput", "run_gradient_matching"]

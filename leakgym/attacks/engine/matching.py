"""The engine: P = N x R gradient-matching problems optimised as one computation per iteration.

:func:`run_gradient_matching` minimises every problem's :class:`~leakgym.attacks.engine.objective.MatchingObjective`
over its dummy images (and, for DLG, soft labels), all restarts at once:

* the dummy updates of all rows come from :class:`~leakgym.attacks.engine.problems.UpdateSimulator`;
* one outer ``torch.autograd.grad`` of ``sum_p loss_p`` differentiates through the inner gradient
  (double backward) and yields every row's image gradient, because rows never interact;
* the optimisers are per row by construction: :class:`~leakgym.optim.adam.BatchedAdam`
  (``torch.optim.Adam`` with a step size and decay milestones per row) and
  :class:`~leakgym.optim.lbfgs.BatchedLBFGS`;
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
:class:`~leakgym.optim.randomness.BatchedGenerator`, so problem ``i``'s random numbers do not
depend on the other problems. Its floating-point results can: vectorised kernels (BLAS, oneDNN) choose
their algorithm by the batch size, so a problem's row of an N-problem batch matches the problem alone
to rounding, not bit for bit (measurements in ``tests/test_attacks_seeds.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from leakgym.attacks.base import problem_seeds
from leakgym.attacks.engine.objective import (
    MatchingObjective,
    PerProblem,
    RowPriors,
    Schedule,
    matching_term,
    objective_terms,
)
from leakgym.attacks.engine.problems import ProblemSet, UpdateSimulator
from leakgym.attacks.engine.replay import IterationGraphs
from leakgym.attacks.losses import (
    FLAT_MAX_ENTRIES,
    FlatWeights,
    flat_layers,
    gradient_distance,
    layer_weights,
    matrix_distance,
    target_sq_norms,
)
from leakgym.devices import canonical_device
from leakgym.optim.adam import DECAY_FRACTIONS, BatchedAdam, decay_milestones, decayed_rates
from leakgym.optim.lbfgs import BatchedLBFGS
from leakgym.optim.randomness import BatchedGenerator


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


def _check_rows(init: Tensor | Sequence[Tensor], counts: list[int], tail: tuple[int, ...], what: str) -> None:
    """ValueError naming ``what`` unless ``init`` is ``(N, R, *tail)`` or N tensors ``(R_i, *tail)`` with the
    restart counts ``counts``."""
    n = len(counts)
    if isinstance(init, Tensor):
        expected = (n, counts[0], *tail)
        if len(set(counts)) != 1 or tuple(init.shape) != expected:
            want = expected if len(set(counts)) == 1 else f"a list of {n} tensors (R_i, {', '.join(map(str, tail))})"
            raise ValueError(f"{what} has shape {tuple(init.shape)}; expected (N, R, ...) = {want}")
        return
    shapes = [tuple(t.shape) for t in init]
    if len(shapes) != n or any(sh != (c, *tail) for sh, c in zip(shapes, counts)):
        raise ValueError(f"{what} has shapes {shapes}; expected one (R_i, {', '.join(map(str, tail))}) per problem "
                         f"with R_i = {counts}")


def _rows(init: Tensor | Sequence[Tensor], counts: list[int], tail: tuple[int, ...], what: str) -> Tensor:
    """``(N, R, *tail)`` or N tensors ``(R_i, *tail)`` -> rows ``(sum R_i, *tail)``, checked against ``counts``."""
    _check_rows(init, counts, tail, what)
    return init.reshape(-1, *tail) if isinstance(init, Tensor) else torch.cat(list(init))


def _check_parts(problems: ProblemSet, parts: Sequence[Part]) -> None:
    """Every part's settings, start images and label logits, checked before any part draws from the
    problems' generators (a DLG part's default label logits) or computes anything; the error names the part."""
    b = problems.batch_size
    for k, part in enumerate(parts):
        head, where = (f"parts[{k}]: ", f"parts[{k}].") if len(parts) > 1 else ("", "")
        try:
            s = (part.per_problem or PerProblem()).resolve(part.problems, part.schedule, part.objective)
        except ValueError as e:
            raise ValueError(f"{head}{e}") from None
        if not _optimises_labels(problems, part) and problems.labels is None:
            raise ValueError(f"{head}a part with known labels needs a ProblemSet built with labels")
        if part.objective.bn > 0 and problems.bn_targets is None:
            raise ValueError(f"{head}objective.bn > 0 needs a ProblemSet built with use_bn_stats=True")
        _check_rows(part.init, s.restarts, (b, *problems.image_shape), f"{where}init")
        if _optimises_labels(problems, part) and part.label_init is not None:
            _check_rows(part.label_init, s.restarts, (b, problems.num_classes), f"{where}label_init")


@dataclass(frozen=True)
class Part:
    """Consecutive problems of one engine call that share an objective and a schedule.

    One engine call may hold several parts -- e.g. the Inverting Gradients, GradInversion and DLG
    attacks that the games of one vector step chose -- which differ in distance, priors, optimiser
    and label handling. All rows of all parts are simulated together (one vmapped update simulation
    and one double backward per iteration, the cost that dominates). Parts that share an optimiser
    and label handling (Inverting Gradients, prior-init and GradInversion: Adam) also share their
    objective evaluation and optimiser step, their differences held per row; DLG's L-BFGS part steps
    its own optimiser. A problem's result does not depend on the other parts.
    """

    problems: int
    """How many consecutive problems of the :class:`ProblemSet` this part owns."""
    objective: MatchingObjective
    schedule: Schedule
    init: Tensor | Sequence[Tensor]
    """Initial images ``(n, R, B, C, H, W)`` or ``n`` tensors ``(R_i, B, C, H, W)`` (normalised space)."""
    label_init: Tensor | Sequence[Tensor] | None = None
    """Initial label logits when the part optimises its labels (standard normal if omitted)."""
    per_problem: PerProblem | None = None
    """Budgets, restarts, step sizes and TV weights per problem of this part."""
    optimise_labels: bool | None = None
    """Optimise soft labels jointly (DLG); None: when the ProblemSet has no labels."""


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
    """Optimise dummy images for all problems and restarts at once (one objective and schedule).

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
    part = Part(problems.n, objective, schedule, init, label_init=label_init, per_problem=per_problem)
    return run_joint_matching(problems, [part], generator=generator, seed=seed, vectorize=vectorize)[0]


def _optimises_labels(problems: ProblemSet, part: Part) -> bool:
    return problems.labels is None if part.optimise_labels is None else part.optimise_labels


def _run_key(problems: ProblemSet, part: Part, index: int) -> tuple:
    """Parts with equal keys run as one :class:`_Run`: one optimiser, one label handling, one set of
    layer weights. Their distances, priors, sign and box steps and learning-rate decay may differ (per
    row); a part that simulates a defense (EOT) runs alone."""
    schedule, objective = part.schedule, part.objective
    return (schedule.optimizer, schedule.history_size if schedule.optimizer == "lbfgs" else None,
            _optimises_labels(problems, part), repr(objective.layer_weights),
            index if objective.simulate_defense is not None else None)


class _Run:
    """The optimisation state of one or more :class:`Part` s that share an optimiser and label handling.

    Its rows are the member parts' rows, part after part; what the parts' objectives and schedules set
    differently is held per row (distance, prior weights, sign step, box, learning-rate decay), so
    Inverting Gradients, prior-init and GradInversion problems of one vector step take one objective
    evaluation, one best-iterate update and one Adam step per iteration together. Row ``p`` still
    computes what its part computes alone: the per-row settings select, row by row, the arithmetic its
    own objective and schedule prescribe (tests: each part equals its own engine call, bit for bit on
    the sequential path). The matched layers are compared as one flat matrix against targets flattened
    once per selection of rows. Measured per iteration (LeNet 16x16, one thread, IG + GradInversion +
    DLG, one row each): 5.99 ms as three parts, 4.57 ms as two runs with the flat matching and the
    compact L-BFGS (:class:`~leakgym.optim.lbfgs.BatchedLBFGS`).
    """

    def __init__(self, problems: ProblemSet, members: list[tuple[Part, int]], generator: BatchedGenerator) -> None:
        b = problems.batch_size
        device, dtype = problems.device, problems.dtype
        self.ps = problems
        self.problem_index = [offset + i for part, offset in members for i in range(part.problems)]
        n = self.n = len(self.problem_index)
        lead = members[0][0]
        self.schedule = lead.schedule  # optimiser, L-BFGS memory (equal for every member)
        optimise = _optimises_labels(problems, lead)
        if not optimise and problems.labels is None:
            raise ValueError("a part with known labels needs a ProblemSet built with labels")

        budgets, counts, lrs, tvs, row_values = [], [], [], [], {k: [] for k in ("l2", "bn", "group")}
        distance, signed, boxed, decay, inits, label_inits = [], [], [], [], [], []
        objectives = []
        for part, offset in members:
            objective, schedule = part.objective, part.schedule
            s = (part.per_problem or PerProblem()).resolve(part.problems, schedule, objective)
            if objective.bn > 0 and problems.bn_targets is None:
                raise ValueError("objective.bn > 0 needs a ProblemSet built with use_bn_stats=True")
            if objective.group > 0 and max(s.restarts) < 2:
                # The consensus of a single restart is the restart itself: the term is identically 0.
                objective = dataclasses.replace(objective, group=0.0)
            objectives.append(objective)
            budgets += s.iterations
            counts += s.restarts
            lrs += s.lr
            rows = sum(s.restarts)
            tvs += [v for v, c in zip(s.tv, s.restarts) for _ in range(c)]
            for name in row_values:
                row_values[name] += [getattr(objective, name)] * rows
            distance += [objective.distance] * rows
            signed += [schedule.signed] * rows
            boxed += [schedule.boxed] * rows
            decay += [schedule.lr_decay] * part.problems
            inits.append(_rows(part.init, s.restarts, (b, *problems.image_shape), "init"))
            if optimise:
                if part.label_init is None:
                    mine = generator.subset(range(offset, offset + part.problems)).with_rows(s.restarts)
                    label_inits.append(mine.randn((b, problems.num_classes), dtype=dtype))
                else:
                    label_inits.append(_rows(part.label_init, s.restarts, (b, problems.num_classes), "label_init"))
        self.objective = objectives[0]  # the layer weights and EOT settings (equal for every member)
        self.budgets, self.counts = budgets, counts
        self.member_sizes = [part.problems for part, _ in members]
        # problem i's restarts draw from its own generator
        self.rows = generator.subset(self.problem_index).with_rows(counts)
        self.p_count = sum(counts)
        self.weights = layer_weights(list(problems.targets), self.objective.layer_weights)
        self.cosine_all = torch.tensor([d == "cosine" for d in distance], device=device)
        self.distances = sorted(set(distance))
        self.t_norm = target_sq_norms(problems.targets, self.weights) if "cosine" in self.distances else None
        # The matched layers as one matrix (the targets flattened once), unless too large or EOT.
        self.names = [name for name in problems.targets if self.weights[name] != 0]
        entries = self.p_count * sum(problems.targets[name][0].numel() for name in self.names)
        self.flat = None
        if self.objective.simulate_defense is None and self.names and entries <= FLAT_MAX_ENTRIES:
            self.flat = FlatWeights(problems.targets, self.weights, self.names, dtype=dtype, device=device)
            self.t_flat = flat_layers(problems.targets, self.names).to(dtype)
        local = torch.repeat_interleave(torch.arange(n, device=device), torch.tensor(counts, device=device))
        self.local = local
        self.owner = torch.tensor(self.problem_index, device=device).index_select(0, local)  # each row's problem
        # Row i matches target row i (one restart each, every problem of the batch): the targets need no gather.
        self.owner_is_row = counts == [1] * n and self.problem_index == list(range(problems.n))
        self.start = [0]
        for c in counts[:-1]:
            self.start.append(self.start[-1] + c)

        x_all = torch.cat(inits).to(device=device, dtype=dtype).clone()
        logits_all = torch.cat(label_inits).to(device=device, dtype=dtype).clone() if optimise else None
        self.hard_all = None if optimise else problems.labels.index_select(0, self.owner)

        self.priors_all = RowPriors.of_rows({"tv": tvs, **row_values}, dtype=dtype, device=device)
        self.signed_all = _flags(signed, device)
        self.boxed_all = _flags(boxed, device)

        self.history = torch.full((max(budgets), self.p_count), math.nan, dtype=dtype, device=device)
        self.best_total = torch.full((self.p_count,), math.inf, dtype=dtype, device=device)
        self.best_match = torch.full((self.p_count,), math.inf, dtype=dtype, device=device)
        self.best_x = x_all.clone()
        self.best_logits = None if logits_all is None else logits_all.clone()

        self.x = x_all.requires_grad_(True)
        self.logits = None if logits_all is None else logits_all.requires_grad_(True)
        # Per-row step sizes, float64 (as the Python floats of torch.optim).
        rate_dtype = torch.float64 if device.type != "mps" else torch.float32
        if self.schedule.optimizer == "adam":
            # A row without decay keeps its rate: milestones past its budget, never reached.
            milestones = [decay_milestones(t) if d else [t + 1] * len(DECAY_FRACTIONS) for t, d in zip(budgets, decay)]
            rates = [decayed_rates(lr, m) if d else [lr] * (len(DECAY_FRACTIONS) + 1)
                     for lr, m, d in zip(lrs, milestones, decay)]
            rates = torch.tensor(rates, dtype=rate_dtype, device=device).index_select(0, local)
            marks = torch.tensor(milestones, dtype=torch.int64, device=device).index_select(0, local) \
                if any(decay) else None
            self.opt = BatchedAdam(self.variables, lr=rates if any(decay) else rates[:, 0], milestones=marks)
        else:
            step_lengths = torch.tensor(lrs, dtype=rate_dtype, device=device).index_select(0, local)
            self.opt = BatchedLBFGS(self.variables, lr=step_lengths, history_size=self.schedule.history_size)
        self.last = max(budgets)  # the iteration of this run's final evaluation
        self.select(list(range(n)))

    @property
    def variables(self) -> list[Tensor]:
        return [self.x] if self.logits is None else [self.x, self.logits]

    def select(self, victims: list[int]) -> None:
        """Work on the rows of problems ``victims`` (local indices) only: those within their budget."""
        ps, device, counts = self.ps, self.ps.device, self.counts
        self.victims = victims
        self.all = len(victims) == self.n
        self.exit = min(self.budgets[i] for i in victims)  # the first iteration at which a problem leaves
        if self.all:
            self.active = torch.arange(self.p_count, device=device)
        else:
            keep = torch.zeros(self.n, dtype=torch.bool, device=device)
            keep[torch.tensor(victims, device=device)] = True
            self.active = torch.nonzero(keep.index_select(0, self.local)).squeeze(1)
        own = self.owner if self.all else self.owner.index_select(0, self.active)
        self.active_owner = own
        self.gen = self.rows if self.all else self.rows.subset(victims)
        pick = (lambda t: t) if self.all else (lambda t: t.index_select(0, self.active))
        # The working rows' targets: flat rows, or per layer for the per-layer and EOT distances (read only).
        gather = (lambda t: t) if self.all and self.owner_is_row else (lambda t: t.index_select(0, own))
        rows_targets = {k: gather(t) for k, t in ps.targets.items()} if self.flat is None else gather(self.t_flat)
        norms = None if self.t_norm is None else gather(self.t_norm)
        self.bn_targets = None if ps.bn_targets is None else [
            (m.index_select(0, own), v.index_select(0, own)) for m, v in ps.bn_targets]
        self.hard = None if self.hard_all is None else pick(self.hard_all)
        self.one_hot = None  # the hard labels as distributions, made once per selection when asked for
        self.priors = self.priors_all if self.all else self.priors_all.select(self.active)
        self.signed = self.signed_all if isinstance(self.signed_all, bool) else pick(self.signed_all)
        self.boxed = self.boxed_all if isinstance(self.boxed_all, bool) else pick(self.boxed_all)
        # The distances: one over every row, or one per distance over its rows (the cached target rows).
        self.norms = norms
        self.rows_targets = rows_targets
        if len(self.distances) == 1:
            self.split = None
        else:
            cosine = pick(self.cosine_all)
            parts = []
            for name, rows in (("cosine", cosine), ("l2", ~cosine)):
                idx = torch.nonzero(rows).squeeze(1)
                if idx.numel() == 0:
                    continue
                targets = rows_targets.index_select(0, idx) if self.flat is not None else {
                    k: t.index_select(0, idx) for k, t in rows_targets.items()}
                parts.append((name, idx, targets, None if name == "l2" else norms.index_select(0, idx)))
            parts.sort(key=lambda part: int(part[1][0]))
            order = torch.cat([idx for _, idx, _, _ in parts])
            # Parts that are blocks of consecutive rows (the usual case: a part's problems are consecutive)
            # take a split, whose backward is one concatenation; else an index_select per part, whose
            # backward zero-fills a (rows, D) matrix per part.
            blocks = bool(torch.equal(order, torch.arange(order.numel(), device=order.device)))
            self.split = (parts, None if blocks else torch.argsort(order))
        # Group consistency: each problem's restarts form its group (blocks of R rows, or any sizes).
        sizes = [counts[i] for i in victims]
        self.restarts = sizes[0]
        self.groups = None
        if len(set(sizes)) > 1:
            size_t = torch.tensor(sizes, device=device)
            self.groups = (torch.repeat_interleave(torch.arange(len(victims), device=device), size_t), size_t)

    def labels(self, soft: bool) -> Tensor:
        """The rows' labels for the simulated update: hard ``(P', B)``, or distributions ``(P', B, C)``."""
        if self.logits is not None:
            return self.logits.softmax(dim=-1)
        if not soft:
            return self.hard
        if self.one_hot is None:
            self.one_hot = torch.nn.functional.one_hot(self.hard, self.ps.num_classes).to(self.ps.dtype)
        return self.one_hot

    def matching_of(self, dummy: dict[str, Tensor] | Tensor) -> Tensor:
        """``(P',)`` distance of every working row under its own part's distance; ``dummy`` is the rows'
        updates (name -> tensor), or with :attr:`flat` their matched layers as one ``(P', D)`` matrix."""
        if self.flat is not None:  # one (rows, D) matrix against the cached flat targets
            g = dummy if isinstance(dummy, Tensor) else flat_layers(dummy, self.names)
            if self.split is None:
                return matrix_distance(g, self.rows_targets, self.flat, distance=self.distances[0],
                                       target_norm_sq=self.norms)
            parts, inverse = self.split
            rows = self._rows_of(g, parts, inverse)
            values = [matrix_distance(mine, targets, self.flat, distance=name, target_norm_sq=norms)
                      for mine, (name, _, targets, norms) in zip(rows, parts)]
            return torch.cat(values) if inverse is None else torch.cat(values).index_select(0, inverse)
        if self.split is None:
            return matching_term(self.objective, dummy, self.rows_targets, self.weights, self.norms, self.gen)
        parts, inverse = self.split
        per_layer = {k: self._rows_of(v, parts, inverse) for k, v in dummy.items()}
        values = [gradient_distance({k: v[j] for k, v in per_layer.items()}, targets, self.weights, distance=name,
                                    target_norm_sq=norms)
                  for j, (name, _, targets, norms) in enumerate(parts)]
        return torch.cat(values) if inverse is None else torch.cat(values).index_select(0, inverse)

    @staticmethod
    def _rows_of(t: Tensor, parts: list, inverse: Tensor | None) -> list[Tensor]:
        """``t``'s rows of each distance part: one split when the parts are blocks (``inverse`` None)."""
        if inverse is None:
            return list(t.split([idx.numel() for _, idx, _, _ in parts]))
        return [t.index_select(0, idx) for _, idx, _, _ in parts]

    def objective_of(self, dummy: dict[str, Tensor] | Tensor, stats: tuple) -> tuple[Tensor, Tensor]:
        """``(matching, total)`` of the working rows, given their dummy updates (see :meth:`matching_of`)
        and BN statistics."""
        matching = self.matching_of(dummy)
        total = objective_terms(matching, self.x, self.priors, restarts=self.restarts, bn_stats=stats,
                                bn_targets=self.bn_targets, groups=self.groups)
        return matching, total

    def keep_best(self, matching: Tensor, total: Tensor) -> None:
        x, logits = self.x, self.logits
        view = (-1,) + (1,) * (x.dim() - 1)
        if self.all:  # every row: in place, without gathering (``out=``: one operator each, no copy)
            better = total < self.best_total  # False for NaN: diverged iterates are never kept
            torch.where(better, total, self.best_total, out=self.best_total)
            torch.where(better, matching, self.best_match, out=self.best_match)
            torch.where(better.view(view), x.detach(), self.best_x, out=self.best_x)
            if logits is not None:
                torch.where(better.view(-1, 1, 1), logits.detach(), self.best_logits, out=self.best_logits)
            return
        idx = self.active
        prev = self.best_total.index_select(0, idx)
        better = total < prev  # False for NaN: diverged iterates are never kept
        self.best_total.index_copy_(0, idx, torch.where(better, total, prev))
        self.best_match.index_copy_(0, idx, torch.where(better, matching, self.best_match.index_select(0, idx)))
        self.best_x.index_copy_(0, idx, torch.where(better.view(view), x.detach(), self.best_x.index_select(0, idx)))
        if logits is not None:
            self.best_logits.index_copy_(0, idx, torch.where(better.view(-1, 1, 1), logits.detach(),
                                                             self.best_logits.index_select(0, idx)))

    def going(self, it: int) -> list[int]:
        """The problems that take a step after evaluation ``it`` (those still within their budget)."""
        return self.victims if it < self.exit else [i for i in self.victims if self.budgets[i] > it]

    def step(self, it: int, going: list[int], matching: Tensor, grads: list[Tensor]) -> None:
        """Problems at their budget leave; the others record their loss and take one optimiser step."""
        if len(going) < len(self.victims):
            # Problems at their budget leave: no further update of their images or optimiser state.
            device = self.ps.device
            mask = torch.tensor([self.budgets[i] > it for i in self.victims for _ in range(self.counts[i])],
                                device=device)
            matching, grads = matching[mask], [g[mask] for g in grads]
            self.x = self.x.detach()[mask].requires_grad_(True)
            self.logits = None if self.logits is None else self.logits.detach()[mask].requires_grad_(True)
            self.opt.keep(mask, self.variables)
            self.select(going)
        if self.all:
            self.history[it] = matching
        else:
            self.history[it].index_copy_(0, self.active, matching)
        x = self.x
        view = (-1,) + (1,) * (x.dim() - 1)
        if self.schedule.optimizer == "adam" and self.signed is not False:
            sign = grads[0].sign()
            grads[0] = sign if self.signed is True else torch.where(self.signed.view(view), sign, grads[0])
        self.opt.step(grads)
        with torch.no_grad():
            if self.boxed is True:  # clamp: min(max(x, lower), upper), the same values for lower <= upper
                x.clamp_(min=self.ps.lower, max=self.ps.upper)
            elif self.boxed is not False:
                boxed = torch.maximum(torch.minimum(x, self.ps.upper), self.ps.lower)
                torch.where(self.boxed.view(view), boxed, x, out=x)
            # A diverged row restarts from its best iterate -- images and, for DLG, label logits: a row whose
            # logits stayed NaN evaluated NaN for the rest of its budget -- others are unaffected. L-BFGS
            # rejects the pair spanning a NaN gradient and goes on; Adam's moments stay NaN after one, so
            # such an Adam row stays at its best iterate for the rest of its budget. A row is finite where
            # its largest magnitude is below infinity (NaN compares False): three operators, where
            # ``isfinite(...).all()`` dispatches six.
            finite = _finite_rows(x)
            logits = self.logits
            if logits is not None:
                finite = finite & _finite_rows(logits)
                best = self.best_logits if self.all else self.best_logits.index_select(0, self.active)
                torch.where(finite.view(-1, 1, 1), logits, best, out=logits)
            best = self.best_x if self.all else self.best_x.index_select(0, self.active)
            torch.where(finite.view(view), x, best, out=x)

    def outputs(self) -> list[MatchingOutput]:
        """Each member part's result: each of its victims' restart with the lowest matching loss (first on ties)."""
        device, dtype = self.ps.device, self.ps.dtype
        start = torch.tensor(self.start, device=device)
        r_max = max(self.counts)
        score = torch.full((self.n, r_max), math.inf, dtype=dtype, device=device)
        position = torch.arange(self.p_count, device=device) - start.index_select(0, self.local)
        found = torch.where(torch.isfinite(self.best_match), self.best_match, torch.full_like(self.best_match, math.inf))
        score[self.local, position] = found
        best_r = score.argmin(dim=1)
        pick = start + best_r
        soft = None if self.best_logits is None else self.best_logits[pick].softmax(dim=-1)
        images, matching, total = self.best_x[pick].detach(), self.best_match[pick], self.best_total[pick]
        history = self.history[:, pick]
        out, lo = [], 0
        for size in self.member_sizes:
            hi = lo + size
            budgets, counts = self.budgets[lo:hi], self.counts[lo:hi]
            out.append(MatchingOutput(
                images=images[lo:hi], soft_labels=None if soft is None else soft[lo:hi],
                matching_loss=matching[lo:hi], total_loss=total[lo:hi], history=history[:max(budgets), lo:hi],
                best_restart=best_r[lo:hi], iterations=max(budgets), restarts=max(counts), budgets=list(budgets),
                restart_counts=list(counts),
            ))
            lo = hi
        return out


def _finite_rows(t: Tensor) -> Tensor:
    """``(P,)``: whether every entry of each row of ``t`` is finite (``isfinite(t).flatten(1).all(1)``); called
    under ``torch.no_grad``."""
    return t.flatten(1).abs().amax(dim=1) < math.inf


def _flags(values: list[bool], device: torch.device) -> bool | Tensor:
    """One flag per row: a Python bool when every row agrees, else a ``(P,)`` bool tensor."""
    if all(values) or not any(values):
        return bool(values[0])
    return torch.tensor(values, device=device)


def _split_rows(tensors: dict[str, Tensor], sizes: list[int]) -> list[dict[str, Tensor]]:
    """``name -> (sum(sizes), ...)`` as one ``name -> (sizes[k], ...)`` dict per block of rows."""
    parts = {k: v.split(sizes) for k, v in tensors.items()}
    return [{k: p[i] for k, p in parts.items()} for i in range(len(sizes))]


def _evaluate(alive: list[_Run], steps: tuple[bool, ...], sim: UpdateSimulator, soft: bool, dtype: torch.dtype,
              vectorize: bool) -> tuple[list[tuple[Tensor, Tensor]], tuple[Tensor, ...]]:
    """One iteration's evaluation of the working rows of the runs ``alive``: each run's ``(matching, total)``
    and the gradients of the objective to the variables of the runs that step (``steps``), in their order.
    Its tensors are those of the runs and the simulator's selection, so a CUDA graph of it replays the same
    evaluation of the updated variables (:class:`~leakgym.attacks.engine.replay.IterationGraphs`)."""
    if len(alive) == 1:
        r = alive[0]
        x, y = r.x, r.labels(soft)
        eps = r.gen.randn((sim.noise_numel,), dtype=dtype) if sim.noise_numel else x.new_zeros(x.shape[0], 0)
    else:
        x = torch.cat([r.x for r in alive])
        y = torch.cat([r.labels(soft) for r in alive])
        eps = torch.cat([r.gen.randn((sim.noise_numel,), dtype=dtype) for r in alive]) if sim.noise_numel \
            else x.new_zeros(x.shape[0], 0)
    dummy, stats = sim.updates(x, y, eps, vectorize=vectorize)
    # Runs that match the same layers as one matrix share one flattening of the dummy updates.
    shared = len(alive) > 1 and all(r.flat is not None and r.names == alive[0].names for r in alive)
    flat = flat_layers(dummy, alive[0].names) if shared else None
    if len(alive) == 1:
        terms = [alive[0].objective_of(dummy, stats)]
    else:
        # Each run's rows as one split per tensor, not a narrow per run: the backward of a split
        # is one concatenation, that of a narrow a zero-filled tensor of all rows per run (the
        # fills were 8% of a profiled digits vector step with random attacker actions, one thread).
        sizes = [r.x.shape[0] for r in alive]
        mine = flat.split(sizes) if shared else _split_rows(dummy, sizes)
        st = list(zip(*[list(zip(m.split(sizes), v.split(sizes))) for m, v in stats])) if stats \
            else [()] * len(alive)
        terms = [r.objective_of(m, tuple(s)) for r, m, s in zip(alive, mine, st)]
    # The terms go back detached: nothing after the evaluation differentiates them, and a reference to this
    # iteration's autograd graph kept into the next evaluation kept the variables' gradient accumulators of
    # the stream they were made on (PyTorch warns when a graph's warm-up stream differs).
    detached = [(m.detach(), t.detach()) for m, t in terms]
    if not any(steps):
        return detached, ()
    total = terms[0][1].sum() if len(alive) == 1 else torch.stack([t.sum() for _, t in terms]).sum()
    variables = [v for r, s in zip(alive, steps) if s for v in r.variables]
    return detached, tuple(torch.autograd.grad(total, variables))


def run_joint_matching(
    problems: ProblemSet,
    parts: Sequence[Part],
    *,
    generator: BatchedGenerator | None = None,
    seed: int = 0,
    vectorize: bool = True,
) -> list[MatchingOutput]:
    """Optimise the problems of several :class:`Part` s (objectives and schedules) as one computation.

    Part ``k`` owns the next ``parts[k].problems`` problems of ``problems``. Every iteration simulates
    the dummy updates of the working rows of all parts at once and differentiates the sum of all
    parts' objectives in one backward pass; the parts that share an optimiser (Adam or L-BFGS) and
    label handling then step it together, each row with its own part's settings (:class:`_Run`). Rows never interact, so each part's problems compute what they would compute in
    an engine call of their own (:func:`run_gradient_matching`), up to floating-point rounding of the
    vectorised kernels; labels of parts with known labels are fed as one-hot distributions when
    another part optimises its labels (the same cross-entropy). ``generator`` holds one generator
    per problem (``seed`` seeds problem ``i`` with ``seed + i`` when it is None). Every part's settings,
    start images and label logits are checked before anything is drawn from the generators or computed
    (a ValueError naming the part). Returns one :class:`MatchingOutput` per part.
    """
    n = problems.n
    device, dtype = problems.device, problems.dtype
    if not parts or any(p.problems < 1 for p in parts) or sum(p.problems for p in parts) != n:
        raise ValueError(f"parts own {[p.problems for p in parts]} problems; they must be >= 1 each and add up to "
                         f"the ProblemSet's {n}")
    _check_parts(problems, parts)
    if generator is None:
        generator = BatchedGenerator.from_seeds(problem_seeds(n, seed=seed), device)
    if generator.n != n or generator.device != canonical_device(device):
        raise ValueError(f"generator has {generator.n} generators on {generator.device}; "
                         f"expected one per problem ({n}) on {device}")
    # Parts that share an optimiser and label handling run as one _Run (per-row settings).
    merged: dict[tuple, list[tuple[int, Part, int]]] = {}
    offset = 0
    for k, part in enumerate(parts):
        merged.setdefault(_run_key(problems, part, k), []).append((k, part, offset))
        offset += part.problems
    runs = [_Run(problems, [(part, off) for _, part, off in members], generator) for members in merged.values()]
    # Known labels go in as class indices unless some part optimises soft labels (then as one-hot rows).
    soft = any(r.logits is not None for r in runs) and len(runs) > 1
    sim = UpdateSimulator(problems, [c for r in runs for c in r.counts],
                          record_bn=any(r.priors_all.bn is not None for r in runs))  # closed below: it patches the model copy
    # The evaluation of each iteration, captured as a CUDA graph and replayed where it can be (replay.py).
    random = sim.noise_numel > 0 or any(r.objective.simulate_defense is not None for r in runs)
    graphs = IterationGraphs.for_device(device, random=random) if vectorize else IterationGraphs(None)
    selected = None
    try:
        for it in range(max(r.last for r in runs) + 1):
            alive = [r for r in runs if it <= r.last]
            key = [(id(r), len(r.active)) for r in alive]
            if key != selected:
                sim.select(alive[0].active_owner if len(alive) == 1 else torch.cat([r.active_owner for r in alive]))
                selected = key
            going = [r.going(it) for r in alive]
            steps = tuple(bool(g) for g in going)
            remaining = min(r.exit for r in alive) - it + 1  # the rows stay until a problem leaves
            terms, grads = graphs.run((tuple(key), steps),
                                      partial(_evaluate, alive, steps, sim, soft, dtype, vectorize), remaining)
            grads = list(grads)
            stepping = [(r, g, t) for r, g, t in zip(alive, going, terms) if g]
            for r, (matching, total_r) in zip(alive, terms):
                r.keep_best(matching, total_r)  # for problems at their budget: the final iterate
            for r, g, (matching, _) in stepping:
                k = len(r.variables)
                mine, grads = grads[:k], grads[k:]
                r.step(it, g, matching, mine)
    finally:
        graphs.close()
        sim.close()
    results: list[MatchingOutput | None] = [None] * len(parts)
    for run, members in zip(runs, merged.values()):
        for (k, _, _), out in zip(members, run.outputs()):
            results[k] = out
    return results  # type: ignore[return-value]


__all__ = ["MatchingOutput", "Part", "run_gradient_matching", "run_joint_matching"]

"""The shared base of the optimisation-based attacks (DLG, Inverting Gradients, GradInversion, ...).

:class:`OptimizationAttack` turns N (update, knowledge, seed) problems into engine calls: it infers
or takes the labels, groups compatible problems into :class:`~leakgym.attacks.engine.problems.ProblemSet`
objects, draws each problem's initial images from its own generator, runs
:func:`~leakgym.attacks.engine.matching.run_gradient_matching` once per group and packs the results.
A subclass only states its objective (:class:`~leakgym.attacks.engine.objective.MatchingObjective`)
and schedule (:class:`~leakgym.attacks.engine.objective.Schedule`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from leakgym.attacks.base import Attack, AttackCost, AttackerKnowledge, AttackResult, seeded_generator
from leakgym.attacks.engine.matching import run_gradient_matching
from leakgym.attacks.engine.objective import MatchingObjective, PerProblem, Schedule
from leakgym.attacks.engine.problems import ProblemSet
from leakgym.attacks.engine.randomness import BatchedGenerator
from leakgym.attacks.labels import LABEL_METHODS, infer_labels
from leakgym.fl.update import SharedUpdate

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class OptimizationConfig:
    """Options shared by every optimisation-based attack."""

    iterations: int = 300
    """Optimiser iterations per restart."""
    restarts: int = 1
    """Restarts per victim (folded into the batch; the best by matching loss is returned)."""
    lr: float = 0.1
    """Optimiser step size."""
    label_method: str = "auto"
    """Label inference when labels are unknown: ``"auto"``, ``"idlg"``, ``"llg"``, ``"yin"`` (see labels.py)."""
    device: str | None = None
    """Device of the computation (None: the model's device)."""
    dtype: str = "float32"
    """Floating-point type of the computation: ``"float32"`` or ``"float64"``."""

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations={self.iterations}; must be >= 1")
        if self.restarts < 1:
            raise ValueError(f"restarts={self.restarts}; must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr}; must be a finite number > 0")
        if self.label_method not in LABEL_METHODS:
            raise ValueError(f"label_method={self.label_method!r}; allowed: {LABEL_METHODS}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; allowed: {tuple(_DTYPES)}")


class OptimizationAttack(Attack):
    """Shared driver of the optimisation-based attacks: grouping, labels, initialisation, results.

    Subclasses provide :meth:`objective` and :meth:`schedule`, and may override
    :meth:`matched_names`, :meth:`label_mode` and :meth:`initial_images`. A call to
    :meth:`reconstruct_batch` groups the problems by (architecture, batch size, update protocol,
    matched layers, device) and runs one engine call per group. Problem ``i`` owns one generator,
    seeded with ``seeds[i]`` on the device of the computation, and draws from it, in this order, its
    initial images, its initial label logits (DLG), and during the run its PRECODE noise and EOT
    samples; so ``reconstruct_batch(us, ks, seeds=s)[i]`` equals ``reconstruct(us[i], ks[i],
    seed=s[i])`` whatever the other problems are, up to the rounding differences of batched kernels.

    With ``configs=`` (problems that differ in :attr:`per_problem_fields`), each problem's schedule and
    objective come from its own config (``type(self)(configs[i]).schedule()`` / ``.objective()``) and the
    problems still make one engine call per group, each with its own budget, restarts, step size and
    TV weight; its cost is its own budget. Subclasses that override :meth:`_reconstruct_batch` with
    further stages (LODA, Mixup decoding) run one computation per distinct config instead.
    """

    Config: Any = OptimizationConfig
    #: Computation path of the engine; False runs the reference per-problem loop.
    vectorize: bool = True
    #: The budget, restarts, step size and TV weight may differ per problem: problems of one
    #: ``reconstruct_batch(..., configs=...)`` call that differ only in these run as one engine call
    #: (:class:`~leakgym.attacks.engine.objective.PerProblem`).
    per_problem_fields = ("iterations", "restarts", "lr", "tv")

    # -- hooks -----------------------------------------------------------------------------------
    def objective(self) -> MatchingObjective:
        raise TypeError(f"{type(self).__name__} must define objective()")

    def schedule(self) -> Schedule:
        raise TypeError(f"{type(self).__name__} must define schedule()")

    def matched_names(self, update: SharedUpdate, knowledge: AttackerKnowledge) -> list[str]:
        """Layers whose updates are matched; default: every parameter present in the update."""
        return [n for n, _ in knowledge.model.named_parameters() if n in update.tensors]

    def label_mode(self, knowledge: AttackerKnowledge) -> Literal["known", "infer", "optimize"]:
        return "known" if knowledge.labels is not None else "infer"

    def uses_bn_stats(self, knowledge: AttackerKnowledge) -> bool:
        return False

    def initial_images(
        self, knowledge: AttackerKnowledge, labels: Tensor | None, restarts: int, generator: torch.Generator
    ) -> Tensor:
        """``(R, B, C, H, W)`` starting points on ``generator.device``, drawn from ``generator`` only;
        default: standard normal in normalised space."""
        return torch.randn(restarts, knowledge.batch_size, *knowledge.spec.shape, generator=generator,
                           device=generator.device)

    # -- driver ----------------------------------------------------------------------------------
    def _device(self, knowledge: AttackerKnowledge) -> torch.device:
        if self.config.device is not None:
            return torch.device(self.config.device)
        p = next(knowledge.model.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def generators(self, seeds: Sequence[int], knowledges: Sequence[AttackerKnowledge]) -> list[torch.Generator]:
        """Problem ``i``'s generator: ``seeds[i]`` on the device of its computation."""
        return [seeded_generator(s, self._device(k)) for s, k in zip(seeds, knowledges)]

    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int]
    ) -> list[AttackResult]:
        return self.invert(updates, knowledges, self.generators(seeds, knowledges))

    def _reconstruct_mixed(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int],
        configs: list[Any],
    ) -> list[AttackResult]:
        if type(self)._reconstruct_batch is not OptimizationAttack._reconstruct_batch:
            # A subclass with further stages: each config through its own full pipeline.
            return super()._reconstruct_mixed(updates, knowledges, seeds=seeds, configs=configs)
        return self.invert(updates, knowledges, self.generators(seeds, knowledges), configs=configs)

    def problem_settings(self, configs: Sequence[Any]) -> list[tuple[int, int, float, float]]:
        """``(iterations, restarts, lr, tv)`` of each config, read from its own schedule and objective."""
        out = []
        for c in configs:
            attack = self if c is self.config else type(self)(c)
            s, o = attack.schedule(), attack.objective()
            out.append((s.iterations, s.restarts, s.lr, o.tv))
        return out

    def invert(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], generators: list[torch.Generator],
        *, configs: Sequence[Any] | None = None,
    ) -> list[AttackResult]:
        """Gradient inversion of every update; problem ``i`` draws from ``generators[i]`` (whose stream
        continues: attacks with a later stage keep drawing from it) and, with ``configs``, runs with the
        budget, restarts, step size and TV weight of ``configs[i]``."""
        objective, schedule = self.objective(), self.schedule()
        settings = self.problem_settings(configs if configs is not None else [self.config] * len(updates))
        dtype = _DTYPES[self.config.dtype]
        prepared = []
        for i, (u, k) in enumerate(zip(updates, knowledges)):
            if u.batch_size != k.batch_size:
                raise ValueError(f"update {i}: batch_size={u.batch_size} but knowledge.batch_size={k.batch_size}")
            mode = self.label_mode(k)
            if mode == "known":
                labels = k.labels.detach().to(torch.int64).cpu()
            elif mode == "infer":
                labels = infer_labels(u, k, method=self.config.label_method)
            else:
                labels = None
            names = tuple(self.matched_names(u, k))
            signature = tuple((n, tuple(p.shape)) for n, p in k.model.named_parameters())
            key = (type(k.model), signature, k.batch_size, u.kind, u.local_steps, names, mode == "optimize",
                   self.uses_bn_stats(k), self._device(k))
            prepared.append((key, labels, names))

        results: list[AttackResult | None] = [None] * len(updates)
        groups: dict[tuple, list[int]] = {}
        for i, (key, _, _) in enumerate(prepared):
            groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            names, device = prepared[idx[0]][2], key[-1]
            optimise = key[6]
            labels = None if optimise else torch.stack([prepared[i][1] for i in idx])
            problems = ProblemSet.from_updates(
                [updates[i] for i in idx], [knowledges[i] for i in idx], names=names, labels=labels,
                device=device, dtype=dtype, use_bn_stats=key[7],
            )
            inits, label_inits = [], []
            for i in idx:
                g, k, restarts = generators[i], knowledges[i], settings[i][1]
                inits.append(self.initial_images(k, prepared[i][1], restarts, g))
                if optimise:
                    label_inits.append(torch.randn(restarts, k.batch_size, k.spec.num_classes,
                                                   generator=g, device=g.device))
            group_objective = objective if key[7] else dataclasses.replace(objective, bn=0.0)
            iterations, restarts, lrs, tvs = (list(v) for v in zip(*(settings[i] for i in idx)))
            out = run_gradient_matching(
                problems, group_objective, schedule, inits,
                generator=BatchedGenerator([generators[i] for i in idx]), vectorize=self.vectorize,
                label_init=label_inits if optimise else None,
                per_problem=PerProblem(iterations=iterations, restarts=restarts, lr=lrs, tv=tvs),
            )
            # One transfer per group for the bookkeeping (not one per problem).
            history, losses = out.history.cpu(), out.matching_loss.cpu()
            optimised = out.soft_labels.argmax(dim=-1).cpu() if optimise else None
            for j, i in enumerate(idx):
                budget = out.budgets[j]
                results[i] = AttackResult(
                    images=out.images[j],
                    labels=optimised[j] if optimise else prepared[i][1],
                    cost=AttackCost(iterations=budget, restarts=out.restart_counts[j], wall_time_s=0.0),
                    history={"matching_loss": history[:budget, j].tolist()},
                    final_loss=float(losses[j]),
                )
        return results  # type: ignore[return-value]


def config_fields(config: Any) -> dict[str, Any]:
    """The options of a config dataclass as a plain dict (for reports and benchmarks)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


__all__ = ["OptimizationAttack", "OptimizationConfig", "config_fields"]

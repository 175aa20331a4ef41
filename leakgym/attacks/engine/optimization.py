"""The shared base of the optimisation-based attacks (DLG, Inverting Gradients, GradInversion, ...).

:class:`OptimizationAttack` turns N (update, knowledge, seed) problems into engine calls: it infers
or takes the labels, groups compatible problems into :class:`~leakgym.attacks.engine.problems.ProblemSet`
objects, draws each problem's initial images from its own generator, runs
:func:`~leakgym.attacks.engine.matching.run_joint_matching` once per group and packs the results.
A subclass only states its objective (:class:`~leakgym.attacks.engine.objective.MatchingObjective`)
and schedule (:class:`~leakgym.attacks.engine.objective.Schedule`). :func:`reconstruct_jointly` does the
same for problems of *different* attacks (the random attacker actions of one vector step): one engine
call per group, one :class:`~leakgym.attacks.engine.matching.Part` per objective and optimiser.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from leakgym.attacks.base import (
    Attack,
    AttackCost,
    AttackerKnowledge,
    AttackResult,
    check_integer,
    check_option_types,
    check_seed,
)
from leakgym.attacks.engine.matching import Part, run_joint_matching
from leakgym.attacks.engine.objective import MatchingObjective, PerProblem, Schedule
from leakgym.attacks.engine.problems import ProblemSet, simulates_whole_updates
from leakgym.attacks.labels import LABEL_METHODS, _head_names, _infer_labels, _infer_labels_many
from leakgym.devices import check_device
from leakgym.fl.bank import ModelBank
from leakgym.fl.update import SharedUpdate
from leakgym.optim.randomness import BatchedGenerator, seeded_generator

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
        check_option_types(self)
        for name in ("iterations", "restarts"):
            check_integer(getattr(self, name), name, 1)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr}; must be a finite number > 0")
        if self.device is not None:  # (a bad name failed in reconstruct, with torch's own error)
            check_device(self.device)
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

    def settings(self) -> tuple[int, int, float, float]:
        """``(iterations, restarts, lr, tv)`` of this attack's config (its per-problem fields)."""
        s, o = self.schedule(), self.objective()
        return s.iterations, s.restarts, s.lr, o.tv

    def _with_config(self, config: Any) -> OptimizationAttack:
        if config is self.config:
            return self
        attack = type(self)(config)
        attack.vectorize = self.vectorize
        return attack

    @property
    def joins_other_attacks(self) -> bool:
        """Whether this attack's problems can share engine calls with other attacks' problems
        (:func:`reconstruct_jointly`): true unless a subclass adds stages after the inversion."""
        return type(self)._reconstruct_batch is OptimizationAttack._reconstruct_batch

    def invert(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], generators: list[torch.Generator],
        *, configs: Sequence[Any] | None = None,
    ) -> list[AttackResult]:
        """Gradient inversion of every update; problem ``i`` draws from ``generators[i]`` (whose stream
        continues: attacks with a later stage keep drawing from it) and, with ``configs``, runs with the
        budget, restarts, step size and TV weight of ``configs[i]``."""
        attacks = [self] * len(updates) if configs is None else [self._with_config(c) for c in configs]
        return invert_jointly(attacks, updates, knowledges, generators)


def invert_jointly(
    attacks: Sequence[OptimizationAttack], updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge],
    generators: Sequence[torch.Generator],
) -> list[AttackResult]:
    """Problem ``i`` attacked by ``attacks[i]`` (its own strategy and config), drawing from ``generators[i]``.

    Problems that can share a :class:`~leakgym.attacks.engine.problems.ProblemSet` (architecture,
    batch size, update protocol, matched layers, BN prior, device, dtype, engine path) make one engine
    call, :func:`~leakgym.attacks.engine.matching.run_joint_matching`, whatever their strategies: the
    problems with one objective, optimiser and label handling form one
    :class:`~leakgym.attacks.engine.matching.Part`, and their budgets, restarts, step sizes, TV weights
    and start images are per problem. On a CPU, problems simulated as whole updates (the CIFAR ConvNet,
    ResNet-18) make one call per :data:`CPU_POSITIONS_PER_PASS` image positions or
    :data:`CPU_PARAMETERS_PER_PASS` parameters instead. Problem ``i``'s
    result is what ``attacks[i]`` would return for it alone, up to the rounding of the vectorised kernels.
    """
    return _invert_jointly(attacks, updates, knowledges, generators, _Facts())


class _Facts:
    """What :func:`invert_jointly` reads of its problems' models and attacks, found once per distinct model
    and attack of one call instead of once per problem: the N games of a vector step attack N models of one
    architecture with a few attack objects, and every walk of a model's parameters (``named_parameters``)
    or rebuilt objective costs microseconds of Python per problem (at N = 256 games, several walks per
    game and step were about a tenth of the attack phase). The entries live for one call and hold the
    objects they describe, so an ``id`` is not reused meanwhile; the next call reads every model afresh
    (a model whose parameters changed between calls is never described by stale entries)."""

    def __init__(self) -> None:
        self._models: dict[int, _ModelFacts] = {}
        self._attacks: dict[tuple[int, Any], tuple[OptimizationAttack, Any]] = {}

    def model(self, model: nn.Module) -> _ModelFacts:
        facts = self._models.get(id(model))
        if facts is None:
            facts = self._models[id(model)] = _ModelFacts(model)
        return facts

    def attack(self, attack: OptimizationAttack, what: Any, compute: Callable[..., Any], *args: Any) -> Any:
        """``compute(*args)``, once per attack object and ``what`` (its settings, its part key)."""
        entry = self._attacks.get((id(attack), what))
        if entry is None:
            entry = self._attacks[(id(attack), what)] = (attack, compute(*args))
        return entry[1]

    def device(self, attack: OptimizationAttack, knowledge: AttackerKnowledge) -> torch.device:
        """``attack._device(knowledge)``."""
        if type(attack)._device is not OptimizationAttack._device or attack.config.device is not None:
            return attack._device(knowledge)
        return self.model(knowledge.model).device

    def matched_names(self, attack: OptimizationAttack, update: SharedUpdate,
                      knowledge: AttackerKnowledge) -> tuple[str, ...]:
        """``tuple(attack.matched_names(update, knowledge))``."""
        if type(attack).matched_names is not OptimizationAttack.matched_names:
            return tuple(attack.matched_names(update, knowledge))
        tensors = update.tensors
        return tuple(n for n in self.model(knowledge.model).names if n in tensors)

    def infer_labels(self, update: SharedUpdate, knowledge: AttackerKnowledge, method: str) -> Tensor:
        """:func:`~leakgym.attacks.labels.infer_labels` with ``method``."""
        return _infer_labels(update, knowledge, method, "auto", self.head_names)

    def head_names(self, model: nn.Module) -> tuple[str, str | None]:
        """:func:`~leakgym.attacks.labels.head_parameter_names` of ``model``."""
        facts = self.model(model)
        if facts.head is None:
            facts.head = _head_names(model, facts.named)
        return facts.head


class _ModelFacts:
    """One walk of a model's parameters: what :class:`_Facts` answers from it."""

    __slots__ = ("_device", "head", "model", "named", "names", "precode_beta", "signature")

    def __init__(self, model: nn.Module) -> None:
        self.model = model  # held: its id stays its own while the entry lives
        # (a game's model is banked: its parameter list comes from the bank, without a walk of its modules)
        self.named = ModelBank.named_parameters(model) or tuple(model.named_parameters())
        self.names = tuple(n for n, _ in self.named)
        self.signature = tuple((n, tuple(p.shape)) for n, p in self.named)
        self.precode_beta = getattr(model, "precode_beta", None)
        self.head: tuple[str, str | None] | None = None
        self._device: torch.device | None = None

    @property
    def device(self) -> torch.device:
        """:meth:`OptimizationAttack._device`'s answer without a device in the config: the first
        parameter's (``model.parameters()`` as a subclass may define it), else the CPU."""
        if self._device is None:
            model = self.model
            if type(model).parameters is nn.Module.parameters:
                p = self.named[0][1] if self.named else None
            else:
                p = next(model.parameters(), None)
            self._device = p.device if p is not None else torch.device("cpu")
        return self._device


def _invert_jointly(
    attacks: Sequence[OptimizationAttack], updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge],
    generators: Sequence[torch.Generator], facts: _Facts,
) -> list[AttackResult]:
    """:func:`invert_jointly`, reading models and attacks through ``facts``."""
    for i, (u, k) in enumerate(zip(updates, knowledges)):
        if u.batch_size != k.batch_size:
            raise ValueError(f"update {i}: batch_size={u.batch_size} but knowledge.batch_size={k.batch_size}")
    modes = [a.label_mode(k) for a, k in zip(attacks, knowledges)]
    infer = [i for i, mode in enumerate(modes) if mode == "infer"]  # all of them at once (one GPU sync)
    inferred = dict(zip(infer, _infer_labels_many([updates[i] for i in infer], [knowledges[i] for i in infer],
                                                  [attacks[i].config.label_method for i in infer],
                                                  facts.head_names, facts.infer_labels)))
    prepared = []
    for i, (a, u, k, mode) in enumerate(zip(attacks, updates, knowledges, modes)):
        if mode == "known":
            labels = k.labels.detach().to(torch.int64).cpu()
        elif mode == "infer":
            labels = inferred[i]
        else:
            labels = None
        names = facts.matched_names(a, u, k)
        model = facts.model(k.model)
        # The engine deep-copies the first problem's model and uses its spec's box: problems whose models
        # differ in a non-parameter setting of the loss (PRECODE's KL weight) or whose datasets differ in
        # their normalisation (not only in shape) must not share a call.
        key = (type(k.model), model.signature, k.batch_size, u.kind, u.local_steps, names, a.uses_bn_stats(k),
               facts.device(a, k), a.config.dtype, a.vectorize, model.precode_beta, k.spec)
        optimise = mode == "optimize"
        prepared.append((key, facts.attack(a, ("part", optimise), _part_key, a, optimise), labels, names))

    results: list[AttackResult | None] = [None] * len(updates)
    groups: dict[tuple, dict[tuple, list[int]]] = {}
    for i, (key, part, _, _) in enumerate(prepared):
        groups.setdefault(key, {}).setdefault(part, []).append(i)
    for key, all_parts in groups.items():
        for parts in _passes(all_parts, key, attacks, updates, knowledges, prepared, facts):
            _invert_pass(parts, key, attacks, updates, knowledges, generators, prepared, facts, results)
    return results  # type: ignore[return-value]


#: On a CPU, the most image positions (engine rows x images per row x height x width) that one engine call
#: simulates as whole updates (:func:`~leakgym.attacks.engine.problems.simulates_whole_updates`: the CIFAR
#: ConvNet, ResNet-18); more problems run in passes of whole problems. Past it each iteration's tensors
#: outgrow what the allocator keeps mapped, and every iteration pays for fresh pages: measured, 256 CIFAR
#: ConvNet games of one image and one restart (the host-bound ``leakgym bench env`` configuration, one CPU
#: thread), attack phase per game in passes of 16 / 32 / 64 / 128 / 256 games: 25.4 / 25.5 / 28.4 / 41.5 /
#: 50.5 ms, peak RSS 4.1 / 4.2 / 4.8 / 5.3 / 6.4 GB (with glibc kept from returning memory to the system,
#: one pass took 22.7 ms at 7.6 GB). Problems of the per-row form (DLG's LeNet on digits) and other devices
#: run in one call.
CPU_POSITIONS_PER_PASS = 1 << 15
#: On a CPU, the most model parameters (engine rows x parameters of the model) one such call holds: every row
#: carries its own dummy update, its flattened copy and their gradients, as large as the model. Binds for
#: large models only (the CIFAR ConvNet's 0.19 M parameters reach it at 179 rows, past the positions' 32):
#: ResNet-18 (11.2 M) runs 3 problems a pass. Measured, ResNet-18, 16 problems of one 32x32 image (computed
#: row by row, :func:`~leakgym.models.parameter_sets.vmap_pays_off`), one thread, ms per problem and
#: iteration: one call 259, passes of 4 problems 217, of 1 problem 216.
CPU_PARAMETERS_PER_PASS = 1 << 25


def _passes(parts: dict[tuple, list[int]], key: tuple, attacks: Sequence[OptimizationAttack],
            updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge], prepared: list,
            facts: _Facts) -> list[dict[tuple, list[int]]]:
    """The engine calls of one group of problems (``parts``: part key -> problem indices): one, or on a CPU
    passes of at most :data:`CPU_POSITIONS_PER_PASS` image positions and :data:`CPU_PARAMETERS_PER_PASS`
    parameters (at least one problem each; the parts in their order) where the problems are simulated as
    whole updates."""
    device = key[7]
    if device.type != "cpu":
        return [parts]
    first = next(iter(parts.values()))[0]
    k = knowledges[first]
    positions = k.batch_size * math.prod(k.spec.shape[1:])
    parameters = sum(p.numel() for p in k.model.parameters())
    per_pass = max(1, min(CPU_POSITIONS_PER_PASS // positions, CPU_PARAMETERS_PER_PASS // max(parameters, 1)))
    rows = {i: facts.attack(attacks[i], "settings", attacks[i].settings)[1]  # (its restarts)
            for members in parts.values() for i in members}
    if sum(rows.values()) <= per_pass:
        return [parts]
    probe = ProblemSet.from_updates([updates[first]], [k], names=prepared[first][3], labels=None, device=device,
                                    dtype=_DTYPES[key[8]], use_bn_stats=key[6])
    if not simulates_whole_updates(probe):
        return [parts]
    out: list[dict[tuple, list[int]]] = []
    current: dict[tuple, list[int]] = {}
    used = 0
    for part, members in parts.items():
        for i in members:
            if current and used + rows[i] > per_pass:
                out.append(current)
                current, used = {}, 0
            current.setdefault(part, []).append(i)
            used += rows[i]
    out.append(current)
    return out


def _invert_pass(parts: dict[tuple, list[int]], key: tuple, attacks: Sequence[OptimizationAttack],
                 updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge],
                 generators: Sequence[torch.Generator], prepared: list, facts: _Facts,
                 results: list[AttackResult | None]) -> None:
    """One engine call: the problems of ``parts`` (part key -> problem indices), results into ``results``."""
    idx = [i for members in parts.values() for i in members]  # problems ordered part by part
    names, use_bn, device, dtype, vectorize = prepared[idx[0]][3], key[6], key[7], _DTYPES[key[8]], key[9]
    if all(part[-1] for part in parts):  # every part optimises its labels
        labels = None
    else:
        b = knowledges[idx[0]].batch_size
        labels = torch.stack([prepared[i][2] if prepared[i][2] is not None else torch.zeros(b, dtype=torch.int64)
                              for i in idx])
    problems = ProblemSet.from_updates(
        [updates[i] for i in idx], [knowledges[i] for i in idx], names=names, labels=labels,
        device=device, dtype=dtype, use_bn_stats=use_bn,
    )
    engine_parts = []
    for (*_, optimise), members in parts.items():
        lead = attacks[members[0]]
        settings = [facts.attack(attacks[i], "settings", attacks[i].settings) for i in members]
        inits, label_inits = [], []
        for i, (_, restarts, _, _) in zip(members, settings):
            g, k = generators[i], knowledges[i]
            inits.append(attacks[i].initial_images(k, prepared[i][2], restarts, g))
            if optimise:
                label_inits.append(torch.randn(restarts, k.batch_size, k.spec.num_classes,
                                               generator=g, device=g.device))
        objective = lead.objective() if use_bn else dataclasses.replace(lead.objective(), bn=0.0)
        iterations, restarts, lrs, tvs = (list(v) for v in zip(*settings))
        engine_parts.append(Part(
            len(members), objective, lead.schedule(), inits, label_init=label_inits if optimise else None,
            per_problem=PerProblem(iterations=iterations, restarts=restarts, lr=lrs, tv=tvs),
            optimise_labels=optimise))
    outputs = run_joint_matching(problems, engine_parts, generator=BatchedGenerator([generators[i] for i in idx]),
                                 vectorize=vectorize)
    for ((*_, optimise), members), out in zip(parts.items(), outputs):
        # One transfer per part for the bookkeeping (not one per problem), and one conversion of the
        # losses to Python floats (the same floats as one conversion per problem).
        columns, finals = out.history.cpu().t().tolist(), out.matching_loss.cpu().tolist()
        optimised = out.soft_labels.argmax(dim=-1).cpu() if optimise else None
        for j, i in enumerate(members):
            budget = out.budgets[j]
            results[i] = AttackResult(
                images=out.images[j],
                labels=optimised[j] if optimise else prepared[i][2],
                cost=AttackCost(iterations=budget, restarts=out.restart_counts[j], wall_time_s=0.0),
                history={"matching_loss": columns[j][:budget]},
                final_loss=finals[j],
            )


def _part_key(attack: OptimizationAttack, optimise: bool) -> tuple:
    """Problems whose attacks have the same objective and schedule up to the per-problem settings
    (budget, restarts, step size, TV weight) and the same label handling form one engine part, whatever
    their class: Inverting Gradients and prior-init (which differ only in their start images) share one.
    The key's last entry is ``optimise`` (whether the part optimises labels): read positionally."""
    objective = dataclasses.replace(attack.objective(), tv=0.0)
    schedule = dataclasses.replace(attack.schedule(), iterations=1, restarts=1, lr=1.0)
    if objective.simulate_defense is not None:
        # A simulator is a fresh closure per call, whose repr names a memory address that the next one may
        # reuse: EOT attacks with different simulators were merged. The attack's own settings decide.
        objective = dataclasses.replace(objective, simulate_defense=None)
        settings = dataclasses.replace(attack.config, iterations=1, restarts=1, lr=1.0, tv=0.0)  # per problem
        return repr(objective), repr(schedule), type(attack).__name__, repr(settings), optimise  # optimise last
    return repr(objective), repr(schedule), optimise


def reconstruct_jointly(
    attacks: Sequence[OptimizationAttack], updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge],
    *, seeds: Sequence[int],
) -> list[AttackResult]:
    """``attacks[i].reconstruct(updates[i], knowledges[i], seed=seeds[i])`` for every ``i``, as few engine
    calls as the problems allow (:func:`invert_jointly`): the attacks of one vector step with random
    attacker actions share one call. Every attack must be an :class:`OptimizationAttack` whose
    :attr:`~OptimizationAttack.joins_other_attacks` is true; the wall time is shared by all problems."""
    if not (len(attacks) == len(updates) == len(knowledges) == len(seeds)):
        raise ValueError(f"got {len(attacks)} attacks, {len(updates)} updates, {len(knowledges)} knowledges and "
                         f"{len(seeds)} seeds; give one of each per problem")
    for i, a in enumerate(attacks):
        if not (isinstance(a, OptimizationAttack) and a.joins_other_attacks):
            raise ValueError(f"attacks[{i}] ({type(a).__name__}) cannot share engine calls with other attacks")
    if not attacks:
        return []
    seeds = [check_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)]
    start = time.perf_counter()
    facts = _Facts()
    generators = [seeded_generator(s, facts.device(a, k)) for a, s, k in zip(attacks, seeds, knowledges)]
    results = _invert_jointly(attacks, updates, knowledges, generators, facts)
    elapsed = time.perf_counter() - start
    for r in results:
        r.cost.wall_time_s = elapsed / len(results)
    return results


def config_fields(config: Any) -> dict[str, Any]:
    """The options of a config dataclass as a plain dict (for reports and benchmarks)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


__all__ = ["OptimizationAttack", "OptimizationConfig", "config_fields", "invert_jointly", "reconstruct_jointly"]

"""The attack interface: what every gradient-inversion attack takes and returns.

An attack consumes plain data — the victim's :class:`~leakgym.fl.update.SharedUpdate` and the
server's :class:`AttackerKnowledge` — and produces an :class:`AttackResult`. Attacks never see the
private batch. Malicious-server attacks additionally get to modify the model before the round
through :meth:`Attack.prepare_model`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from leakgym.checks import is_integer
from leakgym.data import DatasetSpec
from leakgym.devices import in_library_modes
from leakgym.fl.update import SharedUpdate


@dataclass
class AttackerKnowledge:
    """What the server knows when it attacks one client's update."""

    model: nn.Module
    spec: DatasetSpec
    batch_size: int
    labels: Tensor | None = None
    bn_stats: list[tuple[Tensor, Tensor]] | None = None
    public_x: Tensor | None = None
    public_y: Tensor | None = None

    def __post_init__(self) -> None:
        if not is_integer(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"AttackerKnowledge.batch_size={self.batch_size!r}; allowed: integers >= 1")
        labels = self.labels
        if labels is not None:
            # Checked here, not in the engine's cross-entropy: on a GPU an out-of-range class is a
            # device-side assert that ends the process's CUDA context.
            if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
                raise ValueError(f"AttackerKnowledge.labels has dtype {labels.dtype}; allowed: integer class indices")
            if tuple(labels.shape) != (self.batch_size,):
                raise ValueError(f"AttackerKnowledge.labels has shape {tuple(labels.shape)}; batch_size is "
                                 f"{self.batch_size}, so allowed: ({self.batch_size},)")
            classes = self.spec.num_classes
            if bool(((labels < 0) | (labels >= classes)).any()):
                raise ValueError(f"AttackerKnowledge.labels={labels.tolist()}; allowed: class indices in "
                                 f"[0, {classes - 1}] ({self.spec.name} has {classes} classes)")


@dataclass
class AttackCost:
    """The budget an attack spent: optimisation iterations x restarts, the steps of a second stage that runs
    once (``once``), and wall time."""

    iterations: int
    restarts: int
    wall_time_s: float
    once: int = 0
    """Steps of a second stage that runs once on the first stage's best restart, whatever the restarts (Mixup
    decoding's demixing, LODA inversion's Eq. 6 steps)."""

    @property
    def units(self) -> int:
        """Iterations x restarts + the second stage's steps: the budget unit the environment charges for. (The
        second stage was counted as iterations, and so charged once per restart although it ran once.)"""
        return self.iterations * self.restarts + self.once


@dataclass
class AttackResult:
    """Reconstructed images (normalised space), inferred labels, cost and per-iteration statistics."""

    images: Tensor
    """``(B, C, H, W)`` reconstructions in normalised space, on the device of the computation."""
    labels: Tensor
    """``int64 (B,)`` known, inferred or optimised labels, on the CPU (bookkeeping, not hot-path data)."""
    cost: AttackCost
    history: dict[str, list[float]] = field(default_factory=dict)
    final_loss: float = float("nan")


class Attack(ABC):
    """Base class: a config dataclass plus :meth:`reconstruct_batch`.

    Subclasses set ``name`` and ``Config`` and implement :meth:`_reconstruct_batch`. The base class
    validates inputs, times the call and fills in the wall time of every result.
    """

    name: ClassVar[str] = "attack"
    Config: ClassVar[type] = object
    #: True for attacks that modify the model before the round (malicious server).
    malicious: ClassVar[bool] = False
    #: Config fields that may differ between the problems of one :meth:`reconstruct_batch` call
    #: (``configs=``); attacks whose computation takes them per problem batch such problems together.
    per_problem_fields: ClassVar[tuple[str, ...]] = ()
    #: Whether the attack reads the public split (``prepare_model``'s ``public_x``, ``knowledge.public_x`` and
    #: ``public_y``). A game gathers a public split only for the rounds whose attack or defense reads it, and
    #: gives the others ``None`` (:meth:`leakgym.game.batch.GameBatch.public_splits`). Each class declares it
    #: for itself: a subclass that does not say so reads it (True), whatever its parent declared, so an
    #: attack built on a non-reader such as Inverting Gradients never loses a split it reads.
    public_split: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "public_split" not in cls.__dict__:
            cls.public_split = True
        if "prepare_model" in cls.__dict__:  # a malicious server's model runs in the library's modes too
            cls.prepare_model = in_library_modes(cls.__dict__["prepare_model"])

    def reads_public_split(self) -> bool:
        """Whether this attack reads the public split (:attr:`public_split`; an attack whose reading depends
        on its config overrides this)."""
        return self.public_split

    def __init__(self, config: Any | None = None, **overrides: Any) -> None:
        if config is None:
            config = self.Config()
        elif type(config) is not self.Config:  # (another attack's options failed later, as an AttributeError)
            raise ValueError(
                f"config is a {type(config).__name__}; attack {self.name!r} takes a {self.Config.__name__} "
                "(or keyword options)")
        if overrides:
            known = {f.name for f in dataclasses.fields(config)}
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise ValueError(
                    f"unknown option(s) {unknown} for attack {self.name!r}; allowed: {sorted(known)}"
                )
            config = dataclasses.replace(config, **overrides)
        self.config = config

    @classmethod
    def check_scenario(cls, config: Any, model: Callable[[], nn.Module], spec: DatasetSpec) -> None:
        """``ValueError`` where ``config`` cannot run in a scenario whose games hold ``model()`` (a model of the
        scenario's architecture, built when first called) on images of ``spec``: a layer it names that the
        model lacks, say. A scenario calls it for every attacker setting when it is built, so that such a
        setting is refused then, not in the first round (found in an audit). Default: nothing to check."""

    # -- malicious servers -------------------------------------------------------------------
    @in_library_modes
    def prepare_model(self, model: nn.Module, spec: DatasetSpec, *, public_x: Tensor | None = None) -> nn.Module:
        """Return the model the server sends to clients. Honest attacks send it unchanged.

        ``public_x`` (unit images of the public split) lets a malicious server calibrate the
        layers it inserts.
        """
        return model

    # -- reconstruction ----------------------------------------------------------------------
    @in_library_modes
    def reconstruct(self, update: SharedUpdate, knowledge: AttackerKnowledge, *, seed: int = 0) -> AttackResult:
        """One reconstruction: ``reconstruct_batch([update], [knowledge], seeds=[seed])[0]``."""
        return self.reconstruct_batch([update], [knowledge], seeds=[seed])[0]

    def batch_key(self) -> tuple:
        """What problems of one :meth:`reconstruct_batch` call must share: the attack class and every
        config field except :attr:`per_problem_fields` (as ``repr`` text, so any field value works)."""
        fields = dataclasses.fields(self.config) if dataclasses.is_dataclass(self.config) else ()
        return (type(self), tuple((f.name, repr(getattr(self.config, f.name)))
                                  for f in fields if f.name not in self.per_problem_fields))

    @in_library_modes
    def reconstruct_batch(
        self,
        updates: Sequence[SharedUpdate],
        knowledges: Sequence[AttackerKnowledge],
        *,
        seeds: Sequence[int] | None = None,
        seed: int = 0,
        configs: Sequence[Any] | None = None,
    ) -> list[AttackResult]:
        """Run N independent reconstructions (one per update) as one computation.

        Args:
            updates, knowledges: one per problem.
            seeds: one seed per problem (``0 <= seed < 2**63``). Every random draw of problem ``i``
                comes from its own ``torch.Generator`` seeded with ``seeds[i]`` on the device of the
                computation, so result ``i`` is a function of ``(updates[i], knowledges[i], seeds[i])``
                and the attack's config alone: the same whether problem ``i`` runs alone or beside
                any other problems (up to floating-point differences of the vectorised kernels,
                see :mod:`leakgym.attacks.engine`).
            seed: used when ``seeds`` is omitted: ``seeds[i] = seed + i``.
            configs: problem ``i``'s config (default: this attack's for every problem). They may differ
                from this attack's config only in :attr:`per_problem_fields` (e.g. the iteration budget);
                result ``i`` is then what ``type(self)(configs[i])`` would return for problem ``i``.
        """
        if len(updates) != len(knowledges):
            raise ValueError(f"got {len(updates)} updates but {len(knowledges)} knowledges; they must pair up")
        seeds = problem_seeds(len(updates), seeds=seeds, seed=seed)
        configs = self._check_configs(configs, len(updates))
        if not updates:
            return []
        start = time.perf_counter()
        if configs is None:
            results = self._reconstruct_batch(list(updates), list(knowledges), seeds=seeds)
        else:
            results = self._reconstruct_mixed(list(updates), list(knowledges), seeds=seeds, configs=configs)
        elapsed = time.perf_counter() - start
        for r in results:
            # Wall time of a batched call is shared by its N problems.
            r.cost.wall_time_s = elapsed / len(results)
        return results

    def _check_configs(self, configs: Sequence[Any] | None, n: int) -> list[Any] | None:
        """``configs`` validated against this attack (None when every problem uses ``self.config``)."""
        if configs is None:
            return None
        configs = list(configs)
        if len(configs) != n:
            raise ValueError(f"got {len(configs)} configs for {n} problems; give exactly one config per problem")
        key = self.batch_key()
        for i, c in enumerate(configs):
            if type(c) is not type(self.config):
                raise ValueError(f"configs[{i}] is a {type(c).__name__}; expected {type(self.config).__name__}")
            if c is not self.config and type(self)(c).batch_key() != key:
                raise ValueError(
                    f"configs[{i}] differs from the attack's config outside the per-problem fields "
                    f"{self.per_problem_fields}: {c} vs {self.config}")
        if all(c is self.config or c == self.config for c in configs):
            return None
        return configs

    def _reconstruct_mixed(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int],
        configs: list[Any],
    ) -> list[AttackResult]:
        """Problems with their own configs (validated by :meth:`reconstruct_batch`). Default: one
        :meth:`_reconstruct_batch` call per distinct config; attacks that take the per-problem fields
        per problem override this to make one computation."""
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(configs):
            groups.setdefault(repr(c), []).append(i)
        results: list[AttackResult | None] = [None] * len(updates)
        for members in groups.values():
            attack = type(self)(configs[members[0]])
            out = attack._reconstruct_batch([updates[i] for i in members], [knowledges[i] for i in members],
                                            seeds=[seeds[i] for i in members])
            for i, r in zip(members, out):
                results[i] = r
        return results  # type: ignore[return-value]

    @abstractmethod
    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int]
    ) -> list[AttackResult]:
        """The attack's own maths: N reconstructions, problem ``i`` seeded by ``seeds[i]``; wall time
        filled in by the caller."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


#: Seeds are non-negative and fit in 63 bits (``torch.Generator.manual_seed`` takes up to 64).
MAX_SEED = 2**63 - 1


#: Largest magnitude of a real attack option (a weight, step size, tolerance or noise scale), as the defenses
#: cap their noise: a finite tv, bn or noise_std of 1e300 gave an infinite loss and NaN histories.
REAL_OPTION_MAX = 1e6


def check_option_types(config: Any) -> None:
    """Check that every ``bool`` and ``float`` field of an attack's config (a dataclass) holds a value of its type
    (a float field's finite value at most :data:`REAL_OPTION_MAX` in magnitude), and store numpy scalars (of its
    ``int`` fields too) as Python values; ``ValueError`` naming the field otherwise. A config's own
    ``__post_init__`` checks the ranges after this: without it, ``boxed="yes"`` or ``None`` ran on its truth
    value, ``lr=True`` was a number, and ``lr="0.1"`` a TypeError of a comparison."""
    for f in dataclasses.fields(config):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind not in ("bool", "int", "float"):
            continue
        value = getattr(config, f.name)
        # (an int field is checked by the config itself, check_integer, which names the range; NaN and inf of a
        # float field too)
        if kind == "bool" and not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{f.name}={value!r}; allowed: True or False")
        if kind == "float" and (not isinstance(value, numbers.Real) or isinstance(value, bool)
                                or (math.isfinite(value) and abs(value) > REAL_OPTION_MAX)):
            raise ValueError(f"{f.name}={value!r}; allowed: a number of magnitude at most {REAL_OPTION_MAX:g}")
        if isinstance(value, np.generic):
            object.__setattr__(config, f.name, value.item())


def limited(default: Any, limit: int) -> Any:
    """A ``Config`` field whose values a scenario bounds by ``limit``, its documented limit (an inner loop's steps
    or samples, a layer's width: what one round's time and memory grow with), as a defense field's ``limit``:
    listed in :data:`leakgym.game.scenario.LIMITS`, checked on the scenario's ``attacker_menu`` levels and
    ``attack_defaults`` when it is built, lifted by ``allow_large=True``. Found in an audit: a default of 10**9
    such steps built, then hung the first round."""
    return field(default=default, metadata={"limit": limit})


def config_limits(config: type) -> dict[str, int]:
    """``field name -> limit`` of the :func:`limited` fields of an attack's ``Config`` class."""
    return {f.name: f.metadata["limit"] for f in dataclasses.fields(config) if "limit" in f.metadata}


def check_integer(value: Any, name: str, low: int = 0) -> int:
    """``value`` as a Python int, or ValueError naming it unless it is an integer >= ``low`` (a float or
    NaN passes ``value < low`` checks, and failed mid-run)."""
    if type(value) is int and value >= low:  # the common case, without the ABC check of is_integer
        return value
    if not is_integer(value) or value < low:
        raise ValueError(f"{name}={value!r}; must be an integer >= {low}")
    return int(value)


def check_tolerance(value: Any, name: str) -> float:
    """``value`` as a float, or ValueError naming it unless it is a finite number >= 0 (NaN passed
    ``value < 0`` and switched a test off silently)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value!r}; allowed range [0, inf)")
    return float(value)


def check_seed(seed: int, name: str = "seed") -> int:
    """``seed`` as a Python int, or ValueError when it is not an integer in ``[0, MAX_SEED]``."""
    if not is_integer(seed):
        raise ValueError(f"{name}={seed!r}; must be an integer in [0, 2**63 - 1]")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name}={seed}; allowed range [0, 2**63 - 1]")
    return int(seed)


def problem_seeds(n: int, *, seeds: Sequence[int] | None = None, seed: int = 0) -> list[int]:
    """One validated seed per problem: ``seeds`` as given, or ``seed + i`` for problem ``i``."""
    if seeds is None:
        check_seed(seed)
        return [check_seed(seed + i, f"seed + {i}") for i in range(n)]
    seeds = list(seeds)
    if len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} problems; give exactly one seed per problem")
    return [check_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)]

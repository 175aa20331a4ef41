"""The defense registry: every client-side defense is one registered object.

A defense is a small object (an instance of :class:`InputDefense`, :class:`StepDefense` or
:class:`UpdateDefense`) that declares

* ``name`` — its key in :data:`DEFENSES`, :data:`PIPELINE_ORDER`, ``DefenseReport.applied`` and
  ``DefenseReport.details``;
* its **stage** (the base class): ``"input"`` transforms the private batch before any gradient,
  ``"step"`` transforms every local step's gradient, ``"update"`` transforms the final shared update;
* ``fields`` — its :class:`~leakgym.defenses.DefenseConfig` fields as :class:`Field` specs (type,
  default, range or choices, one-line doc). :class:`~leakgym.defenses.DefenseConfig` takes its
  fields from here, so a registered defense's fields are accepted, validated and defaulted by it;
* ``is_active(config)`` — by default "the first field differs from its default" (the first field
  is the on/off switch, its default is "off");
* ``validate(config)`` — cross-field rules it owns (default: none);
* ``cost(config)`` — its extra client compute in clean-gradient units (default: 0, "free by
  comparison"); :func:`defense_compute_units` sums it over the active defenses;
* ``public_split`` / ``reads_public_split(config)`` — whether it reads the public split (default:
  True); the pipeline normalises the split for a call only when one of its defenses reads it;
* ``apply(ctx, ...)`` — the stage's transform; ``ctx`` is a :class:`DefenseContext` carrying the
  config, the model, the dataset spec, the device, the seed, the defense's own generator and the
  normalised public split.

The pipeline (:func:`leakgym.defenses.apply_defense`) runs the stages in the order input, step,
update, and within a stage the registered defenses in registration order (or where ``before=``
put them). Adding a defense touches exactly its own module (the object, and in its fields what a
scenario needs: a :class:`Field`'s ``limit``/``limit_option`` and ``bit_menu``), one line registering
it (the built-in ones are listed in :mod:`leakgym.defenses.catalog`) and its method-check case in
``tests/method_checks.py`` (docs/extending.md).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from leakgym.checks import is_integer
from leakgym.devices import seed_generators

if TYPE_CHECKING:
    from leakgym.data.spec import DatasetSpec

Stage = Literal["input", "step", "update"]
#: The pipeline's stages, in the order they run.
STAGES: tuple[Stage, ...] = ("input", "step", "update")
Update = dict[str, Tensor]


class FieldValues(Protocol):
    """A :class:`~leakgym.defenses.config.DefenseConfig` as the registry reads it: every registered field's
    value as an attribute, and the names of the switched-on defenses. (``DefenseConfig`` is built from this
    registry, so the registry names it only through this protocol, not by importing it.)"""

    def active(self) -> list[str]: ...

    def __getattr__(self, name: str) -> Any: ...


#: Names a field may not take: they are DefenseConfig's own attributes.
RESERVED_NAMES = frozenset({"active", "is_identity", "replace", "to_dict", "from_dict", "preset", "fields"})


# ---------------------------------------------------------------------------------------------------
# Field specs
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BitMenu:
    """How a scenario offers an integer bit-mask field: one on/off action dimension per named bit.

    Attributes:
        option: the scenario option that lists the bits on offer (``oasis_bits = ["hflip"]``).
        bits: bit name -> bit value, in the order the names are documented (and listed in errors).
        default: the names a scenario offers unless it sets ``option``.
        what: what one bit is, in words (errors say "a list of <what> names").
    """

    option: str
    bits: Mapping[str, int]
    default: tuple[str, ...] = ()
    what: str = "bit"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", dict(self.bits))  # a copy (a plain dict: picklable)
        object.__setattr__(self, "default", tuple(self.default))
        if not self.option.isidentifier():
            raise ValueError(f"BitMenu option {self.option!r}; allowed: a Python identifier")
        if not self.bits or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 and b & (b - 1) == 0
                                    for b in self.bits.values()):
            raise ValueError(f"BitMenu {self.option!r}: bits={dict(self.bits)!r}; allowed: a non-empty table "
                             "{name: a power of two}")
        unknown = [b for b in self.default if b not in self.bits]
        if unknown:
            raise ValueError(f"BitMenu {self.option!r}: default {unknown} not among its bits {list(self.bits)}")

    def __hash__(self) -> int:
        return hash((self.option, tuple(self.bits.items()), self.default, self.what))


@dataclass(frozen=True)
class Field:
    """One :class:`~leakgym.defenses.DefenseConfig` field: type, default, allowed values, doc.

    Build one with :func:`real_field`, :func:`int_field` or :func:`choice_field`.

    Attributes:
        name: the config field name (a Python identifier).
        kind: ``"real"`` (a finite number in ``[low, high]``), ``"int"`` (an integer in
            ``[low, high]``, ``high=None`` unbounded) or ``"choice"`` (one of ``choices``).
        default: the value of ``DefenseConfig()``; for a defense's first field, its "off" value.
        doc: one line, shown in menus and ``leakgym list``.
        low, high, low_open, high_open: the range (``"real"``, ``"int"``).
        choices: the allowed strings (``"choice"``).
        limit: the documented upper bound a scenario puts on the field's ``defender_menu`` levels and
            ``defense_defaults`` entry (an inner loop's trials or steps, so that one step finishes
            and fits in memory); listed in :data:`leakgym.game.scenario.LIMITS` under the field's name and
            lifted by ``allow_large=True``. ``None``: no documented bound.
        limit_option: a scenario option whose value bounds the field's nonzero levels and default
            (Mixup's ``mixup_k <= batch_size``); not lifted by ``allow_large``.
        limit_why: the reason given when ``limit_option`` is exceeded (e.g. ``"mixes up to k images of
            the private batch; needs k <= batch_size"``).
        scenario_check: a function ``(value, scenario) -> reason or None`` run on each of the field's
            ``defender_menu`` levels and its ``defense_defaults`` entry when a scenario is built: a reason
            refuses the scenario (PPP needs ``precode=True``; InstaHide's k needs as many public images as
            it mixes). A module-level function (fields are pickled). Not lifted by ``allow_large``.
        bit_menu: how a scenario offers the field: ``None`` for a value dimension (the field's
            ``defender_menu`` levels), a :class:`BitMenu` for an integer bit mask whose bits a scenario
            switches on and off one action dimension each (OASIS's augmentations).
        defense: the owning defense's name (filled in the specs :func:`defense_field` returns).
    """

    name: str
    kind: Literal["real", "int", "choice"]
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    limit: float | None = None
    limit_option: str | None = None
    limit_why: str = ""
    bit_menu: BitMenu | None = None
    defense: str = ""
    scenario_check: Callable[[Any, Any], str | None] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_") or self.name in RESERVED_NAMES:
            raise ValueError(f"field name {self.name!r}; allowed: a public identifier other than "
                             f"{sorted(RESERVED_NAMES)}")
        if self.kind not in ("real", "int", "choice"):
            raise ValueError(f"field {self.name!r}: kind={self.kind!r}; allowed: 'real', 'int', 'choice'")
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"field {self.name!r}: a choice field needs a non-empty tuple of choices")
        if (self.limit is not None or self.limit_option is not None) and self.kind == "choice":
            raise ValueError(f"field {self.name!r}: a choice field takes no limit")
        if self.bit_menu is not None:
            if self.kind != "int":
                raise ValueError(f"field {self.name!r}: a bit menu needs an integer field (the mask)")
            for bit in self.bit_menu.bits.values():
                self.check(bit)  # every bit is a mask the field accepts
        self.check(self.default)

    @property
    def type(self) -> type:
        """``float``, ``int`` or ``str``."""
        return {"real": float, "int": int, "choice": str}[self.kind]

    @property
    def allowed(self) -> str:
        """The allowed values in words, e.g. ``"range [0, inf)"``, ``"integers >= 1"``, ``"'ng', 'gc'"``."""
        if self.kind == "choice":
            return ", ".join(map(repr, self.choices or ()))
        if self.kind == "int":
            return f"integers in [{self.low}, {self.high}]" if self.high is not None else f"integers >= {self.low}"
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None or self.high == math.inf else f"{self.high:g}"
        return f"range {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open or hi == 'inf' else ']'}"

    def check(self, value: Any) -> None:
        """Raise ``ValueError`` naming the field, the value and the allowed values unless ``value`` fits."""
        if self.kind == "choice":
            ok = isinstance(value, str) and value in (self.choices or ())
        elif self.kind == "int":  # (numpy integers too: leakgym.checks.is_integer, as every other layer)
            ok = is_integer(value) and value >= (self.low if self.low is not None else 0)
            ok = ok and (self.high is None or value <= self.high)
        else:
            try:
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            except OverflowError:  # an int beyond float's range (10**400)
                ok = False
            if ok and self.low is not None:
                ok = value > self.low if self.low_open else value >= self.low
            if ok and self.high is not None:
                ok = value < self.high if self.high_open else value <= self.high
        if not ok:
            sep = " " if self.kind == "real" else ": "
            raise ValueError(f"DefenseConfig.{self.name}={value!r}; allowed{sep}{self.allowed}")

    def normalized(self, value: Any) -> Any:
        """``value`` checked (:meth:`check`) and as a plain Python value: a numpy scalar becomes its Python
        number or string (what a config holds: its infos and records are written as JSON)."""
        self.check(value)
        return value.item() if isinstance(value, np.generic) else value


def real_field(name: str, default: float, doc: str, *, low: float | None = 0.0, high: float | None = math.inf,
               low_open: bool = False, high_open: bool = False, limit: float | None = None) -> Field:
    """A finite real field in ``[low, high]`` (open ends with ``low_open`` / ``high_open``); ``limit``: the
    documented bound a scenario puts on it (see :class:`Field`)."""
    return Field(name, "real", default, doc, low=low, high=high, low_open=low_open, high_open=high_open, limit=limit)


def int_field(name: str, default: int, doc: str, *, low: int = 0, high: int | None = None, limit: int | None = None,
              limit_option: str | None = None, limit_why: str = "", bit_menu: BitMenu | None = None,
              scenario_check: Callable[[Any, Any], str | None] | None = None) -> Field:
    """An integer field in ``[low, high]`` (``high=None``: unbounded); ``limit``, ``limit_option``,
    ``limit_why``, ``scenario_check``: what a scenario bounds it by; ``bit_menu``: offered as bits of a mask
    (see :class:`Field`)."""
    return Field(name, "int", default, doc, low=low, high=high, limit=limit, limit_option=limit_option,
                 limit_why=limit_why, bit_menu=bit_menu, scenario_check=scenario_check)


def choice_field(name: str, default: str, doc: str, choices: Sequence[str], *,
                 scenario_check: Callable[[Any, Any], str | None] | None = None) -> Field:
    """A string field taking one of ``choices``; ``scenario_check`` as in :class:`Field`."""
    return Field(name, "choice", default, doc, choices=tuple(choices), scenario_check=scenario_check)


# ---------------------------------------------------------------------------------------------------
# Context handed to every defense
# ---------------------------------------------------------------------------------------------------
def derived_generator(seed: int, name: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded from ``(seed, name)``: one independent stream per defense.

    Draw from it *on its device* (``torch.rand(..., generator=g, device=g.device)``); a CUDA
    generator cannot fill a CPU tensor and vice versa.
    """
    g = torch.Generator(device=device)
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
    return g


@contextmanager
def seeded_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Run a block with the global torch RNG (CPU, and ``device`` if CUDA) seeded; restore it after.

    PRECODE's bottleneck samples with ``torch.randn_like`` (no generator argument), so computations
    through a PRECODE model are made reproducible this way.
    """
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices):
        seed_generators(seed, device)  # only what the block forks (torch.manual_seed re-seeded every GPU)
        yield


class GlobalRngStream:
    """The global torch RNG seeded with ``seed``, as a stream that can be left and resumed.

    The first ``with stream:`` block starts from ``torch.manual_seed(seed)`` (as :func:`seeded_global_rng`);
    every later block continues where the previous one stopped; the caller's RNG state is restored after
    each block. A block inside a block of the same stream just continues it. One client's computations
    interleaved with other clients' (lock-step training, :func:`leakgym.fl.client.compute_updates`) thus
    draw exactly what they would draw in one ``seeded_global_rng(seed)`` block of their own.
    """

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = int(seed)
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._state: tuple[Tensor, Tensor | None] | None = None
        self._outer: tuple[Tensor, Tensor | None] | None = None
        self._depth = 0  # a block inside a block of the same stream continues it (no switch)

    def _get(self) -> tuple[Tensor, Tensor | None]:
        return torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self._cuda else None

    def _set(self, state: tuple[Tensor, Tensor | None]) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def __enter__(self) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        self._outer = self._get()
        if self._state is None:
            # The states torch.manual_seed(seed) gives, of the generators restored after (seed_generators).
            seed_generators(self.seed, self.device if self._cuda else "cpu")
        else:
            self._set(self._state)

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self._state = self._get()
        self._set(self._outer)
        self._outer = None


@dataclass
class DefenseContext:
    """What a defense gets besides the data it transforms (one context per defense and call).

    Attributes:
        name: the defense's name.
        config: the whole :class:`~leakgym.defenses.DefenseConfig` of this call.
        model: the global model as received (never modify it; copy it if needed).
        spec: the dataset spec (normalisation, image box, number of classes).
        device: the device of the private batch; every tensor a defense makes belongs here.
        seed: the call's seed (also seeds PRECODE's sampling through :meth:`global_rng`).
        generator: this defense's own generator, derived from ``(seed, name)`` on ``device``.
        public_x: the public split as *normalised* images on ``device`` (``None`` if not given, or if no
            active defense of the call :meth:`~Defense.reads_public_split`).
        public_y: its labels on ``device`` (``None`` with ``public_x``).
        batch_size: the batch size the client declares (the original ``B``).
        update_kind: ``"gradient"`` (FedSGD) or ``"model_delta"`` (FedAvg).
        metadata: shared by all defenses of the call and copied into
            ``SharedUpdate.metadata``: what a defense attaches to the update (Mixup's
            ``"encoding"``). Use :meth:`skip_round` to withhold the update.
        training_rng: the call's global-RNG stream during local training (shared by the call's
            defenses); :meth:`StepDefense.apply_many` runs each client's :meth:`StepDefense.apply` in it.
    """

    name: str
    config: FieldValues
    model: nn.Module
    spec: DatasetSpec
    device: torch.device
    seed: int
    generator: torch.Generator
    public_x: Tensor | None = None
    public_y: Tensor | None = None
    batch_size: int = 1
    update_kind: str = "gradient"
    metadata: dict = field(default_factory=dict)
    training_rng: GlobalRngStream | None = None

    def global_rng(self) -> AbstractContextManager[None]:
        """Context manager: the global torch RNG seeded with ``seed`` (see :func:`seeded_global_rng`)."""
        return seeded_global_rng(self.seed, self.device)

    def skip_round(self) -> None:
        """Withhold this round's update: the client sends nothing.

        The pipeline then returns all-zero tensors with ``metadata["skipped"] = True``, and
        :meth:`leakgym.fl.server.Server.aggregate` leaves the update out.
        """
        self.metadata["skipped"] = True


# ---------------------------------------------------------------------------------------------------
# Defense base classes
# ---------------------------------------------------------------------------------------------------
class Defense(ABC):
    """What every defense declares (see the module docstring); subclass one of the stage classes."""

    name: ClassVar[str]
    stage: ClassVar[Stage]
    fields: ClassVar[tuple[Field, ...]] = ()

    def is_active(self, config: FieldValues) -> bool:
        """On when the first field (the switch) differs from its default ("off")."""
        switch = self.fields[0]
        return getattr(config, switch.name) != switch.default

    def validate(self, config: FieldValues) -> None:
        """Cross-field rules this defense owns; raise ``ValueError`` naming the values. Default: none."""

    def cost(self, config: FieldValues) -> float:
        """Extra client compute when active, in clean-gradient evaluations. Default: 0 (free by comparison)."""
        return 0.0

    #: whether ``apply`` reads the public split (``ctx.public_x``, ``ctx.public_y``); see :meth:`reads_public_split`.
    #: Each class declares it for itself, as attacks do (:attr:`leakgym.attacks.base.Attack.public_split`): a
    #: subclass that does not say so reads it, whatever its parent declared.
    public_split: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "public_split" not in cls.__dict__:
            cls.public_split = True

    def reads_public_split(self, config: FieldValues) -> bool:
        """Whether ``apply`` reads ``ctx.public_x``/``ctx.public_y`` under ``config``. The pipeline normalises
        a call's public split only when one of its active defenses reads it, and otherwise gives every context
        ``None``: normalising CIFAR-10's 5,000 public images costs 73 ms (one thread), which a noise defense paid
        on every call. Default: the class's ``public_split`` (True unless the defense says it never reads it)."""
        return self.public_split

    def __repr__(self) -> str:
        return f"<{self.stage} defense {self.name!r}: {', '.join(f.name for f in self.fields)}>"


class InputDefense(Defense):
    """Stage ``"input"``: transforms the private batch the client trains on."""

    stage: ClassVar[Stage] = "input"

    @abstractmethod
    def apply(self, ctx: DefenseContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, dict]:
        """``(x, y) -> (x', y', details)``: normalised images and labels (hard or soft) in and out."""

    def apply_many(self, ctxs: Sequence[DefenseContext], xs: Sequence[Tensor],
                   ys: Sequence[Tensor]) -> list[tuple[Tensor, Tensor, dict]]:
        """:meth:`apply` for several clients (the victims of a vector step's games), each with its own
        context. Default: one :meth:`apply` per client; a defense whose work batches over clients
        (LODA's obscuring) overrides it, client ``i``'s result equal to its own :meth:`apply` (to the
        rounding of batched kernels)."""
        return [self.apply(c, x, y) for c, x, y in zip(ctxs, xs, ys)]


class StepDefense(Defense):
    """Stage ``"step"``: transforms the gradient of every local step before it is used."""

    stage: ClassVar[Stage] = "step"

    @abstractmethod
    def apply(self, ctx: DefenseContext, model: nn.Module, x: Tensor, y: Tensor, grad: Update, *,
              step: int) -> tuple[Update, dict]:
        """``grad -> (grad', details)`` at the working model's current parameters (do not modify it).

        ``details`` of every step are collected in a list, ``DefenseReport.details[name][step]``.
        """

    def apply_many(self, ctxs: Sequence[DefenseContext], models: Sequence[nn.Module], xs: Sequence[Tensor],
                   ys: Sequence[Tensor], grads: Sequence[Update], *, step: int) -> list[tuple[Update, dict]]:
        """:meth:`apply` for several clients at local step ``step`` (the victims of a vector step's games,
        trained in lock-step by :func:`leakgym.fl.client.compute_updates`), each with its own context and
        working model. Default: one :meth:`apply` per client, inside the client's training RNG stream; a
        defense whose work batches over clients overrides it, client ``i``'s result equal to its own
        :meth:`apply` (to the rounding of batched kernels)."""
        out = []
        for c, m, x, y, g in zip(ctxs, models, xs, ys, grads):
            with c.training_rng or contextlib.nullcontext():
                out.append(self.apply(c, m, x, y, g, step=step))
        return out


class GroupedStepDefense(StepDefense):
    """A step defense with a batched computation for groups of clients (DCS², CENSOR).

    :meth:`apply_many` groups the clients by :meth:`group_key` and runs every group of at least
    :attr:`min_group` clients through :meth:`apply_group`; a client whose key is ``None`` (a model the
    batched form does not take) and a smaller group run :meth:`apply` one by one, inside the client's
    training RNG stream (PRECODE models draw from it).
    """

    #: Smaller groups run :meth:`apply` (e.g. to keep a lone client's reference computation exact).
    min_group: ClassVar[int] = 1

    @abstractmethod
    def group_key(self, ctx: DefenseContext, model: nn.Module, x: Tensor) -> Any:
        """A hashable key: clients with equal keys may share one :meth:`apply_group` call; ``None``: alone."""

    @abstractmethod
    def apply_group(self, ctxs: Sequence[DefenseContext], models: Sequence[nn.Module], xs: Sequence[Tensor],
                    ys: Sequence[Tensor], grads: Sequence[Update], *, step: int) -> list[tuple[Update, dict]]:
        """:meth:`apply` of every client of one group, as one batched computation."""

    def apply_many(self, ctxs: Sequence[DefenseContext], models: Sequence[nn.Module], xs: Sequence[Tensor],
                   ys: Sequence[Tensor], grads: Sequence[Update], *, step: int) -> list[tuple[Update, dict]]:
        groups: dict[Any, list[int]] = {}
        alone: list[int] = []
        for i, (ctx, model, x, y) in enumerate(zip(ctxs, models, xs, ys)):
            key = self.group_key(ctx, model, x)
            if key is None:
                alone.append(i)
            else:
                # Hard (B,) and soft (B, K) labels (a Mixup/InstaHide client) never share a group: the
                # batched form concatenates the group's labels.
                groups.setdefault((key, y.dim(), y.dtype), []).append(i)
        out: list = [None] * len(ctxs)
        for members in groups.values():
            if len(members) < self.min_group:
                alone += members
                continue
            results = self.apply_group([ctxs[i] for i in members], [models[i] for i in members],
                                       [xs[i] for i in members], [ys[i] for i in members], [grads[i] for i in members],
                                       step=step)
            for i, result in zip(members, results):
                out[i] = result
        for i in alone:
            with ctxs[i].training_rng or contextlib.nullcontext():
                out[i] = self.apply(ctxs[i], models[i], xs[i], ys[i], grads[i], step=step)
        return out


class UpdateDefense(Defense):
    """Stage ``"update"``: transforms the final shared update."""

    stage: ClassVar[Stage] = "update"

    @abstractmethod
    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        """``update -> (update', details)``; ``x, y`` is the batch the client trained on."""

    def apply_many(self, ctxs: Sequence[DefenseContext], updates: Sequence[Update], xs: Sequence[Tensor],
                   ys: Sequence[Tensor]) -> list[tuple[Update, dict]]:
        """:meth:`apply` for several clients (the victims of a vector step's games), each with its own
        context (config, generator). Default: one :meth:`apply` per client; a defense whose work is
        tensor arithmetic overrides it with one batched computation, client ``i``'s result equal to its
        own :meth:`apply` (to the rounding of batched kernels)."""
        return [self.apply(c, u, x, y) for c, u, x, y in zip(ctxs, updates, xs, ys)]


# ---------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------
_REGISTRY: dict[str, Defense] = {}   # always kept in pipeline order
_FIELDS: dict[str, Field] = {}       # every registered field, in pipeline order

#: Read-only, live view: defense name -> defense, in pipeline order.
DEFENSES: Mapping[str, Defense] = MappingProxyType(_REGISTRY)


def defense_registry() -> Mapping[str, Defense]:
    """The registered defenses, name -> defense, in pipeline order (a read-only live view)."""
    return DEFENSES


def defense_fields() -> Mapping[str, Field]:
    """Every registered :class:`Field`, name -> spec, in pipeline order (a read-only live view)."""
    return MappingProxyType(_FIELDS)


def defense_field(name: str) -> Field:
    """The spec of one :class:`~leakgym.defenses.DefenseConfig` field (type, default, range, doc, owner)."""
    if name not in _FIELDS:
        raise ValueError(f"unknown DefenseConfig field {name!r}; allowed: {sorted(_FIELDS)}")
    return _FIELDS[name]


#: bumped at every change of the registry: what a config cached from it (its active defenses) is valid for
_GENERATION = [0]


def registry_generation() -> int:
    """A number that changes whenever a defense is registered or unregistered (cache key)."""
    return _GENERATION[0]


def _rebuild(order: list[Defense]) -> None:
    _GENERATION[0] += 1
    by_stage = sorted(order, key=lambda d: STAGES.index(d.stage))  # stable: keeps order within a stage
    _REGISTRY.clear()
    _REGISTRY.update((d.name, d) for d in by_stage)
    _FIELDS.clear()
    _FIELDS.update((f.name, replace(f, defense=d.name)) for d in by_stage for f in d.fields)


def register_defense(defense: Defense, *, before: str | None = None) -> Defense:
    """Register a defense: its fields join DefenseConfig, it joins the pipeline and the cost model.

    Args:
        defense: an instance of :class:`InputDefense`, :class:`StepDefense` or :class:`UpdateDefense`.
        before: the name of a registered defense of the same stage to run before; default: last
            of its stage.

    Returns:
        ``defense`` (so a module can write ``MY_DEFENSE = register_defense(MyDefense())``).

    Raises:
        ValueError: on a duplicate name, a field name another defense already owns, a defense
            without fields, or a bad ``before``.
    """
    if not isinstance(defense, (InputDefense, StepDefense, UpdateDefense)):
        raise ValueError(f"register_defense needs an InputDefense, StepDefense or UpdateDefense instance; "  # noqa: TRY004
                         f"got {type(defense).__name__}")
    name = getattr(defense, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"defense name {name!r}; allowed: a Python identifier")
    if name in _REGISTRY:
        raise ValueError(f"a defense named {name!r} is already registered ({_REGISTRY[name]!r})")
    if not defense.fields or not all(isinstance(f, Field) for f in defense.fields):
        raise ValueError(f"defense {name!r} needs a non-empty tuple of Field specs (its first field is its switch)")
    names = [f.name for f in defense.fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    clash = sorted(n for n in names if n in _FIELDS)
    if dupes or clash:
        owners = {n: _FIELDS[n].defense for n in clash}
        raise ValueError(f"defense {name!r}: field(s) {dupes + clash} already taken"
                         f"{f' (owned by {owners})' if owners else ' (listed twice)'}")
    order = list(_REGISTRY.values())
    if before is None:
        order.append(defense)
    else:
        if before not in _REGISTRY or _REGISTRY[before].stage != defense.stage:
            same = [n for n, d in _REGISTRY.items() if d.stage == defense.stage]
            raise ValueError(f"before={before!r}; allowed: a registered {defense.stage}-stage defense {same}")
        order.insert(order.index(_REGISTRY[before]), defense)
    _rebuild(order)
    return defense


def unregister_defense(name: str) -> Defense:
    """Remove a registered defense (its fields leave DefenseConfig); returns it."""
    if name not in _REGISTRY:
        raise ValueError(f"no defense named {name!r} is registered; registered: {list(_REGISTRY)}")
    removed = _REGISTRY[name]
    _rebuild([d for n, d in _REGISTRY.items() if n != name])
    return removed


@contextmanager
def registered(defense: Defense, *, before: str | None = None) -> Iterator[Defense]:
    """``with registered(MyDefense()):`` — registered inside the block, unregistered after."""
    register_defense(defense, before=before)
    try:
        yield defense
    finally:
        unregister_defense(defense.name)


class _PipelineOrder(Sequence[str]):
    """The registered defense names in pipeline order; a live, read-only view of the registry."""

    def __getitem__(self, index):  # type: ignore[override]
        return tuple(_REGISTRY)[index]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_REGISTRY))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(_REGISTRY))


#: Canonical application order (stage, then registration order): a live view of the registry.
PIPELINE_ORDER: Sequence[str] = _PipelineOrder()


def defense_compute_units(config: FieldValues) -> float:
    """Extra client compute of ``config``'s defenses, in clean-gradient evaluations.

    The sum of :meth:`Defense.cost` over the active defenses; each defense documents its own model.
    A deterministic count (unlike wall time), so the same seed gives the same rewards.
    """
    return float(sum(_REGISTRY[name].cost(config) for name in config.active()))


def reads_public_split(config: FieldValues) -> bool:
    """Whether a defense active in ``config`` reads the public split (:meth:`Defense.reads_public_split`):
    the pipeline normalises it, and a game gathers it (:meth:`leakgym.game.batch.GameBatch.public_splits`),
    only then."""
    return any(_REGISTRY[name].reads_public_split(config) for name in config.active())

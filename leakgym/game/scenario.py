"""Scenarios: everything that defines one LeakGym game, as data.

A :class:`Scenario` fixes the federated setting (dataset, model, batch size B, K benign clients,
rounds, FedSGD/FedAvg), the threat model, the two agents' action menus and the reward weights.
Named scenarios are TOML files in ``leakgym/game/scenarios/``; each registers a Gymnasium id on
``import leakgym`` (see :mod:`leakgym.envs.registration`).

Action menus
------------
Both actions are ``MultiDiscrete`` vectors whose dimensions are :mod:`leakgym.game.menus` objects:

* defender: one dimension per entry of ``defender_menu`` (a
  :class:`~leakgym.defenses.DefenseConfig` field and the values it may take), then one on/off
  dimension per bit offered of every bit-mask field (a field that declares a
  :class:`~leakgym.defenses.BitMenu`; the scenario names the bits on offer in the option the menu
  declares). Index 0 of every defender dimension should be "off" so that the all-zero action
  means "no defense".
* attacker: one dimension per entry of ``attacker_menu``: ``strategy`` (attack registry names) first,
  then any field of the strategies' configs (``iterations``, ``restarts``, ``tv``, imprint's
  ``num_bins``, ...). A field applies to the strategies whose config has it. ``strategies``,
  ``iterations``, ``restarts`` and ``tv`` are accepted as shorthands for those menu entries.

Every menu value is validated through the real config class when the scenario is built.

What a scenario knows of the defenses comes from the registry (:mod:`leakgym.defenses.registry`):
their fields and how each is offered (a value dimension, or a bit mask with its scenario option) and
bounded (:attr:`~leakgym.defenses.registry.Field.limit`, ``limit_option``); this module names none.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.suggest import UnknownOptionError, did_you_mean, unexpected_keywords

from .menus import BitDimension, Menu, ValueDimension, check_action

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SCENARIO_DIR = Path(__file__).parent / "scenarios"

LEAKAGE_METRICS = ("ssim", "psnr", "lpips", "ssim+psnr")
THREAT_MODELS = ("honest", "malicious")
UPDATE_KINDS = ("gradient", "model_delta")

#: PSNR (dB) that maps to leakage 1.0 when the leakage metric is PSNR-based.
PSNR_FOR_FULL_LEAKAGE = 40.0


@dataclass
class RewardWeights:
    """Weights of the reward formulas (see :mod:`leakgym.game.feedback`)."""

    #: attacker pays this per 1000 budget units (iterations x restarts)
    attack_cost: float = 0.05
    #: defender earns this times the cosine fidelity of its shared update to the clean one
    fidelity: float = 0.5
    #: defender earns this times the global model's test accuracy
    accuracy: float = 0.5
    #: defender pays this per unit of extra client compute (one clean-gradient evaluation)
    defense_overhead: float = 0.002


@dataclass
class Scenario:
    """One LeakGym game. Every field has a default so overrides can name just what changes."""

    name: str = "digits"
    #: dataset name (see ``leakgym list``) or a path to an image folder / .npz file (leakgym.data.custom),
    #: and image side length (None = the dataset's default)
    dataset: str = "digits"
    image_size: int | None = 16
    #: model name (lenet, convnet, mlp, resnet18), optional PRECODE bottleneck and width
    model: str = "lenet"
    precode: bool = False
    model_width: int | None = None
    #: private batch size B of the victim, number K of benign clients, episode length in rounds
    batch_size: int = 1
    num_clients: int = 4
    rounds: int = 8
    #: FedSGD ("gradient") or FedAvg ("model_delta") with local_steps SGD steps of local_lr
    update_kind: str = "gradient"
    local_steps: int = 1
    local_lr: float = 0.1
    #: FedAvg's local optimiser (leakgym.fl.optim, docs/fl_protocol.md): "sgd" (with local_momentum in [0, 1)
    #: and local_weight_decay >= 0) or "adam" (PPP's: betas 0.9/0.999, with local_weight_decay); fresh state
    #: every round. Anything but plain SGD needs update_kind="model_delta".
    local_optimizer: str = "sgd"
    local_momentum: float = 0.0
    local_weight_decay: float = 0.0
    #: the local learning rate over the rounds: "constant", "exponential" (local_lr * local_lr_decay**round,
    #: local_lr_decay in (0, 1]) or "cosine" (toward 0 over the episode, never 0 inside it: lr * (1 + cos(pi *
    #: round / rounds)) / 2, leakgym.fl.optim.scheduled_lr)
    local_lr_schedule: str = "constant"
    local_lr_decay: float = 1.0
    #: server learning rate applied to the aggregated update
    server_lr: float = 0.1
    #: test accuracy is measured every eval_every rounds on eval_size held-out images: the first eval_size of the
    #: dataset's test split, all of them where it holds fewer (digits: 359; found in an audit, unsaid before)
    eval_every: int = 1
    eval_size: int = 256
    #: federated split
    public_fraction: float = 0.1
    dirichlet_alpha: float | None = None
    #: "honest" (honest-but-curious server) or "malicious" (may modify the model it sends)
    threat_model: str = "honest"
    #: what the attacker knows besides the model and the update
    known_labels: bool = False
    #: leakage score in [0, 1] used for rewards: ssim, psnr, lpips or ssim+psnr (their mean)
    leakage_metric: str = "ssim"
    #: defender's self-audit: iterations of Inverting Gradients the client runs on its own
    #: shared update to estimate leakage (0 = no audit; the observation entry is then 0)
    audit_iterations: int = 0
    #: DefenseConfig field -> values the defender may pick (index 0 should be "off"); default:
    #: :data:`leakgym.defenses.catalog.DEFAULT_DEFENDER_MENU`
    defender_menu: dict[str, list[Any]] = field(default_factory=lambda: _default_defender_menu())
    #: bit-mask DefenseConfig field -> names of the bits the defender can switch on, one binary action
    #: dimension each. Set one field's entry through the option its :class:`~leakgym.defenses.BitMenu`
    #: declares (in a file, an override or a keyword: ``<option> = [...]``); default: each menu's ``default``
    defender_bits: dict[str, list[str]] = field(default_factory=lambda: _default_defender_bits())
    #: fixed DefenseConfig settings that apply whatever the action (e.g. synthesis steps)
    defense_defaults: dict[str, Any] = field(default_factory=dict)
    #: attacker menu: "strategy" (attack registry names) first, then attack-config fields and levels
    attacker_menu: dict[str, list[Any]] = field(
        default_factory=lambda: {
            "strategy": ["inverting-gradients", "dlg", "prior-init", "layer-skipping"],
            "iterations": [20, 60, 150],
            "restarts": [1, 2],
            "tv": [0.0, 1e-4, 1e-2],
        }
    )
    #: fixed attack-config settings applied to every strategy that has the field
    attack_defaults: dict[str, Any] = field(default_factory=dict)
    rewards: RewardWeights = field(default_factory=RewardWeights)
    #: lift the documented upper bounds of :data:`LIMITS` and :data:`MEMORY_LIMIT_BYTES` (for users who mean
    #: it): only the caller sets it (``load_scenario(..., allow_large=True)``, an env's ``allow_large=True``
    #: keyword, the CLI's ``--allow-large``), never a scenario file or a ``--overrides`` entry (see
    #: :data:`ALLOW_LARGE_FROM_CALLER`)
    allow_large: bool = False

    def __post_init__(self) -> None:
        _coerce_fields(self)
        self.rewards = _reward_weights(self.name, self.rewards)
        self.validate()

    def __getattr__(self, name: str) -> Any:
        """A bit-mask field's scenario option (``sc.<option>``): its entry of ``defender_bits``."""
        bits = self.__dict__.get("defender_bits") if not name.startswith("_") else None
        if isinstance(bits, dict):
            key = _bit_options().get(name)
            if key is not None:
                return bits.get(key, [])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise ValueError(f"scenario {self.name!r}: {what}")

        # the menus' shape first: the checks below read their levels
        need(isinstance(self.attacker_menu, dict) and "strategy" in self.attacker_menu,
             f"attacker_menu={self.attacker_menu!r} needs a 'strategy' entry")
        need(next(iter(self.attacker_menu)) == "strategy", "attacker_menu must list 'strategy' first")
        for key, values in self.attacker_menu.items():
            need(isinstance(values, list) and len(values) >= 1,
                 f"attacker menu {key!r} = {values!r}; needs a non-empty list of levels")
        for key, values in self.defender_menu.items():
            need(isinstance(values, list) and len(values) >= 1,
                 f"defender menu {key!r} = {values!r}; needs a non-empty list of levels")
        need(self.update_kind != "gradient" or self.local_steps == 1,
             f"local_steps={self.local_steps} needs update_kind='model_delta' (FedSGD shares one gradient)")
        _check_fl_protocol(self)
        _check_limits(self)
        _check_split(self)
        _check_model(self)
        _check_option_limits(self)

        need(self.batch_size >= 1, f"batch_size={self.batch_size}; must be >= 1")
        need(self.num_clients >= 0, f"num_clients={self.num_clients}; must be >= 0")
        need(self.rounds >= 1, f"rounds={self.rounds}; must be >= 1")
        need(self.update_kind in UPDATE_KINDS, f"update_kind={self.update_kind!r}; allowed {UPDATE_KINDS}")
        need(self.local_steps >= 1, f"local_steps={self.local_steps}; must be >= 1")
        need(self.eval_every >= 1, f"eval_every={self.eval_every}; must be >= 1")
        need(self.eval_size >= 1, f"eval_size={self.eval_size}; must be >= 1")
        need(self.threat_model in THREAT_MODELS, f"threat_model={self.threat_model!r}; allowed {THREAT_MODELS}")
        need(
            self.leakage_metric in LEAKAGE_METRICS,
            f"leakage_metric={self.leakage_metric!r}; allowed {LEAKAGE_METRICS}",
        )
        need(self.audit_iterations >= 0, f"audit_iterations={self.audit_iterations}; must be >= 0")
        _validate_menus(self)
        # after the menus' values and the counts are checked: these read them
        _check_local_rates(self)
        _check_requirements(self)

    # -- menus and spaces ------------------------------------------------------------------------
    @property
    def public_images(self) -> int:
        """Images in the public split of the dataset's published training set (:func:`split_counts`)."""
        from leakgym.data.catalog import dataset_info

        return split_counts(self, dataset_info(self.dataset).train_size)[0]

    @property
    def defender_menu_dims(self) -> Menu:
        """The defender's :class:`~leakgym.game.menus.Menu` (menu entries, then the bits of each bit-mask field)."""
        from leakgym.defenses import defense_field

        dims: list = [ValueDimension(k, tuple(v)) for k, v in self.defender_menu.items()]
        for key, names in self.defender_bits.items():
            bits = defense_field(key).bit_menu.bits
            dims += [BitDimension(key, bits[b], b) for b in names]
        return Menu("defender", dims, where=f"scenario {self.name!r}: ")

    @property
    def attacker_menu_dims(self) -> Menu:
        """The attacker's :class:`~leakgym.game.menus.Menu` (strategy, then attack-config fields)."""
        dims = [ValueDimension(k, tuple(v)) for k, v in self.attacker_menu.items()]
        return Menu("attacker", dims, where=f"scenario {self.name!r}: ")

    def menu(self, role: str) -> Menu:
        if role not in ("attacker", "defender"):
            raise ValueError(f"role={role!r}; allowed: 'attacker', 'defender'")
        return self.attacker_menu_dims if role == "attacker" else self.defender_menu_dims

    @property
    def strategies(self) -> list[str]:
        return list(self.attacker_menu["strategy"])

    @property
    def iterations(self) -> list[int]:
        return list(self.attacker_menu.get("iterations", []))

    @property
    def restarts(self) -> list[int]:
        return list(self.attacker_menu.get("restarts", []))

    @property
    def tv(self) -> list[float]:
        return list(self.attacker_menu.get("tv", []))

    @property
    def defender_nvec(self) -> np.ndarray:
        return self.defender_menu_dims.nvec

    @property
    def attacker_nvec(self) -> np.ndarray:
        return self.attacker_menu_dims.nvec

    @property
    def defender_dims(self) -> list[str]:
        """Names of the defender's action dimensions, in order."""
        return self.defender_menu_dims.names

    @property
    def attacker_dims(self) -> list[str]:
        return self.attacker_menu_dims.names

    def decode_defender(self, action: np.ndarray, menu: Menu | None = None) -> dict[str, Any]:
        """Defender action -> readable settings (menu values; each bit-mask field lists its bits switched on,
        ``[]`` when none or none offered).

        ``menu``: this scenario's defender menu if the caller already holds it (a game does).
        """
        settings = (menu or self.defender_menu_dims).read(action)
        for key in self.defender_bits:
            settings.setdefault(key, [])
        return settings

    def decode_attacker(self, action: np.ndarray) -> dict[str, Any]:
        """Attacker action -> readable settings (``strategy`` and the menu's config fields)."""
        return self.attacker_menu_dims.read(action)

    def encode_defender(self, settings: dict[str, Any]) -> np.ndarray:
        """Settings -> the defender action whose menu values are nearest to them.

        Keys not named in ``settings`` are off (index 0). A bit-mask field's entry lists the names of its
        bits to switch on (or gives the mask). Unknown keys raise ``ValueError``.
        """
        settings = dict(settings)
        for key, names in self.defender_bits.items():
            if not names and not settings.get(key, True):  # "none of no bits on offer" is no setting
                settings.pop(key)
        return self.defender_menu_dims.encode(settings)

    def encode_attacker(self, settings: dict[str, Any]) -> np.ndarray:
        """Settings -> the attacker action with the nearest menu values (unmentioned: index 0)."""
        return self.attacker_menu_dims.encode(settings)

    # -- construction ---------------------------------------------------------------------------
    def replace(self, **overrides: Any) -> Scenario:
        """A copy with fields changed (validated); ``strategies``/``iterations``/``restarts``/``tv``
        replace those entries of ``attacker_menu``; a bit-mask field's option its
        entry of ``defender_bits``."""
        overrides = _fold_shorthands(overrides, dict(self.attacker_menu))
        known = set(option_names())
        unknown = sorted(set(overrides) - known)
        if unknown:
            allowed = sorted(known | set(SHORTHANDS))
            raise UnknownOptionError(f"unknown scenario option(s) {unknown}: {unexpected_keywords(unknown, allowed)}; "
                                     f"allowed: {allowed}")
        return dataclasses.replace(self, **_fold_bit_options(overrides, self.defender_bits))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        """A scenario from a file's table (``gym_id`` ignored); ``allow_large`` is refused
        (:data:`ALLOW_LARGE_FROM_CALLER`): a file must not lift the limits that protect whoever runs it."""
        if "allow_large" in data:
            raise ValueError(f"allow_large={data['allow_large']!r} in a scenario file: {ALLOW_LARGE_FROM_CALLER}")
        data = _fold_shorthands({k: v for k, v in data.items() if k != "gym_id"}, None)
        known = set(option_names())
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown scenario key(s) {unknown}; allowed: {sorted(known | set(SHORTHANDS))}")
        return cls(**data)


_dataclass_init = Scenario.__init__


def _scenario_init(self: Scenario, *args: Any, **options: Any) -> None:
    _dataclass_init(self, *args, **_fold_bit_options(options, None))


# The generated __init__ with each bit-mask field's option (``<option>=[...]``) accepted as a keyword.
Scenario.__init__ = functools.wraps(_dataclass_init)(_scenario_init)  # type: ignore[method-assign]

_SCENARIO_LIMITS: dict[str, int] = {
    "batch_size": 64, "num_clients": 64, "rounds": 100_000, "local_steps": 100, "eval_size": 10_000,
    "image_size": 256, "model_width": 512, "audit_iterations": 30_000,
    "iterations": 30_000, "restarts": 64,  # attacker menu levels (IG's paper budget is 24,000)
}
#: the :data:`LIMITS` keys that are attacker menu levels or ``attack_defaults`` (the rest of the scenario's
#: own are its fields; a defense field's are its ``defender_menu`` levels and ``defense_defaults`` entry)
_ATTACK_LIMITS = ("iterations", "restarts")


def _defense_limits() -> dict[str, float]:
    """Each registered defense field's declared :attr:`~leakgym.defenses.registry.Field.limit`, in pipeline order."""
    from leakgym.defenses import defense_fields

    return {key: f.limit for key, f in defense_fields().items() if f.limit is not None}


def _attack_limits() -> dict[str, float]:
    """Each registered attack's :func:`~leakgym.attacks.base.limited` config fields' limits (the smallest where
    two attacks limit a field of one name)."""
    from leakgym.attacks import ATTACKS
    from leakgym.attacks.base import config_limits

    out: dict[str, float] = {}
    for attack in ATTACKS.values():
        for key, cap in config_limits(attack.Config).items():
            out[key] = min(cap, out.get(key, cap))
    return out


class _Limits(Mapping[str, float]):
    """:data:`LIMITS`: a read-only, live view (a defense or attack registered later brings its own limits)."""

    def _all(self) -> dict[str, float]:
        return {**_SCENARIO_LIMITS, **_attack_limits(), **_defense_limits()}

    def __getitem__(self, key: str) -> float:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


#: Documented upper bounds: one step must finish and fit in memory. ``allow_large=True`` lifts them. The
#: scenario's own, the attacks' inner loops and sizes (each :func:`~leakgym.attacks.base.limited` config field's,
#: on its ``attacker_menu`` levels and ``attack_defaults`` entry), then the defenses' inner loops (each field's
#: declared ``limit``, on its menu levels and ``defense_defaults`` entry); a read-only mapping that follows the
#: registries.
LIMITS: Mapping[str, float] = _Limits()
#: Upper bound on the estimated working memory of one round (bytes); see :func:`estimated_round_bytes`.
MEMORY_LIMIT_BYTES = 8 * 2**30
#: Who may set ``allow_large`` (the error for a file or an override that tries).
ALLOW_LARGE_FROM_CALLER = ("the documented limits are lifted only by the caller: --allow-large on the command line, "
                           "allow_large=True from Python (load_scenario, gym.make, parallel_env); not by a scenario "
                           "file, a hyperparameter file or an --overrides entry")

_INT_MIN = {"batch_size": 1, "num_clients": 0, "rounds": 1, "local_steps": 1, "eval_every": 1, "eval_size": 1,
            "audit_iterations": 0}
_OPTIONAL_INT_MIN = {"image_size": 8, "model_width": 1}
#: The largest float32: FedAvg's local step takes its rate and weight decay as float32 scalars (torch's
#: ``add(alpha=...)``), and a larger one overflows there (found in an audit: ``local_lr=1e39`` with Adam, or
#: weight decay 1e39, failed every round)
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: float field -> (lower bound, lower bound excluded, upper bound, upper bound excluded)
_FLOATS = {"local_lr": (0.0, True, math.inf, False), "server_lr": (0.0, True, math.inf, False),
           "public_fraction": (0.0, True, 1.0, True), "local_momentum": (0.0, False, 1.0, True),
           "local_weight_decay": (0.0, False, math.inf, False), "local_lr_decay": (0.0, True, 1.0, False)}
_OPTIONAL_FLOATS = {"dirichlet_alpha": (0.0, True, math.inf, False)}
_BOOLS = ("precode", "known_labels", "allow_large")
_STRINGS = ("name", "dataset", "model", "update_kind", "threat_model", "leakage_metric", "local_optimizer",
            "local_lr_schedule")
_DICTS = ("defender_menu", "defense_defaults", "attacker_menu", "attack_defaults")


def _bad(sc_name: Any, key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"scenario {sc_name!r}: {key}={value!r}; allowed: {allowed}")


def _as_int(sc_name: Any, key: str, value: Any, low: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _bad(sc_name, key, value, f"integers >= {low}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise _bad(sc_name, key, value, f"integers >= {low}")
    return int(value)


REWARD_WEIGHT_MAX = 1e6
"""Largest reward weight a scenario takes (every reward term stays finite)."""


def _as_float(sc_name: Any, key: str, value: Any, bounds: tuple[float, bool, float, bool]) -> float:
    low, low_open, high, high_open = bounds
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _bad(sc_name, key, value, f"finite numbers in {shown}") from None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise _bad(sc_name, key, value, f"finite numbers in {shown}")
    return float(value)


def _as_bool(sc_name: Any, key: str, value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(sc_name, key, value, "true or false")
    return bool(value)


def _python_scalar(value: Any) -> Any:
    """A NumPy scalar as the Python scalar it holds; anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value


def _menu_levels(values: Any) -> Any:
    """A menu entry's levels as a list of Python scalars (a tuple or array too); anything else as it is,
    for :meth:`Scenario.validate` to refuse."""
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, tuple):
        values = list(values)
    return [_python_scalar(v) for v in values] if isinstance(values, list) else values


def _coerce_fields(sc: Scenario) -> None:
    """Types and ranges of the scalar fields; strings from the CLI or RLlib are coerced like TOML values."""
    from leakgym.data import DATASET_NAMES
    from leakgym.models import MODEL_NAMES

    name = sc.name
    if isinstance(sc.dataset, os.PathLike):  # dataset=Path(...) from Python: a path like any other
        sc.dataset = os.fspath(sc.dataset)
    for key in _STRINGS:
        if not isinstance(getattr(sc, key), str):
            raise _bad(name, key, getattr(sc, key), "a string")
    if not sc.name.strip():
        raise _bad(name, "name", sc.name, "a non-empty string (the scenario's label in messages and results)")
    for key, low in _INT_MIN.items():
        setattr(sc, key, _as_int(name, key, getattr(sc, key), low))
    for key, low in _OPTIONAL_INT_MIN.items():
        if getattr(sc, key) is not None:
            setattr(sc, key, _as_int(name, key, getattr(sc, key), low))
    for key, bounds in _FLOATS.items():
        setattr(sc, key, _as_float(name, key, getattr(sc, key), bounds))
    for key, bounds in _OPTIONAL_FLOATS.items():
        if getattr(sc, key) is not None:
            setattr(sc, key, _as_float(name, key, getattr(sc, key), bounds))
    for key in _BOOLS:
        setattr(sc, key, _as_bool(name, key, getattr(sc, key)))
    for key in _DICTS:
        if not isinstance(getattr(sc, key), dict):
            raise _bad(name, key, getattr(sc, key), "a table {name: value}")
    # Menus and defaults given from Python may hold NumPy scalars, tuples or arrays: as the Python lists
    # and scalars TOML gives, so that limits and types are checked on them (np.int64(10**6) iterations
    # passed the limit check, which looked at int and float only).
    for key in ("attacker_menu", "defender_menu"):
        setattr(sc, key, {k: _menu_levels(v) for k, v in getattr(sc, key).items()})
    for key in ("attack_defaults", "defense_defaults"):
        setattr(sc, key, {k: _python_scalar(v) for k, v in getattr(sc, key).items()})
    if not isinstance(sc.defender_bits, dict):
        raise _bad(name, "defender_bits", sc.defender_bits, "a table {bit-mask field: [bit names]}")
    for key, names in sc.defender_bits.items():
        if not isinstance(names, list) or not all(isinstance(b, str) for b in names):
            menu = _bit_fields().get(key)
            raise _bad(name, menu.option if menu else f"defender_bits.{key}", names,
                       f"a list of {menu.what if menu else 'bit'} names")
    if sc.dataset not in DATASET_NAMES:  # else a path: an image folder or an .npz (leakgym.data.custom)
        from leakgym.data.catalog import PATH_HINT, is_dataset_path
        from leakgym.data.custom import resolve_path

        if not is_dataset_path(sc.dataset):
            raise _bad(name, "dataset", sc.dataset,
                       ", ".join(DATASET_NAMES) + f"{did_you_mean(sc.dataset, DATASET_NAMES)}, {PATH_HINT}")
        try:
            sc.dataset = resolve_path(sc.dataset)
        except ValueError as exc:
            raise ValueError(f"scenario {name!r}: dataset: {exc}") from None
    from leakgym.fl.optim import LOCAL_OPTIMIZERS, LR_SCHEDULES

    choices = {"model": MODEL_NAMES, "update_kind": UPDATE_KINDS,
               "threat_model": THREAT_MODELS, "leakage_metric": LEAKAGE_METRICS,
               "local_optimizer": LOCAL_OPTIMIZERS, "local_lr_schedule": LR_SCHEDULES}
    for key, allowed in choices.items():
        if getattr(sc, key) not in allowed:
            raise _bad(name, key, getattr(sc, key), ", ".join(map(str, allowed))
                       + did_you_mean(getattr(sc, key), map(str, allowed)))


def _reward_weights(sc_name: Any, value: Any) -> RewardWeights:
    if isinstance(value, RewardWeights):
        value = dataclasses.asdict(value)
    if not isinstance(value, dict):
        raise _bad(sc_name, "rewards", value, "a table with " + ", ".join(f.name for f in dataclasses.fields(RewardWeights)))
    known = [f.name for f in dataclasses.fields(RewardWeights)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"scenario {sc_name!r}: unknown reward weight(s) {unknown}; allowed: {known}")
    # Bounded: a weight of 1e308 times a cost overflowed rewards to -inf.
    return RewardWeights(**{k: _as_float(sc_name, f"rewards.{k}", v, (0.0, False, REWARD_WEIGHT_MAX, False))
                            for k, v in value.items()})


def estimated_round_bytes(sc: Scenario) -> int:
    """A coarse upper estimate of one round's working memory (bytes), checked against :data:`MEMORY_LIMIT_BYTES`.

    Dominated by the attack: ``restarts x B`` dummy images, each carrying about 64 activation maps of
    the image's size through the double backward, plus the dataset split held per game.
    """
    from leakgym.data import dataset_spec

    spec = dataset_spec(sc.dataset)
    side = sc.image_size or spec.image_size
    pixels = spec.channels * side * side
    # (menu values are validated elsewhere; a non-integer one is refused there, not estimated here)
    restarts = max([int(r) for r in _attack_values(sc, "restarts")
                    if isinstance(r, numbers.Integral) and not isinstance(r, bool)] + [1])
    attack = 4 * 64 * restarts * sc.batch_size * pixels
    clients = 4 * 64 * (sc.num_clients + 1) * max(sc.batch_size, 8) * pixels
    return int(attack + clients)


def _check_fl_protocol(sc: Scenario) -> None:
    """FedAvg's local optimiser and schedule (types and ranges are checked by :func:`_coerce_fields`): only
    with ``update_kind="model_delta"`` when they differ from plain SGD at a constant rate (FedSGD shares one
    gradient and takes no local step), and no SGD momentum with Adam."""
    from leakgym.fl.optim import LocalOptimizer

    try:
        LocalOptimizer(sc.local_optimizer, momentum=sc.local_momentum, weight_decay=sc.local_weight_decay)
    except ValueError as exc:
        raise ValueError(f"scenario {sc.name!r}: {exc}") from None
    if sc.update_kind == "gradient":
        changed = [f"{k}={getattr(sc, k)!r}" for k, plain in (("local_optimizer", "sgd"), ("local_momentum", 0.0),
                   ("local_weight_decay", 0.0), ("local_lr_schedule", "constant"), ("local_lr_decay", 1.0))
                   if getattr(sc, k) != plain]
        if changed:
            raise ValueError(f"scenario {sc.name!r}: {', '.join(changed)} needs update_kind='model_delta' (FedSGD "
                             "shares one gradient and takes no local step)")
    if sc.local_lr_schedule != "exponential" and sc.local_lr_decay != 1.0:
        raise ValueError(f"scenario {sc.name!r}: local_lr_decay={sc.local_lr_decay!r} with local_lr_schedule="
                         f"{sc.local_lr_schedule!r}; allowed: 1.0 (the decay is the 'exponential' schedule's)")


def _check_local_rates(sc: Scenario) -> None:
    """FedAvg's local rate and weight decay within float32 (:data:`FLOAT32_MAX`; the rate a tenth of it with
    Adam, whose first step is ``lr / (1 - beta1)``: found in an audit), and every round's scheduled
    rate a positive float32: an exponential decay over many rounds, or a tiny ``local_lr``, reached 0 there
    and failed every round from then on (found in an audit). Every schedule decreases over the rounds, so the
    last round's rate (:func:`round_local_lr`) is the one to check. FedSGD (``update_kind="gradient"``)
    shares a gradient and uses neither."""
    if sc.update_kind != "model_delta":
        return
    from leakgym.fl.optim import LocalOptimizer

    # Adam's first step is lr / (1 - beta1) (PyTorch's bias correction), a float32 itself: 10x local_lr
    adam = sc.local_optimizer == "adam"
    lr_max = FLOAT32_MAX * (1 - LocalOptimizer("adam").betas[0]) * (1 - 1e-6) if adam else FLOAT32_MAX
    for key, most in (("local_lr", lr_max), ("local_weight_decay", FLOAT32_MAX)):
        if getattr(sc, key) > most:
            why = " with local_optimizer='adam', whose first step is lr / (1 - beta1)" if most != FLOAT32_MAX else ""
            raise ValueError(f"scenario {sc.name!r}: {key}={getattr(sc, key)!r} with update_kind='model_delta'; "
                             f"allowed: at most {most:.6g} (float32{why})")
    last = round_local_lr(sc, sc.rounds - 1)
    if np.float32(last) == 0:
        raise ValueError(f"scenario {sc.name!r}: the local learning rate of the last round, {sc.rounds} ({last:.3g}: "
                         f"local_lr={sc.local_lr!r}, local_lr_schedule={sc.local_lr_schedule!r}, local_lr_decay="
                         f"{sc.local_lr_decay!r}), is 0 in float32; allowed: every round's rate >= "
                         f"{float(np.finfo(np.float32).smallest_subnormal):.3g}")


def local_optimizer(sc: Scenario):
    """The scenario's :class:`leakgym.fl.optim.LocalOptimizer` (None for plain SGD: the clients' default)."""
    from leakgym.fl.optim import LocalOptimizer

    opt = LocalOptimizer(sc.local_optimizer, momentum=sc.local_momentum, weight_decay=sc.local_weight_decay)
    return None if opt.plain else opt


def round_local_lr(sc: Scenario, rnd: int) -> float:
    """The clients' local learning rate in round ``rnd`` (0-based) under the scenario's schedule
    (:func:`leakgym.fl.optim.scheduled_lr`); ``local_lr`` itself for the constant schedule."""
    from leakgym.fl.optim import scheduled_lr

    if sc.local_lr_schedule == "constant":
        return sc.local_lr
    return scheduled_lr(sc.local_lr, sc.local_lr_schedule, min(rnd, sc.rounds - 1), sc.rounds, sc.local_lr_decay)


def _check_model(sc: Scenario) -> None:
    """The model must take the scenario's images (ConvNet needs 9x9 or more): checked when the scenario
    is built, not when the first game resets and builds its model."""
    from leakgym.data import dataset_spec
    from leakgym.models import MODEL_CLASSES
    from leakgym.models.base import check_spec_for

    spec = dataset_spec(sc.dataset, sc.image_size)
    try:
        check_spec_for(MODEL_CLASSES[sc.model], spec)
    except ValueError as exc:
        raise ValueError(f"scenario {sc.name!r}: model={sc.model!r} with image_size={spec.image_size}: {exc}; "
                         "choose a larger image_size or another model") from None


def split_counts(sc: Scenario, n: int) -> tuple[int, int, bool]:
    """The public and private image counts of ``sc``'s federated split of ``n`` training images, and whether
    they suffice: a public image (the attacker's priors, DCS²'s and LODA's start images) and a private one
    per client and the victim."""
    public = math.floor(sc.public_fraction * n)
    return public, n - public, public >= 1 and n - public >= sc.num_clients + 1


def _check_split(sc: Scenario) -> None:
    """:func:`split_counts` of the dataset's published training set must suffice: checked when the scenario
    is built, not at reset or in the first round that needs them."""
    from leakgym.data.catalog import dataset_info

    n = dataset_info(sc.dataset).train_size
    public, _, fits = split_counts(sc, n)
    if fits:
        return
    if public < 1:
        raise ValueError(f"scenario {sc.name!r}: public_fraction={sc.public_fraction!r} leaves no public image of "
                         f"the {n} training images of {sc.dataset}; allowed: >= {1 / n:.3g}")
    raise ValueError(f"scenario {sc.name!r}: num_clients={sc.num_clients} benign clients and the victim need "
                     f"{sc.num_clients + 1} private images, public_fraction={sc.public_fraction!r} leaves "
                     f"{n - public} of the {n} training images of {sc.dataset}")


def _attack_values(sc: Scenario, key: str) -> list:
    """Every value an attack of ``sc`` may take for ``key``: its menu levels and its ``attack_defaults``
    entry (a default of 10**6 iterations used to pass the limits that the menu is held to)."""
    values = list(sc.attacker_menu.get(key, []))
    if key in sc.attack_defaults:
        values.append(sc.attack_defaults[key])
    return values


def _defense_values(sc: Scenario, key: str) -> list:
    """Every value a defense of ``sc`` may take for ``key``: its defender menu levels and its
    ``defense_defaults`` entry."""
    values = list(sc.defender_menu.get(key, []))
    if key in sc.defense_defaults:
        values.append(sc.defense_defaults[key])
    return values


def _check_limits(sc: Scenario) -> None:
    if sc.allow_large:
        return
    hint = "; pass allow_large=True (on the command line: --allow-large) to lift the documented limits"
    defense, attack = _defense_limits(), _attack_limits()
    for key, cap in {**_SCENARIO_LIMITS, **attack, **defense}.items():  # (LIMITS, read once: its view is rebuilt
        # on every lookup)
        if key in defense:
            values = _defense_values(sc, key)
        elif key in _ATTACK_LIMITS or key in attack:
            values = _attack_values(sc, key)
        else:
            values = [getattr(sc, key)] if getattr(sc, key) is not None else []
        too_big = [v for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and v > cap]
        if too_big:
            raise ValueError(f"scenario {sc.name!r}: {key}={too_big[0]!r} exceeds the limit {cap}{hint}")
    need = estimated_round_bytes(sc)
    if need > MEMORY_LIMIT_BYTES:
        raise ValueError(
            f"scenario {sc.name!r}: one round needs about {need / 2**30:.1f} GiB (batch_size x restarts x "
            f"image size) > {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB{hint}"
        )


def _check_option_limits(sc: Scenario) -> None:
    """A defense field bounded by a scenario option (:attr:`~leakgym.defenses.registry.Field.limit_option`:
    Mixup's k by the batch size): its nonzero menu levels and default may not exceed that option's value
    (:func:`_check_requirements` runs each field's own check)."""
    from leakgym.defenses import defense_fields

    for key, spec in defense_fields().items():
        if spec.limit_option is None:
            continue
        values = [v for v in _defense_values(sc, key) if v]
        bound = getattr(sc, spec.limit_option)
        if any(isinstance(v, numbers.Real) and not isinstance(v, bool) and v > bound for v in values):
            raise ValueError(f"scenario {sc.name!r}: defender_menu {key}={values} {spec.limit_why} "
                             f"({spec.limit_option}={bound})")


def _check_requirements(sc: Scenario) -> None:
    """Each defense field's :attr:`~leakgym.defenses.registry.Field.scenario_check` on its menu levels and
    default (PPP needs ``precode=True``; InstaHide's k the public images it mixes in); run after the levels'
    types and ranges are checked, so a check sees only values its field accepts."""
    from leakgym.defenses import defense_fields

    for key, spec in defense_fields().items():
        if spec.scenario_check is None:
            continue
        for value in _defense_values(sc, key):
            why = spec.scenario_check(value, sc)
            if why:
                raise ValueError(f"scenario {sc.name!r}: defender_menu {key}={value!r} {why}")


def _default_defender_menu() -> dict[str, list[Any]]:
    from leakgym.defenses.catalog import DEFAULT_DEFENDER_MENU

    return {key: list(values) for key, values in DEFAULT_DEFENDER_MENU.items()}


def _bit_fields() -> dict[str, Any]:
    """Bit-mask DefenseConfig field -> its :class:`~leakgym.defenses.BitMenu`, in pipeline order."""
    from leakgym.defenses import defense_fields

    return {key: f.bit_menu for key, f in defense_fields().items() if f.bit_menu is not None}


def _bit_options() -> dict[str, str]:
    """Scenario option -> the bit-mask field whose bits it offers."""
    return {menu.option: key for key, menu in _bit_fields().items()}


def _default_defender_bits() -> dict[str, list[str]]:
    return {key: list(menu.default) for key, menu in _bit_fields().items()}


def _fold_bit_options(options: dict[str, Any], base: dict[str, list[str]] | None) -> dict[str, Any]:
    """Move each bit-mask field's option (``<option> = [...]``) into its entry of ``defender_bits``, over
    ``options["defender_bits"]``, else ``base``, else the defaults."""
    by_option = _bit_options()
    given = {k: v for k, v in options.items() if k in by_option}
    if not given:
        return options
    out = {k: v for k, v in options.items() if k not in by_option}
    bits = out.get("defender_bits", base if base is not None else _default_defender_bits())
    bits = dict(bits) if isinstance(bits, dict) else bits  # not a table: refused by _coerce_fields
    if isinstance(bits, dict):
        bits.update({by_option[k]: v for k, v in given.items()})
    out["defender_bits"] = bits
    return out


def option_names() -> list[str]:
    """The options a scenario file, an override or a :class:`Scenario` keyword may set, in field order:
    the fields, with each registered bit-mask field's option for ``defender_bits``.
    (``strategies`` is a shorthand besides, :data:`SHORTHANDS`.)"""
    names: list[str] = []
    for f in dataclasses.fields(Scenario):
        names += list(_bit_options()) if f.name == "defender_bits" else [f.name]
    return names


def scenario_options(sc: Scenario) -> dict[str, Any]:
    """``sc``'s value of every option of :func:`option_names`, in order (what ``leakgym describe`` lists)."""
    return {key: getattr(sc, key) for key in option_names()}


#: shorthand option -> attacker_menu entry it sets
SHORTHANDS = {"strategies": "strategy", "iterations": "iterations", "restarts": "restarts", "tv": "tv"}


def _fold_shorthands(options: dict[str, Any], base_menu: dict[str, list[Any]] | None) -> dict[str, Any]:
    """Move ``strategies``/``iterations``/``restarts``/``tv`` options into ``attacker_menu``."""
    given = {k: options[k] for k in SHORTHANDS if k in options}
    if not given:
        return options
    out = {k: v for k, v in options.items() if k not in SHORTHANDS}
    table = out.get("attacker_menu")
    if isinstance(table, dict):  # both ways at once: one would have been dropped (found in an audit)
        both = [short for short, key in SHORTHANDS.items() if short in given and key in table]
        if both:
            raise ValueError(f"{both[0]}={given[both[0]]!r} and attacker_menu {SHORTHANDS[both[0]]}="
                             f"{table[SHORTHANDS[both[0]]]!r} both set the attacker's {SHORTHANDS[both[0]]} levels; "
                             "allowed: one of the two")
    if base_menu is None:
        base_menu = dict(out.get("attacker_menu", {}))
    elif "attacker_menu" in out:
        base_menu = dict(out["attacker_menu"])
    menu = {"strategy": given.get("strategies", base_menu.get("strategy"))}
    for key, values in base_menu.items():
        if key != "strategy" and (_used_by(key, menu["strategy"]) or "strategies" not in given):
            menu[key] = values  # inherited entries that none of the new strategies has are dropped
    for short, key in SHORTHANDS.items():
        if short in given and key != "strategy":
            menu[key] = given[short]
    out["attacker_menu"] = menu
    return out


def _used_by(key: str, strategies: list[str] | None) -> bool:
    from leakgym.attacks import ATTACKS

    return any(s in ATTACKS and key in {f.name for f in dataclasses.fields(ATTACKS[s].Config)}
               for s in strategies or [])


def _validate_menus(sc: Scenario) -> None:
    """Every menu value through the real config classes, each attacker setting also through its attack's
    ``check_scenario`` on the scenario's model; attack names against the registry."""
    from leakgym.attacks import ATTACKS
    from leakgym.defenses import DefenseConfig

    where = f"scenario {sc.name!r}"
    try:
        DefenseConfig(**sc.defense_defaults)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: defense_defaults={sc.defense_defaults!r}: {exc}") from None
    # Every action sets every menu field: a default of a menu field is never played.
    base = DefenseConfig(**{k: v for k, v in sc.defense_defaults.items() if k not in sc.defender_menu})
    for key, values in sc.defender_menu.items():
        for value in values:
            try:
                base.replace(**{key: value})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: defender_menu {key}={values!r}: {exc}") from None
    # Cross-field rules (Mixup with InstaHide, DCS² with either) are between two fields: every pair of
    # values of every two menu dimensions is a configuration some defender action plays.
    for (key_a, values_a), (key_b, values_b) in itertools.combinations(sc.defender_menu.items(), 2):
        for a, b in itertools.product(values_a, values_b):
            try:
                base.replace(**{key_a: a, key_b: b})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: defender_menu {key_a}={a!r} together with {key_b}={b!r}: {exc}") from None
    bit_fields = _bit_fields()
    for key, names in sc.defender_bits.items():
        if key not in bit_fields:
            raise ValueError(f"{where}: defender_bits {key!r} is not a bit-mask DefenseConfig field; allowed: "
                             f"{sorted(bit_fields)}")
        menu = bit_fields[key]
        bad_bits = [b for b in names if b not in menu.bits]
        if bad_bits:
            raise ValueError(f"{where}: {menu.option} {bad_bits} unknown; allowed: {list(menu.bits)}")
        twice = [b for i, b in enumerate(names) if b in names[:i]]
        if twice:  # (found in an audit: built, then the env refused a dimension named twice, not the option)
            raise ValueError(f"{where}: {menu.option}={list(names)!r} names {sorted(set(twice))} twice; allowed: "
                             f"distinct names of {list(menu.bits)}")
    strategies = sc.attacker_menu["strategy"]
    if not all(isinstance(s, str) for s in strategies):  # ([["dlg"]] was a TypeError: unhashable type 'list')
        raise ValueError(f"{where}: attacker_menu strategy={strategies!r}; allowed: a list of attack names "
                         f"{sorted(ATTACKS)}")
    unknown = [s for s in strategies if s not in ATTACKS]
    if unknown:
        hints = "".join(did_you_mean(u, ATTACKS) for u in unknown[:1])
        raise ValueError(f"{where}: attacker_menu strategy {unknown} unknown{hints}; allowed: {sorted(ATTACKS)}")
    malicious = [s for s in strategies if ATTACKS[s].malicious]
    if malicious and sc.threat_model != "malicious":
        raise ValueError(f"{where}: attacker_menu strategy {malicious} modify the model the server sends, which "
                         f"threat_model={sc.threat_model!r} does not allow; set threat_model='malicious'")
    configs = {s: {f.name for f in dataclasses.fields(ATTACKS[s].Config)} for s in strategies}
    for key in sc.attack_defaults:
        if not any(key in fields for fields in configs.values()):
            fields = sorted(set().union(*configs.values()))
            raise ValueError(f"{where}: attack_defaults {key!r} is a field of none of the strategies {strategies}"
                             f"{did_you_mean(key, fields)}")
    def model() -> Any:  # one of the scenario's architecture for the attacks' checks, built if one reads it
        if not built:
            import torch

            from leakgym.models import build_model

            with torch.device("meta"):  # the checks read layers' names and shapes only: nothing is allocated
                built.append(build_model(sc.model, spec, precode=sc.precode, width=sc.model_width, seed=0))
        return built[0]

    def check(s: str, setting: dict[str, Any], refused: str) -> None:
        """``setting`` through ``s``'s config (``refused``: what a config error blames) and then its
        :meth:`~leakgym.attacks.base.Attack.check_scenario` on the scenario's model (found in an audit: a layer
        the model lacks -- ``analytic``'s ``layer``, ``layer-skipping``'s ``layers``, a ``layer_weights`` key,
        LODA inversion's extractor ``layers`` -- built, then failed the first round)."""
        try:
            config = ATTACKS[s].Config(**setting)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {refused} for {s!r}: {exc}") from None
        try:
            ATTACKS[s].check_scenario(config, model, spec)
        except ValueError as exc:
            raise ValueError(f"{where}: attacker setting {setting!r} for {s!r}: {exc}") from None

    from leakgym.data import dataset_spec

    spec, built = dataset_spec(sc.dataset, sc.image_size), []
    for s in strategies:  # the defaults alone first, so that a bad default is named as one (it was
        # blamed on the first menu level built with it); a strategy owning no menu key is built here only
        fixed = {k: v for k, v in sc.attack_defaults.items() if k in configs[s]}
        check(s, fixed, f"attack_defaults {fixed!r}")
    for key, values in sc.attacker_menu.items():
        if key == "strategy":
            continue
        owners = [s for s in strategies if key in configs[s]]
        if not owners:
            raise ValueError(f"{where}: attacker_menu {key!r} is a field of none of the strategies {strategies}"
                             f"{did_you_mean(key, set().union(*configs.values()))}")
        for s in owners:
            fixed = {k: v for k, v in sc.attack_defaults.items() if k in configs[s]}
            for value in values:
                check(s, {**fixed, key: value}, f"attacker_menu {key}={values!r}")


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def scenario_gym_id(name: str) -> str:
    with open(SCENARIO_DIR / f"{name}.toml", "rb") as fh:
        return tomllib.load(fh)["gym_id"]


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def read_scenario_file(path: str | Path) -> Scenario:
    """A scenario from a TOML file the user names explicitly; errors name the file and the key."""
    path = Path(path)
    if path.suffix != ".toml" or not path.is_file():
        raise ValueError(f"scenario file {str(path)!r} is not an existing .toml file")
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"scenario file {str(path)!r}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ValueError(f"scenario file {str(path)!r}: arrays or tables nested deeper than the parser can read "
                         "(a scenario nests at most 3 deep)") from None
    except UnicodeDecodeError as exc:  # (found in an audit: the decoder's message, naming no file)
        raise ValueError(f"scenario file {str(path)!r}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                         f"offset {exc.start}); allowed: a TOML file, which is UTF-8") from None
    try:
        return Scenario.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"scenario file {str(path)!r}: {exc}") from None


def load_scenario(name: str | Path | Scenario | None = None, /, **overrides: Any) -> Scenario:
    """A scenario with overrides applied: a packaged name (``leakgym/game/scenarios/<name>.toml``), an
    explicit path to a ``.toml`` file, or a :class:`Scenario` (``None``: ``"digits"``).

    Only the packaged folder is searched by name; any other file must be named by its path. The scenario is
    the first argument, positional only, so that ``name=`` renames it like any other field override
    (``load_scenario("digits", name="mine")``); ``load_scenario(name="cifar10")`` without a scenario is refused
    as ambiguous (it loaded cifar10 before ``name`` could be overridden, found in review).
    """
    if name is None:
        if "name" in overrides:
            raise ValueError(f"load_scenario(name={overrides['name']!r}) names no scenario to load: pass it first, "
                             f"load_scenario({overrides['name']!r}), and name= only to rename one "
                             f"(load_scenario('digits', name={overrides['name']!r}))")
        name = "digits"
    if isinstance(name, Scenario):
        return name.replace(**overrides) if overrides else name
    if isinstance(name, Path) or (isinstance(name, str) and name.endswith(".toml")):
        scenario = read_scenario_file(name)
    elif isinstance(name, str) and _NAME.match(name) and (SCENARIO_DIR / f"{name}.toml").is_file():
        scenario = read_scenario_file(SCENARIO_DIR / f"{name}.toml")
    else:
        raise ValueError(f"unknown scenario {name!r}{did_you_mean(name, scenario_names())}; available: "
                         f"{scenario_names()} or a path to a .toml file")
    return scenario.replace(**overrides) if overrides else scenario


__all__ = [
    "LEAKAGE_METRICS",
    "LIMITS",
    "SHORTHANDS",
    "RewardWeights",
    "Scenario",
    "check_action",
    "load_scenario",
    "option_names",
    "scenario_gym_id",
    "scenario_names",
    "scenario_options",
]

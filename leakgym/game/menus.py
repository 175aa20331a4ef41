"""Action menus as data: each action dimension knows its values, how to decode and how to encode.

A scenario's defender and attacker actions are ``MultiDiscrete`` vectors; a :class:`Menu` is the
ordered list of their dimensions. Every dimension

* has a ``name`` (shown by checkers, errors and ``describe``) and ``size`` choices;
* turns an index into readable settings (:meth:`Dimension.read`) and into config fields
  (:meth:`Dimension.write`) — the two differ only where a config stores something compactly, as a
  defense stores a set of on/off options (augmentations, say) in one bit mask;
* turns readable settings back into an index (:meth:`Dimension.encode`, nearest menu value).

Two kinds cover every menu LeakGym ships:

* :class:`ValueDimension` — one config field and the values it may take (a scale ``[0, 0.01, 0.1]``,
  the attacker's ``strategy``, ``iterations``, or any field of an attack's config such as imprint's
  ``num_bins``);
* :class:`BitDimension` — one on/off bit of an integer mask field (a defense field that declares a
  :class:`~leakgym.defenses.BitMenu`): index 1 adds the bit to the mask; its readable form is the list
  of switched-on names.

Which kind a defense field gets, and its bits' names, is the defense registry's to say
(:mod:`leakgym.defenses.registry`); this module names no defense.

Index 0 of every defender dimension should be "off", so that the all-zero action is no defense.
The "own last action" entries of the observations (:mod:`leakgym.game.feedback`) and the
presets of :mod:`leakgym.agents.policies.presets` use these same dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def nearest_index(values: Sequence[Any], wanted: Any) -> int:
    """Index of ``wanted`` in ``values``, or of the numerically nearest value."""
    if wanted in list(values):
        return list(values).index(wanted)
    try:
        return int(np.argmin([abs(float(v) - float(wanted)) for v in values]))
    except (TypeError, ValueError):
        raise ValueError(f"value {wanted!r} is not in the menu {list(values)}") from None


class Dimension:
    """One action dimension. Subclasses define the fields below."""

    name: str
    #: the config field this dimension writes
    field: str

    @property
    def size(self) -> int:
        raise TypeError(f"{type(self).__name__} must define size")

    def labels(self) -> list[str]:
        """Readable value of each index (for ``describe`` and docs)."""
        raise TypeError(f"{type(self).__name__} must define labels()")

    def read(self, index: int, settings: dict[str, Any]) -> None:
        """Add this dimension's readable setting for ``index`` to ``settings``."""
        raise TypeError(f"{type(self).__name__} must define read()")

    def write(self, index: int, fields: dict[str, Any]) -> None:
        """Add this dimension's config field(s) for ``index`` to ``fields``."""
        raise TypeError(f"{type(self).__name__} must define write()")

    def encode(self, settings: dict[str, Any]) -> int:
        """The index that plays ``settings`` (0 where ``settings`` does not mention this dimension)."""
        raise TypeError(f"{type(self).__name__} must define encode()")

    def config_values(self) -> list[Any]:
        """The config-field values this dimension can produce (validated at scenario construction)."""
        fields_per_index = []
        for i in range(self.size):
            out: dict[str, Any] = {}
            self.write(i, out)
            fields_per_index.append(out.get(self.field))
        return fields_per_index


@dataclass(frozen=True)
class ValueDimension(Dimension):
    """A config field and the values it may take; index ``i`` sets ``field = values[i]``."""

    field: str
    values: tuple[Any, ...]

    @property
    def name(self) -> str:  # type: ignore[override]
        return "strategy" if self.field == "strategy" else self.field

    @property
    def size(self) -> int:
        return len(self.values)

    def labels(self) -> list[str]:
        return [str(v) for v in self.values]

    def read(self, index: int, settings: dict[str, Any]) -> None:
        settings[self.field] = self.values[index]

    def write(self, index: int, fields: dict[str, Any]) -> None:
        fields[self.field] = self.values[index]

    def encode(self, settings: dict[str, Any]) -> int:
        if self.field not in settings:
            return 0
        wanted = settings[self.field]
        if isinstance(wanted, str) or any(isinstance(v, str) for v in self.values):
            if wanted not in self.values:
                raise ValueError(f"{self.field} {wanted!r} not in its menu {list(self.values)}")
            return self.values.index(wanted)
        return nearest_index(self.values, wanted)


@dataclass(frozen=True)
class BitDimension(Dimension):
    """One on/off bit of an integer mask field; readable form: ``settings[field]`` lists the names on."""

    field: str
    bit: int
    label: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.field}_{self.label}"

    @property
    def size(self) -> int:
        return 2

    def labels(self) -> list[str]:
        return ["off", "on"]

    def read(self, index: int, settings: dict[str, Any]) -> None:
        names = settings.setdefault(self.field, [])
        if index == 1:
            names.append(self.label)

    def write(self, index: int, fields: dict[str, Any]) -> None:
        fields[self.field] = fields.get(self.field, 0) | (self.bit if index == 1 else 0)

    def encode(self, settings: dict[str, Any]) -> int:
        wanted = settings.get(self.field, [])
        if isinstance(wanted, (int, np.integer)) and not isinstance(wanted, bool):
            return int(bool(int(wanted) & self.bit))
        return int(self.label in list(wanted))


class Menu:
    """The ordered action dimensions of one role.

    Args:
        role: ``"attacker"`` or ``"defender"`` (used in error messages).
        dims: the dimensions, in action order.
    """

    def __init__(self, role: str, dims: Sequence[Dimension], *, where: str = "") -> None:
        self.role = role
        self.dims = tuple(dims)
        self.where = where
        names = [d.name for d in self.dims]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{where}{role} menu names dimension(s) {dupes} twice")
        # What check() reads on every step (the dimensions are a tuple: they never change).
        self._nvec = np.array([d.size for d in self.dims], dtype=np.int64)
        self._names = names

    @property
    def nvec(self) -> np.ndarray:
        return self._nvec.copy()

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def fields(self) -> list[str]:
        """Config fields this menu sets (each once, in first-dimension order)."""
        return list(dict.fromkeys(d.field for d in self.dims))

    def check(self, action: Any) -> np.ndarray:
        """Validate an action; ``ValueError`` names the bad entry and its range. Never changes state."""
        return check_action(action, self._nvec, self.role, self._names)

    def read(self, action: Any) -> dict[str, Any]:
        """Action -> readable settings (menu values; bit dimensions as lists of names)."""
        action = self.check(action)
        settings: dict[str, Any] = {}
        for dim, index in zip(self.dims, action):
            dim.read(int(index), settings)
        return settings

    def config_fields(self, action: Any) -> dict[str, Any]:
        """Action -> the config fields it sets (bit dimensions combined into their mask)."""
        action = self.check(action)
        fields: dict[str, Any] = {}
        for dim, index in zip(self.dims, action):
            dim.write(int(index), fields)
        return fields

    def encode(self, settings: dict[str, Any]) -> np.ndarray:
        """Readable settings -> the action with the nearest menu values (unmentioned dims: index 0)."""
        allowed = set(self.fields)
        unknown = sorted(set(settings) - allowed)
        if unknown:
            raise ValueError(
                f"{self.where}{self.role} settings {unknown} are not in its menu; allowed: {sorted(allowed)}"
            )
        bits = {d.label for d in self.dims if isinstance(d, BitDimension)}
        for d in self.dims:
            if isinstance(d, BitDimension) and d.field in settings and not isinstance(settings[d.field], int):
                missing = [n for n in settings[d.field] if n not in bits]
                if missing:
                    raise ValueError(
                        f"{self.where}{d.field} {missing} not in its {self.role} menu; allowed: {sorted(bits)}"
                    )
        try:
            return np.array([d.encode(settings) for d in self.dims], dtype=np.int64)
        except ValueError as exc:
            raise ValueError(f"{self.where}{exc}") from None

    def describe(self) -> list[dict[str, Any]]:
        """One row per dimension: index, name, config field, values."""
        return [{"index": i, "name": d.name, "field": d.field, "values": d.labels()} for i, d in enumerate(self.dims)]

    def features(self, action: Any) -> np.ndarray:
        """The action as observation features in [0, 1]: each entry index / (size - 1)."""
        denom = np.maximum(self._nvec - 1, 1)
        return (np.asarray(action, dtype=np.float64) / denom).astype(np.float32)


class FlatActions:
    """``Discrete(prod(nvec))`` view of a menu, for value-based algorithms and SuperSuit.

    Index ``k`` is the C-order (last dimension fastest) flattening of the ``MultiDiscrete`` action:
    ``to_multi(k) = np.unravel_index(k, nvec)``.
    """

    def __init__(self, menu: Menu) -> None:
        self.menu = menu
        self.nvec = menu.nvec
        self.n = int(np.prod(self.nvec))

    def to_multi(self, action: Any) -> np.ndarray:
        """A flat action -> the MultiDiscrete action; ``ValueError`` names the value and the range."""
        try:
            arr = np.asarray(action)
        except Exception:  # noqa: BLE001 - e.g. ragged nested sequences, a tensor that requires grad
            raise ValueError(f"{self.menu.where}{self.menu.role} flat action {action!r}: expected one integer in "
                             f"0..{self.n - 1}") from None
        # kinds i/u/f only (numpy files timedelta64 under the integers); a masked entry hides its value
        integer = arr.shape in ((), (1,)) and arr.dtype.kind in "iu"
        whole = (arr.shape in ((), (1,)) and arr.dtype.kind == "f" and bool(np.isfinite(arr).all())
                 and float(arr.reshape(-1)[0]).is_integer())
        if not (integer or whole) or np.ma.is_masked(action):
            raise ValueError(
                f"{self.menu.where}{self.menu.role} flat action {action!r}: expected one integer in 0..{self.n - 1}"
            )
        k = int(arr.reshape(-1)[0])
        if not 0 <= k < self.n:
            raise ValueError(f"{self.menu.where}{self.menu.role} flat action {k}; allowed range 0..{self.n - 1}")
        return np.array(np.unravel_index(k, tuple(self.nvec)), dtype=np.int64)

    def to_flat(self, action: Any) -> int:
        return int(np.ravel_multi_index(tuple(self.menu.check(action)), tuple(self.nvec)))


def check_action(action: Any, nvec: np.ndarray, who: str, dims: list[str]) -> np.ndarray:
    """Validate a MultiDiscrete action; raise ``ValueError`` naming the bad entry and its range.

    Accepts integer arrays and whole-valued finite real arrays of the right shape; rejects booleans,
    complex, object and string dtypes, NaN and infinities. Reads nothing else, changes nothing.
    """
    try:
        arr = np.asarray(action)
    except Exception as exc:  # noqa: BLE001 - e.g. ragged nested sequences
        raise ValueError(f"{who} action {action!r} is not an array of integers: {exc}") from None
    if arr.shape != nvec.shape:
        raise ValueError(f"{who} action has shape {arr.shape}; expected {tuple(nvec.shape)} ({dims})")
    # kinds i/u/f only: numpy files timedelta64 under the integers, and bool is its own kind
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{who} action {action!r} has dtype {arr.dtype}; expected integers")
    if type(action) is not np.ndarray:  # (a plain ndarray has no mask and no entries of their own type)
        if np.ma.is_masked(action):
            raise ValueError(f"{who} action {action!r} has masked entries; expected integers")
        if isinstance(action, (list, tuple)) and any(np.asarray(v).dtype == bool for v in action):
            # numpy turns [True, 0, 1] (or a 0-d bool tensor inside the list) into integers; a mistake all the same
            raise ValueError(f"{who} action {list(action)!r} has bool entries; expected integers")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{who} action {arr.tolist()} has non-finite entries; expected integers")
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{who} action {arr.tolist()} must be integers")
    for i, (a, n) in enumerate(zip(arr.tolist(), nvec)):
        if not 0 <= a < n:
            shown = int(a) if math.isfinite(a) else a
            raise ValueError(f"{who} action[{i}] ({dims[i]}) = {shown}; allowed range 0..{int(n) - 1}")
    return arr.astype(np.int64)


__all__ = ["BitDimension", "Dimension", "FlatActions", "Menu", "ValueDimension", "check_action", "nearest_index"]

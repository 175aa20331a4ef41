"""Argument checks the views share: what counts as a seed (an integer, :func:`leakgym.checks.is_integer`,
>= 0; bools are not)."""

from __future__ import annotations

from typing import Any

from leakgym.checks import is_integer


def is_seed(value: Any) -> bool:
    """An integer >= 0: what Gymnasium's and numpy's seeding accept."""
    return is_integer(value) and value >= 0


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """``seed`` as an ``int`` (or None); ``ValueError`` naming the value and what is allowed."""
    if seed is None:
        return None
    if not is_seed(seed):
        raise ValueError(f"{name}={seed!r}; allowed: None or an integer >= 0")
    return int(seed)


__all__ = ["check_seed", "is_seed"]

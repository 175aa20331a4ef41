"""What LeakGym's argument checks count as an integer: a Python or numpy integer, never a bool.

One predicate for every layer (data, models, attacks, environments, training), so that ``True`` is not
a width of 1, ``2.0`` not a count and ``np.int64(3)`` not refused in one place and accepted in another.
Each caller keeps its own message (the names and ranges its users see).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def is_integer(value: Any) -> bool:
    """A Python or numpy integer (``numbers.Integral``), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


__all__ = ["is_integer"]

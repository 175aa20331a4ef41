"""``did you mean ...?``: the closest allowed names to a mistyped one, for one-line user errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest choice, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownOptionError(TypeError, ValueError):
    """An unknown keyword argument (``gym.make(id, roundz=3)``, ``parallel_env(roundz=3)``).

    A ``TypeError``, as Python raises for an unexpected keyword and as Gymnasium's callers expect (TorchRL's
    ``GymEnv`` probes ``frameskip`` and drops it on a ``TypeError`` saying "unexpected keyword argument
    'frameskip'"); also a ``ValueError``, LeakGym's type for bad input, so ``except ValueError`` still
    catches it.
    """


def unexpected_keywords(unknown: Iterable[str], allowed: Iterable[str]) -> str:
    """``"got an unexpected keyword argument 'x' (did you mean 'y'?)"``, one clause per unknown name."""
    allowed = list(allowed)
    return "; ".join(f"got an unexpected keyword argument {k!r}{did_you_mean(k, allowed)}" for k in unknown)


__all__ = ["UnknownOptionError", "did_you_mean", "unexpected_keywords"]

"""Means with standard errors, and verdicts that say "holds" only beyond two standard errors.

Every reproduced number is an :class:`Estimate`: the mean over the images of all seeds (a privacy
cell) or over the seeds (a utility cell), with its standard error ``std / sqrt(n)`` (``ddof=1``).
A claim compares estimates:

* :func:`compare` — "``a`` is lower (or higher) than ``b``": **holds** when the difference points the
  paper's way and exceeds two standard errors of the difference (``sqrt(se_a^2 + se_b^2)``),
  **does not hold** when it exceeds them the other way, **tie (within noise)** otherwise;
* :func:`against` — the same for an estimate against a fixed threshold (e.g. "below 25 dB");
* :func:`combine` — a claim made of several comparisons (a ranking, "every defense ...") holds when
  every part holds, does not hold when any part does not, and is a tie otherwise (undecided when a
  part is);
* **undecided** — a bound on a difference (an accuracy drop "below 3 points") that the estimate can
  neither meet nor break at two standard errors: the data do not decide it, which is not a tie
  between two measured values (a 42 ± 21-point drop against a 3-point bound was reported as a "tie
  (within noise)" before issue 36). :func:`bound` gives it (:func:`leakgym.reproduce.runner.drop_verdict`
  for accuracy drops). A
  comparison of a single value (one seed of a utility cell, one image of a privacy cell: ``--seeds 0
  --images 1``) is undecided too: one value has no standard error, so no difference can be told from
  noise (it used to count as a standard error of 0, and any difference decided the claim).

Standard errors over images treat the images as independent draws; images of one seed share the
model initialisation, so the seed-to-seed spread is part of the spread of the pooled images.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

HOLDS, TIE, FAILS, UNCHECKED = "holds", "tie (within noise)", "does not hold", "not checkable"
UNDECIDED = "undecided"
STATUSES = (HOLDS, TIE, FAILS, UNCHECKED, UNDECIDED)
#: A difference must exceed this many standard errors to count.
Z = 2.0


@dataclass(frozen=True)
class Estimate:
    """A mean, its standard error and the number of values behind it (``n = 0``: an exact number, such as
    a paper's bound, :func:`exact`)."""

    mean: float
    se: float
    n: int

    def __str__(self) -> str:
        return self.fmt()

    def fmt(self, digits: int = 2) -> str:
        if self.n == 1:
            return f"{self.mean:.{digits}f} (one value)"
        return f"{self.mean:.{digits}f} ± {self.se:.{digits}f}"


def exact(value: float) -> Estimate:
    """A number without noise (a threshold a claim is checked against)."""
    return Estimate(float(value), 0.0, 0)


def estimate(values: Iterable[float]) -> Estimate:
    """Mean and standard error (``std(ddof=1) / sqrt(n)``) of ``values``. A single value has none: its
    ``se`` is stored as 0 and :func:`compare` calls a claim on it undecided."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError("estimate() of no values; need at least one")
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else 0.0
    return Estimate(float(arr.mean()), se, int(arr.size))


def difference(a: Estimate, b: Estimate) -> Estimate:
    """``a - b`` with the standard error of a difference of independent estimates (its ``n`` is the smaller
    of the measured ones: an exact operand adds no noise)."""
    return Estimate(a.mean - b.mean, math.hypot(a.se, b.se), min((e.n for e in (a, b) if e.n), default=0))


def compare(a: Estimate, b: Estimate, *, lower: bool = True) -> str:
    """Does ``a < b`` (``lower=True``) or ``a > b`` (``lower=False``) hold beyond two standard errors?
    Undecided when either is a single value (it has no standard error)."""
    if a.n == 1 or b.n == 1:
        return UNDECIDED
    diff = (b.mean - a.mean) if lower else (a.mean - b.mean)
    noise = Z * math.hypot(a.se, b.se)
    if diff > noise:
        return HOLDS
    if diff < -noise:
        return FAILS
    return TIE


def against(a: Estimate, threshold: float, *, lower: bool = True) -> str:
    """Is ``a`` below (``lower=True``) or above ``threshold`` beyond two standard errors?"""
    return compare(a, exact(threshold), lower=lower)


def bound(d: Estimate, threshold: float, *, lower: bool = True) -> str:
    """Does a difference ``d`` (an accuracy drop, an SSIM gap) stay below (``lower=True``) or above
    ``threshold`` beyond two standard errors? As :func:`against`, except that a bound the estimate neither
    meets nor breaks is undecided (more seeds or images would decide it), not a tie of two values."""
    status = against(d, threshold, lower=lower)
    return UNDECIDED if status == TIE else status


def combine(statuses: Sequence[str]) -> str:
    """All parts hold -> holds; any part fails -> does not hold; otherwise undecided when a part is, else a tie
    (or not checkable)."""
    bad = [s for s in statuses if s not in STATUSES]
    if bad:
        raise ValueError(f"unknown verdict status(es) {bad}; allowed: {STATUSES}")
    if not statuses or UNCHECKED in statuses:
        return UNCHECKED
    if FAILS in statuses:
        return FAILS
    if all(s == HOLDS for s in statuses):
        return HOLDS
    return UNDECIDED if UNDECIDED in statuses else TIE


def ranking(ours: dict[str, Estimate], paper: dict[str, float]) -> tuple[str, list[str]]:
    """Check every pair the paper orders: the row with the paper's smaller value must be smaller in ours.

    Equal paper values order nothing and are skipped. Returns the combined status and one line per
    pair that does not hold or ties, e.g. ``"A 0.12 ± 0.01 vs B 0.30 ± 0.02: does not hold"``.
    """
    keys = [k for k in paper if k in ours and ours[k] is not None and paper[k] is not None]
    statuses, notes = [], []
    for i, x in enumerate(keys):
        for y in keys[i + 1:]:
            if paper[x] == paper[y]:
                continue
            lo, hi = (x, y) if paper[x] < paper[y] else (y, x)
            status = compare(ours[lo], ours[hi])
            statuses.append(status)
            if status != HOLDS:
                notes.append(f"{lo} {ours[lo]} vs {hi} {ours[hi]}: {status}")
    return combine(statuses), notes


__all__ = [
    "FAILS",
    "HOLDS",
    "STATUSES",
    "TIE",
    "UNCHECKED",
    "UNDECIDED",
    "Estimate",
    "Z",
    "against",
    "bound",
    "combine",
    "compare",
    "difference",
    "estimate",
    "exact",
    "ranking",
]

"""Per-value clipping: clamp every entry of the shared update to ``[-c, c]``.

The CENSOR paper's "Clipping" baseline (Zhang et al., NDSS 2025, §V-A "Defenses Configurations",
item 2: "constrains the magnitude of gradients by clipping each value within a clipping bound"),
``g_i <- min(max(g_i, -c), c)`` for every entry. Unlike the global L2 clipping of
:mod:`leakgym.defenses.perturbation` (which only rescales and so leaves cosine-matching attacks
unaffected) it changes the update's direction: the large entries, which carry much of the
data-dependent signal, are flattened. The paper states no value of the bound.

Registered as ``clip_value`` (update stage, after global clipping and before noise, so that noise
is never clipped); free in the cost model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from leakgym.defenses.registry import DefenseContext, UpdateDefense, real_field

Update = dict[str, Tensor]


def clip_values(update: Update, bound: float) -> Update:
    """Every entry clamped to ``[-bound, bound]`` (a new dict; the input is not modified).

    A bound beyond the largest value of a tensor's dtype (``clip_value=1e300`` on float32) clamps nothing;
    ``Tensor.clamp`` raised "value cannot be converted to type float without overflow" for it, in the
    middle of a round whose configuration had been accepted, so the bound is capped at the dtype's largest
    finite value (the same no-op clamp)."""
    if not (bound > 0) or not math.isfinite(bound):
        raise ValueError(f"clip_value bound={bound!r}; allowed range (0, inf)")
    return {k: _clamped(t, bound) for k, t in update.items()}


def _clamped(t: Tensor, bound: float) -> Tensor:
    """``t`` clamped to ``[-bound, bound]``, ``bound`` capped at the largest finite value of ``t``'s dtype."""
    if t.is_floating_point():
        bound = min(bound, float(torch.finfo(t.dtype).max))
    return t.clamp(-bound, bound)


class ClipValue(UpdateDefense):
    """Clamp each entry of the shared update to ``[-clip_value, clip_value]``."""

    name = "clip_value"
    public_split = False
    fields = (real_field("clip_value", 0.0, "Clamp every entry of the update to [-c, c] (CENSOR paper's "
                         "Clipping baseline); 0 off."),)

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        bound = ctx.config.clip_value
        clipped = sum(int((t.abs() > bound).sum()) for t in update.values())
        total = sum(t.numel() for t in update.values())
        return clip_values(update, bound), {"bound": bound, "clipped_fraction": clipped / total if total else 0.0}


CLIP_VALUE = ClipValue()

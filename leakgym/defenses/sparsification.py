"""Update sparsification baselines: per-layer magnitude pruning and global top-k.

* **Pruning / gradient compression** (Lin et al., "Deep Gradient Compression", ICLR 2018; used as a
  defense by Zhu et al. 2019, §5, and as "GC" by Scheliga et al.'s PPP paper, §5.2): in *every
  layer* (parameter tensor) the fraction ``p`` of entries with the smallest magnitude is set to zero.
* **Top-k sparsification** (Aji & Heafield 2017; the CENSOR paper's Eq. for ``Top_k``): over the
  *whole* update, only the ``k`` entries with the largest magnitude are kept, ``k = ceil(keep * N)``.

Ties are broken by position (``torch.topk``/``argsort`` order), so exactly ``floor(p * n)`` entries
per layer, resp. ``N - k`` entries overall, are zeroed; ``p * n`` is the product of the decimal
fraction and the count, in exact arithmetic (:func:`entry_count`: ``0.29 * 100`` is 29, not the binary
float's 28.999...). Pure functions; inputs are not modified.
The registered defenses :data:`PRUNE` (``prune``) and :data:`TOPK` (``topk``) apply them to the
shared update (update stage); both are free in the cost model.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

from leakgym.defenses.registry import DefenseContext, UpdateDefense, real_field

Update = dict[str, Tensor]


def entry_count(fraction: float, n: int, *, round_up: bool = False) -> int:
    """``floor(fraction * n)`` (``ceil`` with ``round_up``) of the fraction as written in decimal, in exact
    arithmetic (``Fraction(repr(fraction))``): as binary floats ``0.29 * 100`` is 28.999999999999996, and
    flooring it zeroed 28 entries of 100 instead of 29."""
    product = Fraction(repr(float(fraction))) * int(n)
    return math.ceil(product) if round_up else math.floor(product)


def prune_smallest(update: Update, fraction: float, *, names: list[str] | None = None) -> Update:
    """Zero the ``floor(fraction * numel)`` smallest-magnitude entries of each tensor (of ``names``)."""
    if not (0.0 <= fraction < 1.0):
        raise ValueError(f"pruning fraction={fraction!r}; allowed range [0, 1)")
    selected = set(update) if names is None else set(names)
    out: Update = {}
    for name, t in update.items():
        n_zero = entry_count(fraction, t.numel())
        if name not in selected or n_zero == 0:
            out[name] = t.clone()
            continue
        flat = t.reshape(-1).clone()
        smallest = torch.topk(flat.abs(), n_zero, largest=False, sorted=False).indices
        flat[smallest] = 0
        out[name] = flat.view_as(t)
    return out


def top_k(update: Update, keep: float) -> Update:
    """Keep the ``ceil(keep * N)`` largest-magnitude entries of the whole update; zero the rest."""
    if not (0.0 < keep <= 1.0):
        raise ValueError(f"top-k keep fraction={keep!r}; allowed range (0, 1]")
    names = list(update)
    flat = torch.cat([update[n].reshape(-1) for n in names])
    k = max(1, entry_count(keep, flat.numel(), round_up=True))
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[torch.topk(flat.abs(), k, largest=True, sorted=False).indices] = True
    kept = torch.where(mask, flat, torch.zeros_like(flat))
    out: Update = {}
    offset = 0
    for n in names:
        size = update[n].numel()
        out[n] = kept[offset:offset + size].view_as(update[n])
        offset += size
    return out


def density(update: Update) -> float:
    """Fraction of non-zero entries of the update."""
    total = sum(t.numel() for t in update.values())
    nonzero = sum(int(torch.count_nonzero(t)) for t in update.values())
    return nonzero / total if total else 0.0


class Prune(UpdateDefense):
    """Per-layer smallest-magnitude pruning (gradient compression)."""

    name = "prune"
    public_split = False
    fields = (real_field("prune", 0.0, "Per-layer smallest-magnitude pruning fraction p (gradient compression); 0 off.",
                         high=1.0, high_open=True),)

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        out = prune_smallest(update, ctx.config.prune)
        return out, {"density": density(out)}

    def apply_many(self, ctxs, updates, xs, ys) -> list[tuple[Update, dict]]:
        """Clients with the same fraction and layer shapes as one computation: per layer, one ``topk``
        over the stacked ``(clients, numel)`` magnitudes and one scatter of zeros."""
        groups: dict[tuple, list[int]] = {}
        for i, (c, u) in enumerate(zip(ctxs, updates)):
            key = (c.config.prune, tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in u.items()))
            groups.setdefault(key, []).append(i)
        out: list[tuple[Update, dict] | None] = [None] * len(updates)
        for (fraction, layout), members in groups.items():
            if not (0.0 <= fraction < 1.0):
                raise ValueError(f"pruning fraction={fraction!r}; allowed range [0, 1)")
            pruned: dict[str, Tensor] = {}
            for name, shape, _, _ in layout:
                flat = torch.stack([updates[i][name].reshape(-1) for i in members])
                n_zero = entry_count(fraction, flat.shape[1])
                if n_zero:
                    smallest = torch.topk(flat.abs(), n_zero, dim=1, largest=False, sorted=False).indices
                    flat = flat.scatter(1, smallest, 0.0)
                pruned[name] = flat.reshape(len(members), *shape)
            nonzero = sum(torch.count_nonzero(t.flatten(1), dim=1) for t in pruned.values()).tolist()
            total = sum(t[0].numel() for t in pruned.values())
            for row, i in enumerate(members):
                out[i] = ({name: t[row] for name, t in pruned.items()},
                          {"density": nonzero[row] / total if total else 0.0})
        return out  # type: ignore[return-value]


class TopK(UpdateDefense):
    """Global top-k sparsification of the whole update."""

    name = "topk"
    public_split = False
    fields = (real_field("topk", 1.0, "Global top-k sparsification: fraction of all entries kept (largest magnitudes); "
                         "1.0 off.", high=1.0, low_open=True),)

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        out = top_k(update, ctx.config.topk)
        return out, {"density": density(out)}


PRUNE = Prune()
TOPK = TopK()

"""Optimal matching of reconstructions to originals, and order-free label accuracy.

A batch attack returns reconstructions in an arbitrary order (the shared gradient is a sum over the
batch, so it carries no order). Before scoring, each original image is paired with a distinct
reconstruction by minimum-cost bipartite matching (the Hungarian algorithm,
``scipy.optimize.linear_sum_assignment``), as breaching and Inverting Gradients do. With more
reconstructions than originals (e.g. an attack that over-generates), the surplus is left unmatched.
Every cost first keeps as many recoveries (pairs at >= 60 dB) as possible, then minimises the total
(:func:`assign`): an exact reconstruction is always scored against its own original.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from leakgym.metrics.functional import DEFAULT_MAX_DB, DEFAULT_SSIM_WINDOW, mse, psnr, ssim

MATCHING_COSTS = ("mse", "psnr", "ssim")
#: A pair at this PSNR or above is a recovery: the MSE matching keeps as many recoveries as it can.
RECOVERED_DB = 60.0


def recovered_pairs(mse_costs: np.ndarray, data_range: float = 1.0) -> np.ndarray:
    """``(N, M)`` bool: the pairs whose MSE puts them at :data:`RECOVERED_DB` or above (recoveries)."""
    return mse_costs <= data_range**2 * 10 ** (-RECOVERED_DB / 10)


def assign(costs: np.ndarray, cost: str = "mse", data_range: float = 1.0, *,
           recovered: np.ndarray | None = None) -> np.ndarray:
    """Minimum-cost assignment of the rows of ``costs`` ``(N, M)`` (originals) to distinct columns, ``(N,)``.

    Minimum total cost alone may give an exact pair away when that lowers the sum over poor pairs (an
    analytic attack's exact image scored against the wrong original, helper review: 34 of 41 exact
    recoveries scored at >= 60 dB under the MSE matching; under SSIM, originals 0.5 and 0.4 with
    reconstructions 0.5 (exact) and 0.6 swap, 0.98 + 0.98 > 1 + 0.92). So the assignment keeps the
    largest number of recoveries (pairs at :data:`RECOVERED_DB` or above, ``recovered``) and, among
    those, has the minimum total cost (lexicographic, in one Hungarian call: every other pair costs
    ``(N + 1)`` times the spread of the costs more, more than any difference of two totals).

    Args:
        costs: ``(N, M)`` costs (MSE, or negated PSNR / SSIM: lower is better), finite.
        cost: which metric ``costs`` holds; for ``"mse"`` the recoveries are read from ``costs``.
        recovered: ``(N, M)`` bool, the recovered pairs (:func:`recovered_pairs` of their MSE);
            required for the ``"psnr"`` and ``"ssim"`` costs, whose values do not say it.
    """
    if cost not in MATCHING_COSTS:
        raise ValueError(f"cost={cost!r} is not supported; allowed: {', '.join(MATCHING_COSTS)}")
    if recovered is None:
        if cost != "mse":
            raise ValueError(f"cost={cost!r} needs recovered= (the pairs at >= {RECOVERED_DB:g} dB, "
                             "recovered_pairs of their MSE)")
        recovered = recovered_pairs(costs, data_range)
    if recovered.shape != costs.shape:
        raise ValueError(f"recovered has shape {recovered.shape}; expected the costs' {costs.shape}")
    if recovered.any():
        spread = float(costs.max() - costs.min()) + 1.0
        costs = costs + (~recovered) * ((costs.shape[0] + 1) * spread)
    rows, cols = linear_sum_assignment(costs)
    assignment = np.empty(costs.shape[0], dtype=np.int64)
    assignment[rows] = cols
    return assignment


def _check_batches(recon: Tensor, orig: Tensor) -> None:
    if not isinstance(recon, Tensor) or not isinstance(orig, Tensor):
        raise ValueError(  # noqa: TRY004 - the library reports all bad input as ValueError
            f"images must be torch.Tensors, got {type(recon).__name__} and {type(orig).__name__}")
    if recon.dim() != 4 or orig.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shapes {tuple(recon.shape)} and {tuple(orig.shape)}")
    if recon.shape[1:] != orig.shape[1:]:
        raise ValueError(f"reconstructions {tuple(recon.shape[1:])} and originals {tuple(orig.shape[1:])} "
                         f"must have the same (C, H, W)")
    if orig.shape[0] < 1:
        raise ValueError("need at least one original image")
    if recon.shape[0] < orig.shape[0]:
        raise ValueError(f"got {recon.shape[0]} reconstructions for {orig.shape[0]} originals; "
                         f"need at least as many reconstructions as originals")


def pairwise_cost(recon: Tensor, orig: Tensor, cost: str = "mse", data_range: float = 1.0, *,
                  ssim_window: int = DEFAULT_SSIM_WINDOW, max_db: float = DEFAULT_MAX_DB) -> np.ndarray:
    """Cost matrix ``(N_orig, M_recon)``: lower is a better match (PSNR and SSIM are negated; their
    ``max_db`` cap and ``ssim_window`` as in :func:`~leakgym.metrics.functional.psnr` / ``ssim``)."""
    if cost not in MATCHING_COSTS:
        raise ValueError(f"cost={cost!r} is not supported; allowed: {', '.join(MATCHING_COSTS)}")
    _check_batches(recon, orig)
    n, m = orig.shape[0], recon.shape[0]
    # Every (original, reconstruction) pair as one flat batch: row i * m + j is (orig i, recon j).
    o = orig.repeat_interleave(m, dim=0)
    r = recon.repeat(n, 1, 1, 1)
    if cost == "mse":
        values = mse(r, o, data_range)
    elif cost == "psnr":
        values = -psnr(r, o, data_range, max_db=max_db)
    else:
        values = -ssim(r, o, data_range, window_size=ssim_window)
    return values.reshape(n, m).double().cpu().numpy()


def match_reconstructions(recon: Tensor, orig: Tensor, cost: str = "mse", data_range: float = 1.0, *,
                          ssim_window: int = DEFAULT_SSIM_WINDOW, max_db: float = DEFAULT_MAX_DB) -> np.ndarray:
    """Assign a distinct reconstruction to every original by minimum total cost.

    Args:
        recon: reconstructions, unit images ``(M, C, H, W)`` with ``M >= N``.
        orig: originals, unit images ``(N, C, H, W)``.
        cost: ``"mse"`` (default), ``"psnr"`` or ``"ssim"`` (the latter two are maximised); each keeps
            the most recoveries first (:func:`assign`).
        ssim_window, max_db: the SSIM window and PSNR cap of the cost (the ones the pairs are scored with).

    Returns:
        ``int64`` array ``(N,)``: ``assignment[i]`` is the index in ``recon`` matched to ``orig[i]``;
        ``recon[assignment]`` is aligned with ``orig``.
    """
    costs = pairwise_cost(recon, orig, cost, data_range, ssim_window=ssim_window, max_db=max_db)
    mse_costs = costs if cost == "mse" else pairwise_cost(recon, orig, "mse", data_range)
    return assign(costs, cost, data_range, recovered=recovered_pairs(mse_costs, data_range))


def _as_label_list(labels: Tensor | np.ndarray | Sequence[int], name: str) -> list[int]:
    if isinstance(labels, Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of class indices, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer class indices, got dtype {arr.dtype}")
    return [int(v) for v in arr]


def label_accuracy(pred: Tensor | np.ndarray | Sequence[int], true: Tensor | np.ndarray | Sequence[int]) -> float:
    """Order-free label accuracy: multiset overlap of predicted and true labels over ``len(true)``.

    Labels inferred from a batch gradient (iDLG, LLG, ...) come as an unordered multiset: the gradient
    tells *which* labels occur and how often, not which image has which label. The score is
    ``sum_c min(#pred == c, #true == c) / len(true)``, in ``[0, 1]``; it is 1 exactly when the
    multisets agree (for ``len(pred) == len(true)``). Extra predicted labels are not rewarded.
    """
    p = _as_label_list(pred, "pred_labels")
    t = _as_label_list(true, "true_labels")
    if not t:
        raise ValueError("true_labels is empty")
    overlap = Counter(p) & Counter(t)
    return sum(overlap.values()) / len(t)


#: Label dtypes whose values are exact as int64 (what :func:`_label_accuracies` counts in).
_EXACT_LABEL_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: Widest range of label values (max - min + 1) counted in one ``(pairs, range)`` table.
_MAX_LABEL_SPAN = 4096


def _label_accuracies(preds: Sequence, trues: Sequence) -> list[float | None]:
    """``label_accuracy(preds[i], trues[i])`` of every pair (None where either is None). The pairs of 1-D
    integer CPU tensors (the games of a vector step) are counted together, a group per lengths and dtypes:
    the multiset overlap ``sum_c min(#pred == c, #true == c)`` from one table of class counts, the same
    integers as :func:`label_accuracy`'s, divided by ``len(true)`` in Python as it does. Every other pair
    (lists, arrays, anything :func:`label_accuracy` refuses) goes through :func:`label_accuracy`."""
    out: list[float | None] = [None] * len(preds)
    groups: dict[tuple, list[int]] = {}
    for i, (p, t) in enumerate(zip(preds, trues)):
        if p is None or t is None:
            continue
        if isinstance(p, Tensor) and isinstance(t, Tensor) and p.dim() == 1 and t.dim() == 1 and t.shape[0] > 0 \
                and p.dtype in _EXACT_LABEL_DTYPES and t.dtype in _EXACT_LABEL_DTYPES \
                and p.device.type == "cpu" and t.device.type == "cpu":
            groups.setdefault((p.shape[0], t.shape[0], p.dtype, t.dtype), []).append(i)
        else:
            out[i] = label_accuracy(p, t)
    for (_, n_true, _, _), members in groups.items():
        with torch.no_grad():
            p = torch.stack([preds[i] for i in members]).to(torch.int64)  # (G, len(pred))
            t = torch.stack([trues[i] for i in members]).to(torch.int64)  # (G, len(true)), len(true) >= 1
            if p.shape[1] == n_true == 1:
                overlap = (p == t).reshape(-1).to(torch.int64)
            else:
                both = torch.cat([p, t], dim=1)
                low = int(both.min())
                span = int(both.max()) - low + 1
                if span > _MAX_LABEL_SPAN:  # a table that large is not worth it: one pair at a time
                    for i in members:
                        out[i] = label_accuracy(preds[i], trues[i])
                    continue
                counts = torch.zeros(2, len(members), span, dtype=torch.int64)
                counts[0].scatter_add_(1, p - low, torch.ones_like(p))
                counts[1].scatter_add_(1, t - low, torch.ones_like(t))
                overlap = counts.amin(dim=0).sum(dim=1)
        for i, o in zip(members, overlap.tolist()):
            out[i] = o / n_true
    return out


__all__ = ["MATCHING_COSTS", "RECOVERED_DB", "assign", "label_accuracy", "match_reconstructions", "pairwise_cost", "recovered_pairs"]

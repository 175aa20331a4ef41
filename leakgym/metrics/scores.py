"""``score_reconstruction``: match reconstructions to originals, then score every pair.

Reconstructions (already mapped to unit images with ``spec.denormalize``) and the private originals
go in; per-image and mean MSE, PSNR, SSIM (and optionally LPIPS), the matching and the label
accuracy come out. :func:`score_reconstructions` does the same for the batches of many games at
once (the environment's scoring phase, ``docs/architecture.md``): batches of one shape are stacked,
their matching costs and every metric computed in one call on their device; only the Hungarian
matching of batches of more than one image runs per batch, on the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from leakgym.devices import to_host
from leakgym.metrics.functional import DEFAULT_MAX_DB, DEFAULT_SSIM_WINDOW, mse, psnr, ssim
from leakgym.metrics.matching import (
    MATCHING_COSTS,
    _check_batches,
    _label_accuracies,
    assign,
    label_accuracy,
    match_reconstructions,
    recovered_pairs,
)
from leakgym.metrics.perceptual import lpips as lpips_fn


@dataclass
class ReconstructionScores:
    """Scores of one reconstructed batch.

    Attributes:
        per_image: metric name -> ``float64`` array ``(N,)`` aligned with the *originals*; keys
            ``mse``, ``psnr``, ``ssim`` and, when requested, ``lpips`` (NaN if unavailable).
        mean: metric name -> mean over images (NaN stays NaN).
        assignment: ``int64 (N,)``; ``assignment[i]`` is the reconstruction matched to original ``i``.
        label_accuracy: order-free label accuracy (see :func:`label_accuracy`), or ``None`` when
            ``pred_labels`` or ``true_labels`` was not given.
    """

    per_image: dict[str, np.ndarray]
    mean: dict[str, float]
    assignment: np.ndarray
    label_accuracy: float | None


def score_reconstruction(recon_unit: Tensor, orig_unit: Tensor, *,
                         pred_labels: Tensor | np.ndarray | Sequence[int] | None = None,
                         true_labels: Tensor | np.ndarray | Sequence[int] | None = None,
                         lpips: bool = False, lpips_net: str = "alex", data_range: float = 1.0,
                         match_cost: str = "mse", ssim_window: int = DEFAULT_SSIM_WINDOW,
                         max_db: float = DEFAULT_MAX_DB) -> ReconstructionScores:
    """Match ``recon_unit`` (M images) to ``orig_unit`` (N <= M images) and score the matched pairs.

    Images are unit images ``(.., C, H, W)``, clamped to ``[0, data_range]`` (see
    :mod:`leakgym.metrics.functional`). Matching keeps as many recoveries (pairs at >= 60 dB) as it can,
    then minimises the total ``match_cost`` (default MSE; :func:`~leakgym.metrics.matching.assign`) with
    the Hungarian algorithm; surplus reconstructions are ignored. Label accuracy compares the label
    multisets (order-free: inferred labels are not tied to particular images).
    """
    assignment = match_reconstructions(recon_unit, orig_unit, cost=match_cost, data_range=data_range,
                                       ssim_window=ssim_window, max_db=max_db)
    index = torch.as_tensor(assignment, device=recon_unit.device)
    matched = recon_unit.detach().index_select(0, index)
    orig = orig_unit.detach().to(matched.device)
    values: dict[str, Tensor] = {
        "mse": mse(matched, orig, data_range),
        "psnr": psnr(matched, orig, data_range, max_db=max_db),
        "ssim": ssim(matched, orig, data_range, window_size=ssim_window),
    }
    if lpips:
        values["lpips"] = lpips_fn(matched, orig, net=lpips_net, data_range=data_range)
    per_image = {k: v.detach().double().cpu().numpy() for k, v in values.items()}
    mean = {k: float(v.mean()) if v.size else math.nan for k, v in per_image.items()}
    acc = None
    if pred_labels is not None and true_labels is not None:
        acc = label_accuracy(pred_labels, true_labels)
    return ReconstructionScores(per_image=per_image, mean=mean, assignment=assignment, label_accuracy=acc)


def score_reconstructions(recons: Sequence[Tensor], origs: Sequence[Tensor], *,
                          pred_labels: Sequence[Tensor | np.ndarray | Sequence[int] | None] | None = None,
                          true_labels: Sequence[Tensor | np.ndarray | Sequence[int] | None] | None = None,
                          lpips: bool = False, lpips_net: str = "alex", data_range: float = 1.0,
                          match_cost: str = "mse", ssim_window: int = DEFAULT_SSIM_WINDOW,
                          max_db: float = DEFAULT_MAX_DB) -> list[ReconstructionScores]:
    """:func:`score_reconstruction` of every pair ``(recons[g], origs[g])``, batched over the pairs.

    Pairs whose reconstructions and originals have the same shapes, device and dtype are stacked:
    their ``(N, M)`` matching costs come from one metric call, and the matched pairs of all of them
    are scored by one call of each metric (one SSIM call for all games). Batches of one image
    need no matching; for larger ones only ``scipy``'s Hungarian algorithm runs per batch, on the
    cost matrix copied to the host. ``pred_labels`` / ``true_labels``: one entry per pair (or None).
    Label tensors on a device come to the host in one transfer per device and shape, not one per pair.
    Returns one :class:`ReconstructionScores` per pair, equal to :func:`score_reconstruction`'s up to
    the rounding of batched kernels.
    """
    if len(recons) != len(origs):
        raise ValueError(f"got {len(recons)} reconstruction batches for {len(origs)} original batches")
    for name, labels in (("pred_labels", pred_labels), ("true_labels", true_labels)):
        if labels is not None and len(labels) != len(origs):
            raise ValueError(f"{name} has {len(labels)} entries for {len(origs)} batches; give one per batch")
    if match_cost not in MATCHING_COSTS:
        raise ValueError(f"cost={match_cost!r} is not supported; allowed: {', '.join(MATCHING_COSTS)}")
    for r, o in zip(recons, origs):
        _check_batches(r, o)

    def metric(name: str, a: Tensor, b: Tensor) -> Tensor:
        if name == "mse":
            return mse(a, b, data_range)
        if name == "psnr":
            return psnr(a, b, data_range, max_db=max_db)
        if name == "ssim":
            return ssim(a, b, data_range, window_size=ssim_window)
        return lpips_fn(a, b, net=lpips_net, data_range=data_range)

    if pred_labels is not None and true_labels is not None:
        pred_labels, true_labels = to_host(pred_labels), to_host(true_labels)
    groups: dict[tuple, list[int]] = {}
    for g, (r, o) in enumerate(zip(recons, origs)):
        r_dev = r.detach()
        groups.setdefault((tuple(r.shape), tuple(o.shape), r_dev.device, r_dev.dtype), []).append(g)
    out: list[ReconstructionScores | None] = [None] * len(recons)
    for (r_shape, o_shape, device, dtype), members in groups.items():
        rec = torch.stack([recons[g].detach() for g in members])  # (G, M, C, H, W)
        org = torch.stack([origs[g].detach().to(device=device, dtype=dtype) for g in members])  # (G, N, ...)
        big, n, m = len(members), o_shape[0], r_shape[0]
        if n == m == 1:
            assignments = np.zeros((big, 1), dtype=np.int64)
        else:
            # Every (original i, reconstruction j) pair of every game: row (g, i * m + j).
            pairs_o = org.repeat_interleave(m, dim=1).flatten(0, 1)
            pairs_r = rec.repeat(1, n, 1, 1, 1).flatten(0, 1)
            sign = 1.0 if match_cost == "mse" else -1.0  # PSNR and SSIM are maximised
            costs = (sign * metric(match_cost, pairs_r, pairs_o)).reshape(big, n, m).double().cpu().numpy()
            mses = costs if match_cost == "mse" else \
                metric("mse", pairs_r, pairs_o).reshape(big, n, m).double().cpu().numpy()
            assignments = np.stack([assign(c, match_cost, data_range, recovered=recovered_pairs(e, data_range))
                                    for c, e in zip(costs, mses)])
        index = torch.as_tensor(assignments, device=device)
        matched = torch.gather(rec, 1, index.view(big, n, 1, 1, 1).expand(big, n, *r_shape[1:]))
        flat_r, flat_o = matched.flatten(0, 1), org.flatten(0, 1)
        names = ("mse", "psnr", "ssim", "lpips") if lpips else ("mse", "psnr", "ssim")
        values = {k: metric(k, flat_r, flat_o).detach().double().reshape(big, n).cpu().numpy() for k in names}
        # Every game's means at once: numpy reduces each row of the (G, N) matrix as it reduces that row alone
        # (the same pairwise summation, the same division), so these are the per-game means bit for bit.
        means = {name: v.mean(axis=1) for name, v in values.items()}
        accuracies = [None] * big if pred_labels is None or true_labels is None else \
            _label_accuracies([pred_labels[g] for g in members], [true_labels[g] for g in members])
        for k, g in enumerate(members):
            per_image = {name: v[k].copy() for name, v in values.items()}
            mean = {name: float(means[name][k]) if n else math.nan for name in per_image}
            out[g] = ReconstructionScores(per_image=per_image, mean=mean, assignment=assignments[k].copy(),
                                          label_accuracy=accuracies[k])
    return out  # type: ignore[return-value]

"""``score_reconstruction``: match reconstructions to originals, then score every pair.

This is the one call the environment makes per round (``docs/architecture.md``): reconstructions
(already mapped to unit images with ``spec.denormalize``) and the private originals go in; per-image
and mean MSE, PSNR, SSIM (and optionally LPIPS), the matching and the label accuracy come out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from leakgym.metrics.functional import DEFAULT_MAX_DB, DEFAULT_SSIM_WINDOW, mse, psnr, ssim
from leakgym.metrics.matching import label_accuracy, match_reconstructions
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
    :mod:`leakgym.metrics.functional`). Matching minimises the total ``match_cost`` (default MSE) with
    the Hungarian algorithm; surplus reconstructions are ignored. Label accuracy compares the label
    multisets (order-free: inferred labels are not tied to particular images).
    """
    assignment = match_reconstructions(recon_unit, orig_unit, cost=match_cost, data_range=data_range)
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

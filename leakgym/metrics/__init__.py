"""Reconstruction metrics: MSE, PSNR, SSIM, LPIPS, optimal matching and ``score_reconstruction``.

Pure functions take unit images ``(N, C, H, W)`` (clamped to ``[0, data_range]``) and return one value
per image ``(N,)``; :data:`METRIC_INFO` declares for each metric whether higher is better. SSIM is the
Gaussian-window SSIM of Wang et al. (via kornia), **not** the CW-SSIM that the breaching library
reports under the name "SSIM"; the two are not comparable. LPIPS needs torchvision's pretrained
backbone file on disk (``$LEAKGYM_LPIPS_WEIGHTS`` or torch's hub cache) and returns NaN (with one
warning) otherwise; see
:mod:`leakgym.metrics.perceptual`.
"""

from leakgym.metrics.functional import (
    DEFAULT_MAX_DB,
    DEFAULT_SSIM_WINDOW,
    METRIC_INFO,
    MetricInfo,
    check_image_pair,
    mse,
    psnr,
    ssim,
)
from leakgym.metrics.matching import MATCHING_COSTS, label_accuracy, match_reconstructions, pairwise_cost
from leakgym.metrics.perceptual import (
    LPIPS_BACKBONE_FILES,
    LPIPS_WEIGHTS_ENV,
    LPIPSWeightsMissingWarning,
    lpips,
    lpips_available,
    lpips_status,
    lpips_weights_path,
)
from leakgym.metrics.scores import ReconstructionScores, score_reconstruction, score_reconstructions

__all__ = [
    "DEFAULT_MAX_DB",
    "DEFAULT_SSIM_WINDOW",
    "LPIPS_BACKBONE_FILES",
    "LPIPS_WEIGHTS_ENV",
    "MATCHING_COSTS",
    "METRIC_INFO",
    "LPIPSWeightsMissingWarning",
    "MetricInfo",
    "ReconstructionScores",
    "check_image_pair",
    "label_accuracy",
    "lpips",
    "lpips_available",
    "lpips_status",
    "lpips_weights_path",
    "match_reconstructions",
    "mse",
    "pairwise_cost",
    "psnr",
    "score_reconstruction",
    "score_reconstructions",
    "ssim",
]

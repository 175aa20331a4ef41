"""Per-image reconstruction metrics as pure functions: MSE, PSNR, SSIM.

All functions take two batches of *unit* images ``(N, C, H, W)`` (see ``docs/architecture.md``:
metrics receive ``spec.denormalize(x_n)``) and return a tensor ``(N,)`` with one value per image pair.

Input handling, shared by every metric:

* Both inputs must be floating tensors of the same 4-D shape, with finite values; ``data_range`` must be
  a number in :data:`DATA_RANGE_LIMITS` (the metrics compute in float32, where SSIM's constants underflow
  and squared errors overflow outside it), ``max_db`` one in ``(0, MAX_DB_LIMIT]``. Violations raise
  ``ValueError`` naming the bad value and the allowed range.
* Values are **clamped** to ``[0, data_range]`` before scoring. Attacks return unconstrained images,
  and a reconstruction is judged as the image a viewer would see (clipped to the valid range), the
  convention of Inverting Gradients and breaching.

Metric conventions:

* ``mse``: mean over ``C, H, W`` of ``(a - b)^2``.
* ``psnr``: ``10 log10(data_range^2 / mse)`` per image, capped at ``max_db`` (identical images have
  ``mse = 0`` and would give ``+inf``; the cap keeps means finite).
* ``ssim``: SSIM of Wang et al. (IEEE TIP 2004) as ``kornia.metrics.ssim`` computes it (equal to its
  values to float32 rounding; test: ``tests/test_metrics.py``), with kornia's Gaussian kernel but the
  local means as one separable ``F.conv2d`` with every channel of every image a batch entry: kornia
  filters a batch as one grouped kernel, which on some CPUs rounds an image's map differently depending
  on the other images of the call (AMD EPYC, AVX-512: up to 7e-8), and a game of a vector env must score
  what it scores alone. Computed in at least float32. Gaussian window (sigma = 1.5), constants
  ``c1 = (0.01 L)^2, c2 = (0.03 L)^2``, ``padding="valid"`` (no border padding, as in the reference
  MATLAB code), no denominator ``eps``; the per-image value is the mean of the SSIM map over channels and
  positions. The default window is 7 taps: the usual 11 would leave
  only a 6x6 map on the 16x16 digit images LeakGym uses by default; 7 (scikit-image's default window
  length) leaves 10x10. Images must be at least ``window_size`` pixels on each side.

  Note: the "SSIM" reported by the breaching library (Geiping et al.) is the complex-wavelet CW-SSIM,
  a different quantity; its numbers are not comparable with the SSIM here (or in most papers).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import kornia
import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_SSIM_WINDOW = 7
"""Gaussian SSIM window (taps); valid for images of at least 7x7 pixels."""

DEFAULT_MAX_DB = 100.0
"""PSNR cap for identical images."""

DATA_RANGE_LIMITS = (1e-6, 1e6)
"""Allowed ``data_range`` (inclusive): unit images take 1, 8-bit ones 255. Outside it, float32 broke the metrics
(found in an audit): at 1e-10 SSIM's ``c1 * c2`` underflows to 0 and two equal images score NaN, at 1e20 squared
errors overflow and PSNR is -inf."""

MAX_DB_LIMIT = 1000.0
"""Largest allowed PSNR cap (``max_db``): 1e300 did not fit the float32 result."""


@dataclass(frozen=True)
class MetricInfo:
    """What a metric is: its name, whether higher means a better reconstruction, its value range."""

    name: str
    higher_is_better: bool
    lower_bound: float
    upper_bound: float


METRIC_INFO: dict[str, MetricInfo] = {
    "mse": MetricInfo("mse", higher_is_better=False, lower_bound=0.0, upper_bound=math.inf),
    "psnr": MetricInfo("psnr", higher_is_better=True, lower_bound=-math.inf, upper_bound=DEFAULT_MAX_DB),
    "ssim": MetricInfo("ssim", higher_is_better=True, lower_bound=-1.0, upper_bound=1.0),
    "lpips": MetricInfo("lpips", higher_is_better=False, lower_bound=0.0, upper_bound=math.inf),
}
"""Metric registry; ``higher_is_better`` tells whether a larger value means more leakage."""


def check_image_pair(a: Tensor, b: Tensor, data_range: float = 1.0) -> tuple[Tensor, Tensor]:
    """Validate two unit-image batches and return them clamped to ``[0, data_range]``."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise ValueError(  # noqa: TRY004 - the library reports all bad input as ValueError
            f"images must be torch.Tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(a.shape)}")
    if a.shape != b.shape:
        raise ValueError(f"image batches must have equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")
    if min(a.shape[1:]) == 0:  # an empty image would score as a perfect match (its MSE is NaN)
        raise ValueError(f"images need C, H, W >= 1, got shape {tuple(a.shape)}")
    if not a.is_floating_point() or not b.is_floating_point():
        raise ValueError(f"images must be floating point, got {a.dtype} and {b.dtype}")
    low, high = DATA_RANGE_LIMITS
    if isinstance(data_range, bool) or not (isinstance(data_range, numbers.Real) and low <= data_range <= high):
        raise ValueError(f"data_range={data_range!r}; allowed: a number in [{low:g}, {high:g}]")
    for name, images in (("reconstructions (first argument)", a), ("originals (second argument)", b)):
        bad = int((~torch.isfinite(images.detach().flatten(1))).any(dim=1).sum())
        if bad:
            raise ValueError(f"{name}: {bad} of {images.shape[0]} images contain NaN or inf values")
    data_range = float(data_range)
    a = a.detach().clamp(0.0, data_range)
    b = b.detach().clamp(0.0, data_range).to(a.dtype)
    return a, b


def mse(a: Tensor, b: Tensor, data_range: float = 1.0) -> Tensor:
    """Per-image mean squared error ``(N,)`` (lower is better); computed in at least float32 (a
    float16 square of a small difference underflows, and would read as a perfect match)."""
    a, b = check_image_pair(a, b, data_range)
    if torch.finfo(a.dtype).bits < 32:
        a, b = a.float(), b.float()
    return (a - b).pow(2).flatten(1).mean(dim=1)


def psnr(a: Tensor, b: Tensor, data_range: float = 1.0, max_db: float = DEFAULT_MAX_DB) -> Tensor:
    """Per-image peak signal-to-noise ratio in dB ``(N,)``, capped at ``max_db`` (higher is better)."""
    if isinstance(max_db, bool) or not (isinstance(max_db, numbers.Real) and 0 < max_db <= MAX_DB_LIMIT):
        raise ValueError(f"max_db={max_db!r}; allowed: a number in (0, {MAX_DB_LIMIT:g}]")
    err = mse(a, b, data_range)
    with torch.no_grad():
        safe = err.clamp_min(torch.finfo(err.dtype).tiny)
        value = 20.0 * math.log10(data_range) - 10.0 * torch.log10(safe)
        value = torch.where(err > 0, value, torch.full_like(value, max_db))
    return value.clamp(max=max_db)


def ssim(a: Tensor, b: Tensor, data_range: float = 1.0, window_size: int = DEFAULT_SSIM_WINDOW) -> Tensor:
    """Per-image SSIM ``(N,)``: mean of the Gaussian-window SSIM map (higher is better), in ``[-1, 1]`` (the
    mean clamped there: its float rounding can pass 1 by an ulp)."""
    a, b = check_image_pair(a, b, data_range)
    h, w = a.shape[-2:]
    if not isinstance(window_size, int) or window_size < 3 or window_size % 2 == 0:
        raise ValueError(f"window_size={window_size!r} must be an odd int >= 3")
    if window_size > min(h, w):
        raise ValueError(f"window_size={window_size} exceeds the image size {h}x{w}; "
                         f"use an odd window_size <= {min(h, w)}")
    if torch.finfo(a.dtype).bits < 32:  # as kornia: float16/bfloat16 images are filtered in float32
        a, b = a.float(), b.float()
    n, c = a.shape[:2]
    c1, c2 = (0.01 * float(data_range)) ** 2, (0.03 * float(data_range)) ** 2
    with torch.no_grad():
        # Local means of a, b, a^2, b^2, ab: every channel of every image one batch entry of the same
        # separable Gaussian convolution, so an image's value does not depend on its company.
        maps = torch.stack([a, b, a * a, b * b, a * b]).reshape(5 * n * c, 1, h, w)
        kernel = kornia.filters.get_gaussian_kernel1d(window_size, 1.5, device=a.device, dtype=a.dtype)
        kernel = kernel.reshape(-1)
        local = F.conv2d(F.conv2d(maps, kernel.view(1, 1, 1, -1)), kernel.view(1, 1, -1, 1))
        mu_a, mu_b, mu_aa, mu_bb, mu_ab = local.reshape(5, n, c, *local.shape[-2:])
        mu_a2, mu_b2, mu_a_mu_b = mu_a**2, mu_b**2, mu_a * mu_b
        numerator = (2 * mu_a_mu_b + c1) * (2 * (mu_ab - mu_a_mu_b) + c2)
        denominator = (mu_a2 + mu_b2 + c1) * ((mu_aa - mu_a2) + (mu_bb - mu_b2) + c2)
        ssim_map = numerator / denominator
    # SSIM lies in [-1, 1]; float32 rounding of a near-perfect match gave 1.0000001 (DLG against no defense),
    # which the episode log's reader then refused on --resume as out of range (found in an audit).
    return ssim_map.flatten(1).mean(dim=1).clamp(-1.0, 1.0)

"""Reward formulas.

Leakage ``L`` is the matched per-image reconstruction score, averaged over the private batch and
mapped to [0, 1]:

* ``ssim``: mean SSIM clipped to [0, 1];
* ``psnr``: mean PSNR / 40 dB clipped to [0, 1] (40 dB is visually exact);
* ``lpips``: 1 - mean LPIPS clipped to [0, 1] (needs the pretrained LPIPS weights);
* ``ssim+psnr``: the mean of the two above.

Attacker: ``r_A = L - w_cost * (iterations x restarts) / 1000``, with ``iterations`` the steps the
attack ran (``AttackResult.cost``): the menu's budget, plus the second stage of two-stage attacks --
Mixup decoding's demixing steps (``decode_steps``, default 1000) and LODA inversion's Eq. 6 steps
(``inversion_steps``) -- which are real work and charged as such.

Defender: ``r_D = -L + w_fid * fidelity + w_acc * accuracy - w_ovh * defense_units``, where
fidelity is the cosine of the shared update to the clean update, accuracy the global model's last
measured test accuracy and ``defense_units`` the defense's extra client compute in units of one
clean gradient computation (:func:`leakgym.defenses.defense_compute_units`: each registered defense
declares its own cost model; a deterministic count so that the same seed gives the same rewards,
unlike wall time).
"""

from __future__ import annotations

import math

from leakgym.metrics import ReconstructionScores

from .scenario import PSNR_FOR_FULL_LEAKAGE, RewardWeights


def _clip01(v: float) -> float:
    """``v`` clipped to [0, 1]; NaN (a score of a reconstruction with NaN pixels) is 0: nothing leaked, and
    rewards stay finite (``max(nan, 0.0)`` is NaN)."""
    return 0.0 if math.isnan(v) else float(min(max(v, 0.0), 1.0))


def leakage_score(scores: ReconstructionScores, metric: str) -> float:
    ssim = _clip01(scores.mean["ssim"])
    psnr = _clip01(scores.mean["psnr"] / PSNR_FOR_FULL_LEAKAGE)
    if metric == "ssim":
        return ssim
    if metric == "psnr":
        return psnr
    if metric == "ssim+psnr":
        return (ssim + psnr) / 2
    if metric == "lpips":
        return _clip01(1.0 - scores.mean["lpips"])
    raise ValueError(f"leakage metric {metric!r}; allowed: ssim, psnr, lpips, ssim+psnr")


def rewards(
    *,
    leakage: float,
    attack_units: int,
    fidelity: float,
    accuracy: float,
    defense_units: float,
    weights: RewardWeights,
) -> dict[str, float]:
    parts = {
        "attacker_leakage": leakage,
        "attacker_cost": -weights.attack_cost * attack_units / 1000.0,
        "defender_leakage": -leakage,
        "defender_fidelity": weights.fidelity * fidelity,
        "defender_accuracy": weights.accuracy * accuracy,
        "defender_overhead": -weights.defense_overhead * defense_units,
    }
    parts["attacker"] = parts["attacker_leakage"] + parts["attacker_cost"]
    parts["defender"] = (
        parts["defender_leakage"] + parts["defender_fidelity"] + parts["defender_accuracy"] + parts["defender_overhead"]
    )
    return {k: float(v) for k, v in parts.items()}

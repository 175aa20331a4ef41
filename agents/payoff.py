"""Per-episode values, per-pair statistics and the empirical payoff table of ``leakgym eval``.

An :class:`EpisodeStats` holds one episode of one (attacker, defender) pair; a :class:`PairResult`
holds a pair's episodes and summarises each quantity in :data:`METRICS` as its mean over episodes
with a 95% Student-t confidence interval ``mean ± t_{0.975, n-1} s / sqrt(n)`` (``s`` the sample
standard deviation; undefined for n = 1). A :class:`PayoffTable` holds every pair of a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: metrics reported per pair (each as mean and 95% CI)
METRICS = (
    "leakage_ssim",
    "leakage_psnr",
    "leakage_lpips",
    "label_accuracy",
    "accuracy",
    "attacker_return",
    "defender_return",
)
#: metrics averaged over the rounds of an episode (the others are per-episode totals / final values)
ROUND_METRICS = ("leakage_ssim", "leakage_psnr", "leakage_lpips", "label_accuracy")


def t_interval(values: np.ndarray | list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the Student-t interval; low/high are NaN for fewer than 2 values."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x)):
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


@dataclass
class EpisodeStats:
    """One episode of one pair: the value of every metric in :data:`METRICS` and the rounds played."""

    metrics: dict[str, float]
    rounds: int


@dataclass
class LastRound:
    """The last round of a pair's last episode, as plain arrays (what the gallery shows).

    ``originals[i]`` is a private image (unit range, ``(C, H, W)``), ``matched[i]`` the
    reconstruction matched to it and ``ssim[i]`` their SSIM.
    """

    originals: np.ndarray
    matched: np.ndarray
    ssim: np.ndarray

    @classmethod
    def from_game(cls, last: Any) -> LastRound | None:
        """From the game's record of its last round (``env.game.last``, a
        :class:`~leakgym.envs.game.RoundRecord`); ``None`` before any round."""
        if last is None:
            return None
        originals_t, recon_t, scores = last.originals, last.reconstructions, last.scores
        originals = originals_t.detach().cpu().clamp(0, 1).numpy().astype(np.float32)
        recon = recon_t.detach().cpu().clamp(0, 1).numpy().astype(np.float32)
        assignment = np.asarray(scores.assignment, dtype=np.int64)[: len(originals)]
        ssim = np.asarray(scores.per_image["ssim"], dtype=np.float64)[: len(originals)]
        return cls(originals=originals, matched=recon[assignment], ssim=ssim)


@dataclass
class PairResult:
    """Every episode of one (attacker, defender) pair, and the last round it played."""

    attacker: str
    defender: str
    episodes: list[EpisodeStats]
    last_round: LastRound | None = None

    def summary(self) -> dict[str, Any]:
        """``attacker, defender, episodes, rounds`` and ``<metric>_mean/_ci95_low/_ci95_high``."""
        row: dict[str, Any] = {
            "attacker": self.attacker,
            "defender": self.defender,
            "episodes": len(self.episodes),
            "rounds": int(sum(e.rounds for e in self.episodes)),
        }
        for m in METRICS:
            mean, low, high = t_interval([e.metrics[m] for e in self.episodes])
            row[f"{m}_mean"], row[f"{m}_ci95_low"], row[f"{m}_ci95_high"] = mean, low, high
        return row


@dataclass
class PayoffTable:
    """The result of :func:`leakgym.agents.play.evaluate`: one :class:`PairResult` per pair."""

    env_id: str
    scenario: str
    attackers: list[str]
    defenders: list[str]
    pairs: list[PairResult]
    seed: int
    overrides: dict[str, Any]

    def rows(self) -> list[dict[str, Any]]:
        return [p.summary() for p in self.pairs]

    def matrix(self, column: str) -> np.ndarray:
        """``column`` (e.g. ``"leakage_ssim_mean"``) as an attackers x defenders array."""
        by_pair = {(r["attacker"], r["defender"]): r[column] for r in self.rows()}
        return np.array([[by_pair[(a, d)] for d in self.defenders] for a in self.attackers], dtype=np.float64)


__all__ = ["METRICS", "ROUND_METRICS", "EpisodeStats", "LastRound", "PairResult", "PayoffTable", "t_interval"]

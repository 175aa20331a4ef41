"""Per-episode values, per-pair statistics and the empirical payoff table of ``leakgym eval``.

An :class:`EpisodeStats` holds one episode of one (attacker, defender) pair; a :class:`PairResult`
holds a pair's episodes and summarises each quantity in :data:`METRICS` as its mean over episodes
with a 95% Student-t confidence interval ``mean ± t_{0.975, n-1} s / sqrt(n)`` (``s`` the sample
standard deviation; undefined for n = 1), clipped to the metric's range (:data:`METRIC_RANGES`).
With fewer than :data:`MIN_EPISODES` episodes such intervals are wide and the normal approximation
behind them is poor; the payoff figure says so. A :class:`PayoffTable` holds every pair of a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from leakgym.metrics.functional import DEFAULT_MAX_DB

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
#: the values each metric can take (PSNR of unit images is >= 0 dB, and capped at DEFAULT_MAX_DB: an interval
#: reached 197 dB before, found in an audit); intervals are clipped to them
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "leakage_ssim": (-1.0, 1.0),
    "leakage_psnr": (0.0, DEFAULT_MAX_DB),
    "leakage_lpips": (0.0, math.inf),
    "label_accuracy": (0.0, 1.0),
    "accuracy": (0.0, 1.0),
    "attacker_return": (-math.inf, math.inf),
    "defender_return": (-math.inf, math.inf),
}
#: how far outside its range a saved value of these metrics may lie and still be read (clamped into the range,
#: :func:`clamped_metric_value`): SSIM of a near-perfect match float-rounded past 1 by an ulp or two of
#: float32 (1.0000000596046448, 1.0000001192092896) in the files of versions that did not clamp it, which
#: ``--resume`` refused (found in an audit); 1e-6 is about 8 float32 ulps at 1, while a real out-of-range
#: value (1.01) is still refused
METRIC_ROUNDING: dict[str, float] = {"leakage_ssim": 1e-6}


def metric_value_error(metric: str, value: float) -> str | None:
    """Why ``value`` is not a defined value of ``metric``, or ``None``: a defined value is finite and in
    :data:`METRIC_RANGES`, or within :data:`METRIC_ROUNDING`
    of it (the check of ``--resume``, here and in ``leakgym metagame``'s state file)."""
    if not math.isfinite(value):
        return "is not a finite number"
    low, high = METRIC_RANGES[metric]
    slack = METRIC_ROUNDING.get(metric, 0.0)
    if not low - slack <= value <= high + slack:
        return f"is outside its range [{low}, {high}]"
    return None


def clamped_metric_value(metric: str, value: float) -> float:
    """``value`` clamped into ``metric``'s range (a value :func:`metric_value_error` accepts lies at most
    :data:`METRIC_ROUNDING` outside it); NaN (undefined) stays NaN."""
    if math.isnan(value):
        return value
    low, high = METRIC_RANGES[metric]
    return min(max(value, low), high)


#: fewer episodes per pair than this and the payoff figure warns that its intervals are unreliable
MIN_EPISODES = 5


def t_interval(
    values: np.ndarray | list[float], confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the Student-t interval, low/high clipped to ``bounds`` when given;
    low/high are NaN for fewer than 2 values."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x)):
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return mean, low, high


@dataclass
class EpisodeStats:
    """One episode of one pair: the value of every metric in :data:`METRICS` and the rounds played."""

    metrics: dict[str, float]
    rounds: int


@dataclass
class LastRound:
    """The last round of one of a pair's episodes (:func:`gallery_episode`), as plain arrays (what the
    gallery shows).

    ``originals[i]`` is a private image (unit range, ``(C, H, W)``), ``matched[i]`` the
    reconstruction matched to it, ``ssim[i]`` and ``psnr[i]`` their SSIM and PSNR (dB),
    ``labels[i]`` its class (``None`` when the round record does not carry labels), and ``lpips[i]``
    their LPIPS: ``None`` (not available) unless the game scored it with the user's backbone weights
    (a last round saved before LPIPS was kept reads back as ``None`` too).
    """

    originals: np.ndarray
    matched: np.ndarray
    ssim: np.ndarray
    psnr: np.ndarray
    labels: np.ndarray | None = None
    lpips: np.ndarray | None = None

    @classmethod
    def from_game(cls, last: Any) -> LastRound | None:
        """From the game's record of its last round (``env.last_round``, a
        :class:`~leakgym.game.records.RoundRecord`); ``None`` before any round."""
        if last is None:
            return None
        originals_t, recon_t, scores = last.originals, last.reconstructions, last.scores
        originals = originals_t.detach().cpu().clamp(0, 1).numpy().astype(np.float32)
        recon = recon_t.detach().cpu().clamp(0, 1).numpy().astype(np.float32)
        n = len(originals)
        assignment = np.asarray(scores.assignment, dtype=np.int64)[:n]
        per_image = {k: np.asarray(scores.per_image[k], dtype=np.float64)[:n] for k in ("ssim", "psnr")}
        lpips = scores.per_image.get("lpips")  # scored only where the LPIPS weights are present
        if lpips is not None:
            lpips = np.asarray(lpips, dtype=np.float64)[:n]
            if not np.isfinite(lpips).all():  # NaN: the weights were missing; never shown as a number
                lpips = None
        labels = last.labels  # the private batch's classes
        if labels is not None:
            labels = labels.detach().cpu()
            labels = (labels.argmax(-1) if labels.ndim == 2 else labels).numpy().astype(np.int64)[:n]
        return cls(originals=originals, matched=recon[assignment], ssim=per_image["ssim"], psnr=per_image["psnr"],
                   labels=labels, lpips=lpips)


def gallery_episode(attacker_index: int, defender_index: int, episodes: int) -> int:
    """The episode whose last round the pair (row ``attacker_index``, column ``defender_index`` of the
    payoff table) keeps for the gallery: ``(attacker_index + defender_index) mod episodes``.

    Pairs play with common random numbers (episode ``e`` of every pair has seed ``seed + e``), so the last
    rounds of one episode show every pair the same private images; this choice shows neighbouring pairs
    (in a row or a column) different originals whenever there are several episodes, and changes no number
    of the tables.
    """
    return (attacker_index + defender_index) % episodes


@dataclass
class PairResult:
    """Every episode of one (attacker, defender) pair, and the last round it played."""

    attacker: str
    defender: str
    episodes: list[EpisodeStats]
    last_round: LastRound | None = None

    def summary(self) -> dict[str, Any]:
        """``attacker, defender, episodes, total_rounds`` (rounds played over all episodes) and
        ``<metric>_mean/_ci95_low/_ci95_high`` (the interval clipped to :data:`METRIC_RANGES`)."""
        row: dict[str, Any] = {
            "attacker": self.attacker,
            "defender": self.defender,
            "episodes": len(self.episodes),
            "total_rounds": int(sum(e.rounds for e in self.episodes)),
        }
        for m in METRICS:
            mean, low, high = t_interval([e.metrics[m] for e in self.episodes], bounds=METRIC_RANGES[m])
            row[f"{m}_mean"], row[f"{m}_ci95_low"], row[f"{m}_ci95_high"] = mean, low, high
        return row


@dataclass
class PayoffTable:
    """The result of :func:`leakgym.agents.experiments.evaluation.play.evaluate`: one :class:`PairResult`
    per pair."""

    env_id: str
    scenario: str
    attackers: list[str]
    defenders: list[str]
    pairs: list[PairResult]
    seed: int
    overrides: dict[str, Any]
    episodes: int | None = None
    """Episodes per pair (None: not recorded)."""
    lockstep: int | None = None
    """Games played together (their batched kernels decide the rounding; None: not recorded)."""
    device: str | None = None
    """The torch device of the games (None: not recorded)."""

    def rows(self) -> list[dict[str, Any]]:
        return [p.summary() for p in self.pairs]

    def matrix(self, column: str) -> np.ndarray:
        """``column`` (e.g. ``"leakage_ssim_mean"``) as an attackers x defenders array."""
        by_pair = {(r["attacker"], r["defender"]): r[column] for r in self.rows()}
        return np.array([[by_pair[(a, d)] for d in self.defenders] for a in self.attackers], dtype=np.float64)


__all__ = ["METRICS", "METRIC_RANGES", "METRIC_ROUNDING", "MIN_EPISODES", "ROUND_METRICS", "EpisodeStats", "LastRound",
           "PairResult", "PayoffTable", "clamped_metric_value", "gallery_episode", "metric_value_error", "t_interval"]

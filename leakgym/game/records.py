"""The plain records a round passes between its phases, and the record of a game's last round.

Each is data only (no methods that play the round): :func:`leakgym.game.round.play_round` makes them,
one per game of the round, and the views read :class:`RoundOutcome` and :class:`RoundRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from leakgym.attacks.base import Attack, AttackerKnowledge
from leakgym.defenses import DefenseConfig, DefenseReport
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import ReconstructionScores


@dataclass(frozen=True)
class RoundPlan:
    """A validated, decoded pair of actions (phase 1, plan)."""

    defender_action: np.ndarray
    attacker_action: np.ndarray
    defense_settings: dict[str, Any]
    attack_settings: dict[str, Any]
    defense: DefenseConfig
    attack: Attack
    #: whether the attack or a defense reads the public split (the round then gathers it for the game)
    reads_public_split: bool = True


@dataclass
class AttackJob:
    """One reconstruction problem: an attack, the update it targets, what the server knows, a seed."""

    attack: Attack
    update: SharedUpdate
    knowledge: AttackerKnowledge
    seed: int


@dataclass
class Defended:
    """What the victim shared (phase 2, defend) and what the attack needs."""

    x: Tensor  # private batch, normalised
    y: Tensor
    update: SharedUpdate
    report: DefenseReport
    attack_job: AttackJob
    seed: int
    timings: dict[str, float] = field(default_factory=dict)
    #: the defender's self-audit of this update (SSIM in [0, 1] of its own reference attack), None without one
    audit: float | None = None


@dataclass(frozen=True)
class Scored:
    """Phase 4 (score): scores of the reconstruction, the leakage in [0, 1], the self-audit."""

    scores: ReconstructionScores
    leakage: float
    audit_leakage: float
    originals: Tensor  # unit images, CPU
    reconstructions: Tensor  # unit images, CPU
    labels: Tensor  # the private batch's labels, CPU


@dataclass(frozen=True)
class RoundRecord:
    """The last round of a game, as its observations and ``render()`` see it."""

    round: int
    defender_action: np.ndarray
    attacker_action: np.ndarray
    defense_settings: dict[str, Any]
    attack_settings: dict[str, Any]
    strategy: str
    applied: tuple[str, ...]
    update: SharedUpdate
    #: the attacker's summary of ``update`` (:func:`~leakgym.game.feedback.update_summaries`)
    update_summary: np.ndarray
    #: the attack's final gradient-matching loss; None for attacks without one (analytic, imprint)
    matching_loss: float | None
    audit_leakage: float
    fidelity: float
    leakage: float
    scores: ReconstructionScores
    originals: Tensor
    reconstructions: Tensor
    #: labels of the private batch (CPU), for galleries
    labels: Tensor


@dataclass
class RoundOutcome:
    """What one game's round returns to its view: observations, rewards, infos, whether the episode ended."""

    observations: dict[str, np.ndarray]
    rewards: dict[str, float]
    #: per agent: numbers only, one fixed key set (:func:`leakgym.game.feedback.numeric_info`)
    infos: dict[str, dict[str, Any]]
    #: the episode's last round was played: a terminal state of the game, whose horizon every observation
    #: carries (its round fraction; docs/game.md, "Episodes")
    terminated: bool
    record: RoundRecord
    #: per agent: the round's full record, the infos' numbers and what is not a number (strategy name,
    #: decoded settings, defenses applied): what ``round_details()`` returns
    details: dict[str, dict[str, Any]]


__all__ = ["AttackJob", "Defended", "RoundOutcome", "RoundPlan", "RoundRecord", "Scored"]

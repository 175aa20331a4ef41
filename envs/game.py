"""The state of one LeakGym game and what each phase of a round does to it.

:class:`LeakGame` owns one game: the global model on the server, the clients' data, the round
counter, the game's random generator and the :class:`RoundRecord` of the last round.
:class:`~leakgym.envs.round.Round` drives a round through the game's phase methods, in this order:
:meth:`LeakGame.plan` (validate, decode; changes nothing) -> :meth:`LeakGame.defend` ->
attack (batched across games by the Round) -> :meth:`LeakGame.score` ->
:meth:`LeakGame.federated_step` -> :meth:`LeakGame.conclude`. :meth:`LeakGame.snapshot` and
:meth:`LeakGame.restore` make a failed round leave no trace.

Everything random is drawn from the game's own generator, seeded by :meth:`LeakGame.reset`, so the
same seed and the same actions give the same trajectory, whatever other games run beside it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from leakgym.attacks import ATTACKS, build_attack
from leakgym.attacks.base import Attack, AttackerKnowledge, AttackResult
from leakgym.data import federated_split, load_dataset
from leakgym.defenses import DefenseConfig, DefenseReport, defense_compute_units
from leakgym.fl.client import compute_update
from leakgym.fl.server import Server
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import ReconstructionScores
from leakgym.models import build_model

from .observations import attacker_obs_size, attacker_observation, defender_obs_size, defender_observation
from .rewards import leakage_score, rewards
from .round import AttackJob, score_all, share_update
from .scenario import Scenario

#: stream tag of the attack's seed (``SeedSequence([round_seed, ATTACK_STREAM])``)
ATTACK_STREAM = 1


@lru_cache(maxsize=8)
def _dataset(name: str, image_size: int | None):
    return load_dataset(name, image_size=image_size)


def defense_config_for(scenario: Scenario, defender_action: Any) -> DefenseConfig:
    """Defender action -> the DefenseConfig applied this round (scenario defaults + menu fields)."""
    fields = scenario.defender_menu_dims.config_fields(defender_action)
    return DefenseConfig(**{**scenario.defense_defaults, **fields})


def attack_for(scenario: Scenario, attack_settings: dict[str, Any]) -> Attack:
    """Decoded attacker settings -> a configured attack (menu fields set where the attack has them)."""
    strategy = attack_settings["strategy"]
    fields = {f.name for f in dataclasses.fields(ATTACKS[strategy].Config)}
    overrides = {k: v for k, v in scenario.attack_defaults.items() if k in fields}
    overrides.update({k: v for k, v in attack_settings.items() if k in fields})
    return build_attack(strategy, **overrides)


# --------------------------------------------------------------------------------------------------
# Records passed between the phases
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundPlan:
    """A validated, decoded pair of actions (phase 1)."""

    defender_action: np.ndarray
    attacker_action: np.ndarray
    defense_settings: dict[str, Any]
    attack_settings: dict[str, Any]
    defense: DefenseConfig
    attack: Attack


@dataclass
class Defended:
    """What the victim shared (phase 2) and what the attack needs."""

    x: Tensor  # private batch, normalised
    y: Tensor
    update: SharedUpdate
    report: DefenseReport
    attack_job: AttackJob
    seed: int
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Scored:
    """Phase 4: scores of the reconstruction, the leakage in [0, 1], the self-audit."""

    scores: ReconstructionScores
    leakage: float
    audit_leakage: float
    originals: Tensor  # unit images, CPU
    reconstructions: Tensor  # unit images, CPU


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
    #: the attack's final gradient-matching loss; None for attacks without one (analytic, imprint)
    matching_loss: float | None
    audit_leakage: float
    fidelity: float
    leakage: float
    scores: ReconstructionScores
    originals: Tensor
    reconstructions: Tensor


@dataclass
class RoundOutcome:
    observations: dict[str, np.ndarray]
    rewards: dict[str, float]
    infos: dict[str, dict[str, Any]]
    truncated: bool
    record: RoundRecord


@dataclass
class GameSnapshot:
    """Everything a round may change, copied (see :meth:`LeakGame.snapshot`)."""

    model_state: dict[str, Tensor]
    rng_state: dict[str, Any]
    round: int
    accuracy: float
    test_loss: float
    last: RoundRecord | None
    timings: dict[str, float]


def _finite(value: float, default: float = 0.0) -> float:
    value = float(value)
    return value if math.isfinite(value) else default


# --------------------------------------------------------------------------------------------------
# The game
# --------------------------------------------------------------------------------------------------
class LeakGame:
    """One LeakGym game: global model, clients, round counter, generator, last round."""

    agents = ("attacker", "defender")

    def __init__(self, scenario: Scenario, *, device: str | torch.device = "cpu") -> None:
        self.scenario = scenario
        self.device = torch.device(device)
        self.dataset = _dataset(scenario.dataset, scenario.image_size)
        self.spec = self.dataset.spec
        if scenario.leakage_metric in ("lpips",):
            from leakgym.metrics import lpips_available

            if not lpips_available():
                raise ValueError(
                    "leakage_metric='lpips' needs the pretrained LPIPS backbone weights, which are not "
                    "installed (see the warning above / README 'LPIPS'); choose 'ssim', 'psnr' or 'ssim+psnr'"
                )
        self.round = 0
        self.last: RoundRecord | None = None
        self.timings: dict[str, float] = {}
        self.diverged_at: int | None = None

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int) -> dict[str, np.ndarray]:
        sc = self.scenario
        self.rng = np.random.default_rng(seed)
        self.round = 0
        self.diverged_at = None
        split = federated_split(
            self.dataset,
            num_clients=sc.num_clients + 1,
            public_fraction=sc.public_fraction,
            alpha=sc.dirichlet_alpha,
            seed=seed,
        )
        norm = self.spec.normalize
        dev = self.device
        self.public_x = split.public_x.to(dev)  # unit images (attacker priors, defender auxiliaries)
        self.public_y = split.public_y.to(dev)
        self.victim_x, self.victim_y = norm(split.clients[0][0]).to(dev), split.clients[0][1].to(dev)
        self.benign = [(norm(x).to(dev), y.to(dev)) for x, y in split.clients[1:]]
        n_eval = min(sc.eval_size, len(split.test_x))
        eval_x, eval_y = norm(split.test_x[:n_eval]).to(dev), split.test_y[:n_eval].to(dev)
        model = build_model(sc.model, self.spec, precode=sc.precode, width=sc.model_width, seed=seed, device=dev)
        self.server = Server(model, lr=sc.server_lr, eval_x=eval_x, eval_y=eval_y)
        self.accuracy, self.test_loss = self.server.evaluate()
        self.last = None
        self.timings = {}
        return self.observations()

    # ------------------------------------------------------------------ snapshot / restore
    def snapshot(self) -> GameSnapshot:
        return GameSnapshot(
            model_state={k: v.detach().clone() for k, v in self.server.model.state_dict().items()},
            rng_state=copy.deepcopy(self.rng.bit_generator.state),
            round=self.round,
            accuracy=self.accuracy,
            test_loss=self.test_loss,
            last=self.last,
            timings=dict(self.timings),
        )

    def restore(self, snap: GameSnapshot) -> None:
        self.server.model.load_state_dict(snap.model_state)
        self.rng.bit_generator.state = snap.rng_state
        self.round, self.accuracy, self.test_loss = snap.round, snap.accuracy, snap.test_loss
        self.last, self.timings = snap.last, snap.timings

    # ------------------------------------------------------------------ observations
    def observations(self) -> dict[str, np.ndarray]:
        sc = self.scenario
        frac = self.round / sc.rounds
        last = self.last
        return {
            "attacker": attacker_observation(
                round_fraction=frac,
                update=None if last is None else last.update,
                matching_loss=None if last is None else last.matching_loss,
                last_action=np.zeros(len(sc.attacker_nvec), np.int64) if last is None else last.attacker_action,
                menu=sc.attacker_menu_dims,
            ),
            "defender": defender_observation(
                round_fraction=frac,
                accuracy=self.accuracy,
                loss=self.test_loss,
                num_classes=self.spec.num_classes,
                last_action=np.zeros(len(sc.defender_nvec), np.int64) if last is None else last.defender_action,
                menu=sc.defender_menu_dims,
                audit_leakage=0.0 if last is None else last.audit_leakage,
                fidelity=1.0 if last is None else last.fidelity,
            ),
        }

    def observation_sizes(self) -> dict[str, int]:
        sc = self.scenario
        return {"attacker": attacker_obs_size(sc.attacker_nvec), "defender": defender_obs_size(sc.defender_nvec)}

    # ------------------------------------------------------------------ phase 1: plan
    def plan(self, defender_action: Any, attacker_action: Any) -> RoundPlan:
        """Validate and decode the actions. Draws nothing and changes nothing."""
        sc = self.scenario
        d_action = sc.defender_menu_dims.check(defender_action)
        a_action = sc.attacker_menu_dims.check(attacker_action)
        a_settings = sc.decode_attacker(a_action)
        return RoundPlan(
            defender_action=d_action,
            attacker_action=a_action,
            defense_settings=sc.decode_defender(d_action),
            attack_settings=a_settings,
            defense=defense_config_for(sc, d_action),
            attack=attack_for(sc, a_settings),
        )

    # ------------------------------------------------------------------ phase 2: defend
    def defend(self, plan: RoundPlan) -> Defended:
        """The victim draws its private batch and shares its (defended) update."""
        sc = self.scenario
        seed = int(self.rng.integers(2**31 - 1))
        t0 = time.perf_counter()
        idx = self.rng.choice(len(self.victim_x), size=sc.batch_size, replace=len(self.victim_x) < sc.batch_size)
        x, y = self.victim_x[idx], self.victim_y[idx]
        sent_model = plan.attack.prepare_model(self.server.model, self.spec, public_x=self.public_x)
        update, report = share_update(
            sent_model, x, y, plan.defense, seed=seed, update_kind=sc.update_kind, local_steps=sc.local_steps,
            local_lr=sc.local_lr, public_x=self.public_x, public_y=self.public_y,
        )
        knowledge = AttackerKnowledge(
            model=sent_model,
            spec=self.spec,
            batch_size=sc.batch_size,
            labels=y.clone() if sc.known_labels else None,
            public_x=self.public_x,
            public_y=self.public_y,
        )
        # The attack gets its own seed, derived from the round seed: it must not replay the client's
        # draws (e.g. PRECODE's sampling noise, seeded by the round seed in apply_defense).
        attack_seed = int(np.random.SeedSequence([seed, ATTACK_STREAM]).generate_state(1)[0])
        return Defended(
            x=x, y=y, update=update, report=report, seed=seed,
            attack_job=AttackJob(attack=plan.attack, update=update, knowledge=knowledge, seed=attack_seed),
            timings={"defense_s": time.perf_counter() - t0},
        )

    def audit_job(self, defended: Defended) -> AttackJob | None:
        """The defender's self-audit: Inverting Gradients with known labels on its own update."""
        if self.scenario.audit_iterations <= 0:
            return None
        attack = build_attack("inverting-gradients", iterations=self.scenario.audit_iterations, restarts=1)
        knowledge = dataclasses.replace(defended.attack_job.knowledge, labels=defended.y.clone())
        return AttackJob(attack=attack, update=defended.update, knowledge=knowledge, seed=defended.attack_job.seed + 1)

    # ------------------------------------------------------------------ phase 4: score
    def score(self, defended: Defended, result: AttackResult, audit: float | None) -> Scored:
        t0 = time.perf_counter()
        (scores,) = score_all(
            self.spec, [result], [defended.x], true_labels=[defended.y], lpips="lpips" in self.scenario.leakage_metric
        )
        skipped = bool(defended.update.metadata.get("skipped"))
        scored = Scored(
            scores=scores,
            # nothing sent, nothing leaked: the grey guess's chance similarity is not leakage
            leakage=0.0 if skipped else leakage_score(scores, self.scenario.leakage_metric),
            audit_leakage=0.0 if audit is None else audit,
            originals=self.spec.denormalize(defended.x).clamp(0, 1).cpu(),
            reconstructions=self.spec.denormalize(result.images.detach()).clamp(0, 1).cpu(),
        )
        defended.timings["score_s"] = time.perf_counter() - t0
        return scored

    # ------------------------------------------------------------------ phase 5: aggregate
    def federated_step(self, defended: Defended) -> None:
        """Benign clients' updates, aggregation with the victim's, evaluation; advances the round."""
        sc = self.scenario
        t0 = time.perf_counter()
        benign_updates = []
        for bx, by in self.benign:
            take = self.rng.choice(len(bx), size=min(len(bx), max(sc.batch_size, 8)), replace=False)
            benign_updates.append(
                compute_update(
                    self.server.model, bx[take], by[take], kind=sc.update_kind, local_steps=sc.local_steps,
                    local_lr=sc.local_lr,
                )
            )
        self.server.aggregate([defended.update] + benign_updates)
        self.round += 1
        if self.round % sc.eval_every == 0 or self.round == sc.rounds:
            self.accuracy, self.test_loss = self.server.evaluate()
            if not math.isfinite(self.test_loss) and self.diverged_at is None:
                self.diverged_at = self.round
        defended.timings["fl_s"] = time.perf_counter() - t0

    # ------------------------------------------------------------------ phase 6: reward
    def conclude(self, plan: RoundPlan, defended: Defended, result: AttackResult, scored: Scored) -> RoundOutcome:
        """Rewards, infos, the round's record and the next observations."""
        sc = self.scenario
        units = result.cost.units
        defense_units = defense_compute_units(plan.defense)
        fidelity = _finite(defended.report.fidelity)
        accuracy = _finite(self.accuracy)
        r = rewards(
            leakage=scored.leakage,
            attack_units=units,
            fidelity=fidelity,
            accuracy=accuracy,
            defense_units=defense_units,
            weights=sc.rewards,
        )
        final_loss = float(result.final_loss)
        matching_loss = final_loss if math.isfinite(final_loss) else None
        self.last = RoundRecord(
            round=self.round,
            defender_action=plan.defender_action,
            attacker_action=plan.attacker_action,
            defense_settings=plan.defense_settings,
            attack_settings=plan.attack_settings,
            strategy=plan.attack_settings["strategy"],
            applied=tuple(defended.report.applied),
            update=defended.update,
            matching_loss=matching_loss,
            audit_leakage=scored.audit_leakage,
            fidelity=fidelity,
            leakage=scored.leakage,
            scores=scored.scores,
            originals=scored.originals,
            reconstructions=scored.reconstructions,
        )
        self.timings = dict(defended.timings)
        mean = scored.scores.mean
        common: dict[str, Any] = {
            "round": self.round,
            "leakage": scored.leakage,
            "leakage_ssim": _finite(mean["ssim"]),
            "leakage_psnr": _finite(mean["psnr"]),
            "leakage_mse": _finite(mean["mse"]),
            "label_accuracy": _finite(scored.scores.label_accuracy or 0.0),
            "accuracy": accuracy,
            "test_loss": _finite(self.test_loss, default=float(np.finfo(np.float32).max)),
            "model_diverged": self.diverged_at is not None,
            "update_skipped": bool(defended.update.metadata.get("skipped")),
        }
        if self.diverged_at is not None:
            common["diverged_round"] = self.diverged_at
        if "lpips" in mean and math.isfinite(mean["lpips"]):
            common["leakage_lpips"] = mean["lpips"]
        attacker_info = dict(
            common,
            strategy=plan.attack_settings["strategy"],
            attack_settings=dict(plan.attack_settings),
            reward_leakage=r["attacker_leakage"],
            reward_cost=r["attacker_cost"],
            attack_units=float(units),
        )
        if matching_loss is not None:
            attacker_info["matching_loss"] = matching_loss
        infos = {
            "attacker": attacker_info,
            "defender": dict(
                common,
                defense_settings=dict(plan.defense_settings),
                defenses=list(defended.report.applied),
                reward_leakage=r["defender_leakage"],
                reward_fidelity=r["defender_fidelity"],
                reward_accuracy=r["defender_accuracy"],
                reward_overhead=r["defender_overhead"],
                fidelity=fidelity,
                defense_units=float(defense_units),
                audit_leakage=float(scored.audit_leakage),
            ),
        }
        return RoundOutcome(
            observations=self.observations(),
            rewards={"attacker": r["attacker"], "defender": r["defender"]},
            infos=infos,
            truncated=self.round >= sc.rounds,
            record=self.last,
        )


__all__ = [
    "Defended",
    "GameSnapshot",
    "LeakGame",
    "RoundOutcome",
    "RoundPlan",
    "RoundRecord",
    "Scored",
    "attack_for",
    "defense_config_for",
]

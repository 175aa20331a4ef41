"""The game engine behind every LeakGym environment: one federated-learning round per step.

A round is split into three phases so that a vector of games can batch the expensive middle one:

1. :meth:`LeakGame.defend` — the victim draws its private batch and computes its shared update
   under the defender's chosen defense (``leakgym.defenses.apply_defense``); a malicious server's
   model modification (``Attack.prepare_model``) happens first, because the server sends the model
   before the client trains.
2. the attack — ``Attack.reconstruct_batch`` on the shared update; :func:`run_attacks` groups the
   pending rounds of many games by attack configuration and runs each group as one engine call.
3. :meth:`LeakGame.finish` — match and score the reconstruction against the private batch,
   aggregate the victim's and the benign clients' updates on the server, measure accuracy, and
   compute observations, rewards and infos.

Everything random is drawn from generators seeded by :meth:`LeakGame.reset`, so the same seed and
the same actions give the same trajectory (on CPU).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from leakgym.attacks import build_attack
from leakgym.attacks.base import Attack, AttackerKnowledge, AttackResult
from leakgym.data import federated_split, load_dataset
from leakgym.defenses import DefenseConfig, DefenseReport, apply_defense
from leakgym.fl.client import compute_update
from leakgym.fl.server import Server
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import score_reconstruction
from leakgym.models import build_model

from .observations import attacker_obs_size, attacker_observation, defender_obs_size, defender_observation
from .rewards import defense_compute_units, leakage_score, rewards
from .scenario import Scenario


@lru_cache(maxsize=8)
def _dataset(name: str, image_size: int | None):
    return load_dataset(name, image_size=image_size)


def defense_config_for(scenario: Scenario, settings: dict[str, Any]) -> DefenseConfig:
    """Decoded defender settings -> the DefenseConfig applied this round."""
    from leakgym.defenses.oasis import BIT_NAMES

    bit_of = {name: bit for bit, name in BIT_NAMES.items()}
    values = dict(scenario.defense_defaults)
    values.update({k: v for k, v in settings.items() if k != "oasis"})
    values["oasis"] = sum(bit_of[name] for name in settings.get("oasis", []))
    return DefenseConfig(**values)


def attack_for(scenario: Scenario, settings: dict[str, Any]) -> Attack:
    """Decoded attacker settings -> a configured attack (budget fields set where the attack has them)."""
    from leakgym.attacks import ATTACKS

    cls = ATTACKS[settings["strategy"]]
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    overrides = {k: v for k, v in scenario.attack_defaults.items() if k in fields}
    for key in ("iterations", "restarts", "tv"):
        if key in fields:
            overrides[key] = settings[key]
    return build_attack(settings["strategy"], **overrides)


@dataclass
class PendingRound:
    """What phase 1 hands to the attack phase and on to phase 3."""

    defender_action: np.ndarray
    attacker_action: np.ndarray
    defense: DefenseConfig
    attack: Attack
    attack_settings: dict[str, Any]
    x: Tensor  # private batch, normalised
    y: Tensor
    update: SharedUpdate
    report: DefenseReport
    knowledge: AttackerKnowledge
    seed: int
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class RoundOutcome:
    observations: dict[str, np.ndarray]
    rewards: dict[str, float]
    infos: dict[str, dict[str, Any]]
    truncated: bool


class LeakGame:
    """The state of one LeakGym game: global model, clients, round counter, last observations."""

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
        self.last: dict[str, Any] = {}
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int) -> dict[str, np.ndarray]:
        sc = self.scenario
        self.rng = np.random.default_rng(seed)
        self.round = 0
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
        self.last = {
            "defender_action": np.zeros(len(sc.defender_nvec), dtype=np.int64),
            "attacker_action": np.zeros(len(sc.attacker_nvec), dtype=np.int64),
            "matching_loss": float("nan"),
            "audit_leakage": 0.0,
            "fidelity": 1.0,
            "update": None,
        }
        return self.observations()

    # ------------------------------------------------------------------ observations
    def observations(self) -> dict[str, np.ndarray]:
        sc = self.scenario
        frac = self.round / sc.rounds
        return {
            "attacker": attacker_observation(
                round_fraction=frac,
                update=self.last["update"],
                matching_loss=self.last["matching_loss"],
                last_action=self.last["attacker_action"],
                nvec=sc.attacker_nvec,
            ),
            "defender": defender_observation(
                round_fraction=frac,
                accuracy=self.accuracy,
                loss=self.test_loss,
                num_classes=self.spec.num_classes,
                last_action=self.last["defender_action"],
                nvec=sc.defender_nvec,
                audit_leakage=self.last["audit_leakage"],
                fidelity=self.last["fidelity"],
            ),
        }

    def observation_sizes(self) -> dict[str, int]:
        sc = self.scenario
        return {
            "attacker": attacker_obs_size(sc.attacker_nvec),
            "defender": defender_obs_size(sc.defender_nvec),
        }

    # ------------------------------------------------------------------ phase 1: defend
    def defend(self, defender_action: np.ndarray, attacker_action: np.ndarray) -> PendingRound:
        sc = self.scenario
        d_settings = sc.decode_defender(defender_action)
        a_settings = sc.decode_attacker(attacker_action)
        defense = defense_config_for(sc, d_settings)
        attack = attack_for(sc, a_settings)
        seed = int(self.rng.integers(2**31 - 1))
        t0 = time.perf_counter()
        idx = self.rng.choice(len(self.victim_x), size=sc.batch_size, replace=len(self.victim_x) < sc.batch_size)
        x, y = self.victim_x[idx], self.victim_y[idx]
        sent_model = attack.prepare_model(self.server.model, self.spec, public_x=self.public_x)
        update, report = apply_defense(
            sent_model,
            x,
            y,
            defense,
            update_kind=sc.update_kind,
            local_steps=sc.local_steps,
            local_lr=sc.local_lr,
            seed=seed,
            public_x=self.public_x,
            public_y=self.public_y,
        )
        knowledge = AttackerKnowledge(
            model=sent_model,
            spec=self.spec,
            batch_size=sc.batch_size,
            labels=y.clone() if sc.known_labels else None,
            public_x=self.public_x,
            public_y=self.public_y,
        )
        return PendingRound(
            defender_action=np.asarray(defender_action, dtype=np.int64),
            attacker_action=np.asarray(attacker_action, dtype=np.int64),
            defense=defense,
            attack=attack,
            attack_settings=a_settings,
            x=x,
            y=y,
            update=update,
            report=report,
            knowledge=knowledge,
            seed=seed,
            timings={"defense_s": time.perf_counter() - t0},
        )

    # ------------------------------------------------------------------ phase 3: finish
    def finish(self, pending: PendingRound, result: AttackResult) -> RoundOutcome:
        sc = self.scenario
        t0 = time.perf_counter()
        recon_unit = self.spec.denormalize(result.images.detach()).clamp(0, 1)
        orig_unit = self.spec.denormalize(pending.x).clamp(0, 1)
        scores = score_reconstruction(
            recon_unit,
            orig_unit,
            pred_labels=result.labels,
            true_labels=pending.y,
            lpips="lpips" in sc.leakage_metric,
        )
        leak = leakage_score(scores, sc.leakage_metric)
        t_score = time.perf_counter() - t0

        audit = self._self_audit(pending) if sc.audit_iterations > 0 else 0.0

        t1 = time.perf_counter()
        benign_updates = []
        for bx, by in self.benign:
            take = self.rng.choice(len(bx), size=min(len(bx), max(sc.batch_size, 8)), replace=False)
            benign_updates.append(
                compute_update(
                    self.server.model,
                    bx[take],
                    by[take],
                    kind=sc.update_kind,
                    local_steps=sc.local_steps,
                    local_lr=sc.local_lr,
                )
            )
        self.server.aggregate([pending.update] + benign_updates)
        self.round += 1
        if self.round % sc.eval_every == 0 or self.round == sc.rounds:
            self.accuracy, self.test_loss = self.server.evaluate()
        t_fl = time.perf_counter() - t1

        units = result.cost.units
        defense_units = defense_compute_units(pending.defense)
        r = rewards(
            leakage=leak,
            attack_units=units,
            fidelity=pending.report.fidelity,
            accuracy=self.accuracy,
            defense_units=defense_units,
            weights=sc.rewards,
        )
        matching_loss = float(result.final_loss)
        self.last.update(
            defender_action=pending.defender_action,
            attacker_action=pending.attacker_action,
            matching_loss=matching_loss,
            audit_leakage=audit,
            fidelity=pending.report.fidelity,
            update=pending.update,
            originals=orig_unit.cpu(),
            reconstructions=recon_unit.cpu(),
            scores=scores,
            strategy=pending.attack_settings["strategy"],
            applied=list(pending.report.applied),
        )
        self.timings = dict(pending.timings, score_s=t_score, fl_s=t_fl)
        truncated = self.round >= sc.rounds
        common = {
            "round": self.round,
            "leakage": leak,
            "leakage_ssim": scores.mean["ssim"],
            "leakage_psnr": scores.mean["psnr"],
            "leakage_mse": scores.mean["mse"],
            "label_accuracy": float(scores.label_accuracy) if scores.label_accuracy is not None else 0.0,
            "accuracy": float(self.accuracy),
            "test_loss": float(self.test_loss),
        }
        if "lpips" in scores.mean and np.isfinite(scores.mean["lpips"]):
            common["leakage_lpips"] = scores.mean["lpips"]
        infos = {
            "attacker": dict(
                common,
                reward_leakage=r["attacker_leakage"],
                reward_cost=r["attacker_cost"],
                attack_units=float(units),
                matching_loss=matching_loss,
            ),
            "defender": dict(
                common,
                reward_leakage=r["defender_leakage"],
                reward_fidelity=r["defender_fidelity"],
                reward_accuracy=r["defender_accuracy"],
                reward_overhead=r["defender_overhead"],
                fidelity=float(pending.report.fidelity),
                defense_units=float(defense_units),
                audit_leakage=float(audit),
            ),
        }
        return RoundOutcome(
            observations=self.observations(),
            rewards={"attacker": r["attacker"], "defender": r["defender"]},
            infos=infos,
            truncated=truncated,
        )

    def _self_audit(self, pending: PendingRound) -> float:
        """The client attacks its own shared update (Inverting Gradients, labels known) and scores it.

        This is the defender's only view of leakage: it knows its private batch, so it can measure
        what a fixed reference attacker would recover from the update it just shared.
        """
        audit_attack = build_attack("inverting-gradients", iterations=self.scenario.audit_iterations, restarts=1)
        knowledge = dataclasses.replace(pending.knowledge, labels=pending.y.clone())
        result = audit_attack.reconstruct(pending.update, knowledge, seed=pending.seed + 1)
        scores = score_reconstruction(
            self.spec.denormalize(result.images.detach()).clamp(0, 1),
            self.spec.denormalize(pending.x).clamp(0, 1),
        )
        return float(np.clip(scores.mean["ssim"], 0.0, 1.0))

    # ------------------------------------------------------------------ one whole round
    def play_round(self, defender_action: np.ndarray, attacker_action: np.ndarray) -> RoundOutcome:
        pending = self.defend(defender_action, attacker_action)
        (result,) = run_attacks([pending])
        return self.finish(pending, result)


def run_attacks(pendings: list[PendingRound]) -> list[AttackResult]:
    """Run the attacks of many pending rounds, one batched engine call per attack configuration."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(pendings):
        key = (type(p.attack), repr(p.attack.config), id(p.knowledge.model) if p.attack.malicious else 0)
        groups.setdefault(key, []).append(i)
    results: list[AttackResult | None] = [None] * len(pendings)
    for members in groups.values():
        attack = pendings[members[0]].attack
        t0 = time.perf_counter()
        out = attack.reconstruct_batch(
            [pendings[i].update for i in members],
            [pendings[i].knowledge for i in members],
            seed=pendings[members[0]].seed,
        )
        elapsed = time.perf_counter() - t0
        for i, r in zip(members, out):
            results[i] = r
            pendings[i].timings["attack_s"] = elapsed / len(members)
    return results  # type: ignore[return-value]

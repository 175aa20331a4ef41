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
from torch import Tensor, nn

from leakgym.attacks import ATTACKS, build_attack
from leakgym.attacks.base import Attack, AttackerKnowledge, AttackResult
from leakgym.data import load_dataset, split_indices
from leakgym.defenses import (
    DefenseCall,
    DefenseConfig,
    DefenseReport,
    apply_defense_many,
    defense_compute_units,
)
from leakgym.defenses.registry import seeded_global_rng
from leakgym.devices import check_device
from leakgym.fl import batched as fl_batched
from leakgym.fl.bank import ModelBank
from leakgym.fl.client import compute_update
from leakgym.fl.server import Server
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import ReconstructionScores
from leakgym.models import build_model

from .menus import Menu
from .observations import attacker_obs_size, attacker_observation, defender_obs_size, defender_observation
from .rewards import leakage_score, rewards
from .round import AttackJob
from .scenario import Scenario, local_optimizer, round_local_lr
from .shared_data import SharedImages, shared_images

#: stream tag of the attack's seed (``SeedSequence([round_seed, ATTACK_STREAM])``)
ATTACK_STREAM = 1
#: stream tag of the seed of torch's global RNG while the benign clients train (PRECODE samples and
#: dropout masks draw from it): ``SeedSequence([round_seed, BENIGN_STREAM])``
BENIGN_STREAM = 2


@lru_cache(maxsize=8)
def _dataset(name: str, image_size: int | None):
    return load_dataset(name, image_size=image_size)


def defense_config_for(scenario: Scenario, defender_action: Any, menu: Menu | None = None) -> DefenseConfig:
    """Defender action -> the DefenseConfig applied this round (scenario defaults + menu fields)."""
    fields = (menu or scenario.defender_menu_dims).config_fields(defender_action)
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


@dataclass(frozen=True)
class Drawn:
    """Phase 2a: what the victim's round starts from (drawn from the game's generator)."""

    seed: int
    x: Tensor  # private batch, normalised
    y: Tensor
    model: Any  # the model the server sent (maybe maliciously modified)
    seconds: float


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
    #: the attacker's summary of ``update`` (:func:`~leakgym.envs.observations.update_summaries`)
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
    observations: dict[str, np.ndarray]
    rewards: dict[str, float]
    infos: dict[str, dict[str, Any]]
    truncated: bool
    record: RoundRecord


@dataclass
class GameSnapshot:
    """Everything a round may change, copied (see :meth:`LeakGame.snapshot`)."""

    model_state: dict[str, Tensor]
    """The model's state dict; without the parameters when :attr:`banked` (the bank's copy holds them)."""
    banked: bool
    rng_state: dict[str, Any]
    round: int
    accuracy: float
    test_loss: float
    last: RoundRecord | None
    timings: dict[str, float]
    diverged_at: int | None


def _by_images(games: list[LeakGame]) -> dict[SharedImages, list[int]]:
    """The indices of ``games`` grouped by the shared images they read (one group per dataset and device)."""
    groups: dict[SharedImages, list[int]] = {}
    for i, g in enumerate(games):
        groups.setdefault(g.images, []).append(i)
    return groups


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
        self.device = check_device(device)
        self.dataset = _dataset(scenario.dataset, scenario.image_size)
        self.spec = self.dataset.spec
        if scenario.leakage_metric in ("lpips",):
            from leakgym.metrics import lpips_available, lpips_status

            if not lpips_available():
                raise ValueError(
                    f"leakage_metric='lpips' needs the pretrained LPIPS backbone weights: {lpips_status()}; or "
                    "choose 'ssim', 'psnr' or 'ssim+psnr'"
                )
        #: the scenario's action menus, built once (the scenario is fixed for the game's lifetime)
        self.menus: dict[str, Menu] = {role: scenario.menu(role) for role in self.agents}
        self.round = 0
        self.last: RoundRecord | None = None
        self.timings: dict[str, float] = {}
        self.diverged_at: int | None = None
        self._signed: tuple[nn.Module, tuple | None] | None = None  # (server model, its batch signature)
        self._kept_plan: RoundPlan | None = None  # a validated step's plan, for the Round (plan)
        self.bank: ModelBank | None = None  # the vector's stacked parameters (use_bank), None alone
        self.bank_row = 0

    def batch_signature(self, model: nn.Module) -> tuple | None:
        """:func:`leakgym.fl.batched.signature` of ``model`` when :func:`leakgym.fl.batched.supports` it,
        else None: what decides which games' clients are batched together. For the server's model
        (rebuilt at reset; its architecture, device and dtype fixed until then) it is computed once
        per episode rather than every round."""
        server = self.server.model
        if model is server and self._signed is not None and self._signed[0] is server:
            return self._signed[1]
        key = fl_batched.signature(model) if fl_batched.supports(model) else None
        if model is server:
            self._signed = (server, key)
        return key

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int) -> dict[str, np.ndarray]:
        sc = self.scenario
        self.rng = np.random.default_rng(seed)
        self.round = 0
        self.diverged_at = None
        split = split_indices(
            self.dataset,
            num_clients=sc.num_clients + 1,
            public_fraction=sc.public_fraction,
            alpha=sc.dirichlet_alpha,
            seed=seed,
        )
        dev = self.device
        # The clients' images are rows of one normalised copy of the dataset that every game of the
        # process reads (envs/shared_data.py); this game keeps its split as index sets on the CPU.
        self.images = shared_images(self.dataset, dev)
        self.public_x = self.dataset.train_x[split.public].to(dev)  # unit images (attacker priors, defender auxiliaries)
        self.public_y = self.dataset.train_y[split.public].to(dev)
        self.victim_rows, self.benign_rows = split.clients[0], split.clients[1:]
        eval_x, eval_y = self.images.evaluation(min(sc.eval_size, len(split.test)))
        model = build_model(sc.model, self.spec, precode=sc.precode, width=sc.model_width, seed=seed, device=dev)
        if self.bank is not None:
            self.bank.bind(self.bank_row, model)  # the previous episode's model is released
        self._has_buffers = any(True for _ in model.buffers())
        self.server = Server(model, lr=sc.server_lr, eval_x=eval_x, eval_y=eval_y)
        self.accuracy, self.test_loss = self.server.evaluate()
        self.last = None
        self.timings = {}
        return self.observations()

    # ------------------------------------------------------------------ snapshot / restore
    def snapshot(self) -> GameSnapshot:
        """Everything a round may change, copied. A game whose model is held by a :class:`ModelBank`
        (:meth:`use_bank`) leaves its parameters out: the :class:`~leakgym.envs.round.Round` copies the
        bank's rows of all its games at once (one copy per parameter name, not per game and name)."""
        model, banked = self.server.model, self.banked
        if not banked:
            state = model.state_dict()  # detached
        elif self._has_buffers:
            state = {k: v for k, v in model.state_dict().items() if k not in self.bank.stacks}
        else:
            state = {}  # the bank holds all of it (a model without buffers: no walk over its modules)
        return GameSnapshot(
            model_state={k: v.clone() for k, v in state.items()},
            banked=banked,
            rng_state=copy.deepcopy(self.rng.bit_generator.state),
            round=self.round,
            accuracy=self.accuracy,
            test_loss=self.test_loss,
            last=self.last,
            timings=dict(self.timings),
            diverged_at=self.diverged_at,
        )

    def restore(self, snap: GameSnapshot) -> None:
        """Back to ``snap``; a banked game's parameters are restored by the Round, from the bank's copy."""
        self.server.model.load_state_dict(snap.model_state, strict=not snap.banked)
        self.rng.bit_generator.state = snap.rng_state
        self.round, self.accuracy, self.test_loss = snap.round, snap.accuracy, snap.test_loss
        self.last, self.timings = snap.last, snap.timings
        self.diverged_at = snap.diverged_at

    # ------------------------------------------------------------------ the vector's model bank
    def use_bank(self, bank: ModelBank, row: int) -> None:
        """Hold the global model's parameters in row ``row`` of ``bank`` (a vector env's games share one,
        :mod:`leakgym.fl.bank`): from the next :meth:`reset` on (now, if the game has a model). The bind
        comes first: a refused one (``ValueError``: the model is in another bank) leaves the game as it was."""
        if hasattr(self, "server"):
            bank.bind(row, self.server.model)
        self.bank, self.bank_row = bank, row

    @property
    def banked(self) -> bool:
        """Whether the global model's parameters are row :attr:`bank_row` of :attr:`bank` (and still its
        views): the Round restores a banked game's parameters from that row's copy."""
        if self.bank is None:
            return False
        found = ModelBank.of([self.server.model])
        return found is not None and found[0] is self.bank and found[1] == [self.bank_row]

    # ------------------------------------------------------------------ observations
    def observations(self) -> dict[str, np.ndarray]:
        sc = self.scenario
        frac = self.round / sc.rounds
        last = self.last
        return {
            "attacker": attacker_observation(
                round_fraction=frac,
                summary=None if last is None else last.update_summary,
                matching_loss=None if last is None else last.matching_loss,
                last_action=np.zeros(len(self.menus["attacker"].dims), np.int64) if last is None
                else last.attacker_action,
                menu=self.menus["attacker"],
            ),
            "defender": defender_observation(
                round_fraction=frac,
                accuracy=self.accuracy,
                loss=self.test_loss,
                num_classes=self.spec.num_classes,
                last_action=np.zeros(len(self.menus["defender"].dims), np.int64) if last is None
                else last.defender_action,
                menu=self.menus["defender"],
                audit_leakage=0.0 if last is None else last.audit_leakage,
                fidelity=1.0 if last is None else last.fidelity,
            ),
        }

    def observation_sizes(self) -> dict[str, int]:
        sc = self.scenario
        return {"attacker": attacker_obs_size(sc.attacker_nvec), "defender": defender_obs_size(sc.defender_nvec)}

    # ------------------------------------------------------------------ phase 1: plan
    def plan(self, defender_action: Any, attacker_action: Any, *, keep: bool = False) -> RoundPlan:
        """Validate and decode the actions. Draws nothing and changes no game state.

        ``keep``: the step validating its actions before the :class:`~leakgym.envs.round.Round` plays
        them (``LeakGymParallelEnv.check_actions``) keeps the decoded plan, and the Round's call for the
        same actions takes it instead of decoding again (building the attack and its config: about
        0.2 ms a game and step, a tenth of a host-bound vector step). A kept plan serves one call."""
        sc, defender, attacker = self.scenario, self.menus["defender"], self.menus["attacker"]
        d_action, a_action = defender.check(defender_action), attacker.check(attacker_action)
        kept, self._kept_plan = self._kept_plan, None
        if (kept is not None and np.array_equal(kept.defender_action, d_action)
                and np.array_equal(kept.attacker_action, a_action)):
            plan = kept  # a plan depends on the actions and the (fixed) scenario only
        else:
            a_settings = attacker.read(a_action)
            plan = RoundPlan(
                defender_action=d_action,
                attacker_action=a_action,
                defense_settings=sc.decode_defender(d_action, defender),
                attack_settings=a_settings,
                defense=defense_config_for(sc, d_action, defender),
                attack=attack_for(sc, a_settings),
            )
        if keep:
            self._kept_plan = plan
        return plan

    # ------------------------------------------------------------------ phase 2: defend
    def defend(self, plan: RoundPlan) -> Defended:
        """The victim draws its private batch and shares its (defended) update."""
        drawn = self.draw(plan)
        t0 = time.perf_counter()
        (shared,) = apply_defense_many([self.defense_call(plan, drawn)])
        return self.share(plan, drawn, shared, time.perf_counter() - t0)

    def draw(self, plan: RoundPlan) -> Drawn:
        """Phase 2a: the round seed, the victim's private batch and the model the server sends."""
        (drawn,) = type(self).draw_all([self], [plan])
        return drawn

    @staticmethod
    def draw_all(games: list[LeakGame], plans: list[RoundPlan]) -> list[Drawn]:
        """:meth:`draw` of every game, each from its own generator, with the private batches of games that
        share their images read at once (:meth:`~leakgym.envs.shared_data.SharedImages.read`)."""
        t0 = time.perf_counter()
        seeds, rows = [], []
        for g in games:
            sc = g.scenario
            seeds.append(int(g.rng.integers(2**31 - 1)))
            n = len(g.victim_rows)
            rows.append(g.victim_rows[g.rng.choice(n, size=sc.batch_size, replace=n < sc.batch_size)])
        batches: list = [None] * len(games)
        for images, members in _by_images(games).items():
            for i, batch in zip(members, images.read([rows[i] for i in members])):
                batches[i] = batch
        share = (time.perf_counter() - t0) / len(games)
        out = []
        for g, plan, seed, (x, y) in zip(games, plans, seeds, batches):
            t1 = time.perf_counter()
            sent_model = plan.attack.prepare_model(g.server.model, g.spec, public_x=g.public_x)
            out.append(Drawn(seed=seed, x=x, y=y, model=sent_model, seconds=share + time.perf_counter() - t1))
        return out

    def defense_call(self, plan: RoundPlan, drawn: Drawn, clean: SharedUpdate | None = None,
                     clean_seconds: float = 0.0) -> DefenseCall:
        """Phase 2b's arguments: the victim's defense pipeline call for ``drawn`` (``clean``: its clean
        update when the Round computed it already, for all games at once, :meth:`clean_updates`)."""
        sc = self.scenario
        return DefenseCall(drawn.model, drawn.x, drawn.y, plan.defense, seed=drawn.seed, update_kind=sc.update_kind,
                           local_steps=sc.local_steps, local_lr=self.local_lr_now(), public_x=self.public_x,
                           public_y=self.public_y, clean=clean, clean_seconds=clean_seconds,
                           optimizer=local_optimizer(sc))

    def local_lr_now(self) -> float:
        """The clients' local learning rate in the round being played (the scenario's ``local_lr_schedule``,
        :func:`leakgym.envs.scenario.round_local_lr`; ``local_lr`` for the constant schedule)."""
        return round_local_lr(self.scenario, self.round)

    def share(self, plan: RoundPlan, drawn: Drawn, shared: tuple[SharedUpdate, DefenseReport],
              seconds: float) -> Defended:
        """Phase 2c: what the server receives, ``shared`` = ``(update, report)`` of the pipeline
        (:func:`~leakgym.defenses.apply_defense_many`, all games' victims at once in a Round), which took
        ``seconds`` for this game; and what the attacker knows."""
        sc = self.scenario
        x, y, seed, sent_model = drawn.x, drawn.y, drawn.seed, drawn.model
        update, report = shared
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
            timings={"defense_s": drawn.seconds + seconds},
        )

    @staticmethod
    def clean_updates(games: list[LeakGame], drawn: list[Drawn]) -> tuple[list[SharedUpdate | None], list[float]]:
        """The victims' clean updates of all games as batched computations (the Round's ``batch_clients``
        path): games whose sent model :func:`leakgym.fl.batched.supports` and whose architecture, batch shape
        and protocol agree make one :func:`leakgym.fl.batched.client_updates` call; the others get ``None``
        (their pipeline computes it). Equal to ``compute_update`` to floating-point rounding. Returns the
        updates and each game's share of its call's wall time."""
        groups: dict[tuple, list[int]] = {}
        for i, (g, d) in enumerate(zip(games, drawn)):
            sc, signature = g.scenario, g.batch_signature(d.model)
            if signature is not None:
                key = (signature, tuple(d.x.shape), sc.update_kind, sc.local_steps, g.local_lr_now(),
                       local_optimizer(sc))
                groups.setdefault(key, []).append(i)
        cleans: list[SharedUpdate | None] = [None] * len(games)
        seconds = [0.0] * len(games)
        for (_, _, kind, steps, lr, optimizer), members in groups.items():
            if len(members) < 2:
                continue
            t0 = time.perf_counter()
            out = fl_batched.client_updates([drawn[i].model for i in members], [drawn[i].x for i in members],
                                            [drawn[i].y for i in members], kind=kind, local_steps=steps, local_lr=lr,
                                            signed=True, optimizer=optimizer)
            share = (time.perf_counter() - t0) / len(members)
            for i, u in zip(members, out):
                cleans[i], seconds[i] = u, share
        return cleans, seconds

    def audit_job(self, defended: Defended) -> AttackJob | None:
        """The defender's self-audit: Inverting Gradients with known labels on its own update."""
        if self.scenario.audit_iterations <= 0:
            return None
        attack = build_attack("inverting-gradients", iterations=self.scenario.audit_iterations, restarts=1)
        knowledge = dataclasses.replace(defended.attack_job.knowledge, labels=defended.y.clone())
        return AttackJob(attack=attack, update=defended.update, knowledge=knowledge, seed=defended.attack_job.seed + 1)

    # ------------------------------------------------------------------ phase 4: score
    def score(self, defended: Defended, audit: float | None, scores: ReconstructionScores,
              images: tuple[Tensor, Tensor, Tensor], seconds: float) -> Scored:
        """Phase 4 of this game, from what the :class:`~leakgym.envs.round.Round` computed for all games
        at once (:func:`~leakgym.envs.round.score_all`): this game's ``scores``, its ``images``
        (originals and reconstructions, unit images on the CPU, and the private labels on the CPU) and
        its share of the time, ``seconds``."""
        t0 = time.perf_counter()
        skipped = bool(defended.update.metadata.get("skipped"))
        scored = Scored(
            scores=scores,
            # nothing sent, nothing leaked: the grey guess's chance similarity is not leakage
            leakage=0.0 if skipped else leakage_score(scores, self.scenario.leakage_metric),
            audit_leakage=0.0 if audit is None else audit,
            originals=images[0],
            reconstructions=images[1],
            labels=images[2],
        )
        defended.timings["score_s"] = seconds + time.perf_counter() - t0
        return scored

    # ------------------------------------------------------------------ phase 5: aggregate
    def federated_step(self, defended: Defended) -> None:
        """Benign clients' updates, aggregation with the victim's, evaluation; advances the round."""
        t0 = time.perf_counter()
        self.federated_step_from(defended, self.benign_batches())
        defended.timings["fl_s"] = time.perf_counter() - t0

    def benign_batches(self) -> list[tuple[Tensor, Tensor]]:
        """This round's batch of every benign client, drawn from the game's generator in client order."""
        return self.images.read(self.draw_benign_rows())

    def draw_benign_rows(self) -> list[Tensor]:
        """The training-set rows of this round's batch of every benign client (what :meth:`benign_batches`
        reads), drawn from the game's generator in client order."""
        size = max(self.scenario.batch_size, 8)
        return [shard[self.rng.choice(len(shard), size=min(len(shard), size), replace=False)]
                for shard in self.benign_rows]

    def evaluates_next(self) -> bool:
        """Whether the round being played ends with an evaluation of the global model."""
        sc = self.scenario
        return (self.round + 1) % sc.eval_every == 0 or self.round + 1 == sc.rounds

    def advance_round(self, evaluate=None) -> None:
        """Count the round; ``evaluate() -> (accuracy, test_loss)`` when :meth:`evaluates_next` said so."""
        self.round += 1
        if evaluate is not None:
            self.accuracy, self.test_loss = evaluate()
            if not math.isfinite(self.test_loss) and self.diverged_at is None:
                self.diverged_at = self.round

    @staticmethod
    def federated_steps(games: list[LeakGame], defended: list[Defended]) -> None:
        """:meth:`federated_step` of every game, as batched computations over the games (the Round's
        ``batch_clients`` path): each game draws its clients' batches from its own generator as
        :meth:`federated_step` does; then the benign updates, aggregations and evaluations of games that
        share an architecture and protocol are one computation each (:mod:`leakgym.fl.batched`, BatchNorm
        running statistics included), equal to :meth:`federated_step` to floating-point rounding
        (aggregation exactly). Games whose model :func:`leakgym.fl.batched.supports` rejects (PRECODE,
        dropout) or whose clients' batch sizes differ run :meth:`federated_step`."""
        t0 = time.perf_counter()
        groups: dict[tuple, list[int]] = {}
        rows: dict[int, list[Tensor]] = {}
        for i, g in enumerate(games):
            sc, signature = g.scenario, g.batch_signature(g.server.model)
            if signature is None:
                g.federated_step(defended[i])
                continue
            rows[i] = g.draw_benign_rows()
            sizes = {len(r) for r in rows[i]}
            if len(sizes) != 1:
                # Ragged client batches: this game's updates one client at a time, from the same draws.
                g.federated_step_from(defended[i], g.images.read(rows[i]))
                continue
            key = (signature, len(rows[i]), sizes.pop(), sc.update_kind, sc.local_steps, g.local_lr_now(),
                   local_optimizer(sc), sc.server_lr, id(g.images))
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            # Every client batch of the group in one read of the shared images: (games, clients, batch, ...)
            images = games[members[0]].images
            ((x, y),) = images.read([torch.cat([r for i in members for r in rows[i]])])
            shape = (len(members), len(rows[members[0]]), len(rows[members[0]][0]))
            x, y = x.reshape(*shape, *x.shape[1:]), y.reshape(shape)
            LeakGame._federated_group([games[i] for i in members], [defended[i] for i in members], x, y)
        share = (time.perf_counter() - t0) / len(games)
        for d in defended:
            d.timings["fl_s"] = share

    def federated_step_from(self, defended: Defended, batches: list[tuple[Tensor, Tensor]]) -> None:
        """:meth:`federated_step` with the benign clients' batches already drawn. The clients train with
        torch's global RNG seeded from the round seed (PRECODE's bottleneck and dropout draw from it), so
        the same game seed gives the same round whatever the process's RNG state."""
        sc = self.scenario
        seed = int(np.random.SeedSequence([defended.seed, BENIGN_STREAM]).generate_state(1)[0])
        with seeded_global_rng(seed, self.device):
            updates = [compute_update(self.server.model, bx, by, kind=sc.update_kind, local_steps=sc.local_steps,
                                      local_lr=self.local_lr_now(), optimizer=local_optimizer(sc))
                       for bx, by in batches]
        self.server.aggregate([defended.update] + updates)
        self.advance_round(self.server.evaluate if self.evaluates_next() else None)

    @staticmethod
    def _federated_group(games: list[LeakGame], defended: list[Defended], x: Tensor, y: Tensor) -> None:
        """Phase 5 of games of one architecture and protocol, as one computation per step; ``x``/``y``:
        the benign clients' batches, ``(games, clients, batch, ...)``."""
        sc, model = games[0].scenario, games[0].server.model
        lr, optimizer = games[0].local_lr_now(), local_optimizer(sc)  # (the group shares both)
        models = [g.server.model for g in games]
        params = fl_batched.stack_parameters(models)
        buffers = fl_batched.stack_buffers(models) or None
        benign = fl_batched.benign_updates(model, params, x, y, kind=sc.update_kind, local_steps=sc.local_steps,
                                           local_lr=lr, buffers=buffers, optimizer=optimizer)
        k, b = x.shape[1], x.shape[2]
        # Slot 0: the victim's update (weight 0 when it sent nothing, or for names it lacks); 1..K: benign.
        victim = {name: torch.stack([d.update.tensors[name] if name in d.update.tensors else torch.zeros_like(p)
                                     for d, p in zip(defended, params[name].unbind(0))])
                  for name in params if any(name in d.update.tensors for d in defended)}
        sent = [0.0 if d.update.metadata.get("skipped", False) else float(d.update.batch_size) for d in defended]
        weights = torch.tensor([[w] + [float(b)] * k for w in sent], dtype=torch.float64)
        slots = [victim] + [{name: t[:, j] for name, t in benign.tensors.items()} for j in range(k)]
        missing = [i for i, d in enumerate(defended) if any(name not in d.update.tensors for name in params)]
        if missing:
            # A victim's update without some global parameter: that game's mean over those names
            # excludes the victim (Server.aggregate's per-name rule), so it is aggregated on its own.
            for i in missing:
                games[i].server.aggregate([defended[i].update]
                                          + [fl_batched.unpack(benign, i, j, kind=sc.update_kind, batch_size=b,
                                                               local_steps=sc.local_steps, local_lr=lr,
                                                               optimizer=optimizer,
                                                               model=models[i])
                                             for j in range(k)])
        step = sc.server_lr if sc.update_kind == "gradient" else 1.0
        keep = [i for i in range(len(games)) if i not in missing]
        if keep:
            index = torch.tensor(keep)
            new = fl_batched.aggregate_many(
                {n: p[index.to(p.device)] for n, p in params.items()},
                [{n: t[index.to(t.device)] for n, t in slot.items()} for slot in slots], weights[index], step=step)
            if buffers is not None:
                # BN statistics: Server.aggregate averages those of the updates that carry them.
                carried = [defended[i].update.buffers for i in keep]
                victim_buffers = {name: torch.stack([c[name] if c else buffers[name][i] for c, i in zip(carried, keep)])
                                  for name in buffers}
                buffer_weights = weights[index].clone()
                buffer_weights[:, 0] = torch.tensor([w if c else 0.0 for w, c in zip(weights[index, 0].tolist(), carried)],
                                                    dtype=torch.float64)
                new.update(fl_batched.average_buffers_many(
                    {n: t[index.to(t.device)] for n, t in buffers.items()},
                    [victim_buffers] + [{n: t[index.to(t.device), j] for n, t in benign.buffers.items()}
                                        for j in range(k)], buffer_weights))
            # Every game's new state into its model. The parameters of a vector's games are rows of one
            # ModelBank: one copy per name. The rest (BN statistics, or models without a bank): one
            # multi-tensor copy (a fused kernel on a GPU) rather than a copy per game and tensor.
            banked = ModelBank.of([models[i] for i in keep])
            if banked is not None:
                bank, bank_rows = banked
                bank.scatter(bank_rows, {n: new[n] for n in params})
            rest = [n for n in new if banked is None or n not in params]
            if rest:
                rows = {name: new[name].unbind(0) for name in rest}
                destinations, sources = [], []
                for row, i in enumerate(keep):
                    state = dict(models[i].named_parameters())
                    state.update(models[i].named_buffers())
                    for name in rest:
                        destinations.append(state[name])
                        sources.append(rows[name][row])
                with torch.no_grad():
                    torch._foreach_copy_(destinations, sources)
        due = [i for i, g in enumerate(games) if g.evaluates_next()]
        results: dict[int, tuple[float, float]] = {}
        if due:
            s0 = games[due[0]].server
            shared = all(games[i].server.eval_x is s0.eval_x and games[i].server.eval_y is s0.eval_y for i in due)
            if keep and set(due) <= set(keep):  # the models now hold `new`: evaluate those stacks directly
                row_of = {i: row for row, i in enumerate(keep)}
                at = torch.tensor([row_of[i] for i in due])
                names = set(params)
                stacked = {n: t.index_select(0, at.to(t.device)) for n, t in new.items()}
                due_params = {n: t for n, t in stacked.items() if n in names}
                due_buffers = {n: t for n, t in stacked.items() if n not in names and t.is_floating_point()}
            else:
                due_params = fl_batched.stack_parameters([models[i] for i in due])
                due_buffers = fl_batched.stack_buffers([models[i] for i in due])
            acc, loss = fl_batched.evaluate_many(
                model, due_params,
                s0.eval_x if shared else [games[i].server.eval_x for i in due],
                s0.eval_y if shared else [games[i].server.eval_y for i in due],
                buffers=due_buffers or None)
            results = {i: (a, lo) for i, a, lo in zip(due, acc, loss)}
        for i, g in enumerate(games):
            g.advance_round((lambda r=results[i]: r) if i in results else None)

    # ------------------------------------------------------------------ phase 6: reward
    def conclude(self, plan: RoundPlan, defended: Defended, result: AttackResult, scored: Scored,
                 update_summary: np.ndarray) -> RoundOutcome:
        """Rewards, infos, the round's record and the next observations (``update_summary``: the
        attacker's summary of the shared update, computed for all games of the round at once)."""
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
            update_summary=update_summary,
            matching_loss=matching_loss,
            audit_leakage=scored.audit_leakage,
            fidelity=fidelity,
            leakage=scored.leakage,
            scores=scored.scores,
            originals=scored.originals,
            reconstructions=scored.reconstructions,
            labels=scored.labels,
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

"""One federated-learning round, for one game or many: defend -> attack -> score -> aggregate -> reward.

:class:`Round` is the only place that plays a round. The PettingZoo env, the Gymnasium single-agent
view and the vector env hand it their games and actions; the reproduction harness calls its phase
functions (:func:`share_update`, :func:`reconstruct_all`, :func:`score_all`). Reading
:meth:`Round.play` top to bottom is reading a round:

1. **plan** — every action is validated and decoded into a :class:`~leakgym.defenses.DefenseConfig`
   and an :class:`~leakgym.attacks.base.Attack` (:meth:`LeakGame.plan`). A bad action raises
   ``ValueError`` here, before any game draws a random number or changes state.
2. **defend** — each victim draws its private batch (:meth:`LeakGame.draw`; a malicious server's
   model modification comes first, because the server sends the model before the client trains),
   and the defense pipelines of all games run as one :func:`~leakgym.defenses.apply_defense_many`,
   the update-side defenses batched over the games (:meth:`LeakGame.share` packs each result). With
   ``batch_clients=True`` the victims' clean updates of all games are one batched computation
   (:meth:`LeakGame.clean_updates`) that the pipelines reuse, and the step defenses run batched over
   the games (DCS² synthesises every game's concealed samples at once).
3. **attack** — :func:`reconstruct_all` runs the attacks of all games as one batched engine call for
   all optimisation strategies whatever the budgets (per-problem iterations, restarts, TV weight,
   learning rate) and one call per other strategy, each game with its *own* seed, so a game's
   reconstruction does not depend on its neighbours.
4. **score** — :func:`score_all` matches and scores reconstructions against the private batches;
   the leakage score of :mod:`leakgym.envs.rewards`; the defender's optional self-audit.
5. **aggregate** — benign clients' updates, server aggregation and evaluation
   (:meth:`LeakGame.federated_step`, or for all games at once with ``batch_clients=True``:
   :meth:`LeakGame.federated_steps`, :mod:`leakgym.fl.batched`).
6. **reward** — rewards, infos and observations (:meth:`LeakGame.conclude`; the attacker's summaries of
   the shared updates for all games at once, :func:`~leakgym.envs.observations.update_summaries`).

Atomicity: every game is snapshotted before phase 2 (the parameters of a vector's games as one copy
of their :class:`~leakgym.fl.bank.ModelBank` rows); if anything fails, every game of the round is
restored to exactly its state before the round (model, generator, round counter, last record) and
the failure is raised as :class:`RoundError`, naming the round, the actions and the cause (a
``KeyboardInterrupt`` is raised as itself, after the same restore).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from leakgym.attacks.base import Attack, AttackCost, AttackerKnowledge, AttackResult
from leakgym.attacks.engine.optimization import OptimizationAttack, reconstruct_jointly
from leakgym.defenses import DefenseConfig, DefenseReport, apply_defense, apply_defense_many
from leakgym.devices import to_host
from leakgym.fl.bank import ModelBank
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import ReconstructionScores, score_reconstructions

from .observations import update_summaries

if TYPE_CHECKING:
    from .game import LeakGame, RoundOutcome, RoundPlan


class RoundError(RuntimeError):
    """A round failed for a reason other than an invalid action.

    The message names the scenario, the round and the actions; ``__cause__`` is the original
    exception. Every game of the round is left exactly as it was before the round.
    """


# --------------------------------------------------------------------------------------------------
# Phase functions (also used by the reproduction harness)
# --------------------------------------------------------------------------------------------------
def share_update(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    defense: DefenseConfig,
    *,
    seed: int,
    update_kind: str = "gradient",
    local_steps: int = 1,
    local_lr: float = 0.1,
    public_x: Tensor | None = None,
    public_y: Tensor | None = None,
    clean: SharedUpdate | None = None,
    clean_seconds: float = 0.0,
    optimizer=None,
) -> tuple[SharedUpdate, DefenseReport]:
    """Phase 2 for one client: the update it shares under ``defense`` (``x`` normalised); ``clean``: its
    clean update if already computed (``apply_defense``); ``optimizer``: FedAvg's local optimiser
    (:class:`leakgym.fl.optim.LocalOptimizer`, None: plain SGD)."""
    return apply_defense(
        model, x, y, defense, update_kind=update_kind, local_steps=local_steps, local_lr=local_lr,
        seed=seed, public_x=public_x, public_y=public_y, clean=clean, clean_seconds=clean_seconds,
        optimizer=optimizer,
    )


@dataclasses.dataclass
class AttackJob:
    """One reconstruction problem: an attack, the update it targets, what the server knows, a seed."""

    attack: Attack
    update: SharedUpdate
    knowledge: AttackerKnowledge
    seed: int


def reconstruct_all(jobs: Sequence[AttackJob], *, batched: bool = True) -> tuple[list[AttackResult], list[float]]:
    """Phase 3: run every job in as few engine calls as the problems allow.

    The optimisation attacks (DLG, Inverting Gradients, prior-init, GradInversion, ...) of all jobs
    share engine calls whatever their strategies, budgets, restarts, step sizes and TV weights
    (:func:`~leakgym.attacks.engine.optimization.reconstruct_jointly`): one call per architecture and
    update protocol, so a vector step with random attacker actions makes one engine call. Every other
    attack (analytic and malicious attacks, and attacks with stages after the inversion: Mixup
    decoding, LODA inversion) makes one ``reconstruct_batch`` call per strategy, jobs grouped by
    (attack class, the config fields other than the per-problem ones, and for malicious attacks the
    modified model they sent), each job with its own config.

    Each job keeps its own seed and settings, so its result does not depend on its neighbours' seeds
    or actions. It may still differ from the job run alone by floating-point rounding: vectorised
    kernels sum in a different order for different batch sizes (measured on CPU for LeNet on digits: at
    most 1e-4 in a pixel, 2e-6 in SSIM; chaotic optimisers such as L-BFGS on a ConvNet amplify it).
    ``batched=False`` runs every job as its own call, which makes each result bit-identical to the job
    alone, at the cost of the batching speed-up. Returns the results in job order and each job's share
    of its call's wall time.
    """
    results: list[AttackResult | None] = [None] * len(jobs)
    seconds = [0.0] * len(jobs)
    joint = [i for i, job in enumerate(jobs)
             if batched and isinstance(job.attack, OptimizationAttack) and job.attack.joins_other_attacks]
    if joint:
        out = reconstruct_jointly([jobs[i].attack for i in joint], [jobs[i].update for i in joint],
                                  [jobs[i].knowledge for i in joint], seeds=[jobs[i].seed for i in joint])
        for i, r in zip(joint, out):
            results[i], seconds[i] = r, r.cost.wall_time_s
    groups: dict[tuple, list[int]] = {}
    taken = set(joint)
    for i, job in enumerate(jobs):
        if i in taken:
            continue
        key = (job.attack.batch_key(), id(job.knowledge.model) if job.attack.malicious else 0)
        groups.setdefault(key if batched else (i,), []).append(i)
    for members in groups.values():
        t0 = time.perf_counter()
        out = jobs[members[0]].attack.reconstruct_batch(
            [jobs[i].update for i in members],
            [jobs[i].knowledge for i in members],
            seeds=[jobs[i].seed for i in members],
            configs=[jobs[i].attack.config for i in members],
        )
        elapsed = time.perf_counter() - t0
        for i, r in zip(members, out):
            results[i] = r
            seconds[i] = elapsed / len(members)
    return results, seconds  # type: ignore[return-value]


def _reports_lpips(scenario) -> bool:
    """LPIPS is scored where the scenario's leakage metric needs it and, beside SSIM and PSNR, wherever the
    backbone weights are on disk (``$LEAKGYM_LPIPS_WEIGHTS`` or torch's hub cache; leakgym.metrics.perceptual):
    the step infos then carry ``leakage_lpips``. Without the weights no LPIPS number is reported."""
    from leakgym.metrics import lpips_available

    return "lpips" in scenario.leakage_metric or lpips_available()


def score_all(
    spec,
    results: Sequence[AttackResult],
    originals: Sequence[Tensor],
    *,
    true_labels: Sequence[Tensor] | None = None,
    lpips: bool = False,
) -> list[ReconstructionScores]:
    """Phase 4: match and score each reconstruction (normalised) against its originals (normalised),
    all of them at once (:func:`~leakgym.metrics.score_reconstructions`: one metric call per shape,
    on the images' device; only the Hungarian matching of batches of several images per batch)."""
    return score_reconstructions(
        [spec.denormalize(r.images.detach()).clamp(0, 1) for r in results],
        [spec.denormalize(x).clamp(0, 1) for x in originals],
        pred_labels=None if true_labels is None else [r.labels for r in results],
        true_labels=true_labels,
        lpips=lpips,
    )


def nothing_sent(spec, x: Tensor) -> AttackResult:
    """The attack's result when the client sent no update: a uniform grey guess, no cost, no loss."""
    grey = spec.normalize(torch.full_like(x, 0.5))
    labels = torch.zeros(x.shape[0], dtype=torch.int64)
    return AttackResult(images=grey, labels=labels, cost=AttackCost(iterations=0, restarts=0, wall_time_s=0.0))


# --------------------------------------------------------------------------------------------------
# The round
# --------------------------------------------------------------------------------------------------
class Round:
    """Plays one round of each of ``games`` (one game for the PettingZoo env, N for a vector)."""

    def __init__(self, games: Sequence[LeakGame], *, batch_attacks: bool = True, batch_clients: bool = False) -> None:
        """``batch_attacks``: the games' attacks share engine calls (:func:`reconstruct_all`).
        ``batch_clients``: the victims' clean updates and step defenses (phase 2, ``LeakGame.clean_updates``,
        ``apply_defense_many(batch_defenses=True)``) and phase 5 of all games as batched computations (``LeakGame.federated_steps``; equal to the game-by-game phases
        to floating-point rounding, not bit for bit, hence off by default)."""
        if not games:
            raise ValueError("a Round needs at least one game")
        self.games = list(games)
        self.batch_attacks = batch_attacks
        self.batch_clients = bool(batch_clients)

    def plan(self, actions: Sequence[tuple[Any, Any]]) -> list[RoundPlan]:
        """Validate and decode ``(defender_action, attacker_action)`` per game; changes nothing."""
        if len(actions) != len(self.games):
            raise ValueError(f"got {len(actions)} action pairs for {len(self.games)} games")
        return [g.plan(d, a) for g, (d, a) in zip(self.games, actions)]

    def play(self, actions: Sequence[tuple[Any, Any]]) -> list[RoundOutcome]:
        """One round of every game. ``ValueError`` for bad actions (nothing changed); ``RoundError``
        for any other failure (every game restored to its state before the round)."""
        plans = self.plan(actions)
        snapshots = [g.snapshot() for g in self.games]
        banked = self._bank_snapshots(snapshots)
        try:
            defended = self._defend(plans)
            t0 = time.perf_counter()
            results, attack_s = self._attacks(defended)
            audits = self._self_audits(defended)
            t_attack = time.perf_counter() - t0
            for d, a_s in zip(defended, attack_s):
                d.timings["attack_s"] = a_s if len(self.games) > 1 else t_attack
            scored = self._score(defended, results, audits)
            self._federated_steps(defended)
            summaries = update_summaries([d.update for d in defended])
            outcomes = [g.conclude(p, d, r, s, f)
                        for g, p, d, r, s, f in zip(self.games, plans, defended, results, scored, summaries)]
        except BaseException as exc:  # Ctrl-C too: a half-played round is undone before it goes up
            for g, snap in zip(self.games, snapshots):
                g.restore(snap)
            for bank, rows, saved in banked:
                bank.scatter(rows, saved)
            if not isinstance(exc, Exception):
                raise
            raise RoundError(self._describe_failure(plans, exc)) from exc
        return outcomes

    def _bank_snapshots(self, snapshots) -> list[tuple[ModelBank, list[int], dict[str, Tensor]]]:
        """The parameters of the games whose snapshots left them to their :class:`ModelBank` (a vector's
        games): one copy of their rows per bank and parameter name."""
        rows: dict[int, tuple[ModelBank, list[int]]] = {}
        for g, snap in zip(self.games, snapshots):
            if snap.banked:
                rows.setdefault(id(g.bank), (g.bank, []))[1].append(g.bank_row)
        return [(bank, members, bank.gather(members)) for bank, members in rows.values()]

    def _defend(self, plans) -> list:
        """Phase 2 of every game, each with its own draws: the victims' defense pipelines as one
        :func:`~leakgym.defenses.apply_defense_many` (update-side defenses batched over the games); with
        ``batch_clients`` the victims' clean updates are one batched computation per architecture
        (``LeakGame.clean_updates``) that the pipelines reuse, the input and step defenses run batched over
        the games (LODA's obscuring, DCS²'s synthesis, CENSOR's trials; to float32 rounding), and the
        victims that train under them take each local step's gradients as one vmapped computation
        (``compute_updates(batched=True)``); without it they run game by game (bit-identical)."""
        if len(self.games) == 1:
            return [self.games[0].defend(plans[0])]
        drawn = type(self.games[0]).draw_all(self.games, plans)
        if self.batch_clients:
            cleans, seconds = type(self.games[0]).clean_updates(self.games, drawn)
        else:
            cleans, seconds = [None] * len(drawn), [0.0] * len(drawn)
        t0 = time.perf_counter()
        shared = apply_defense_many([g.defense_call(p, d, clean=c, clean_seconds=t)
                                     for g, p, d, c, t in zip(self.games, plans, drawn, cleans, seconds)],
                                    batch_defenses=self.batch_clients)
        share = (time.perf_counter() - t0) / len(self.games)
        return [g.share(p, d, s, t + share) for g, p, d, s, t in zip(self.games, plans, drawn, shared, seconds)]

    def _attacks(self, defended) -> tuple[list[AttackResult], list[float]]:
        """Phase 3 for every game whose client sent an update (CENSOR ``skip`` sends none)."""
        sent = [i for i, d in enumerate(defended) if not d.update.metadata.get("skipped")]
        results: list[AttackResult] = [nothing_sent(self.games[i].spec, d.x) for i, d in enumerate(defended)]
        seconds = [0.0] * len(defended)
        out, secs = reconstruct_all([defended[i].attack_job for i in sent], batched=self.batch_attacks)
        for i, r, t in zip(sent, out, secs):
            results[i], seconds[i] = r, t
        return results, seconds

    def _score(self, defended, results, audits) -> list:
        """Phase 4 of every game, games with one dataset spec and leakage metric scored together
        (what :func:`score_all` does, keeping the unit images for the games' renderings)."""
        groups: dict[tuple, list[int]] = {}
        for i, g in enumerate(self.games):
            groups.setdefault((g.spec, g.scenario.leakage_metric), []).append(i)
        scored: list = [None] * len(self.games)
        for members in groups.values():
            t0 = time.perf_counter()
            lead = self.games[members[0]]
            spec = lead.spec
            # Unit images once: scored on the device, then moved to the host for rendering.
            originals = [spec.denormalize(defended[i].x).clamp(0, 1) for i in members]
            recons = [spec.denormalize(results[i].images.detach()).clamp(0, 1) for i in members]
            scores = score_reconstructions(recons, originals, pred_labels=[results[i].labels for i in members],
                                           true_labels=[defended[i].y for i in members],
                                           lpips=_reports_lpips(lead.scenario))
            share = (time.perf_counter() - t0) / len(members)
            labels = to_host([defended[i].y.detach() for i in members])
            for i, s, o, r, y in zip(members, scores, to_host(originals), to_host(recons), labels):
                scored[i] = self.games[i].score(defended[i], audits[i], s, (o, r, y), share)
        return scored

    def _federated_steps(self, defended) -> None:
        """Phase 5 of every game: batched over the games with ``batch_clients``, else game by game
        (each game's own draws either way)."""
        if self.batch_clients and len(self.games) > 1:
            type(self.games[0]).federated_steps(self.games, defended)
        else:
            for g, d in zip(self.games, defended):
                g.federated_step(d)

    def _self_audits(self, defended) -> list[float | None]:
        """The defender's self-audit (scenario ``audit_iterations``): it attacks its own update."""
        jobs, owners = [], []
        for i, (g, d) in enumerate(zip(self.games, defended)):
            job = g.audit_job(d)
            if job is not None and not d.update.metadata.get("skipped"):
                jobs.append(job)
                owners.append(i)
        audits: list[float | None] = [None] * len(self.games)
        if jobs:
            results, _ = reconstruct_all(jobs, batched=self.batch_attacks)
            for i, res in zip(owners, results):
                s = score_all(self.games[i].spec, [res], [defended[i].x])[0]
                audits[i] = float(np.clip(s.mean["ssim"], 0.0, 1.0))
        return audits

    def _describe_failure(self, plans, exc: BaseException) -> str:
        parts = []
        for i, (g, p) in enumerate(zip(self.games, plans)):
            game = f"game {i}: " if len(self.games) > 1 else ""
            parts.append(
                f"{game}round {g.round + 1} of scenario {g.scenario.name!r} with actions "
                f"attacker={p.attacker_action.tolist()} defender={p.defender_action.tolist()}"
            )
        return "; ".join(parts) + f" failed: {exc!r}; every game is left as it was before the round"


__all__ = ["AttackJob", "Round", "RoundError", "nothing_sent", "reconstruct_all", "score_all", "share_update"]

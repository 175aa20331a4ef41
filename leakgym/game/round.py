"""One federated-learning round over N games: plan -> defend -> attack -> score -> aggregate -> reward.

:func:`play_round` is the only place that plays a round. The PettingZoo env (a batch of one game, or a
row of a batch several envs share), the Gymnasium single-agent view and the vector env (a batch of N)
hand it their :class:`~leakgym.game.batch.GameBatch`, the rows that play and their actions; the
reproduction harness calls its library-level helpers (:func:`share_update`, :func:`reconstruct_all`,
:func:`score_all`). Each phase is one function over all the round's games, reading and writing the
batch:

1. :func:`plan` -- every action is validated and decoded into a :class:`~leakgym.defenses.DefenseConfig`
   and an :class:`~leakgym.attacks.base.Attack`. A bad action raises ``ValueError`` here, before any game
   draws a random number or changes state.
2. :func:`defend` -- each victim draws its private batch from its game's generator (a malicious server's
   model modification comes first: the server sends the model before the client trains), and the defense
   pipelines of all games run as one :func:`~leakgym.defenses.apply_defense_many`, the update-side
   defenses batched over the games. With ``batch_clients`` the victims' clean updates of all games are
   one batched computation (:func:`leakgym.fl.batched.client_updates`) that the pipelines reuse, and the
   step defenses run batched over the games (DCS² synthesises every game's concealed samples at once).
3. :func:`attack` -- the attacks of all games as one batched engine call for all optimisation strategies
   whatever the budgets, one call per other strategy (:func:`reconstruct_all`), each game with its own
   seed, so a game's reconstruction does not depend on its neighbours; and the defenders' self-audits.
4. :func:`score` -- reconstructions matched and scored against the private batches (one metric call),
   and each game's leakage score (:func:`leakgym.game.feedback.leakage_score`).
5. :func:`aggregate` -- benign clients' updates, server aggregation and evaluation: for all games at once
   with ``batch_clients`` (:func:`leakgym.fl.rounds.aggregate_round` over the bank's rows), else game by
   game (:func:`leakgym.fl.client.compute_update`, :meth:`leakgym.fl.server.Server.aggregate`; bit-identical).
6. :func:`reward` -- rewards, infos, the round's record and the next observations (the attacker's
   summaries of all shared updates in one computation, :func:`leakgym.game.feedback.update_summaries`).

Atomicity: the rows are snapshotted before phase 2 (:meth:`GameBatch.snapshot`: the bank's rows as one
copy per parameter name); if anything fails, every game of the round is restored to exactly its state
before the round and the failure is raised as :class:`RoundError`, naming the round, the actions and the
cause (a ``KeyboardInterrupt`` is raised as itself, after the same restore).

Seeds: a game draws everything from its own generator: the round seed, the private batch, the benign
clients' batches. The round seed seeds the defenses (one derived generator per defense) and the attack
(:data:`ATTACK_STREAM`), so game *i* plays the same trajectory alone, in a batch of 2 or of 256.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from leakgym.attacks import ATTACKS, build_attack
from leakgym.attacks.base import Attack, AttackCost, AttackerKnowledge, AttackResult
from leakgym.attacks.engine.optimization import OptimizationAttack, reconstruct_jointly
from leakgym.defenses import (
    DefenseCall,
    DefenseConfig,
    DefenseReport,
    apply_defense,
    apply_defense_many,
    defense_compute_units,
    reads_public_split,
)
from leakgym.defenses.registry import registry_generation, seeded_global_rng
from leakgym.devices import in_library_modes, to_host
from leakgym.fl import batched as fl_batched
from leakgym.fl.bank import ModelBank
from leakgym.fl.client import compute_update
from leakgym.fl.rounds import aggregate_round
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import ReconstructionScores, score_reconstructions
from leakgym.optim.randomness import derived_seeds

from .batch import GameBatch
from .feedback import (
    attacker_observations,
    defender_observations,
    leakage_score,
    numeric_info,
    rewards,
    update_summaries,
)
from .records import AttackJob, Defended, RoundOutcome, RoundPlan, RoundRecord, Scored

#: stream tag of the attack's seed (``SeedSequence([round_seed, ATTACK_STREAM])``)
ATTACK_STREAM = 1
#: stream tag of the seed of torch's global RNG while the benign clients train (PRECODE samples and
#: dropout masks draw from it): ``SeedSequence([round_seed, BENIGN_STREAM])``
BENIGN_STREAM = 2


class RoundError(RuntimeError):
    """A round failed for a reason other than an invalid action.

    The message names the scenario, the round and the actions; ``__cause__`` is the original
    exception. Every game of the round is left exactly as it was before the round.
    """


# --------------------------------------------------------------------------------------------------
# The round
# --------------------------------------------------------------------------------------------------
@in_library_modes
def play_round(batch: GameBatch, rows: Sequence[int], actions: Sequence[tuple[Any, Any]], *,
               batch_attacks: bool = True, batch_clients: bool = False) -> list[RoundOutcome]:
    """One round of the games ``rows`` of ``batch``, ``actions[i]`` = ``(defender_action, attacker_action)``
    of game ``rows[i]``.

    ``batch_attacks``: the games' attacks share engine calls (:func:`reconstruct_all`). ``batch_clients``:
    the victims' clean updates, the step defenses and phase 5 as batched computations over the games (equal
    to the game-by-game phases to floating-point rounding, not bit for bit, hence off by default).
    ``ValueError`` for bad actions (nothing changed); ``RoundError`` for any other failure (every game
    restored to its state before the round)."""
    rows = [batch.check_row(r) for r in rows]
    if not rows:
        raise ValueError("a round needs at least one game")
    if len(set(rows)) != len(rows):
        raise ValueError(f"rows={rows}: each game may play once per round")
    with collector_paused():
        plans = plan(batch, rows, actions)
        snap = batch.snapshot(rows)
        try:
            defended = defend(batch, rows, plans, batch_clients=batch_clients)
            results = attack(batch, rows, defended, batch_attacks=batch_attacks)
            scored = score(batch, rows, defended, results)
            aggregate(batch, rows, defended, batch_clients=batch_clients)
            outcomes = reward(batch, rows, plans, defended, results, scored)
        except BaseException as exc:  # Ctrl-C too: a half-played round is undone before it goes up
            batch.restore(snap)
            if not isinstance(exc, Exception):
                raise
            raise RoundError(_describe_failure(batch, rows, plans, exc)) from exc
    return outcomes


_pause_lock = threading.Lock()
_pauses = 0  # rounds now inside collector_paused(), in every thread
_resume = False  # whether the last of them turns the collector back on


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector (:mod:`gc`) off while a round runs, and back on after it, also on an
    error; unchanged if it was off. Nested and concurrent rounds share one pause: the last to leave ends it.

    Why: a round allocates hundreds of thousands of container objects (records, dicts, autograd and
    ``vmap`` bookkeeping) that die within it, freed by reference counting. With the collector on, the ones
    alive when it runs are promoted to the older generations, and every few steps that promotion count
    triggers a full collection, which walks every object of the process -- about 340 per game (models,
    generators, menus) plus the 450,000 or so that torch and the other imports hold. At 1,024 digits games
    that was 0.3 full collections a step at 350 ms each on a CPU (``leakgym bench env``'s host-bound
    configuration: 1,560 -> about 1,420 ms a step with the vector env's whole step paused), and on an H200
    with the default attack 1,641 -> 1,242 ms a step (``docs/results/bench_env_gpu.md``). Paused, what dies
    within the round is never seen by the collector; what outlives it is collected as usual afterwards.

    A round makes no reference cycles of its own (a test plays rounds with the collector off and finds
    none), so nothing of the round waits for the collector, with one exception it cannot remove: ``vmap``
    and ``grad`` of :mod:`torch.func` leave small cycles of pytree helpers (tuples, closures; no tensors)
    on each call, which the first collection after the round frees.
    """
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


def _describe_failure(batch: GameBatch, rows: list[int], plans: list[RoundPlan], exc: BaseException) -> str:
    parts = []
    for r, p in zip(rows, plans):
        game = f"game {r}: " if batch.size > 1 else ""
        parts.append(f"{game}round {int(batch.round[r]) + 1} of scenario {batch.scenario.name!r} with actions "
                     f"attacker={p.attacker_action.tolist()} defender={p.defender_action.tolist()}")
    return "; ".join(parts) + f" failed: {exc!r}; every game is left as it was before the round"


# --------------------------------------------------------------------------------------------------
# Phase 1: plan
# --------------------------------------------------------------------------------------------------
def defense_config_for(scenario, defender_action: Any, menu=None) -> DefenseConfig:
    """Defender action -> the DefenseConfig applied this round (scenario defaults + menu fields)."""
    fields = (menu or scenario.defender_menu_dims).config_fields(defender_action)
    return DefenseConfig(**{**scenario.defense_defaults, **fields})


def attack_for(scenario, attack_settings: dict[str, Any]) -> Attack:
    """Decoded attacker settings -> a configured attack (menu fields set where the attack has them)."""
    strategy = attack_settings["strategy"]
    fields = {f.name for f in dataclasses.fields(ATTACKS[strategy].Config)}
    overrides = {k: v for k, v in scenario.attack_defaults.items() if k in fields}
    overrides.update({k: v for k, v in attack_settings.items() if k in fields})
    return build_attack(strategy, **overrides)


#: decoded plans a batch keeps (:attr:`GameBatch.plans`); beyond it the cache starts again
PLAN_CACHE = 4096


def plan_one(batch: GameBatch, row: int, defender_action: Any, attacker_action: Any) -> RoundPlan:
    """Validate and decode one game's actions. Draws nothing and changes no game state.

    A plan depends on the actions and the (fixed) scenario only, and its parts are immutable (the config,
    the attack's config, the actions; the settings reach infos and records as copies), so the batch decodes
    each action pair once (:attr:`GameBatch.plans`): decoding builds the attack and validates the defense
    config, about 0.2 ms a game and step, and a view validates a step's actions before the round plans
    them."""
    defender, attacker = batch.menus["defender"], batch.menus["attacker"]
    generation = registry_generation()
    if batch.plans_generation != generation:  # (found in an audit: after an unregister, a cached plan still
        # reported the gone defense's settings and played without it, while a new action was refused)
        batch.plans.clear()
        batch.plans_generation = generation
    if _checked_form(defender_action, defender) and _checked_form(attacker_action, attacker):
        # An int64 array of the menu's shape whose bytes a decoded plan has: that action was checked then.
        out = batch.plans.get((defender_action.tobytes(), attacker_action.tobytes()))
        if out is not None:
            return out
    d_action, a_action = defender.check(defender_action), attacker.check(attacker_action)
    key = (d_action.tobytes(), a_action.tobytes())
    out = batch.plans.get(key)
    if out is None:
        sc = batch.scenario
        a_settings = attacker.read(a_action)
        d_settings = defender.read(d_action)  # (Scenario.decode_defender: each bit-mask field listed)
        for field in batch.bit_fields:
            d_settings.setdefault(field, [])
        d_action, a_action = d_action.copy(), a_action.copy()  # (check may return the caller's array)
        d_action.flags.writeable = a_action.flags.writeable = False
        defense, decoded_attack = defense_config_for(sc, d_action, defender), attack_for(sc, a_settings)
        out = RoundPlan(defender_action=d_action, attacker_action=a_action, defense_settings=d_settings,
                        attack_settings=a_settings, defense=defense, attack=decoded_attack,
                        reads_public_split=decoded_attack.reads_public_split() or reads_public_split(defense))
        if len(batch.plans) >= PLAN_CACHE:
            batch.plans.clear()
        batch.plans[key] = out
    return out


def _checked_form(action: Any, menu) -> bool:
    """True for an action in the form :meth:`Menu.check` returns (an int64 array of the menu's shape),
    whose bytes then name its values."""
    return type(action) is np.ndarray and action.dtype == np.int64 and action.shape == (len(menu.dims),)


def plan(batch: GameBatch, rows: list[int], actions: Sequence[tuple[Any, Any]]) -> list[RoundPlan]:
    """Phase 1: validate and decode ``(defender_action, attacker_action)`` per game; changes nothing."""
    if len(actions) != len(rows):
        raise ValueError(f"got {len(actions)} action pairs for {len(rows)} games")
    for r in rows:
        if not batch.started(r):
            raise RuntimeError(f"game {r} has not been reset; call reset() first")
    return [plan_one(batch, r, d, a) for r, (d, a) in zip(rows, actions)]


# --------------------------------------------------------------------------------------------------
# Phase 2: defend
# --------------------------------------------------------------------------------------------------
def defend(batch: GameBatch, rows: list[int], plans: list[RoundPlan], *, batch_clients: bool) -> list[Defended]:
    """Phase 2 of every game, each with its own draws: the round seed and the private batch from the game's
    generator (all private batches as one read of the shared images), the public split of the games whose
    attack or defense reads it (:meth:`GameBatch.public_splits`; ``None`` for the others), the model the server
    sends, the victims' defense pipelines as one :func:`~leakgym.defenses.apply_defense_many`; with ``batch_clients``
    the victims' clean updates first, as one batched computation per architecture (:func:`_clean_updates`),
    and the input and step defenses batched over the games (to float32 rounding); without it the pipelines
    run game by game (bit-identical; a round of one game batches its own defenses' work either way)."""
    sc = batch.scenario
    t0 = time.perf_counter()
    seeds, picks = [], []
    for r in rows:
        rng, victims = batch.rngs[r], batch.victim_rows[r]
        seeds.append(int(rng.integers(2**31 - 1)))
        n = len(victims)
        picks.append(victims[rng.choice(n, size=sc.batch_size, replace=n < sc.batch_size)])
    private = batch.images.read(picks)
    # The public split, gathered for the games whose attack or defense reads it (the others get None).
    reading = [r for r, p in zip(rows, plans) if p.reads_public_split]
    gathered = dict(zip(reading, batch.public_splits(reading)))
    publics = [gathered.get(r, (None, None)) for r in rows]
    draw_s = (time.perf_counter() - t0) / len(rows)
    sent_models, prepare_s = [], []
    for r, p, (public_x, _) in zip(rows, plans, publics):
        t1 = time.perf_counter()
        sent_models.append(p.attack.prepare_model(batch.model(r), batch.spec, public_x=public_x))
        prepare_s.append(draw_s + time.perf_counter() - t1)
    if batch_clients and len(rows) > 1:
        cleans, clean_s = _clean_updates(batch, rows, sent_models, private)
    else:
        cleans, clean_s = [None] * len(rows), [0.0] * len(rows)
    t0 = time.perf_counter()
    calls = [DefenseCall(m, x, y, p.defense, seed=seed, update_kind=sc.update_kind, local_steps=sc.local_steps,
                         local_lr=batch.local_lr(r), public_x=public_x, public_y=public_y,
                         clean=c, clean_seconds=t, optimizer=batch.local_optimizer)
             for r, p, m, (x, y), seed, c, t, (public_x, public_y)
             in zip(rows, plans, sent_models, private, seeds, cleans, clean_s, publics)]
    shared = apply_defense_many(calls, batch_defenses=batch_clients or len(rows) == 1)
    share_s = (time.perf_counter() - t0) / len(rows)
    # The attack gets its own seed, derived from the round seed: it must not replay the client's draws (e.g.
    # PRECODE's sampling noise, seeded by the round seed in apply_defense). SeedSequence([seed, ATTACK_STREAM]).
    attack_seeds = derived_seeds(seeds, ATTACK_STREAM)
    out = []
    for p, m, (x, y), seed, attack_seed, (update, report), t_prep, t_clean, (public_x, public_y) in zip(
            plans, sent_models, private, seeds, attack_seeds, shared, prepare_s, clean_s, publics):
        knowledge = AttackerKnowledge(model=m, spec=batch.spec, batch_size=sc.batch_size,
                                      labels=y.clone() if sc.known_labels else None,
                                      public_x=public_x, public_y=public_y)
        out.append(Defended(x=x, y=y, update=update, report=report, seed=seed,
                            attack_job=AttackJob(attack=p.attack, update=update, knowledge=knowledge, seed=attack_seed),
                            timings={"defense_s": t_prep + t_clean + share_s}))
    return out


def _clean_updates(batch: GameBatch, rows: list[int], models: list[nn.Module],
                   private: list[tuple[Tensor, Tensor]]) -> tuple[list[SharedUpdate | None], list[float]]:
    """The victims' clean updates as batched computations: games whose sent model
    :func:`leakgym.fl.batched.supports` and whose architecture and batch shape agree make one
    :func:`leakgym.fl.batched.client_updates` call; the others get ``None`` (their pipeline computes it).
    Equal to ``compute_update`` to floating-point rounding. Returns the updates and each game's share of
    its call's wall time."""
    sc = batch.scenario
    groups: dict[tuple, list[int]] = {}
    for i, (r, m, (x, _)) in enumerate(zip(rows, models, private)):
        signature = batch.signature(r, m)
        if signature is not None:
            groups.setdefault((signature, tuple(x.shape), batch.local_lr(r)), []).append(i)
    cleans: list[SharedUpdate | None] = [None] * len(rows)
    seconds = [0.0] * len(rows)
    for (_, _, lr), members in groups.items():
        if len(members) < 2:
            continue
        t0 = time.perf_counter()
        out = fl_batched.client_updates([models[i] for i in members], [private[i][0] for i in members],
                                        [private[i][1] for i in members], kind=sc.update_kind,
                                        local_steps=sc.local_steps, local_lr=lr, signed=True,
                                        optimizer=batch.local_optimizer)
        share = (time.perf_counter() - t0) / len(members)
        for i, u in zip(members, out):
            cleans[i], seconds[i] = u, share
    return cleans, seconds


def share_update(model: nn.Module, x: Tensor, y: Tensor, defense: DefenseConfig, *, seed: int,
                 update_kind: str = "gradient", local_steps: int = 1, local_lr: float = 0.1,
                 public_x: Tensor | None = None, public_y: Tensor | None = None, clean: SharedUpdate | None = None,
                 clean_seconds: float = 0.0, optimizer=None) -> tuple[SharedUpdate, DefenseReport]:
    """Phase 2 for one client outside a game (the reproduction harness): the update it shares under
    ``defense`` (``x`` normalised); ``clean``: its clean update if already computed; ``optimizer``:
    FedAvg's local optimiser (:class:`leakgym.fl.optim.LocalOptimizer`, None: plain SGD)."""
    return apply_defense(model, x, y, defense, update_kind=update_kind, local_steps=local_steps, local_lr=local_lr,
                         seed=seed, public_x=public_x, public_y=public_y, clean=clean, clean_seconds=clean_seconds,
                         optimizer=optimizer)


# --------------------------------------------------------------------------------------------------
# Phase 3: attack
# --------------------------------------------------------------------------------------------------
def attack(batch: GameBatch, rows: list[int], defended: list[Defended], *,
           batch_attacks: bool) -> list[AttackResult]:
    """Phase 3 for every game whose client sent an update (CENSOR ``skip`` sends none: the attacker gets
    nothing, :func:`nothing_sent`), and the defenders' self-audits (scenario ``audit_iterations``)."""
    t0 = time.perf_counter()
    sent = [i for i, d in enumerate(defended) if not d.update.metadata.get("skipped")]
    results = [nothing_sent(batch.spec, d.x) for d in defended]
    seconds = [0.0] * len(defended)
    out, secs = reconstruct_all([defended[i].attack_job for i in sent], batched=batch_attacks)
    for i, r, t in zip(sent, out, secs):
        results[i], seconds[i] = r, t
    t1 = time.perf_counter()
    _self_audits(batch, defended, sent, batch_attacks=batch_attacks)
    # The self-audits' time, shared equally, is attack time as it is for a game alone (found in an audit: left out
    # of each game's share, it counted as Python overhead in `leakgym bench env`'s vector rows, 90% at 150 audit
    # iterations, against attack time in the sequential baseline).
    audit_share = (time.perf_counter() - t1) / len(defended)
    total = time.perf_counter() - t0
    for d, t in zip(defended, seconds):
        d.timings["attack_s"] = t + audit_share if len(defended) > 1 else total
    return results


def _self_audits(batch: GameBatch, defended: list[Defended], sent: list[int], *, batch_attacks: bool) -> None:
    """The defender's self-audit (scenario ``audit_iterations``; 0: none): Inverting Gradients with known
    labels on its own update, scored by SSIM in [0, 1] into :attr:`Defended.audit`."""
    iterations = batch.scenario.audit_iterations
    if iterations <= 0 or not sent:
        return
    jobs = []
    for i in sent:
        d = defended[i]
        audit_attack = build_attack("inverting-gradients", iterations=iterations, restarts=1)
        knowledge = dataclasses.replace(d.attack_job.knowledge, labels=d.y.clone())
        jobs.append(AttackJob(attack=audit_attack, update=d.update, knowledge=knowledge, seed=d.attack_job.seed + 1))
    results, _ = reconstruct_all(jobs, batched=batch_attacks)
    for i, res in zip(sent, results):
        s = score_all(batch.spec, [res], [defended[i].x])[0]
        defended[i].audit = float(np.clip(s.mean["ssim"], 0.0, 1.0))


@in_library_modes
def reconstruct_all(jobs: Sequence[AttackJob], *, batched: bool = True) -> tuple[list[AttackResult], list[float]]:
    """Run every job in as few engine calls as the problems allow.

    The optimisation attacks (DLG, Inverting Gradients, prior-init, GradInversion, ...) of all jobs share
    engine calls whatever their strategies, budgets, restarts, step sizes and TV weights
    (:func:`~leakgym.attacks.engine.optimization.reconstruct_jointly`): one call per architecture and update
    protocol, so a vector step with random attacker actions makes one engine call. Every other attack
    (analytic and malicious attacks, and attacks with stages after the inversion: Mixup decoding, LODA
    inversion) makes one ``reconstruct_batch`` call per strategy, jobs grouped by (attack class, the config
    fields other than the per-problem ones, and for malicious attacks the modified model they sent), each
    job with its own config.

    Each job keeps its own seed and settings, so its result does not depend on its neighbours' seeds or
    actions. It may still differ from the job run alone by floating-point rounding: vectorised kernels sum
    in a different order for different batch sizes (measured on CPU for LeNet on digits: at most 1e-4 in a
    pixel, 2e-6 in SSIM; chaotic optimisers such as L-BFGS on a ConvNet amplify it). ``batched=False`` runs
    every job as its own call, which makes each result bit-identical to the job alone, at the cost of the
    batching speed-up. Returns the results in job order and each job's share of its call's wall time.
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
            [jobs[i].update for i in members], [jobs[i].knowledge for i in members],
            seeds=[jobs[i].seed for i in members], configs=[jobs[i].attack.config for i in members])
        elapsed = time.perf_counter() - t0
        for i, r in zip(members, out):
            results[i] = r
            seconds[i] = elapsed / len(members)
    return results, seconds  # type: ignore[return-value]


def nothing_sent(spec, x: Tensor) -> AttackResult:
    """The attack's result when the client sent no update: a uniform grey guess, no cost, no loss."""
    grey = spec.normalize(torch.full_like(x, 0.5))
    labels = torch.zeros(x.shape[0], dtype=torch.int64)
    return AttackResult(images=grey, labels=labels, cost=AttackCost(iterations=0, restarts=0, wall_time_s=0.0))


# --------------------------------------------------------------------------------------------------
# Phase 4: score
# --------------------------------------------------------------------------------------------------
def unit_images(spec, images: Sequence[Tensor]) -> list[Tensor]:
    """Normalised image batches -> unit images clamped to [0, 1] (detached), the batches of one shape,
    device and dtype as one stacked computation (elementwise, so each equals its own bit for bit; one
    kernel per operation for the games of a vector step instead of one per game).

    A NaN pixel (an attack that diverged and returned it: the built-in attacks fall back to their best
    finite iterate, a user-registered one may not) becomes 0.5, the grey of :func:`nothing_sent`'s
    uninformed guess, and -inf/+inf clamp to 0/1: the metrics refuse non-finite images, and a diverged
    attack's output is scored as the guess it is, not as a failed round."""
    out: list[Tensor] = [torch.empty(0)] * len(images)
    groups: dict[tuple, list[int]] = {}
    for i, x in enumerate(images):
        groups.setdefault((tuple(x.shape), x.device, x.dtype), []).append(i)
    for members in groups.values():
        stacked = torch.stack([images[i].detach() for i in members])
        for i, x in zip(members, spec.denormalize(stacked).clamp(0, 1).nan_to_num_(0.5).unbind(0)):
            out[i] = x
    return out


def score_all(spec, results: Sequence[AttackResult], originals: Sequence[Tensor], *,
              true_labels: Sequence[Tensor] | None = None, lpips: bool = False) -> list[ReconstructionScores]:
    """Match and score each reconstruction (normalised) against its originals (normalised), all of them at
    once (:func:`~leakgym.metrics.score_reconstructions`: one metric call per shape, on the images' device;
    only the Hungarian matching of batches of several images per batch)."""
    return score_reconstructions(
        unit_images(spec, [r.images for r in results]), unit_images(spec, originals),
        pred_labels=None if true_labels is None else [r.labels for r in results],
        true_labels=true_labels,
        lpips=lpips,
    )


def score(batch: GameBatch, rows: list[int], defended: list[Defended], results: list[AttackResult]) -> list[Scored]:
    """Phase 4 of every game, scored together on the device (the unit images are kept on the host for the
    games' renderings); a game whose client sent nothing leaked nothing (the grey guess's chance
    similarity is not leakage)."""
    t0 = time.perf_counter()
    spec, metric = batch.spec, batch.scenario.leakage_metric
    originals = unit_images(spec, [d.x for d in defended])
    recons = unit_images(spec, [r.images for r in results])
    scores = score_reconstructions(recons, originals, pred_labels=[r.labels for r in results],
                                   true_labels=[d.y for d in defended], lpips=batch.reports_lpips)
    labels = to_host([d.y.detach() for d in defended])
    out = []
    for d, s, o, rec, y in zip(defended, scores, to_host(originals), to_host(recons), labels):
        skipped = bool(d.update.metadata.get("skipped"))
        out.append(Scored(scores=s, leakage=0.0 if skipped else leakage_score(s, metric),
                          audit_leakage=0.0 if d.audit is None else d.audit,
                          originals=o, reconstructions=rec, labels=y))
    share = (time.perf_counter() - t0) / len(rows)
    for d in defended:
        d.timings["score_s"] = share
    return out


# --------------------------------------------------------------------------------------------------
# Phase 5: aggregate
# --------------------------------------------------------------------------------------------------
def aggregate(batch: GameBatch, rows: list[int], defended: list[Defended], *, batch_clients: bool) -> None:
    """Phase 5 of every game: each draws its benign clients' batches from its own generator (in client
    order), then the benign updates, aggregation with the victim's update and (when due) evaluation. With
    ``batch_clients`` the games whose model :func:`leakgym.fl.batched.supports` and whose clients' batches
    are equal in size are one computation (:func:`leakgym.fl.rounds.aggregate_round` over the bank's rows,
    BatchNorm statistics included, then one stacked evaluation); the others, and every game without it, go
    client by client (:func:`_aggregate_alone`, bit-identical to the plain FL loop)."""
    t0 = time.perf_counter()
    sc = batch.scenario
    size = max(sc.batch_size, 8)
    drawn = []
    for r in rows:
        rng = batch.rngs[r]
        drawn.append([shard[rng.choice(len(shard), size=min(len(shard), size), replace=False)]
                      for shard in batch.benign_rows[r]])
    together: list[int] = []
    if batch_clients and len(rows) > 1:
        for i, r in enumerate(rows):
            if batch.signature(r, batch.model(r)) is not None and len({len(d) for d in drawn[i]}) == 1:
                together.append(i)
    joined = set(together)
    lone = [i for i in range(len(rows)) if i not in joined]
    if together:
        # (the games of a batch share the architecture; the learning rate follows the round counter)
        by_lr: dict[tuple, list[int]] = {}
        for i in together:
            by_lr.setdefault((batch.local_lr(rows[i]), len(drawn[i]), len(drawn[i][0])), []).append(i)
        for members in by_lr.values():
            _aggregate_together(batch, [rows[i] for i in members], [defended[i] for i in members],
                                [drawn[i] for i in members])
    for i in lone:
        r = rows[i]
        t1 = time.perf_counter()
        _aggregate_alone(batch, r, defended[i], batch.images.read(drawn[i]))
        defended[i].timings["fl_s"] = time.perf_counter() - t1
    if together:
        share = (time.perf_counter() - t0) / len(rows)
        for i in together:
            defended[i].timings["fl_s"] = share


def _aggregate_alone(batch: GameBatch, row: int, defended: Defended, batches: list[tuple[Tensor, Tensor]]) -> None:
    """Phase 5 of one game, client by client. The clients train with torch's global RNG seeded from the
    round seed (PRECODE's bottleneck and dropout draw from it), so the same game seed gives the same round
    whatever the process's RNG state."""
    sc, model = batch.scenario, batch.model(row)
    seed = int(np.random.SeedSequence([defended.seed, BENIGN_STREAM]).generate_state(1)[0])
    with seeded_global_rng(seed, batch.device):
        updates = [compute_update(model, bx, by, kind=sc.update_kind, local_steps=sc.local_steps,
                                  local_lr=batch.local_lr(row), optimizer=batch.local_optimizer)
                   for bx, by in batches]
    server = batch.servers[row]
    server.aggregate([defended.update] + updates)
    batch.advance(row, server.evaluate() if batch.evaluates_next(row) else None)


def _aggregate_together(batch: GameBatch, rows: list[int], defended: list[Defended], drawn: list[list[Tensor]]) -> None:
    """Phase 5 of games with one learning rate and client batch shape, as one computation per step."""
    sc = batch.scenario
    # Every client batch of the group in one read of the shared images: (games, clients, batch, ...)
    ((x, y),) = batch.images.read([torch.cat([rr for d in drawn for rr in d])])
    shape = (len(rows), len(drawn[0]), len(drawn[0][0]))
    x, y = x.reshape(*shape, *x.shape[1:]), y.reshape(shape)
    models = [batch.model(r) for r in rows]
    params = fl_batched.stack_parameters(models)
    buffers = fl_batched.stack_buffers(models) or None
    result = aggregate_round(models[0], params, buffers, [d.update for d in defended], x, y, kind=sc.update_kind,
                             local_steps=sc.local_steps, local_lr=batch.local_lr(rows[0]),
                             optimizer=batch.local_optimizer, server_lr=sc.server_lr, models=models)
    for i, updates in result.alone.items():
        batch.servers[rows[i]].aggregate(updates)
    keep, new = result.kept, result.state
    if keep:
        # Every game's new state into its model. The parameters are rows of the batch's ModelBank: one copy
        # per name. The rest (BN statistics, or models out of the bank): one multi-tensor copy.
        banked = ModelBank.of([models[i] for i in keep])
        if banked is not None:
            bank, bank_rows = banked
            bank.scatter(bank_rows, {n: new[n] for n in params})
        rest = [n for n in new if banked is None or n not in params]
        if rest:
            stacks = {name: new[name].unbind(0) for name in rest}
            destinations, sources = [], []
            for j, i in enumerate(keep):
                state = dict(models[i].named_parameters())
                state.update(models[i].named_buffers())
                for name in rest:
                    destinations.append(state[name])
                    sources.append(stacks[name][j])
            with torch.no_grad():
                torch._foreach_copy_(destinations, sources)
    due = [i for i, r in enumerate(rows) if batch.evaluates_next(r)]
    results: dict[int, tuple[float, float]] = {}
    if due:
        server0 = batch.servers[rows[due[0]]]
        if keep and set(due) <= set(keep):  # the models now hold `new`: evaluate those stacks directly
            row_of = {i: j for j, i in enumerate(keep)}
            at = torch.tensor([row_of[i] for i in due])
            stacked = {n: t.index_select(0, at.to(t.device)) for n, t in new.items()}
            due_params = {n: t for n, t in stacked.items() if n in params}
            due_buffers = {n: t for n, t in stacked.items() if n not in params and t.is_floating_point()}
        else:
            due_params = fl_batched.stack_parameters([models[i] for i in due])
            due_buffers = fl_batched.stack_buffers([models[i] for i in due])
        acc, loss = fl_batched.evaluate_many(models[0], due_params, server0.eval_x, server0.eval_y,
                                             buffers=due_buffers or None)
        results = {i: (a, lo) for i, a, lo in zip(due, acc, loss)}
    for i, r in enumerate(rows):
        batch.advance(r, results.get(i))


# --------------------------------------------------------------------------------------------------
# Phase 6: reward
# --------------------------------------------------------------------------------------------------
def _settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of a plan's decoded settings (its lists too) for a record or an info: the plan is shared by
    every round that plays the same actions (:func:`plan_one`)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in settings.items()}


def _finite(value: float, default: float = 0.0) -> float:
    value = float(value)
    return value if math.isfinite(value) else default


def observe(batch: GameBatch, row: int) -> dict[str, np.ndarray]:
    """Game ``row``'s observations: only what each party could see (:mod:`leakgym.game.feedback`)."""
    return observe_all(batch, [row])[0]


def observe_all(batch: GameBatch, rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The observations of the games ``rows``, computed as one matrix per role (each row equals the game's
    observation computed alone: every entry is elementwise)."""
    sc, menus = batch.scenario, batch.menus
    lasts = [batch.last[r] for r in rows]
    fractions = [int(batch.round[r]) / sc.rounds for r in rows]

    def last_actions(role: str) -> np.ndarray:
        width = len(menus[role].dims)
        return np.array([np.zeros(width, np.int64) if last is None else getattr(last, f"{role}_action")
                         for last in lasts], np.int64).reshape(len(rows), width)

    attacker = attacker_observations(
        round_fractions=fractions,
        summaries=[None if last is None else last.update_summary for last in lasts],
        matching_losses=[None if last is None else last.matching_loss for last in lasts],
        last_actions=last_actions("attacker"),
        menu=menus["attacker"],
    )
    defender = defender_observations(
        round_fractions=fractions,
        accuracies=[float(batch.accuracy[r]) for r in rows],
        losses=[float(batch.test_loss[r]) for r in rows],
        num_classes=batch.spec.num_classes,
        last_actions=last_actions("defender"),
        menu=menus["defender"],
        audit_leakages=[0.0 if last is None else last.audit_leakage for last in lasts],
        fidelities=[1.0 if last is None else last.fidelity for last in lasts],
    )
    return [{"attacker": a.copy(), "defender": d.copy()} for a, d in zip(attacker, defender)]


def reward(batch: GameBatch, rows: list[int], plans: list[RoundPlan], defended: list[Defended],
           results: list[AttackResult], scored: list[Scored]) -> list[RoundOutcome]:
    """Phase 6: rewards (:func:`leakgym.game.feedback.rewards`), infos, each game's :class:`RoundRecord` and
    next observations (the attacker's summaries of all shared updates as one computation). Its time, shared
    equally, is each game's ``reward_s``; every phase's timings go to :attr:`GameBatch.timings` here."""
    t0 = time.perf_counter()
    summaries = update_summaries([d.update for d in defended])
    outcomes = [_conclude(batch, r, p, d, res, s, f)
                for r, p, d, res, s, f in zip(rows, plans, defended, results, scored, summaries)]
    for outcome, observations in zip(outcomes, observe_all(batch, rows)):  # (of the records just concluded)
        outcome.observations = observations
    share = (time.perf_counter() - t0) / len(rows)
    for r, d in zip(rows, defended):
        d.timings["reward_s"] = share
        batch.timings[r] = dict(d.timings)
    return outcomes


def _conclude(batch: GameBatch, row: int, plan: RoundPlan, defended: Defended, result: AttackResult,
              scored: Scored, update_summary: np.ndarray) -> RoundOutcome:
    """Game ``row``'s rewards, infos and record (its observations are :func:`reward`'s, all rows at once)."""
    sc = batch.scenario
    units = result.cost.units
    defense_units = defense_compute_units(plan.defense)
    fidelity = _finite(defended.report.fidelity)
    accuracy = _finite(batch.accuracy[row])
    test_loss = float(batch.test_loss[row])
    r = rewards(leakage=scored.leakage, attack_units=units, fidelity=fidelity, accuracy=accuracy,
                defense_units=defense_units, weights=sc.rewards)
    final_loss = float(result.final_loss)
    matching_loss = final_loss if math.isfinite(final_loss) else None
    rnd = int(batch.round[row])
    diverged = batch.diverged_at[row]
    record = RoundRecord(
        round=rnd, defender_action=plan.defender_action, attacker_action=plan.attacker_action,
        defense_settings=_settings(plan.defense_settings), attack_settings=_settings(plan.attack_settings),
        strategy=plan.attack_settings["strategy"], applied=tuple(defended.report.applied), update=defended.update,
        update_summary=update_summary, matching_loss=matching_loss, audit_leakage=scored.audit_leakage,
        fidelity=fidelity, leakage=scored.leakage, scores=scored.scores, originals=scored.originals,
        reconstructions=scored.reconstructions, labels=scored.labels,
    )
    batch.last[row] = record
    mean = scored.scores.mean
    common: dict[str, Any] = {
        "round": rnd,
        "leakage": scored.leakage,
        "leakage_ssim": _finite(mean["ssim"]),
        "leakage_psnr": _finite(mean["psnr"]),
        "leakage_mse": _finite(mean["mse"]),
        "label_accuracy": _finite(scored.scores.label_accuracy or 0.0),
        "accuracy": accuracy,
        "test_loss": _finite(test_loss, default=float(np.finfo(np.float32).max)),
        "model_diverged": diverged is not None,
        "update_skipped": bool(defended.update.metadata.get("skipped")),
    }
    if diverged is not None:
        common["diverged_round"] = diverged
    if "lpips" in mean and math.isfinite(mean["lpips"]):
        common["leakage_lpips"] = mean["lpips"]
    attacker_info = dict(common, strategy=plan.attack_settings["strategy"], attack_settings=_settings(plan.attack_settings),
                         reward_leakage=r["attacker_leakage"], reward_cost=r["attacker_cost"], attack_units=float(units))
    if matching_loss is not None:
        attacker_info["matching_loss"] = matching_loss
    details = {
        "attacker": attacker_info,
        "defender": dict(
            common,
            defense_settings=_settings(plan.defense_settings),
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
    infos = {role: numeric_info(d, role, batch.strategies, lpips=batch.reports_lpips) for role, d in details.items()}
    return RoundOutcome(observations={}, rewards={"attacker": r["attacker"], "defender": r["defender"]},
                        infos=infos, terminated=rnd >= sc.rounds, record=record, details=details)


__all__ = [
    "ATTACK_STREAM",
    "BENIGN_STREAM",
    "RoundError",
    "aggregate",
    "attack",
    "attack_for",
    "defend",
    "defense_config_for",
    "nothing_sent",
    "observe",
    "observe_all",
    "plan",
    "plan_one",
    "play_round",
    "reconstruct_all",
    "reward",
    "score",
    "score_all",
    "share_update",
    "unit_images",
]

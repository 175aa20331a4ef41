"""Playing every attacker against every defender on the PettingZoo parallel environment.

Each (attacker, defender) pair plays ``episodes`` full episodes (both agents act each round;
adaptive agents get ``observe`` after each round and keep what they learnt across the pair's
episodes; each pair gets fresh agent instances). Episode ``e`` of every pair is reset with the same
seed ``seed + e`` (common random numbers: the same private batches, client splits and model
initialisation), so differences between pairs come from the agents, not from the draw.

Per episode :func:`play_episode` records the mean over rounds of the leakage metrics in the round
infos (``leakage_ssim``, ``leakage_psnr``, ``leakage_lpips`` when the environment reports it — only
when the pretrained LPIPS weights are installed — and ``label_accuracy``), the global model's test
``accuracy`` after the last round, and both agents' returns (sums of rewards).

Games play in *lockstep*, ``lockstep`` at a time (:func:`play_episodes`): each round of a group's games
is one :func:`~leakgym.game.round.play_round` (:func:`~leakgym.envs.leakgym_env.step_together`), so their
attacks share engine calls as a vector env's do. A pair whose two agents are
:attr:`~leakgym.agents.policies.base.Agent.episodic` (they carry nothing between episodes: scripted agents,
presets, saved policies) plays its episodes at once, one game and one copy of each agent per episode; a
pair with an agent that learns across episodes (the bandit) plays them one after another with one
instance, as before. A pair's numbers equal its episodes played alone up to the floating-point rounding
of the batched attack kernels, which depends on which games share a group: games are grouped in table
order, a resumed run replays whole groups, and ``lockstep`` is part of a run's settings, so a run
reproduces its own numbers exactly; ``lockstep=1`` reproduces one-game-at-a-time play.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.agents.policies.base import Agent
from leakgym.agents.policies.factory import make_agent
from leakgym.devices import canonical_device

from ..cli_common import resolve_env
from .episode_log import EpisodeLog
from .payoff import ROUND_METRICS, EpisodeStats, LastRound, PairResult, PayoffTable, gallery_episode

#: pairs of an evaluation that play in lockstep by default (:func:`evaluate`)
DEFAULT_LOCKSTEP = 16


def play_episodes(envs: list, attackers: list[Agent], defenders: list[Agent],
                  seed: int | Sequence[int]) -> list[EpisodeStats]:
    """One episode in each of ``envs`` (parallel envs, each with its own attacker and defender), reset
    with ``seed`` (one for all, or one per env) and their rounds played together
    (:func:`~leakgym.envs.leakgym_env.step_together`).

    Every env's agents act with generators derived from its seed and observe their own rewards, exactly
    as :func:`play_episode` has them do alone (agents keep no state shared between envs: pass distinct
    instances)."""
    from leakgym.envs.leakgym_env import step_together

    if not (len(envs) == len(attackers) == len(defenders)) or not envs:
        raise ValueError(f"need one attacker and one defender per env; got {len(envs)} envs, {len(attackers)} "
                         f"attackers, {len(defenders)} defenders")
    seeds = [int(seed)] * len(envs) if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
    if len(seeds) != len(envs):
        raise ValueError(f"got {len(seeds)} seeds for {len(envs)} envs")
    players = [{"attacker": a, "defender": d} for a, d in zip(attackers, defenders)]
    if len({id(agent) for p in players for agent in p.values()}) != 2 * len(players):
        raise ValueError("each env needs its own attacker and defender instances (agents keep per-episode state)")
    obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
    rngs = [{role: np.random.default_rng([s, i]) for i, role in enumerate(p)} for p, s in zip(players, seeds)]
    for p, s in zip(players, seeds):
        for i, agent in enumerate(p.values()):
            agent.reset(s + 1000 * (i + 1))
    per_round: list[dict[str, list[float]]] = [{m: [] for m in ROUND_METRICS} for _ in envs]
    returns = [{"attacker": 0.0, "defender": 0.0} for _ in envs]
    accuracy = [float("nan")] * len(envs)
    rounds = [0] * len(envs)
    while live := [j for j, env in enumerate(envs) if env.agents]:
        actions = [{r: a.act(obs[j][r], envs[j].action_space(r), rngs[j][r]) for r, a in players[j].items()}
                   for j in live]
        for j, (o, rewards, _, _, infos) in zip(live, step_together([envs[j] for j in live], actions)):
            obs[j] = o
            for role, agent in players[j].items():
                agent.observe(rewards[role], infos[role])
                returns[j][role] += float(rewards[role])
            info = infos["attacker"]
            for m in ROUND_METRICS:
                per_round[j][m].append(float(info.get(m, float("nan"))))
            accuracy[j] = float(info["accuracy"])
            rounds[j] += 1
    out = []
    for j in range(len(envs)):
        metrics = {m: float(np.mean(v)) if v else float("nan") for m, v in per_round[j].items()}
        metrics.update(accuracy=accuracy[j], attacker_return=returns[j]["attacker"],
                       defender_return=returns[j]["defender"])
        out.append(EpisodeStats(metrics=metrics, rounds=rounds[j]))
    return out


def play_episode(env, attacker: Agent, defender: Agent, seed: int) -> EpisodeStats:
    """One episode of the parallel env; agents act with generators derived from ``seed``."""
    return play_episodes([env], [attacker], [defender], seed)[0]


def _input_files(scenario_name: str, specs: list[Any]) -> dict[str, str]:
    """Path -> content hash (:func:`leakgym.files.file_digest`) of every file the run's agents and scenario
    are read from: each policy's ``.zip`` and ``.json`` (a :class:`LearnedAgent` or a spec naming a file,
    as :func:`~leakgym.agents.policies.factory.make_agent` reads it) and the scenario's TOML file."""
    from leakgym.agents.policies.factory import SCRIPTED_NAMES
    from leakgym.agents.policies.learned import LearnedAgent, metadata_path
    from leakgym.agents.policies.presets import PRESETS
    from leakgym.files import file_digest
    from leakgym.game.scenario import SCENARIO_DIR

    paths = [SCENARIO_DIR / f"{scenario_name}.toml"]
    for spec in specs:
        if isinstance(spec, LearnedAgent):
            paths += [spec.path, metadata_path(spec.path)]
        elif isinstance(spec, (str, os.PathLike)) and not isinstance(spec, Agent):
            text = str(spec)
            if text in SCRIPTED_NAMES or text in PRESETS or text.startswith("fixed:"):
                continue
            if text.endswith(".zip") or Path(text).is_file():  # a policy, as make_agent reads it
                paths += [Path(text), metadata_path(text)]
    return {str(p): file_digest(p) for p in paths if p.is_file()}


def _label(spec: Any) -> str:
    return spec.name if isinstance(spec, Agent) else str(spec)


@dataclass
class _Track:
    """Episodes of one pair that one game and one attacker/defender pair play one after another."""

    pair: int
    episodes: list[int]
    attacker: Agent
    defender: Agent


def _groups(tracks: list[_Track], lockstep: int) -> list[list[_Track]]:
    """``tracks`` in groups of at most ``lockstep``, in order; an agent object is in at most one track
    of a group (every pair plays its own copies, :func:`_tracks`, so this holds by construction)."""
    groups: list[list[_Track]] = []
    group: list[_Track] = []
    used: set[int] = set()
    for track in tracks:
        mine = {id(track.attacker), id(track.defender)}
        if len(group) == lockstep or mine & used:
            groups.append(group)
            group, used = [], set()
        group.append(track)
        used |= mine
    return [*groups, group]


def _tracks(table: list[tuple], episodes: int, penv: Any) -> list[_Track]:
    """Pair ``p``'s episodes as one track (an agent learns across episodes) or one track per episode
    (both agents :attr:`~Agent.episodic`: each episode gets its own copies). Every agent is checked
    against its role's spaces in ``penv`` (:meth:`~Agent.check_spaces`)."""
    tracks = []
    for p, (a_spec, _, d_spec, _) in enumerate(table):
        # An Agent object given as a spec is a template: each pair plays its own copy, as a name builds a
        # fresh agent per pair (the object itself carried what it learnt from one pair into the next).
        attacker = copy.deepcopy(make_agent(a_spec, role="attacker", scenario=penv.scenario))
        defender = copy.deepcopy(make_agent(d_spec, role="defender", scenario=penv.scenario))
        for role, agent in (("attacker", attacker), ("defender", defender)):
            agent.check_spaces(penv.observation_space(role), penv.action_space(role))
        if attacker.episodic and defender.episodic:
            tracks += [_Track(p, [e], copy.deepcopy(attacker), copy.deepcopy(defender)) for e in range(episodes)]
        else:
            tracks.append(_Track(p, list(range(episodes)), attacker, defender))
    return tracks


def evaluate(
    env: str,
    attackers: list[Any],
    defenders: list[Any],
    *,
    episodes: int = 3,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    device: str = "cpu",
    lockstep: int = DEFAULT_LOCKSTEP,
) -> PayoffTable:
    """Play every attacker against every defender for ``episodes`` episodes (see the module docstring).

    ``lockstep`` games play together (in table order: a pair of episodic agents is one game per
    episode, any other pair one game for all its episodes; 1: one game at a time). With ``out``, each
    pair's episodes are written to ``out/episodes.csv`` as soon as the group of its last game ends (see
    :mod:`leakgym.agents.experiments.evaluation.episode_log`); with ``resume`` too, the pairs already
    there are read back instead of played again (``ValueError`` if that run had other settings; a group with an unfinished
    pair is replayed whole, recording only that pair). An interrupted call (``KeyboardInterrupt``)
    leaves every finished pair on disk.
    """
    from tqdm.auto import tqdm

    from leakgym.envs.leakgym_env import parallel_env, share_batch

    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    if not attackers or not defenders:
        raise ValueError(f"need at least one attacker and one defender; got {attackers} and {defenders}")
    if resume and out is None:
        raise ValueError("resume=True needs out= (the folder of the run to resume)")
    if isinstance(lockstep, bool) or not isinstance(lockstep, int) or lockstep < 1:
        raise ValueError(f"lockstep={lockstep!r}; allowed: integers >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r}; allowed: integers >= 0")
    gym_id, scenario_name = resolve_env(env)
    overrides = dict(overrides or {})
    penv = parallel_env(scenario_name, device=device, **overrides)  # checks the device
    # one spelling of it for the log and the table: the device decides float rounding, so a resume on
    # another one would mix two runs' numbers
    device_label = str(canonical_device(device))
    a_labels, d_labels = [_label(s) for s in attackers], [_label(s) for s in defenders]
    for names, role in ((a_labels, "attacker"), (d_labels, "defender")):
        if len(set(names)) != len(names):
            raise ValueError(f"{role} list {names} names an agent twice")
    table = [(a_spec, a_label, d_spec, d_label) for a_spec, a_label in zip(attackers, a_labels)
             for d_spec, d_label in zip(defenders, d_labels)]
    labels = [(a_label, d_label) for _, a_label, _, d_label in table]
    # Every pair's agents are built here, so a bad spec fails before the log is touched or anything runs.
    groups = _groups(_tracks(table, episodes, penv), lockstep)
    log = None
    if out is not None:
        import torch

        # the device and the torch threads decide the float rounding: a resume on others would mix two
        # runs' numbers
        settings = {"env_id": gym_id, "scenario": scenario_name, "attackers": a_labels, "defenders": d_labels,
                    "episodes": episodes, "seed": seed, "overrides": overrides, "lockstep": lockstep,
                    "device": device_label, "threads": torch.get_num_threads()}
        log = EpisodeLog.open(out, settings, resume=resume, files=_input_files(scenario_name, attackers + defenders))
    finished = log.finished if log is not None else {}
    # Every group's games are rows of one batch, so each round of a group is one batched round (step_together).
    envs = [penv] + [parallel_env(scenario_name, device=device, **overrides)
                     for _ in range(max(len(group) for group in groups) - 1)]
    share_batch(envs)
    played: dict[tuple[str, str], PairResult] = dict(finished)
    stats: dict[int, dict[int, EpisodeStats]] = {p: {} for p in range(len(table))}
    bar = tqdm(total=len(table) * episodes, initial=len(finished) * episodes, desc="eval", unit="episode",
               disable=not progress)
    # each pair's kept round (gallery_episode), recorded in whichever group plays that episode: a pair's
    # episodes may be split over groups
    last: dict[int, LastRound | None] = {}
    try:
        for group in groups:
            if all(labels[t.pair] in finished for t in group):
                continue
            # The whole group plays (its make-up decides the rounding of its shared attack computations),
            # so a resumed run gets the numbers the uninterrupted one got; only unfinished pairs are recorded.
            pairs_here = sorted({t.pair for t in group})
            bar.set_postfix_str(f"pairs {pairs_here[0] + 1}-{pairs_here[-1] + 1} of {len(table)}" if len(pairs_here) > 1
                                else "{} vs {}".format(*labels[pairs_here[0]]))
            for wave in range(max(len(t.episodes) for t in group)):
                live = [j for j, t in enumerate(group) if wave < len(t.episodes)]
                episode = play_episodes([envs[j] for j in live], [group[j].attacker for j in live],
                                        [group[j].defender for j in live],
                                        [seed + group[j].episodes[wave] for j in live])
                for j, result in zip(live, episode):
                    track = group[j]
                    stats[track.pair][track.episodes[wave]] = result
                    if track.episodes[wave] == gallery_episode(*divmod(track.pair, len(d_labels)), episodes):
                        last[track.pair] = LastRound.from_game(envs[j].last_round)
                bar.update(sum(labels[group[j].pair] not in finished for j in live))
            for p in pairs_here:
                if labels[p] in finished or len(stats[p]) < episodes:
                    continue  # recorded already, or its other episodes are in the next group
                pair = PairResult(*labels[p], [stats[p][e] for e in range(episodes)], last[p])
                if log is not None:
                    log.append(pair)
                played[labels[p]] = pair
    finally:
        bar.close()
        for game_env in envs:
            game_env.close()
    pairs = [played[key] for key in labels]
    return PayoffTable(
        env_id=gym_id,
        scenario=scenario_name,
        attackers=a_labels,
        defenders=d_labels,
        pairs=pairs,
        seed=seed,
        overrides=overrides,
        episodes=episodes,
        lockstep=lockstep,
        device=device_label,
    )


__all__ = ["DEFAULT_LOCKSTEP", "evaluate", "play_episode", "play_episodes"]

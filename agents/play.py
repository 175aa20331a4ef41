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
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import Agent
from .cli_common import resolve_env
from .episode_log import EpisodeLog
from .factory import make_agent
from .payoff import ROUND_METRICS, EpisodeStats, LastRound, PairResult, PayoffTable


def play_episode(env, attacker: Agent, defender: Agent, seed: int) -> EpisodeStats:
    """One episode of the parallel env; agents act with generators derived from ``seed``."""
    obs, _ = env.reset(seed=seed)
    agents = {"attacker": attacker, "defender": defender}
    rngs = {role: np.random.default_rng([seed, i]) for i, role in enumerate(agents)}
    for i, agent in enumerate(agents.values()):
        agent.reset(seed + 1000 * (i + 1))
    per_round: dict[str, list[float]] = {m: [] for m in ROUND_METRICS}
    returns = {"attacker": 0.0, "defender": 0.0}
    accuracy = float("nan")
    rounds = 0
    while env.agents:
        actions = {r: a.act(obs[r], env.action_space(r), rngs[r]) for r, a in agents.items()}
        obs, rewards, _, _, infos = env.step(actions)
        for role, agent in agents.items():
            agent.observe(rewards[role], infos[role])
            returns[role] += float(rewards[role])
        info = infos["attacker"]
        for m in ROUND_METRICS:
            per_round[m].append(float(info.get(m, float("nan"))))
        accuracy = float(info["accuracy"])
        rounds += 1
    metrics = {m: float(np.mean(v)) if v else float("nan") for m, v in per_round.items()}
    metrics.update(accuracy=accuracy, attacker_return=returns["attacker"], defender_return=returns["defender"])
    return EpisodeStats(metrics=metrics, rounds=rounds)


def _label(spec: Any) -> str:
    return spec.name if isinstance(spec, Agent) else str(spec)


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
) -> PayoffTable:
    """Play every attacker against every defender for ``episodes`` episodes (see the module docstring).

    With ``out``, each pair's episodes are written to ``out/episodes.csv`` as soon as the pair ends
    (see :mod:`leakgym.agents.episode_log`); with ``resume`` too, the pairs already there are read
    back instead of played again (``ValueError`` if that run had other settings). An interrupted call
    (``KeyboardInterrupt``) leaves every finished pair on disk.
    """
    from tqdm.auto import tqdm

    from leakgym.envs.leakgym_env import parallel_env

    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    if not attackers or not defenders:
        raise ValueError(f"need at least one attacker and one defender; got {attackers} and {defenders}")
    if resume and out is None:
        raise ValueError("resume=True needs out= (the folder of the run to resume)")
    gym_id, scenario_name = resolve_env(env)
    overrides = dict(overrides or {})
    penv = parallel_env(scenario_name, device=device, **overrides)
    scenario = penv.scenario
    # Build every agent once up front so that a bad spec fails before any episode runs.
    for spec in attackers:
        make_agent(spec, role="attacker", scenario=scenario)
    for spec in defenders:
        make_agent(spec, role="defender", scenario=scenario)
    a_labels, d_labels = [_label(s) for s in attackers], [_label(s) for s in defenders]
    for labels, role in ((a_labels, "attacker"), (d_labels, "defender")):
        if len(set(labels)) != len(labels):
            raise ValueError(f"{role} list {labels} names an agent twice")
    log = None
    if out is not None:
        settings = {"env_id": gym_id, "scenario": scenario_name, "attackers": a_labels, "defenders": d_labels,
                    "episodes": episodes, "seed": seed, "overrides": overrides}
        log = EpisodeLog.open(out, settings, resume=resume)
    finished = log.finished if log is not None else {}

    pairs: list[PairResult] = []
    total = len(attackers) * len(defenders) * episodes
    bar = tqdm(total=total, initial=len(finished) * episodes, desc="eval", unit="episode", disable=not progress)
    try:
        for a_spec, a_label in zip(attackers, a_labels):
            for d_spec, d_label in zip(defenders, d_labels):
                if (a_label, d_label) in finished:
                    pairs.append(finished[(a_label, d_label)])
                    continue
                attacker = make_agent(a_spec, role="attacker", scenario=scenario)
                defender = make_agent(d_spec, role="defender", scenario=scenario)
                stats = []
                for e in range(episodes):
                    bar.set_postfix_str(f"{a_label} vs {d_label}")
                    stats.append(play_episode(penv, attacker, defender, seed + e))
                    bar.update(1)
                pair = PairResult(a_label, d_label, stats, LastRound.from_game(penv.game.last))
                if log is not None:
                    log.append(pair)
                pairs.append(pair)
    finally:
        bar.close()
        penv.close()
    return PayoffTable(
        env_id=gym_id,
        scenario=scenario_name,
        attackers=a_labels,
        defenders=d_labels,
        pairs=pairs,
        seed=seed,
        overrides=overrides,
    )


__all__ = ["evaluate", "play_episode"]

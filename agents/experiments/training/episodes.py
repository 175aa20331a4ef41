"""Evaluation episodes of a policy against its opponent, one after another or in lockstep on a vector env."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..evaluation.payoff import METRIC_RANGES

#: per-episode quantities an evaluation reports (means over the episode's rounds, final accuracy)
EVAL_METRICS = ("return", "leakage", "leakage_ssim", "leakage_psnr", "accuracy")
#: their ranges (the leakage score lies in [0, 1]); intervals are clipped to them
EVAL_RANGES = {"return": (-math.inf, math.inf), "leakage": (0.0, 1.0),
               **{m: METRIC_RANGES[m] for m in ("leakage_ssim", "leakage_psnr", "accuracy")}}


def _eval_row(total: float, per_round: dict[str, list[float]], accuracy: float) -> dict[str, float]:
    row = {"return": total, **{m: float(np.mean(v)) for m, v in per_round.items()}}
    row["accuracy"] = accuracy
    return row


PER_ROUND_METRICS = ("leakage", "leakage_ssim", "leakage_psnr")


def run_eval_episodes(env, predict: Callable[[Any], Any], episodes: int, seed: int) -> list[dict[str, float]]:
    """Play ``episodes`` episodes (reset seeds ``seed + e``) of a single-agent view with ``predict``, one
    after another.

    Returns per episode: the learner's ``return``, the mean over rounds of ``leakage``,
    ``leakage_ssim`` and ``leakage_psnr``, and the test ``accuracy`` after the last round.
    """
    rows = []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        total, per_round, info, done = 0.0, {m: [] for m in PER_ROUND_METRICS}, {}, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(predict(obs))
            total += float(reward)
            for m, values in per_round.items():
                values.append(float(info.get(m, float("nan"))))
            done = terminated or truncated
        rows.append(_eval_row(total, per_round, float(info.get("accuracy", float("nan")))))
    return rows


def run_eval_episodes_together(venv, predict: Callable[[Any], Any], seed: int) -> list[dict[str, float]]:
    """:func:`run_eval_episodes` with its episodes played at once: episode ``e`` is game ``e`` of the
    vector env ``venv`` (``gym.make_vec``, reset seed ``seed + e``), all rounds of all games one
    :func:`~leakgym.game.round.play_round` per step; ``predict`` gets the games' observations as a batch.

    Each game starts from the state :func:`run_eval_episodes`' episode ``e`` starts from (the same
    reset seed, its own copy of the opponent), so the rows are that function's to the rounding of the
    batched attacks (:func:`leakgym.game.round.reconstruct_all`). A game whose episode ended is not
    recorded further while the others finish.
    """
    n = venv.num_envs
    obs, _ = venv.reset(seed=[seed + e for e in range(n)])
    totals = [0.0] * n
    per_round = [{m: [] for m in PER_ROUND_METRICS} for _ in range(n)]
    accuracy = [float("nan")] * n
    done = np.zeros(n, dtype=bool)
    while not done.all():
        obs, rewards, terminated, truncated, infos = venv.step(predict(obs))
        for i in np.flatnonzero(~done):
            totals[i] += float(rewards[i])
            for m, values in per_round[i].items():
                present = m in infos and infos[f"_{m}"][i]
                values.append(float(infos[m][i]) if present else float("nan"))
            if terminated[i] or truncated[i]:
                done[i] = True
                if "accuracy" in infos and infos["_accuracy"][i]:
                    accuracy[i] = float(infos["accuracy"][i])
    return [_eval_row(totals[i], per_round[i], accuracy[i]) for i in range(n)]


def evaluate_policy(make_env: Callable[[int], Any], predict: Callable[[Any], Any], episodes: int, seed: int, *,
                    together: bool) -> list[dict[str, float]]:
    """One evaluation: ``episodes`` episodes on environments built for it (``make_env(num_envs)``: a
    single-agent view for 1, a vector env otherwise), closed after.

    Fresh environments mean a fresh opponent, so an evaluation does not depend on the ones before it
    (an opponent that learns across episodes, the bandit, would otherwise carry what it learned into
    the next evaluation). ``together``: the episodes in lockstep (:func:`run_eval_episodes_together`)
    -- for opponents that do not learn across episodes (:attr:`leakgym.agents.Agent.episodic`), where
    each episode's own copy of the opponent plays what the shared one would; otherwise one after
    another on one env (:func:`run_eval_episodes`), the opponent learning across them as in training.
    """
    env = make_env(episodes if together else 1)
    try:
        if together:
            return run_eval_episodes_together(env, predict, seed)
        return run_eval_episodes(env, predict, episodes, seed)
    finally:
        env.close()

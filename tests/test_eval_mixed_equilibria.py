"""``leakgym eval`` reports the mixed equilibria of its payoff table, with the bootstrap stability of their supports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from leakgym.agents.experiments.evaluation.analysis import mixed_equilibria, mixed_equilibria_text
from leakgym.agents.experiments.evaluation.payoff import METRICS, EpisodeStats, PairResult, PayoffTable
from leakgym.agents.experiments.evaluation.reporting import write_json


def _table(attacker_returns, defender_returns, attackers, defenders) -> PayoffTable:
    """A table whose pair (i, j) has the per-episode returns ``attacker_returns[i][j]`` (a list)."""
    pairs = []
    for i, a in enumerate(attackers):
        for j, d in enumerate(defenders):
            episodes = []
            for ra, rd in zip(attacker_returns[i][j], defender_returns[i][j]):
                metrics = dict.fromkeys(METRICS, 0.5)
                metrics.update(attacker_return=float(ra), defender_return=float(rd))
                episodes.append(EpisodeStats(metrics=metrics, rounds=2))
            pairs.append(PairResult(a, d, episodes))
    return PayoffTable("LeakGym-Digits-v0", "digits", list(attackers), list(defenders), pairs, seed=0, overrides={},
                       episodes=len(pairs[0].episodes))


def test_matching_pennies_table_has_its_mixed_equilibrium_with_a_stable_support():
    noise = np.array([0.05, -0.05, 0.02, -0.02, 0.0])
    A = [[list(1 + noise), list(-1 + noise)], [list(-1 + noise), list(1 + noise)]]
    B = [[[-v for v in A[i][j]] for j in range(2)] for i in range(2)]
    table = _table(A, B, ["ig", "dlg"], ["noise", "prune"])
    result = mixed_equilibria(table, resamples=50)
    assert len(result["equilibria"]) == 1
    e = result["equilibria"][0]
    assert e["attacker_mix"] == pytest.approx({"ig": 0.5, "dlg": 0.5}, abs=1e-6)
    assert e["defender_support"] == ["noise", "prune"]
    assert e["support_stability"] == 1.0 and result["resamples"] == 50
    assert "ig 0.50, dlg 0.50" in mixed_equilibria_text(result)


def test_an_unstable_support_is_reported_as_such():
    """Two attackers whose mean returns differ by less than their episode-to-episode spread: the pure
    equilibrium's support changes under resampling (stability well below 1)."""
    A = [[[2.0, 0.0] * 4], [[1.1, 0.95] * 4]]  # means 1.0 and 1.025; the first's spread is 1
    B = [[list(np.zeros(8))], [list(np.zeros(8))]]
    table = _table(A, B, ["a", "b"], ["none"])
    result = mixed_equilibria(table, resamples=200)
    stabilities = [e["support_stability"] for e in result["equilibria"]]
    assert stabilities and max(stabilities) < 0.9


def test_payoff_json_carries_mixed_equilibria(tmp_path):
    A = [[[3, 3], [0, 0]], [[0, 0], [2, 2]]]
    B = [[[2, 2], [0, 0]], [[0, 0], [3, 3]]]
    table = _table(A, B, ["a0", "a1"], ["d0", "d1"])
    write_json(table, tmp_path / "payoff.json")
    payload = json.loads((tmp_path / "payoff.json").read_text())
    eqs = payload["mixed_equilibria"]["equilibria"]
    assert len(eqs) == 3  # battle of the sexes: two pure, one mixed
    mixed = next(e for e in eqs if len(e["attacker_support"]) == 2)
    assert mixed["attacker_mix"]["a0"] == pytest.approx(0.6) and mixed["defender_mix"]["d1"] == pytest.approx(0.6)
    assert {"attacker_value", "defender_value", "support_stability"} <= set(mixed)


def test_a_table_without_finite_returns_is_not_solved():
    table = _table([[[float("nan"), 1.0]]], [[[0.0, 0.0]]], ["a"], ["d"])
    result = mixed_equilibria(table)
    assert result["equilibria"] == [] and "finite" in result["note"]

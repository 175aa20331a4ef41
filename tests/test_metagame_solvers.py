"""The meta-solvers of ``leakgym.agents.experiments.metagame``: every equilibrium of a bimatrix game, PRD, uniform."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from leakgym.agents.experiments.metagame import (
    DegenerateGameWarning,
    IncompleteEnumerationWarning,
    analyse_game,
    meta_solver,
    nash_equilibria,
    projected_replicator_dynamics,
)
from leakgym.agents.experiments.metagame.solvers import (
    MAX_ENUMERATION,
    is_equilibrium,
    nash_conv,
    select_equilibrium,
)


def _quiet(A, B):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a nondegenerate game warns about nothing
        return nash_equilibria(A, B)


def _contains(equilibria, x, y, atol=1e-6):
    return any(np.allclose(ex, x, atol=atol) and np.allclose(ey, y, atol=atol) for ex, ey in equilibria)


def test_matching_pennies_has_one_mixed_equilibrium():
    A = np.array([[1.0, -1.0], [-1.0, 1.0]])
    eqs = _quiet(A, -A)
    assert len(eqs) == 1
    assert np.allclose(eqs[0][0], [0.5, 0.5]) and np.allclose(eqs[0][1], [0.5, 0.5])


def test_rock_paper_scissors_is_uniform():
    A = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    eqs = _quiet(A, -A)
    assert len(eqs) == 1
    assert np.allclose(eqs[0][0], 1 / 3) and np.allclose(eqs[0][1], 1 / 3)


def test_prisoners_dilemma_has_one_pure_equilibrium():
    A = np.array([[3.0, 0.0], [5.0, 1.0]])  # row: cooperate, defect
    eqs = _quiet(A, A.T)
    assert len(eqs) == 1
    assert np.allclose(eqs[0][0], [0, 1]) and np.allclose(eqs[0][1], [0, 1])


def test_battle_of_the_sexes_has_three():
    A = np.array([[3.0, 0.0], [0.0, 2.0]])
    B = np.array([[2.0, 0.0], [0.0, 3.0]])
    eqs = _quiet(A, B)
    assert len(eqs) == 3
    assert _contains(eqs, [1, 0], [1, 0]) and _contains(eqs, [0, 1], [0, 1])
    assert _contains(eqs, [3 / 5, 2 / 5], [2 / 5, 3 / 5])


def test_degenerate_game_is_said_and_its_sets_extreme_points_listed():
    # von Stengel (2007, Fig. 3.x): the first row has two best responses; an infinite set of equilibria
    # ((1,0,0), (q, 1-q)) for q in [2/3, 1], plus one isolated mixed equilibrium.
    A = np.array([[3.0, 3.0], [2.0, 5.0], [0.0, 6.0]])
    B = np.array([[3.0, 3.0], [2.0, 6.0], [3.0, 1.0]])
    with pytest.warns(DegenerateGameWarning, match="degenerate"):
        eqs = nash_equilibria(A, B)
    assert _contains(eqs, [0, 1 / 3, 2 / 3], [1 / 3, 2 / 3])
    assert _contains(eqs, [1, 0, 0], [1, 0]) and _contains(eqs, [1, 0, 0], [2 / 3, 1 / 3])
    assert all(is_equilibrium(A, B, x, y) for x, y in eqs)
    assert analyse_game(A, B).degenerate


def test_every_listed_pair_is_an_equilibrium_and_nash_conv_is_zero():
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    eqs = nash_equilibria(A, B)
    assert len(eqs) % 2 == 1  # a nondegenerate game has an odd number (random payoffs: nondegenerate)
    for x, y in eqs:
        gain_a, gain_d = nash_conv(A, B, x, y)
        assert gain_a < 1e-9 and gain_d < 1e-9
    # a perturbed mixture is not an equilibrium: the check has teeth
    x, y = eqs[0]
    assert sum(nash_conv(A, B, np.full(4, 0.25), y)) > 1e-3 or sum(nash_conv(A, B, x, np.full(6, 1 / 6))) > 1e-3


def test_one_strategy_on_a_side():
    eqs = _quiet(np.array([[1.0, 2.0, 0.5]]), np.array([[0.0, 1.0, 0.5]]))
    assert len(eqs) == 1 and np.allclose(eqs[0][1], [0, 1, 0])
    # Found in an audit: past MAX_ENUMERATION strategies the complete list of best responses was said to be
    # possibly incomplete
    n = MAX_ENUMERATION + 2
    eqs = _quiet(np.zeros((1, n)), -np.arange(float(n))[None])
    assert len(eqs) == 1 and np.allclose(eqs[0][1], np.eye(n)[0])
    eqs = _quiet(-np.arange(float(n))[:, None], np.zeros((n, 1)))
    assert len(eqs) == 1 and np.allclose(eqs[0][0], np.eye(n)[0])


@pytest.mark.parametrize("seed", [1, 2])
def test_large_tables_by_mixed_integer_programming_agree_with_vertex_enumeration(seed):
    """Past MAX_ENUMERATION strategies the equilibria come one support pattern at a time from a MILP; on a
    table small enough for both, the two lists are the same (a random table is nondegenerate)."""
    from leakgym.agents.experiments.metagame import solvers

    rng = np.random.default_rng(seed)
    A, B = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
    by_vertices = _quiet(A, B)
    a, b = solvers._scaled(A), solvers._scaled(B)
    by_milp, complete = solvers._milp_equilibria(a, b)
    assert complete and len(by_milp) == len(by_vertices)
    assert all(_contains(by_vertices, x, y, atol=1e-5) for x, y in by_milp)
    big = rng.normal(size=(9, MAX_ENUMERATION - 9 + 3))
    analysis = analyse_game(big, -big)  # zero-sum: one equilibrium
    assert analysis.method.startswith("mixed-integer") and analysis.exhaustive
    assert len(analysis.equilibria) == 1
    e = analysis.equilibria[0]
    assert is_equilibrium(big, -big, e.attacker_mix, e.defender_mix)


def test_an_incomplete_list_is_said(monkeypatch):
    from leakgym.agents.experiments.metagame import solvers

    rng = np.random.default_rng(4)
    A, B = rng.normal(size=(9, 9)), rng.normal(size=(9, 9))
    monkeypatch.setattr(solvers, "MAX_MILP_EQUILIBRIA", 1)
    monkeypatch.setattr(solvers._milp_equilibria, "__defaults__", (1,))
    with pytest.warns(IncompleteEnumerationWarning, match="incomplete"):
        eqs = nash_equilibria(A, B)
    assert len(eqs) == 1 and is_equilibrium(A, B, *eqs[0])


@pytest.mark.parametrize("A, B, match", [
    (np.zeros((2, 2)), np.zeros((2, 3)), "one shape"),
    (np.zeros((0, 2)), np.zeros((0, 2)), "empty population"),
    (np.array([[1.0, np.nan]]), np.zeros((1, 2)), "finite"),
])
def test_bad_tables_are_refused(A, B, match):
    with pytest.raises(ValueError, match=match):
        nash_equilibria(A, B)


def test_payoffs_near_float64s_largest_value_are_solved():
    """Found in an audit: the scaling's difference of two finite payoffs overflowed, and nash failed with 'no
    equilibrium found' (prd with an IndexError)."""
    big = np.finfo(np.float64).max * 0.95
    A = np.array([[big, -big], [-big, big]])
    assert _contains(_quiet(A, -A), [0.5, 0.5], [0.5, 0.5])
    for name in ("nash", "prd"):
        x, y = meta_solver(name)(A, -A)
        assert np.allclose(x, 0.5, atol=1e-3) and np.allclose(y, 0.5, atol=1e-3)
    # and near its smallest (found in a review: the halving made subnormal payoffs all zero)
    tiny = np.array([[5e-324, 0.0], [0.0, 5e-324]])
    eqs = nash_equilibria(tiny, tiny)
    assert _contains(eqs, [1, 0], [1, 0]) and _contains(eqs, [0, 1], [0, 1])
    assert all(is_equilibrium(tiny, tiny, x, y) for x, y in eqs) and not _contains(eqs, [1, 0], [0, 1])


def test_projected_replicator_dynamics():
    R = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    x, y = projected_replicator_dynamics(R, -R)
    assert np.allclose(x, 1 / 3, atol=0.02) and np.allclose(y, 1 / 3, atol=0.02)
    A = np.array([[3.0, 0.0], [5.0, 1.0]])
    x, y = projected_replicator_dynamics(A, A.T)
    assert x[1] > 0.99 and y[1] > 0.99  # defect is dominant
    with pytest.raises(ValueError, match="dt"):
        projected_replicator_dynamics(A, A.T, dt=-1.0)


def test_nash_meta_solver_prefers_the_mixed_equilibrium():
    A = np.array([[3.0, 0.0], [0.0, 2.0]])
    B = np.array([[2.0, 0.0], [0.0, 3.0]])
    e = select_equilibrium(analyse_game(A, B))
    assert len(e.attacker_support) == 2 and len(e.defender_support) == 2
    x, y = meta_solver("nash")(A, B)
    assert np.allclose(x, [0.6, 0.4]) and np.allclose(y, [0.4, 0.6])
    x, y = meta_solver("uniform")(A, B)
    assert np.allclose(x, 0.5) and np.allclose(y, 0.5)


def test_unknown_meta_solver_is_one_line_with_the_allowed_names():
    with pytest.raises(ValueError) as info:
        meta_solver("nahs")
    message = str(info.value)
    assert "\n" not in message and "'nash'" in message and "nash, prd, uniform" in message


@pytest.mark.parametrize("case", ["constant 2x2", "constant 7x6", "duplicated rock-paper-scissors 7x7"])
def test_nash_widens_an_extreme_equilibrium_where_ties_allow_a_more_mixed_one(case):
    """Found in an audit: vertex enumeration and the mixed-integer program return extreme equilibria, so a table
    with tied members (a PSRO best response that copies an earlier member, a constant table) got all the weight
    on one copy: the all-zero 7 x 6 table gave two pure strategies. nash() now widens its pick within the set of
    equilibria around it: every tied member that some equilibrium there plays is played."""
    from leakgym.agents.experiments.metagame.solvers import nash, nash_conv, support

    if case == "constant 2x2":
        A = B = np.ones((2, 2))
    elif case == "constant 7x6":  # (past MAX_ENUMERATION strategies: the mixed-integer path)
        A = B = np.zeros((7, 6))
    else:
        rps = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])
        copies = [0, 1, 2, 0, 1, 2, 0]
        A = rps[np.ix_(copies, copies)]
        B = -A
    x, y = nash(A, B)
    assert max(nash_conv(A, B, x, y)) <= 1e-9
    assert support(x) == list(range(A.shape[0])) and support(y) == list(range(A.shape[1]))
    if case.startswith("constant"):
        np.testing.assert_allclose(x, np.full(A.shape[0], 1 / A.shape[0]))
        np.testing.assert_allclose(y, np.full(A.shape[1], 1 / A.shape[1]))

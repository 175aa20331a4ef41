"""Meta-solvers: from an empirical payoff table to one mixture per player.

A payoff table of ``m`` attackers and ``n`` defenders is two ``(m, n)`` arrays: ``A[i, j]`` the
attacker's payoff and ``B[i, j]`` the defender's when attacker ``i`` meets defender ``j``. LeakGym's
game is general-sum (the rewards combine leakage, accuracy and cost differently for each side), so the
solvers here are the two-player general-sum ones:

* :func:`nash_equilibria` -- every Nash equilibrium, by vertex enumeration of the two best-response
  polytopes (Avis, Rosenberg, Savani & von Stengel 2010; nashpy's ``vertex_enumeration``), each checked
  as an equilibrium before it is returned. For a table too large to enumerate (more than
  :data:`MAX_ENUMERATION` strategies in all) one equilibrium per support pattern is found by mixed-integer
  programming (:func:`_milp_equilibria`, scipy's HiGHS; complete for a nondegenerate game), and
  :class:`IncompleteEnumerationWarning` says when that list may be incomplete.
* :func:`projected_replicator_dynamics` -- PRD, the meta-solver of PSRO (Lanctot et al. 2017, Sec. 3.1 and
  Appendix A): replicator dynamics projected onto the simplex with every probability at least
  ``gamma / (number of strategies)``; the average of the second half of the trajectory is returned.
* :func:`uniform` -- the uniform mixture (PSRO with it is fictitious play over the population).

Degenerate games (a mixed strategy of support size ``k`` with more than ``k`` pure best responses, e.g.
two attackers with equal payoffs against a defender) can have infinite sets of equilibria; vertex
enumeration then returns the extreme points of those sets (possibly several per set), and
:class:`DegenerateGameWarning` says that the list is not the whole set. :func:`analyse_game` returns the
equilibria together with that diagnosis, their supports and each side's value.

:func:`select_equilibrium` picks the one equilibrium the ``nash`` meta-solver starts from: the one of largest
joint entropy (ties broken by order), so that the meta-strategy does not put all its weight on one member
when the table also supports a mixture; :func:`nash` then widens it (:func:`_widened`) where the table's ties
make a more mixed equilibrium around it, which no extreme point is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: vertex enumeration for tables of at most this many strategies (attackers + defenders); measured with
#: nashpy 0.0.43 on random tables on one CPU core: 4 x 7 in 0.09 s, 6 x 9 in 0.6 s, 7 x 10 in 5 s. Larger tables go to
#: :func:`_milp_equilibria` (nashpy's Lemke-Howson cycled without end on a random 9 x 9 table).
MAX_ENUMERATION = 12
#: at most this many equilibria from the mixed-integer enumeration of a large table
MAX_MILP_EQUILIBRIA = 64
#: an equilibrium check tolerates this much gain from deviating (payoffs are scaled to unit range first)
EQUILIBRIUM_TOLERANCE = 1e-6
#: probabilities below this are outside a mixture's support
SUPPORT_TOLERANCE = 1e-6


class DegenerateGameWarning(UserWarning):
    """The game is degenerate: its equilibria may form infinite sets, of which only extreme points are listed."""


class IncompleteEnumerationWarning(UserWarning):
    """The list of equilibria may be incomplete (the mixed-integer enumeration stopped at its limit)."""


def _check_tables(attacker_payoffs, defender_payoffs) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(attacker_payoffs, dtype=np.float64)
    B = np.asarray(defender_payoffs, dtype=np.float64)
    if A.ndim != 2 or A.shape != B.shape:
        raise ValueError(f"payoff tables must be two 2-d arrays of one shape (attackers x defenders); got shapes "
                         f"{A.shape} and {B.shape}")
    if A.shape[0] < 1 or A.shape[1] < 1:
        raise ValueError(f"empty population: payoff table of shape {A.shape}; each side needs at least one strategy")
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
        raise ValueError("payoff tables must be finite (a pair without a finite mean return cannot be solved)")
    return A, B


def _scaled(M: np.ndarray) -> np.ndarray:
    """``M`` shifted and scaled to [0, 1] (equilibria are invariant to a positive affine map of a player's payoffs)."""
    lo, hi = M.min(), M.max()
    with np.errstate(over="ignore"):
        span = float(hi - lo)
    if np.isinf(span):
        # the difference of two finite payoffs passed float64's largest value: halved first (found in an audit:
        # [[1.7e308, -1.7e308], ...] became inf and NaN, and the solvers failed with an unexplained error). Only
        # then: halving loses subnormal payoffs (5e-324 / 2 is 0; found in a review)
        return (M / 2 - lo / 2) / float(hi / 2 - lo / 2)
    return (M - lo) / span if span > 0 else np.zeros_like(M)


def is_equilibrium(A: np.ndarray, B: np.ndarray, x: np.ndarray, y: np.ndarray,
                   tolerance: float = EQUILIBRIUM_TOLERANCE) -> bool:
    """Whether neither side gains more than ``tolerance`` (in units of its payoff range) by deviating."""
    a, b = _scaled(np.asarray(A, float)), _scaled(np.asarray(B, float))
    return bool((a @ y).max() <= x @ a @ y + tolerance and (x @ b).max() <= x @ b @ y + tolerance)


def _clean(p: np.ndarray) -> np.ndarray:
    p = np.where(np.abs(p) < SUPPORT_TOLERANCE, 0.0, np.asarray(p, dtype=np.float64))
    p = np.clip(p, 0.0, None)
    return p / p.sum()


def support(p: np.ndarray) -> list[int]:
    """The indices a mixture plays with probability above :data:`SUPPORT_TOLERANCE`."""
    return [int(i) for i in np.flatnonzero(np.asarray(p) > SUPPORT_TOLERANCE)]


def _milp_equilibria(a: np.ndarray, b: np.ndarray, limit: int = MAX_MILP_EQUILIBRIA, *, largest_support: bool = False
                     ) -> tuple[list[tuple[np.ndarray, np.ndarray]], bool]:
    """Equilibria of the unit-range tables ``(a, b)`` one support pattern at a time, by the mixed-integer
    formulation of Sandholm, Gilpin & Conitzer (2005, "Mixed-integer programming methods for finding Nash
    equilibria", Formulation 1) solved with scipy's HiGHS: binary ``s_i = 1`` marks a strategy outside the
    support, which may then have positive regret (at most 1, the payoff range); every found pattern is
    cut off (a no-good constraint) and the program solved again until it is infeasible. In a nondegenerate
    game each equilibrium has its own support pattern, so the list is complete; returns ``(equilibria,
    complete)``, ``complete`` False when ``limit`` was reached or a solve hit its time limit.
    ``largest_support``: minimise the number of strategies outside the supports, so that the first
    equilibrium found is one of the most mixed (what the ``nash`` meta-solver wants of a large table)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    m, n = a.shape
    size = m + n + 2 + m + n  # x, y, u_a, u_d, s_a, s_d
    ix, iy, iua, iud = np.arange(m), m + np.arange(n), m + n, m + n + 1
    isa, isd = m + n + 2 + np.arange(m), m + n + 2 + m + np.arange(n)
    rows, low, high = [], [], []

    def add(row: np.ndarray, lo: float, hi: float) -> None:
        rows.append(row)
        low.append(lo)
        high.append(hi)

    for idx in (ix, iy):  # probabilities sum to one
        r = np.zeros(size)
        r[idx] = 1
        add(r, 1, 1)
    # For each side: u - (payoff of pure strategy k against the other's mix) in [0, s_k], and p_k <= 1 - s_k
    # (rows of ``a`` against y for the attacker; columns of ``b`` against x for the defender)
    for payoffs, own, value, outside, other in ((a, ix, iua, isa, iy), (b.T, iy, iud, isd, ix)):
        for k in range(len(own)):
            r = np.zeros(size)
            r[value], r[other] = 1, -payoffs[k]
            add(r, 0, np.inf)
            r2 = r.copy()
            r2[outside[k]] = -1
            add(r2, -np.inf, 0)
            r3 = np.zeros(size)
            r3[own[k]], r3[outside[k]] = 1, 1
            add(r3, -np.inf, 1)
    cost = np.zeros(size)
    if largest_support:
        cost[np.concatenate([isa, isd])] = 1.0
    integrality = np.zeros(size)
    integrality[np.concatenate([isa, isd])] = 1
    bounds = Bounds(np.zeros(size), np.ones(size))
    binaries = np.concatenate([isa, isd])
    found: list[tuple[np.ndarray, np.ndarray]] = []
    while len(found) < limit:
        result = milp(cost, constraints=LinearConstraint(np.array(rows), low, high),
                      integrality=integrality, bounds=bounds, options={"time_limit": 30})
        if result.status == 2:  # infeasible: every support pattern is found
            return found, True
        if result.status != 0 or result.x is None:
            return found, False
        z = result.x
        found.append((z[ix].copy(), z[iy].copy()))
        pattern = np.round(z[binaries]).astype(int)
        cut = np.zeros(size)  # sum over s* = 1 of (1 - s) + sum over s* = 0 of s >= 1
        cut[binaries] = np.where(pattern == 1, -1.0, 1.0)
        add(cut, 1 - int(pattern.sum()), np.inf)
    return found, False


def _is_degenerate(a: np.ndarray, b: np.ndarray, equilibria: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Degenerate if a pure strategy (support 1) has several pure best responses, if some equilibrium
    strategy of support ``k`` has more than ``k`` best responses, or if the count of equilibria is even
    (a nondegenerate game has an odd number: Shapley's index theorem)."""
    tol = TIE_TOLERANCE
    if any(np.sum(b[i] >= b[i].max() - tol) > 1 for i in range(a.shape[0])):
        return True
    if any(np.sum(a[:, j] >= a[:, j].max() - tol) > 1 for j in range(a.shape[1])):
        return True
    for x, y in equilibria:
        ay, xb = a @ y, x @ b
        if np.sum(ay >= ay.max() - tol) > len(support(y)) or np.sum(xb >= xb.max() - tol) > len(support(x)):
            return True
    return len(equilibria) % 2 == 0


@dataclass
class Equilibrium:
    """One equilibrium of a payoff table: the two mixtures, their supports and each side's expected payoff."""

    attacker_mix: np.ndarray
    defender_mix: np.ndarray
    attacker_value: float
    defender_value: float

    @property
    def attacker_support(self) -> list[int]:
        return support(self.attacker_mix)

    @property
    def defender_support(self) -> list[int]:
        return support(self.defender_mix)

    @property
    def entropy(self) -> float:
        p = np.concatenate([self.attacker_mix, self.defender_mix])
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())


@dataclass
class GameAnalysis:
    """What :func:`analyse_game` found: the equilibria, whether the game is degenerate, the method, and
    whether the list is exhaustive (every extreme equilibrium, or one per support pattern for large tables)."""

    equilibria: list[Equilibrium]
    degenerate: bool
    exhaustive: bool
    method: str

    @property
    def note(self) -> str:
        notes = []
        if self.degenerate:
            listed = ("their extreme points are listed" if self.method == "vertex enumeration"
                      else "one equilibrium per support pattern is listed")
            notes.append(f"degenerate game: equilibria may form infinite sets; {listed}")
        if not self.exhaustive:
            notes.append(f"the list may be incomplete (the enumeration stopped at {MAX_MILP_EQUILIBRIA} equilibria "
                         "or a solver time limit)")
        return "; ".join(notes)


def analyse_game(attacker_payoffs, defender_payoffs) -> GameAnalysis:
    """Every equilibrium of the bimatrix game (see the module docstring), with supports, values and the
    degeneracy diagnosis; no warnings (:func:`nash_equilibria` warns)."""
    import nashpy

    A, B = _check_tables(attacker_payoffs, defender_payoffs)
    a, b = _scaled(A), _scaled(B)
    m, n = A.shape
    # nashpy's vertex enumeration needs positive payoffs; a constant shift changes no equilibrium
    game = nashpy.Game(a + 1.0, b + 1.0)
    exhaustive = m + n <= MAX_ENUMERATION
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nashpy warns about degeneracy in its own words; diagnosed below
        candidates: list = []
        if min(m, n) == 1:
            # One strategy on a side: the other side's pure best responses are the extreme equilibria (qhull
            # needs two dimensions)
            if m == 1:
                candidates = [(np.ones(1), np.eye(n)[j]) for j in np.flatnonzero(b[0] >= b[0].max() - 1e-12)]
            else:
                candidates = [(np.eye(m)[i], np.ones(1)) for i in np.flatnonzero(a[:, 0] >= a[:, 0].max() - 1e-12)]
            method = "best responses to the single strategy"
            exhaustive = True  # (every extreme equilibrium, whatever the table's size: found in an audit, 1 x 20
            # tables were said to be possibly incomplete)
        elif exhaustive:
            try:
                candidates = list(game.vertex_enumeration())
                method = "vertex enumeration"
            except Exception:  # noqa: BLE001 - qhull refuses some flat (degenerate) polytopes
                exhaustive = False
        if not candidates and min(m, n) > 1:
            candidates, complete = _milp_equilibria(a, b)
            exhaustive = complete
            method = "mixed-integer programming over supports (scipy HiGHS)"
    found: list[tuple[np.ndarray, np.ndarray]] = []
    for x, y in candidates:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != (m,) or y.shape != (n,) or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            continue
        if x.sum() <= 0 or y.sum() <= 0:
            continue
        x, y = _clean(x), _clean(y)
        if not is_equilibrium(A, B, x, y):
            continue
        if any(np.allclose(x, fx, atol=1e-6) and np.allclose(y, fy, atol=1e-6) for fx, fy in found):
            continue
        found.append((x, y))
    if not found and method == "vertex enumeration":
        # qhull's rounding can lose a degenerate table's vertices: the mixed-integer search finds one
        for x, y in _milp_equilibria(a, b, limit=1)[0]:
            x, y = _clean(x), _clean(y)
            if is_equilibrium(A, B, x, y):
                found.append((x, y))
        method += " (mixed-integer programming as a fallback)"
        exhaustive = False
    if not found:  # pragma: no cover - a finite game always has one
        raise RuntimeError("no equilibrium found; please report the payoff table")
    equilibria = [Equilibrium(x, y, float(x @ A @ y), float(x @ B @ y)) for x, y in found]
    return GameAnalysis(equilibria, _is_degenerate(a, b, found), exhaustive, method)


def nash_equilibria(attacker_payoffs, defender_payoffs) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every Nash equilibrium of the two-player general-sum game as ``(attacker_mix, defender_mix)`` arrays
    (rows = attacker strategies, columns = defender strategies).

    Warns :class:`DegenerateGameWarning` for a degenerate game (the list then holds the extreme points of
    the equilibrium sets, or one per support pattern for a large table) and :class:`IncompleteEnumerationWarning`
    when the list may be incomplete (see :func:`analyse_game`). ``ValueError`` for tables of
    different shapes, an empty population or a non-finite payoff.
    """
    analysis = analyse_game(attacker_payoffs, defender_payoffs)
    if analysis.degenerate:
        warnings.warn(f"degenerate game ({len(analysis.equilibria)} equilibria listed): equilibria may form "
                      "infinite sets, of which the extreme points are listed", DegenerateGameWarning, stacklevel=2)
    if not analysis.exhaustive:
        warnings.warn(f"{analysis.method}: {analysis.note}", IncompleteEnumerationWarning, stacklevel=2)
    return [(e.attacker_mix, e.defender_mix) for e in analysis.equilibria]


def select_equilibrium(analysis: GameAnalysis) -> Equilibrium:
    """The equilibrium the ``nash`` meta-solver plays: largest joint entropy, the first on ties."""
    best = max(range(len(analysis.equilibria)), key=lambda k: (round(analysis.equilibria[k].entropy, 9), -k))
    return analysis.equilibria[best]


def _project_simplex(v: np.ndarray, floor: float) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{p : sum p = 1, p >= floor}`` (Duchi et al. 2008, Fig. 1, on the
    shifted simplex)."""
    n = v.size
    mass = 1.0 - floor * n
    w = v - floor
    u = np.sort(w)[::-1]
    css = np.cumsum(u) - mass
    rho = np.nonzero(u - css / np.arange(1, n + 1) > 0)[0][-1]
    theta = css[rho] / (rho + 1.0)
    return np.maximum(w - theta, 0.0) + floor


def projected_replicator_dynamics(attacker_payoffs, defender_payoffs, *, iterations: int = 20_000,
                                  dt: float = 1e-2, gamma: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Projected replicator dynamics (Lanctot et al. 2017, Appendix A): from the uniform mixtures, each
    step moves ``x <- P(x + dt * x * (A y - x.A y))`` (likewise ``y`` with ``B``), ``P`` the projection onto
    the simplex with every probability at least ``gamma / n``; payoffs are scaled to unit range first. Returns
    the average of the second half of the trajectory (OpenSpiel averages the last strategies too)."""
    A, B = _check_tables(attacker_payoffs, defender_payoffs)
    for name, value, ok in (("iterations", iterations, isinstance(iterations, int) and iterations >= 2),
                            ("dt", dt, np.isfinite(dt) and dt > 0), ("gamma", gamma, np.isfinite(gamma) and 0 <= gamma < 1)):
        if not ok:
            raise ValueError(f"{name}={value!r}; allowed: iterations >= 2, dt > 0, 0 <= gamma < 1")
    a, b = _scaled(A), _scaled(B)
    m, n = A.shape
    x, y = np.full(m, 1.0 / m), np.full(n, 1.0 / n)
    sx, sy = np.zeros(m), np.zeros(n)
    start = iterations // 2
    for t in range(iterations):
        ay, xb = a @ y, x @ b
        x_next = _project_simplex(x + dt * x * (ay - x @ ay), gamma / m)
        y = _project_simplex(y + dt * y * (xb - xb @ y), gamma / n)
        x = x_next
        if t >= start:
            sx += x
            sy += y
    return sx / sx.sum(), sy / sy.sum()


def uniform(attacker_payoffs, defender_payoffs) -> tuple[np.ndarray, np.ndarray]:
    """The uniform mixture over each population."""
    A, _ = _check_tables(attacker_payoffs, defender_payoffs)
    m, n = A.shape
    return np.full(m, 1.0 / m), np.full(n, 1.0 / n)


#: a strategy whose payoff is within this of the best (in unit-range payoffs) is a tied best response when an
#: equilibrium is widened (:func:`_widened`)
TIE_TOLERANCE = 1e-9


def _widest(own: np.ndarray, other: np.ndarray, opponent: np.ndarray, current: np.ndarray) -> np.ndarray:
    """One side's mixture in the equilibria with the opponent's mixture ``opponent`` fixed, with every strategy
    that can be played played: ``own`` (``(k, l)``: this side's payoff of its strategy ``i`` against the
    opponent's ``j``) and ``other`` (the opponent's payoffs, same layout). The mixtures ``p`` that keep the pair
    an equilibrium are a polytope: ``p`` on this side's best responses to ``opponent`` only, and every strategy
    ``opponent`` plays still a best response of the opponent to ``p``. One LP per best response finds the
    polytope's point with the most weight on it; their average lies in the polytope and plays every strategy any
    of its points plays (``current``, a point of the polytope, where no LP solves)."""
    from scipy.optimize import linprog

    gains = own @ opponent
    best = np.flatnonzero(gains >= gains.max() - TIE_TOLERANCE)
    played = np.flatnonzero(opponent > SUPPORT_TOLERANCE)
    if len(best) < 2:
        return current
    k = own.shape[0]
    replies = other[best].T  # (l, |best|): the opponent's payoff of its strategy j against each best response
    # for every strategy j the opponent plays and every strategy q it could play: p . (replies[q] - replies[j]) <= 0
    upper = (replies[None, :, :] - replies[played][:, None, :]).reshape(-1, len(best))
    points = []
    for t in range(len(best)):
        objective = np.zeros(len(best))
        objective[t] = -1.0
        out = linprog(objective, A_ub=upper, b_ub=np.zeros(len(upper)), A_eq=np.ones((1, len(best))), b_eq=[1.0],
                      bounds=(0, None), method="highs")
        if out.status == 0:
            p = np.zeros(k)
            p[best] = np.clip(out.x, 0.0, None)
            points.append(p / p.sum())
    return np.mean(points, axis=0) if points else current


def _widened(A: np.ndarray, B: np.ndarray, x: np.ndarray, y: np.ndarray, rounds: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """The equilibrium ``(x, y)`` of a degenerate table widened to the largest supports its set of equilibria
    allows around it: each side in turn takes :func:`_widest` against the other's mixture (every step keeps an
    equilibrium, and the supports only grow). Vertex enumeration and the mixed-integer program both return
    extreme points: in a table with tied members (a PSRO best response that copies an earlier member, a constant
    table) those put all the weight on one of the copies, where the copies mixed are equilibria too (found in an
    audit: the all-zero 7 x 6 table gave two pure strategies, not the uniform pair)."""
    a, b = _scaled(A), _scaled(B)
    for _ in range(rounds):
        wider_x = _widest(a, b, y, x)
        wider_y = _widest(b.T, a.T, wider_x, y)
        grown = support(wider_x) != support(x) or support(wider_y) != support(y)
        if not is_equilibrium(A, B, wider_x, wider_y):
            break
        x, y = _clean(wider_x), _clean(wider_y)
        if not grown:
            break
    return x, y


def nash(attacker_payoffs, defender_payoffs) -> tuple[np.ndarray, np.ndarray]:
    """The ``nash`` meta-solver: the equilibrium :func:`select_equilibrium` picks among :func:`analyse_game`'s;
    for a table of more than :data:`MAX_ENUMERATION` strategies, whose list would be long (a PSRO table with
    near-duplicate members has many support patterns), one equilibrium of largest support straight from
    :func:`_milp_equilibria` (one solve). Either is then widened (:func:`_widened`) where the table's ties
    allow a more mixed equilibrium around it."""
    A, B = _check_tables(attacker_payoffs, defender_payoffs)
    m, n = A.shape
    if m + n > MAX_ENUMERATION and min(m, n) > 1:
        for x, y in _milp_equilibria(_scaled(A), _scaled(B), limit=1, largest_support=True)[0]:
            x, y = _clean(x), _clean(y)
            if is_equilibrium(A, B, x, y):
                return _widened(A, B, x, y)
    e = select_equilibrium(analyse_game(A, B))
    return _widened(A, B, e.attacker_mix, e.defender_mix)


#: ``--meta-solver`` name -> function ``(A, B) -> (attacker_mix, defender_mix)``
META_SOLVERS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "nash": nash,
    "prd": projected_replicator_dynamics,
    "uniform": uniform,
}


def meta_solver(name: str) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """The meta-solver called ``name``; ``ValueError`` naming the allowed ones otherwise."""
    from leakgym.suggest import did_you_mean

    if name not in META_SOLVERS:
        raise ValueError(f"meta-solver {name!r}{did_you_mean(str(name), list(META_SOLVERS))}; allowed: "
                         f"{', '.join(META_SOLVERS)}")
    return META_SOLVERS[name]


def nash_conv(A: np.ndarray, B: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Each side's gain from its best pure deviation against ``(x, y)`` in the full table ``(A, B)``:
    ``(max_i (A y)_i - x.A y, max_j (x B)_j - x.B y)``; their sum is NashConv (0 at an equilibrium)."""
    A, B = _check_tables(A, B)
    return float((A @ y).max() - x @ A @ y), float((x @ B).max() - x @ B @ y)


__all__ = [
    "EQUILIBRIUM_TOLERANCE",
    "MAX_ENUMERATION",
    "META_SOLVERS",
    "DegenerateGameWarning",
    "Equilibrium",
    "GameAnalysis",
    "IncompleteEnumerationWarning",
    "analyse_game",
    "is_equilibrium",
    "meta_solver",
    "nash",
    "nash_conv",
    "nash_equilibria",
    "projected_replicator_dynamics",
    "select_equilibrium",
    "support",
    "uniform",
]

"""Who beats whom in an empirical payoff table: best responses, pure-strategy and mixed equilibria.

A best response is decided by mean return, which two agents can share (two attackers that play the
same action) and which a few episodes only estimate. So every best response lists all the agents tied
at the best mean (``tied``), and says whether it is ``clear``: its 95% interval lies above the interval
of every other agent; a winner whose interval overlaps the runner-up's is the best *of this table*,
not a finding. The printed table marks both.

Mixed equilibria (:func:`mixed_equilibria`) are every Nash equilibrium of the table's mean attacker and
defender returns (:func:`leakgym.agents.experiments.metagame.solvers.analyse_game`); a bootstrap over
episodes says how stable each one's support is: episode indices are resampled with replacement, the same indices for
every pair (episode ``e`` of every pair shares its seed, so this keeps the pairing), and the share of
resamples whose table has an equilibrium with the same supports is reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .payoff import PayoffTable

#: means closer than this (relative to the larger, at least 1e-12 absolute) are a tie, not a win
TIE_TOLERANCE = 1e-9


def _best(mean: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[list[int], bool]:
    """The indices tied at the best finite mean of ``mean`` (a 1-d array; none when no mean is finite) and
    whether the best is clear of every other agent at 95% (its interval's low end above their intervals'
    high ends)."""
    finite = np.isfinite(mean)
    if not finite.any():  # nothing to compare: no best response (not the first agent by list order)
        return [], False
    top = float(np.max(mean[finite]))
    tol = max(TIE_TOLERANCE * abs(top), 1e-12)
    tied = [i for i in range(len(mean)) if finite[i] and mean[i] >= top - tol]
    others = [i for i in range(len(mean)) if i not in tied]
    floor = min(float(low[i]) for i in tied)
    # an agent without an interval (one episode, a non-finite return) cannot be told apart: not clear
    clear = len(tied) == 1 and all(np.isfinite(floor) and np.isfinite(high[i]) and floor > float(high[i])
                                   for i in others)
    return tied, bool(clear)


def best_responses(table: PayoffTable) -> dict[str, Any]:
    """Best responses by mean return, and the pure-strategy equilibria of the empirical game.

    ``against_defender[d]``: the attacker with the highest mean attacker return against ``d``
    (``attacker``; every attacker tied at that mean in ``tied``; ``clear``: its 95% interval above every
    other attacker's); ``against_attacker[a]``: the same for defenders; ``pure_equilibria``: every pair
    of mutual best responses (ties included), each with ``clear`` when both best responses are.
    """
    ra, rd = table.matrix("attacker_return_mean"), table.matrix("defender_return_mean")
    ra_low, ra_high = table.matrix("attacker_return_ci95_low"), table.matrix("attacker_return_ci95_high")
    rd_low, rd_high = table.matrix("defender_return_ci95_low"), table.matrix("defender_return_ci95_high")
    ssim = table.matrix("leakage_ssim_mean")
    best_a = [_best(ra[:, j], ra_low[:, j], ra_high[:, j]) for j in range(len(table.defenders))]  # per defender
    best_d = [_best(rd[i], rd_low[i], rd_high[i]) for i in range(len(table.attackers))]  # per attacker
    nan = float("nan")
    against_defender = {
        d: {"attacker": table.attackers[tied[0]] if tied else None,
            "attacker_return": ra[tied[0], j] if tied else nan, "leakage_ssim": ssim[tied[0], j] if tied else nan,
            "tied": [table.attackers[i] for i in tied], "clear": clear}
        for j, (d, (tied, clear)) in enumerate(zip(table.defenders, best_a))
    }
    against_attacker = {
        a: {"defender": table.defenders[tied[0]] if tied else None,
            "defender_return": rd[i, tied[0]] if tied else nan, "leakage_ssim": ssim[i, tied[0]] if tied else nan,
            "tied": [table.defenders[j] for j in tied], "clear": clear}
        for i, (a, (tied, clear)) in enumerate(zip(table.attackers, best_d))
    }
    equilibria = [
        {"attacker": table.attackers[i], "defender": table.defenders[j], "clear": best_a[j][1] and best_d[i][1]}
        for i in range(len(table.attackers))
        for j in range(len(table.defenders))
        if i in best_a[j][0] and j in best_d[i][0]
    ]
    return {"against_defender": against_defender, "against_attacker": against_attacker, "pure_equilibria": equilibria}


#: bootstrap resamples of the mixed equilibria's support stability
BOOTSTRAP_RESAMPLES = 200


def mixed_equilibria(table: PayoffTable, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """Every mixed equilibrium of the table's mean returns, with supports, probabilities, each side's value and
    the bootstrap share of resamples with the same supports (``support_stability``; None with one episode).

    Returns ``{"equilibria": [...], "degenerate", "exhaustive", "method", "note", "resamples"}``;
    ``equilibria`` is empty (and ``note`` says why) when a pair has no finite mean return.
    """
    from ..metagame.solvers import MAX_ENUMERATION, analyse_game, support

    cached = getattr(table, "_mixed_equilibria", None)  # payoff.json and the printed summary share one bootstrap
    if cached is not None and cached[0] == (resamples, seed):
        return cached[1]
    ra, rd = table.matrix("attacker_return_mean"), table.matrix("defender_return_mean")
    if not (np.all(np.isfinite(ra)) and np.all(np.isfinite(rd))):
        return {"equilibria": [], "degenerate": None, "exhaustive": None, "method": None, "resamples": 0,
                "note": "not solved: a pair has no finite mean return"}
    analysis = analyse_game(ra, rd)
    keys = [(tuple(e.attacker_support), tuple(e.defender_support)) for e in analysis.equilibria]
    counts = dict.fromkeys(keys, 0)
    n_episodes = {len(p.episodes) for p in table.pairs}
    done = 0
    # past MAX_ENUMERATION strategies one table's list takes many solves: no bootstrap (resamples = 0)
    small = len(table.attackers) + len(table.defenders) <= MAX_ENUMERATION
    if resamples > 0 and small and len(n_episodes) == 1 and min(n_episodes) >= 2:
        n = n_episodes.pop()
        by_pair = {(p.attacker, p.defender): p for p in table.pairs}
        sa = np.array([[[e.metrics["attacker_return"] for e in by_pair[(a, d)].episodes] for d in table.defenders]
                       for a in table.attackers], dtype=np.float64)
        sd = np.array([[[e.metrics["defender_return"] for e in by_pair[(a, d)].episodes] for d in table.defenders]
                       for a in table.attackers], dtype=np.float64)
        rng = np.random.default_rng(seed)
        for _ in range(resamples):
            idx = rng.integers(0, n, size=n)
            found = analyse_game(sa[:, :, idx].mean(axis=2), sd[:, :, idx].mean(axis=2)).equilibria
            got = {(tuple(support(e.attacker_mix)), tuple(support(e.defender_mix))) for e in found}
            for key in counts:
                counts[key] += key in got
            done += 1
    equilibria = []
    for e, key in zip(analysis.equilibria, keys):
        equilibria.append({
            "attacker_support": [table.attackers[i] for i in e.attacker_support],
            "defender_support": [table.defenders[j] for j in e.defender_support],
            "attacker_mix": {table.attackers[i]: float(e.attacker_mix[i]) for i in e.attacker_support},
            "defender_mix": {table.defenders[j]: float(e.defender_mix[j]) for j in e.defender_support},
            "attacker_value": e.attacker_value,
            "defender_value": e.defender_value,
            "support_stability": counts[key] / done if done else None,
        })
    result = {"equilibria": equilibria, "degenerate": analysis.degenerate, "exhaustive": analysis.exhaustive,
              "method": analysis.method, "note": analysis.note, "resamples": done}
    table._mixed_equilibria = ((resamples, seed), result)
    return result


def mixed_equilibria_text(result: dict[str, Any]) -> str:
    """The mixed equilibria as printed by ``leakgym eval``."""
    if not result["equilibria"]:
        return f"mixed equilibria: {result['note']}"
    lines = [f"mixed equilibria of the mean returns ({result['method']}"
             + (f"; support stability: share of {result['resamples']} bootstrap resamples of the episodes with an "
                "equilibrium of the same supports" if result["resamples"] else "") + "):"]
    for k, e in enumerate(result["equilibria"], 1):
        mix = lambda d: ", ".join(f"{name} {p:.2f}" for name, p in d.items())
        stable = "" if e["support_stability"] is None else f"  [support stable in {100 * e['support_stability']:.0f}%]"
        lines.append(f"  {k}. attacker: {mix(e['attacker_mix'])} | defender: {mix(e['defender_mix'])}  "
                     f"(values {e['attacker_value']:.3f}, {e['defender_value']:.3f}){stable}")
    if result["note"]:
        lines.append(f"  note: {result['note']}")
    return "\n".join(lines)


def _mark(response: dict[str, Any], one_episode: bool = False) -> str:
    """``"(tie: a, b)"`` / ``"(within noise)"`` after a best response that is not a clear win
    (``one_episode``: the pairs have one episode each, so no interval at all)."""
    if not response["tied"]:
        return "  (no finite return)"
    if len(response["tied"]) > 1:
        return f"  (tie: {', '.join(response['tied'])})"
    if response["clear"]:
        return ""
    return "  (within noise: no 95% interval from 1 episode)" if one_episode else "  (within noise: 95% intervals overlap)"


def who_beats_whom(table: PayoffTable) -> str:
    """A plain-text table of the best responses (printed by ``leakgym eval``)."""
    br = best_responses(table)
    one_episode = min(len(p.episodes) for p in table.pairs) < 2
    wa = max(12, *(len(a) for a in table.attackers))
    wd = max(12, *(len(d) for d in table.defenders))
    lines = ["best attacker against each defender (highest attacker return):",
             f"  {'defender':<{wd}}  {'best attacker':<{wa}}  {'return':>8}  {'SSIM':>6}"]
    for d, r in br["against_defender"].items():
        lines.append(f"  {d:<{wd}}  {r['attacker'] or '-':<{wa}}  {r['attacker_return']:8.3f}  {r['leakage_ssim']:6.3f}"
                     + _mark(r, one_episode))
    lines += ["best defender against each attacker (highest defender return):",
              f"  {'attacker':<{wa}}  {'best defender':<{wd}}  {'return':>8}  {'SSIM':>6}"]
    for a, r in br["against_attacker"].items():
        lines.append(f"  {a:<{wa}}  {r['defender'] or '-':<{wd}}  {r['defender_return']:8.3f}  {r['leakage_ssim']:6.3f}"
                     + _mark(r, one_episode))
    eq = ", ".join(f"({e['attacker']}, {e['defender']}){'' if e['clear'] else '*'}"
                   for e in br["pure_equilibria"]) or "none"
    lines.append(f"pure-strategy equilibria of this table: {eq}")
    if any(not e["clear"] for e in br["pure_equilibria"]):
        lines.append("  *: a best response in it is tied or within noise (more episodes would decide it)")
    return "\n".join(lines)


__all__ = ["BOOTSTRAP_RESAMPLES", "TIE_TOLERANCE", "best_responses", "mixed_equilibria", "mixed_equilibria_text", "who_beats_whom"]

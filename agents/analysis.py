"""Who beats whom in an empirical payoff table: best responses and pure-strategy equilibria.

A best response is decided by mean return, which two agents can share (two attackers that play the
same action) and which a few episodes only estimate. So every best response lists all the agents tied
at the best mean (``tied``), and says whether it is ``clear``: its 95% interval lies above the interval
of every other agent; a winner whose interval overlaps the runner-up's is the best *of this table*,
not a finding. The printed table marks both.
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


__all__ = ["TIE_TOLERANCE", "best_responses", "who_beats_whom"]

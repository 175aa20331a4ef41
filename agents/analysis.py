"""Who beats whom in an empirical payoff table: best responses and pure-strategy equilibria."""

from __future__ import annotations

from typing import Any

import numpy as np

from .payoff import PayoffTable


def best_responses(table: PayoffTable) -> dict[str, Any]:
    """Best responses by mean return, and the pure-strategy equilibria of the empirical game.

    ``against_defender[d]``: the attacker with the highest mean attacker return against ``d``;
    ``against_attacker[a]``: the defender with the highest mean defender return against ``a``;
    ``pure_equilibria``: pairs that are mutual best responses (pure Nash equilibria of the table).
    """
    ra = table.matrix("attacker_return_mean")
    rd = table.matrix("defender_return_mean")
    ssim = table.matrix("leakage_ssim_mean")
    best_a = np.nanargmax(ra, axis=0)  # per defender
    best_d = np.nanargmax(rd, axis=1)  # per attacker
    against_defender = {
        d: {"attacker": table.attackers[best_a[j]], "attacker_return": ra[best_a[j], j], "leakage_ssim": ssim[best_a[j], j]}
        for j, d in enumerate(table.defenders)
    }
    against_attacker = {
        a: {"defender": table.defenders[best_d[i]], "defender_return": rd[i, best_d[i]], "leakage_ssim": ssim[i, best_d[i]]}
        for i, a in enumerate(table.attackers)
    }
    equilibria = [
        {"attacker": table.attackers[i], "defender": table.defenders[j]}
        for i in range(len(table.attackers))
        for j in range(len(table.defenders))
        if best_a[j] == i and best_d[i] == j
    ]
    return {"against_defender": against_defender, "against_attacker": against_attacker, "pure_equilibria": equilibria}


def who_beats_whom(table: PayoffTable) -> str:
    """A plain-text table of the best responses (printed by ``leakgym eval``)."""
    br = best_responses(table)
    wa = max(12, *(len(a) for a in table.attackers))
    wd = max(12, *(len(d) for d in table.defenders))
    lines = ["best attacker against each defender (highest attacker return):",
             f"  {'defender':<{wd}}  {'best attacker':<{wa}}  {'return':>8}  {'SSIM':>6}"]
    for d, r in br["against_defender"].items():
        lines.append(f"  {d:<{wd}}  {r['attacker']:<{wa}}  {r['attacker_return']:8.3f}  {r['leakage_ssim']:6.3f}")
    lines += ["best defender against each attacker (highest defender return):",
              f"  {'attacker':<{wa}}  {'best defender':<{wd}}  {'return':>8}  {'SSIM':>6}"]
    for a, r in br["against_attacker"].items():
        lines.append(f"  {a:<{wa}}  {r['defender']:<{wd}}  {r['defender_return']:8.3f}  {r['leakage_ssim']:6.3f}")
    eq = ", ".join(f"({e['attacker']}, {e['defender']})" for e in br["pure_equilibria"]) or "none"
    lines.append(f"pure-strategy equilibria of this table: {eq}")
    return "\n".join(lines)


__all__ = ["best_responses", "who_beats_whom"]

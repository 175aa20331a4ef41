"""Verdict statistics of `leakgym reproduce`: holds / tie / does not hold, on synthetic numbers."""

from __future__ import annotations

import math

import pytest

from leakgym.reproduce.runner import drop_verdict, extreme_verdict, ranking_verdict
from leakgym.reproduce.stats import (
    FAILS,
    HOLDS,
    TIE,
    UNCHECKED,
    UNDECIDED,
    Estimate,
    against,
    bound,
    combine,
    compare,
    difference,
    estimate,
    exact,
    ranking,
)


def test_estimate_is_mean_and_standard_error():
    e = estimate([1.0, 2.0, 3.0, 4.0])
    assert e.mean == 2.5 and e.n == 4
    assert e.se == pytest.approx(math.sqrt(5 / 3) / 2)  # std(ddof=1) / sqrt(n)
    assert estimate([7.0]).se == 0.0
    with pytest.raises(ValueError, match="no values"):
        estimate([])


@pytest.mark.parametrize(("a", "b", "lower", "want"), [
    (Estimate(1.0, 0.1, 8), Estimate(2.0, 0.1, 8), True, HOLDS),     # gap 1.0 > 2 * 0.141
    (Estimate(1.0, 0.4, 8), Estimate(2.0, 0.4, 8), True, TIE),       # gap 1.0 < 2 * 0.566
    (Estimate(2.0, 0.1, 8), Estimate(1.0, 0.1, 8), True, FAILS),     # the other way, beyond noise
    (Estimate(2.0, 0.1, 8), Estimate(1.0, 0.1, 8), False, HOLDS),    # "higher" claim
    (Estimate(1.0, 0.0, 8), Estimate(1.0, 0.0, 8), True, TIE),       # equal: never "holds"
])
def test_compare(a, b, lower, want):
    assert compare(a, b, lower=lower) == want


def test_two_standard_errors_is_the_boundary():
    se = 0.5 / math.sqrt(2)  # hypot(se, se) = 0.5 -> noise band 1.0
    assert compare(Estimate(0.0, se, 4), Estimate(1.01, se, 4)) == HOLDS
    assert compare(Estimate(0.0, se, 4), Estimate(0.99, se, 4)) == TIE


def test_against_a_threshold_and_difference():
    assert against(Estimate(20.0, 1.0, 10), 25.0) == HOLDS
    assert against(Estimate(24.0, 1.0, 10), 25.0) == TIE
    assert against(Estimate(30.0, 1.0, 10), 25.0) == FAILS
    d = difference(Estimate(90.0, 0.3, 3), Estimate(88.0, 0.4, 3))
    assert d.mean == pytest.approx(2.0) and d.se == pytest.approx(0.5)



@pytest.mark.parametrize(("a", "b"), [(estimate([0.39]), estimate([0.38])),     # one image of one seed
                                      (estimate([0.39]), estimate([0.1, 0.2])),
                                      (estimate([10.0]), exact(50.0))])            # one value, a wide gap
def test_a_single_value_decides_nothing(a, b):
    """Found in an audit: ``--seeds 0 --images 1`` gave standard errors of 0, so a 0.01 SSIM gap decided
    "DCS² gives the lowest SSIM" and the table printed "± 0.00". One value has no standard error."""
    assert compare(a, b) == compare(b, a) == compare(a, b, lower=False) == UNDECIDED
    assert bound(difference(a, b), 0.0) == UNDECIDED
    assert str(estimate([0.39])) == "0.39 (one value)"
    assert difference(estimate([1.0, 2.0]), exact(1.0)).n == 2  # an exact operand adds no noise, nor a count
    assert against(estimate([20.0, 21.0, 19.0]), 25.0) == HOLDS  # (a threshold is exact, not one value)


def test_a_bound_neither_met_nor_broken_is_undecided():
    """Found in an audit: OASIS's accuracy-drop bound and PPP's SSIM-gap bound used against(), so a 4 ± 3-point
    drop against a 3-point bound was a "tie (within noise)"; a bound on a difference is undecided there."""
    drop = Estimate(4.0, 3.0, 3)
    assert against(drop, 3.0) == TIE and bound(drop, 3.0) == UNDECIDED
    assert bound(Estimate(1.0, 0.5, 3), 3.0) == HOLDS and bound(Estimate(9.0, 0.5, 3), 3.0) == FAILS


def test_oasis_accuracy_bound_says_undecided_on_committed_results():
    """The OASIS claim "no transformation costs more than MAX_DROP points" on the committed run, with MR+SH made
    a (MAX_DROP + 1) ± 3-point drop over three seeds and no drop elsewhere: undecided (it said "tie (within
    noise)")."""
    import json
    from pathlib import Path

    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.oasis import MAX_DROP

    result = json.loads((Path(__file__).parents[1] / "docs/results/reproduce_oasis.json").read_text())
    base, row = result["utility"]["WO"]["accuracy"], result["utility"]["MR+SH"]
    drop, spread = (MAX_DROP + 1) / 100, 0.052
    row["accuracy_per_seed"] = [base - drop - spread, base - drop, base - drop + spread]
    row["accuracy"] = sum(row["accuracy_per_seed"]) / 3
    row["accuracy_se"] = spread / math.sqrt(3)
    for other in set(result["utility"]) - {"WO", "MR+SH"}:
        result["utility"][other] = dict(result["utility"]["WO"])
    (claim,) = [v for v in paper_spec("oasis").verdicts(result) if "costs more than" in v["claim"]]
    assert claim["status"] == UNDECIDED, claim


def test_combine():
    assert combine([HOLDS, HOLDS]) == HOLDS
    assert combine([HOLDS, TIE]) == TIE
    assert combine([HOLDS, TIE, UNDECIDED]) == UNDECIDED and combine([UNDECIDED, FAILS]) == FAILS
    assert combine([HOLDS, TIE, FAILS]) == FAILS
    assert combine([HOLDS, UNCHECKED]) == UNCHECKED
    assert combine([]) == UNCHECKED
    with pytest.raises(ValueError, match="unknown verdict status"):
        combine(["maybe"])


def test_ranking_checks_every_pair_the_paper_orders():
    paper = {"a": 0.1, "b": 0.5, "c": 0.9, "d": 0.9}  # c and d tie in the paper: no claim between them
    clear = {"a": Estimate(0.0, 0.01, 8), "b": Estimate(0.5, 0.01, 8), "c": Estimate(1.0, 0.01, 8),
             "d": Estimate(0.95, 0.01, 8)}
    assert ranking(clear, paper) == (HOLDS, [])
    noisy = dict(clear, b=Estimate(0.5, 0.4, 8))
    status, notes = ranking(noisy, paper)
    assert status == TIE and any(n.startswith("a ") and "b " in n for n in notes)
    swapped = dict(clear, a=Estimate(0.7, 0.01, 8))
    status, notes = ranking(swapped, paper)
    assert status == FAILS and any("does not hold" in n for n in notes)


def test_verdict_helpers():
    ours = {"x": Estimate(1.0, 0.1, 8), "y": Estimate(3.0, 0.1, 8), "z": Estimate(1.1, 0.1, 8)}
    assert extreme_verdict("x lowest", ours, "x")["status"] == TIE          # x vs z within noise
    assert extreme_verdict("y highest", ours, "y", lowest=False)["status"] == HOLDS
    v = ranking_verdict("rank", ours, {"x": 1.0, "y": 2.0})
    assert v["status"] == HOLDS and v["why"] == "" and "x 1.00 ± 0.10" in v["ours"]
    keeps = drop_verdict("keeps", Estimate(95.0, 0.2, 3), Estimate(94.5, 0.2, 3), 2.0)
    loses = drop_verdict("loses", Estimate(95.0, 0.2, 3), Estimate(80.0, 0.2, 3), 2.0, why="because")
    unsure = drop_verdict("unsure", Estimate(95.0, 1.0, 3), Estimate(93.0, 1.0, 3), 2.0)
    # a drop that neither meets nor breaks its bound is undecided, not a tie (issue 36)
    assert (keeps["status"], loses["status"], unsure["status"]) == (HOLDS, FAILS, UNDECIDED)
    assert loses["why"] == "because" and "two standard errors" in unsure["why"]
    assert drop_verdict("n/a", None, Estimate(1.0, 0.0, 1), 2.0)["status"] == UNCHECKED


def _one_value_each(result: dict) -> dict:
    """A committed result cut down to what ``--seeds 0 --images 1`` measures: one image per cell, one seed per
    utility row and diagnosis curve."""
    import copy

    def first(v):
        if isinstance(v, list):
            return v[:1]
        return {k: x[:1] if isinstance(x, list) else x for k, x in v.items()} if isinstance(v, dict) else v

    def cut(obj):
        if isinstance(obj, dict):
            return {k: (first(v) if k in ("per_seed", "sent", "curves", "curves_obscured_test")
                        or k.endswith("_per_seed") else cut(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [cut(v) for v in obj]
        return obj

    out = cut(copy.deepcopy(result))
    for c in out["cells"]:
        c["per_image"] = {k: v[:1] for k, v in c["per_image"].items()}
        c["sent"] = c.get("sent", [])[:1]
    for u in out["utility"].values():
        for key in ("accuracy", "accuracy_victim", "test_loss"):
            if u.get(f"{key}_per_seed"):
                u[key], u[f"{key}_se"] = u[f"{key}_per_seed"][0], 0.0
    return out


@pytest.mark.parametrize("paper", ["dcs2", "oasis", "ppp", "censor", "loda"])
def test_one_value_each_decides_no_verdict_and_claims_no_reason(paper):
    """Found in review: with one value each, verdicts were undecided but kept reasons written for a failed
    claim ("the stochastic bottleneck did not derail IG"), LODA's diagnosis read an undecided comparison as
    a finding ("no better with more rounds"), and OASIS's 'MR or SH' claim ranked the statuses without
    'undecided' (a ValueError). Every verdict now holds, fails or ties only on measured noise."""
    import json
    from pathlib import Path

    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.runner import UNDECIDED_WHY

    result = json.loads((Path(__file__).parents[1] / f"docs/results/reproduce_{paper}.json").read_text())
    verdicts = paper_spec(paper).verdicts(_one_value_each(result))
    assert verdicts
    for v in verdicts:
        assert v["status"] in (UNDECIDED, UNCHECKED, HOLDS, FAILS), v  # (a share of 0 or 1 images may be exact)
        if v["status"] == UNDECIDED:
            assert v["why"] == UNDECIDED_WHY or "more seeds would decide it" in v["why"], v

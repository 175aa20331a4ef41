"""``leakgym eval``'s statistics and files on hand-made inputs whose answers are worked out by hand, and
its log against damaged or hand-edited files (tests/test_evaluation.py and tests/test_eval_resume.py
cover the common paths)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pickle

import numpy as np
import pytest

from leakgym.agents.experiments.evaluation import cli as ev
from leakgym.agents.experiments.evaluation import episode_log as el
from leakgym.agents.experiments.evaluation import play
from leakgym.agents.experiments.evaluation.payoff import (
    METRICS,
    EpisodeStats,
    LastRound,
    PairResult,
    PayoffTable,
)

TINY = {"rounds": 1, "num_clients": 1, "iterations": [1], "eval_size": 16}


def _pair(a: str, d: str, ra, rd=None, ssim=None, last: LastRound | None = None) -> PairResult:
    """A pair whose episodes have attacker returns ``ra`` (a list, one per episode), defender returns
    ``rd`` (default ``-ra``: zero-sum) and leakage SSIM ``ssim`` (default ``ra``)."""
    ra = list(ra)
    rd = [-x for x in ra] if rd is None else list(rd)
    ssim = ra if ssim is None else list(ssim)
    episodes = []
    for x, y, s in zip(ra, rd, ssim, strict=True):
        metrics = {m: 0.5 for m in METRICS}
        metrics.update(attacker_return=x, defender_return=y, leakage_ssim=s)
        episodes.append(EpisodeStats(metrics, 2))
    return PairResult(a, d, episodes, last)


def _table(attackers, defenders, by_pair: dict) -> PayoffTable:
    pairs = [_pair(a, d, *by_pair[(a, d)]) if isinstance(by_pair[(a, d)], tuple) else _pair(a, d, by_pair[(a, d)])
             for a in attackers for d in defenders]
    return PayoffTable("X-v0", "x", list(attackers), list(defenders), pairs, 0, {})


# ------------------------------------------------------------------ the interval
def test_t_interval_by_hand_identical_values_clipping_and_non_finite():
    # n = 2, values 0 and 1: mean 0.5, s = 1/sqrt(2), t_{0.975, 1} = 12.7062047...: half = t * s / sqrt(2) = t / 2
    mean, low, high = ev.t_interval([0.0, 1.0])
    assert mean == 0.5 and (low, high) == pytest.approx((0.5 - 6.3531024, 0.5 + 6.3531024))
    # ... clipped to a range it leaves the mean inside
    assert ev.t_interval([0.0, 1.0], bounds=(-1.0, 1.0)) == (0.5, -1.0, 1.0)
    assert ev.t_interval([0.0, 1.0], bounds=(0.0, math.inf))[1:] == pytest.approx((0.0, 6.8531024))
    # n = 3, values 1, 2, 3: s = 1, t_{0.975, 2} = 4.3026527...; a 90% interval uses t_{0.95, 2} = 2.9199856...
    assert ev.t_interval([1.0, 2.0, 3.0])[1:] == pytest.approx((2 - 4.3026527 / 3**0.5, 2 + 4.3026527 / 3**0.5))
    assert ev.t_interval([1.0, 2.0, 3.0], confidence=0.9)[1:] == pytest.approx((2 - 2.9199856 / 3**0.5,
                                                                                   2 + 2.9199856 / 3**0.5))
    # identical episodes: an interval of width 0 at the value itself (not NaN)
    assert ev.t_interval([0.25, 0.25, 0.25, 0.25]) == (0.25, 0.25, 0.25)
    # a value at the edge of its range stays inside it, the mean too
    mean, low, high = ev.t_interval([1.0, 1.0, 0.0], bounds=(-1.0, 1.0))
    assert low <= mean <= high == 1.0
    # no finite mean from a non-finite value, and no interval from one value or none
    for values in ([0.1, float("nan"), 0.3], [0.1, float("inf")], []):
        assert all(math.isnan(v) for v in ev.t_interval(values)), values



def test_psnr_intervals_stay_below_the_psnr_cap():
    """Found in an audit: PSNR's range was [0, inf), so an exact reconstruction beside a poor one gave an
    upper end of 197 dB in payoff.csv; the game caps PSNR at DEFAULT_MAX_DB (100 dB)."""
    from leakgym.agents.experiments.evaluation.payoff import METRIC_RANGES
    from leakgym.metrics.functional import DEFAULT_MAX_DB

    assert METRIC_RANGES["leakage_psnr"] == (0.0, DEFAULT_MAX_DB) == (0.0, 100.0)
    mean, low, high = ev.t_interval([100.0, 20.0], bounds=METRIC_RANGES["leakage_psnr"])
    assert (mean, low, high) == (60.0, 0.0, 100.0)


# ------------------------------------------------------------------ best responses and equilibria
def test_best_responses_orientation_on_a_non_square_table():
    """Rows are attackers, columns defenders; zero-sum, return = +-leakage. Leakage:

                D1    D2
          A1   0.9   0.1
          A2   0.5   0.4
          A3   0.2   0.3

    The attacker maximises leakage down a column (D1: A1, D2: A2), the defender minimises it along a
    row (A1: D2, A2: D2, A3: D1); the one pure equilibrium is the saddle point (A2, D2)."""
    leak = {("A1", "D1"): 0.9, ("A1", "D2"): 0.1, ("A2", "D1"): 0.5, ("A2", "D2"): 0.4, ("A3", "D1"): 0.2,
            ("A3", "D2"): 0.3}
    table = _table(["A1", "A2", "A3"], ["D1", "D2"], {k: [v] * 3 for k, v in leak.items()})
    np.testing.assert_allclose(table.matrix("leakage_ssim_mean"), [[0.9, 0.1], [0.5, 0.4], [0.2, 0.3]])
    br = ev.best_responses(table)
    assert {d: r["attacker"] for d, r in br["against_defender"].items()} == {"D1": "A1", "D2": "A2"}
    assert {a: r["defender"] for a, r in br["against_attacker"].items()} == {"A1": "D2", "A2": "D2", "A3": "D1"}
    assert br["against_attacker"]["A3"]["leakage_ssim"] == pytest.approx(0.2)
    assert br["against_defender"]["D2"]["attacker_return"] == pytest.approx(0.4)
    # three identical episodes each: intervals of width 0, so every best response is clear
    assert all(r["clear"] for side in ("against_defender", "against_attacker") for r in br[side].values())
    assert br["pure_equilibria"] == [{"attacker": "A2", "defender": "D2", "clear": True}]
    text = ev.who_beats_whom(table)
    assert "pure-strategy equilibria of this table: (A2, D2)\n" in text + "\n" and "*" not in text


def test_no_equilibrium_and_several_equilibria():
    pennies = _table(["A1", "A2"], ["D1", "D2"], {("A1", "D1"): [1.0] * 2, ("A1", "D2"): [0.0] * 2,
                                                   ("A2", "D1"): [0.0] * 2, ("A2", "D2"): [1.0] * 2})
    assert ev.best_responses(pennies)["pure_equilibria"] == []
    assert ev.who_beats_whom(pennies).endswith("pure-strategy equilibria of this table: none")
    # a coordination game (both gain on the diagonal): two pure equilibria, both clear
    coordination = _table(["A1", "A2"], ["D1", "D2"], {
        ("A1", "D1"): ([1.0] * 2, [1.0] * 2), ("A1", "D2"): ([0.0] * 2, [0.0] * 2),
        ("A2", "D1"): ([0.0] * 2, [0.0] * 2), ("A2", "D2"): ([0.5] * 2, [0.5] * 2)})
    assert ev.best_responses(coordination)["pure_equilibria"] == [
        {"attacker": "A1", "defender": "D1", "clear": True}, {"attacker": "A2", "defender": "D2", "clear": True}]


def test_a_clear_win_is_clear_of_every_other_interval_not_only_the_runner_up():
    """A1 (0.80 +- 0.01) is clear of the runner-up A2 (0.50 +- 0.01) but not of A3 (mean 0.30, whose
    wide interval reaches 2.3): within noise."""
    table = _table(["A1", "A2", "A3"], ["D1"], {("A1", "D1"): [0.79, 0.80, 0.81], ("A2", "D1"): [0.49, 0.50, 0.51],
                                                 ("A3", "D1"): [-0.5, 0.3, 1.1]})
    r = ev.best_responses(table)["against_defender"]["D1"]
    assert r["attacker"] == "A1" and r["tied"] == ["A1"] and not r["clear"]
    assert "(within noise: 95% intervals overlap)" in ev.who_beats_whom(table)
    narrow = _table(["A1", "A2", "A3"], ["D1"], {("A1", "D1"): [0.79, 0.80, 0.81], ("A2", "D1"): [0.49, 0.50, 0.51],
                                                  ("A3", "D1"): [0.29, 0.30, 0.31]})
    assert ev.best_responses(narrow)["against_defender"]["D1"]["clear"]


def test_means_equal_up_to_rounding_are_a_tie():
    """0.1 + 0.2 and 0.3 differ in the last bit: the same return summed in another order is a tie, not a
    win decided by rounding; a difference of 1e-6 is not."""
    table = _table(["A1", "A2"], ["D1"], {("A1", "D1"): [0.1 + 0.2], ("A2", "D1"): [0.3]})
    assert table.matrix("attacker_return_mean")[0, 0] != table.matrix("attacker_return_mean")[1, 0]
    assert ev.best_responses(table)["against_defender"]["D1"]["tied"] == ["A1", "A2"]
    apart = _table(["A1", "A2"], ["D1"], {("A1", "D1"): [0.3], ("A2", "D1"): [0.3 + 1e-6]})
    assert ev.best_responses(apart)["against_defender"]["D1"]["tied"] == ["A2"]


# ------------------------------------------------------------------ the files
def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"non-finite number {name} in payoff.json")

    return json.loads(text, parse_constant=refuse)


def test_one_episode_tables_are_finite_and_csv_json_and_printed_table_agree(tmp_path):
    """One episode per pair: no interval (empty in the CSV, null in the JSON, absent from the printed
    table), no NaN or infinity in any file, and the CSV, the JSON and the printed table hold the same
    numbers."""
    images = np.random.default_rng(0).random((2, 1, 4, 4)).astype(np.float32)
    last = LastRound(images, images, np.ones(2), np.full(2, 30.0), np.array([1, 2]))
    leak = {("A1", "D1"): 0.123456, ("A1", "D2"): 0.5, ("A2", "D1"): -0.25, ("A2", "D2"): 0.75}
    table = PayoffTable("X-v0", "x", ["A1", "A2"], ["D1", "D2"],
                        [_pair(a, d, [v], last=last) for (a, d), v in leak.items()], 0, {}, episodes=1)
    for pair in table.pairs:
        pair.episodes[0].metrics["leakage_lpips"] = float("nan")  # not measured (no LPIPS weights)
    with pytest.warns(UserWarning, match="1 episode per pair: no confidence interval"):
        ev.write_outputs(table, tmp_path)
    with open(tmp_path / "payoff.csv") as fh:
        rows = list(csv.DictReader(fh))
    payload = _strict_json((tmp_path / "payoff.json").read_text())
    assert len(rows) == len(payload["pairs"]) == 4
    for row, pair in zip(rows, payload["pairs"]):
        assert list(row) == list(pair) == ev.CSV_COLUMNS
        for column, text in row.items():
            value = pair[column]
            if text == "":
                assert value is None and (column.endswith(("_ci95_low", "_ci95_high")) or "lpips" in column), column
            elif column in ("attacker", "defender"):
                assert text == value
            else:
                assert math.isfinite(float(text)) and float(text) == value, column
        assert row["leakage_ssim_mean"] == repr(leak[(row["attacker"], row["defender"])])
    br = payload["best_responses"]
    assert br["against_defender"]["D1"]["attacker"] == "A1" and br["against_attacker"]["A2"]["defender"] == "D1"
    # a best response from one episode is not clear, and there is no interval that could overlap
    who = ev.who_beats_whom(table)
    assert who.count("(within noise: no 95% interval from 1 episode)") == 4 and "intervals overlap" not in who
    printed = ev.payoff_text(table).splitlines()
    assert printed[1].split() == ["attacker", "D1", "D2"]
    assert printed[2].split() == ["A1", "0.123", "0.500"] and printed[3].split() == ["A2", "-0.250", "0.750"]


# ------------------------------------------------------------------ the log, hand-edited or damaged
SETTINGS = {"env_id": "X-v0", "scenario": "x", "attackers": ["A1"], "defenders": ["D1"], "episodes": 2, "seed": 7,
            "overrides": {}}


@pytest.mark.parametrize("column,value", [("leakage_ssim", "5.0"), ("leakage_ssim", "nan"), ("accuracy", "-0.5"),
                                          ("label_accuracy", "1.5"), ("leakage_psnr", "inf"),
                                          ("attacker_return", "-inf"), ("defender_return", "NaN")])
def test_log_refuses_values_no_run_can_write(tmp_path, column, value):
    """A value outside its metric's range, or a non-finite one spelled out (the log writes an undefined
    value as an empty field), is a hand edit or damage: refused naming the file, the line and the metric.
    It was read back, and an SSIM of 5 came out as the interval [5, 1] (its low end above its high end)."""
    log = el.EpisodeLog.open(tmp_path, SETTINGS, resume=False)
    log.append(_pair("A1", "D1", [0.25, 0.5]))
    path = tmp_path / "episodes.csv"
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        row[column] = value
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=el.EPISODE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ValueError, match=rf"episodes\.csv, line 2: {column} = {value} "):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)


def test_log_accepts_every_value_a_run_writes(tmp_path):
    """The edges of each range and undefined values (written empty) read back as written."""
    log = el.EpisodeLog.open(tmp_path, SETTINGS, resume=False)
    edges = [{"leakage_ssim": -1.0, "leakage_psnr": 0.0, "leakage_lpips": float("nan"), "label_accuracy": 0.0,
              "accuracy": 1.0, "attacker_return": -123.5, "defender_return": 1e300},
             {"leakage_ssim": 1.0, "leakage_psnr": 99.0, "leakage_lpips": 0.0, "label_accuracy": 1.0,
              "accuracy": 0.0, "attacker_return": 0.0, "defender_return": float("nan")}]
    log.append(PairResult("A1", "D1", [EpisodeStats(m, 1) for m in edges]))
    back = el.EpisodeLog.open(tmp_path, SETTINGS, resume=True).finished[("A1", "D1")]
    for got, want in zip(back.episodes, edges):
        assert json.dumps(got.metrics) == json.dumps(want)  # NaN as NaN


def test_an_unreadable_log_is_refused_naming_it(tmp_path):
    el.EpisodeLog.open(tmp_path, SETTINGS, resume=False)
    (tmp_path / "episodes.csv").write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(ValueError, match=r"episodes\.csv.*run without --resume"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)


class _Planted:
    """Unpickling this creates the folder ``path`` (what a planted pickle could do with any code)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _args(out, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    return parser.parse_args(
        ["--env", "LeakGym-Digits-v0", "--attackers", "random", "--defenders", "none,noise-0.1,prune-0.9",
         "--episodes", "1", "--seed", "2", "--out", str(out), "--no-progress", *extra, "--overrides"]
        + [f"{k}={v}" for k, v in TINY.items()]
    )


def test_planted_or_damaged_last_rounds_are_never_unpickled_and_the_tables_are_still_written(tmp_path, monkeypatch,
                                                                                            capsys):
    """last_round/*.npz are read with allow_pickle=False: a pickle, or an npz holding an object array, is
    ignored without running it, as is one holding the wrong types; the resumed run writes its tables
    without them. With none left it used to stop at the very end ("no pair has a finished round to
    show"), payoff.csv and payoff.json rewritten and the gallery of an earlier write left beside them."""
    out = tmp_path / "run"
    assert ev.main(_args(out)) == 0
    reference = (out / "payoff.csv").read_text()
    capsys.readouterr()
    npz = sorted((out / "last_round").iterdir())
    assert [p.name for p in npz] == ["a000_d000.npz", "a000_d001.npz", "a000_d002.npz"]
    ran = tmp_path / "planted-code-ran"
    npz[0].write_bytes(pickle.dumps(_Planted(ran)))  # a pickle under the npz's name
    with open(npz[1], "wb") as fh:  # an npz whose images are pickled objects
        np.savez(fh, attacker=np.array("random"), defender=np.array("noise-0.1"),
                 originals=np.array([_Planted(ran)], dtype=object), matched=np.zeros(1), ssim=np.zeros(1),
                 psnr=np.zeros(1))
    with np.load(npz[2]) as data:  # right shapes, but text where the images were
        arrays = dict(data)
    arrays["originals"] = np.full(arrays["originals"].shape, "x")
    with open(npz[2], "wb") as fh:
        np.savez(fh, **arrays)

    calls: list[int] = []
    real = play.play_episodes
    monkeypatch.setattr(play, "play_episodes", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert ev.main(_args(out, "--resume")) == 0
    captured = capsys.readouterr()
    assert calls == [] and not ran.exists()
    assert (out / "payoff.csv").read_text() == reference and (out / "payoff.png").is_file()
    assert not (out / "gallery.png").exists() and "gallery.png" not in captured.out
    assert "gallery.png" in captured.err and "last_round" in captured.err  # says why it is missing

    # one good last round again: the gallery shows that pair alone
    assert ev.main(_args(tmp_path / "fresh")) == 0
    (out / "last_round" / "a000_d001.npz").write_bytes((tmp_path / "fresh" / "last_round" / "a000_d001.npz").read_bytes())
    assert ev.main(_args(out, "--resume")) == 0 and (out / "gallery.png").is_file() and not ran.exists()


# ------------------------------------------------------------------ resuming a pair split across groups
def test_resume_of_a_pair_split_across_lockstep_groups_reproduces_the_table(tmp_path, monkeypatch):
    """Three one-episode games per pair in groups of two: (none e0, e1) (none e2, noise e0) (noise e1, e2).
    Interrupted in the third group, the (none) pair is on disk; the resume skips the first group only and
    replays the second whole (it holds noise's first episode), so every number is the uninterrupted run's."""
    kwargs = {"episodes": 3, "seed": 4, "overrides": TINY, "progress": False, "lockstep": 2}
    reference = ev.evaluate("digits", ["random"], ["none", "noise-0.1"], out=tmp_path / "reference", **kwargs)
    calls: list[int] = []
    interrupt = [True]
    real = play.play_episodes

    def counting(*args, **kw):
        calls.append(1)
        if len(calls) == 3 and interrupt.pop():
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(play, "play_episodes", counting)
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate("digits", ["random"], ["none", "noise-0.1"], out=tmp_path / "run", **kwargs)
    with open(tmp_path / "run" / "episodes.csv") as fh:
        assert [(r["defender"], r["episode"]) for r in csv.DictReader(fh)] == [("none", "0"), ("none", "1"),
                                                                              ("none", "2")]
    calls.clear()
    interrupt.append(False)
    resumed = ev.evaluate("digits", ["random"], ["none", "noise-0.1"], out=tmp_path / "run", resume=True, **kwargs)
    assert len(calls) == 2  # the second and third groups
    assert ev.json_safe(resumed.rows()) == ev.json_safe(reference.rows())
    assert (tmp_path / "run" / "episodes.csv").read_text() == (tmp_path / "reference" / "episodes.csv").read_text()

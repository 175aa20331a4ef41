"""The evaluation harness (`leakgym eval`): payoff files, confidence intervals, best responses."""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest
import torch
from scipy import stats

from leakgym.agents import EpsilonGreedyBandit, make_agent
from leakgym.agents.experiments.evaluation import cli as ev
from leakgym.envs.leakgym_env import parallel_env

# Tiny digits games: 2 rounds, one benign client, 1-2 attack iterations, small test set.
TINY = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}


def test_t_interval_matches_scipy():
    x = np.array([0.2, 0.4, 0.35, 0.1, 0.3])
    mean, low, high = ev.t_interval(x)
    ref = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert mean == pytest.approx(x.mean()) and (low, high) == pytest.approx(ref)
    one = ev.t_interval([0.5])
    assert one[0] == 0.5 and np.isnan(one[1]) and np.isnan(one[2])


def test_eval_cli_writes_the_four_files(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    args = parser.parse_args(
        ["--env", "LeakGym-Digits-v0", "--attackers", "random,fixed:1,1,0,0", "--defenders", "none,noise-0.1",
         "--episodes", "2", "--seed", "3", "--out", str(tmp_path), "--no-progress", "--overrides"]
        + [f"{k}={v}" for k, v in {**TINY, "rounds": 1}.items()]
    )
    assert ev.main(args) == 0
    for name in ("payoff.csv", "payoff.json", "payoff.png", "gallery.png"):
        assert (tmp_path / name).stat().st_size > 0, name

    with open(tmp_path / "payoff.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ev.CSV_COLUMNS
    assert [(r["attacker"], r["defender"]) for r in rows] == [
        ("random", "none"), ("random", "noise-0.1"), ("fixed:1,1,0,0", "none"), ("fixed:1,1,0,0", "noise-0.1")
    ]
    for r in rows:
        assert r["episodes"] == "2" and r["total_rounds"] == "2"
        for m in ("leakage_ssim", "leakage_psnr", "accuracy", "attacker_return", "defender_return"):
            mean, low, high = (float(r[f"{m}_{s}"]) for s in ("mean", "ci95_low", "ci95_high"))
            assert low <= mean <= high, (m, r)
        assert -1.0 <= float(r["leakage_ssim_mean"]) <= 1.0

    payload = json.loads((tmp_path / "payoff.json").read_text())
    assert payload["attackers"] == ["random", "fixed:1,1,0,0"] and payload["defenders"] == ["none", "noise-0.1"]
    assert payload["overrides"] == {**TINY, "rounds": 1} and len(payload["pairs"]) == 4
    # the settings that change the numbers (were only in run.json)
    assert (payload["episodes"], payload["lockstep"], payload["device"]) == (2, 16, "cpu")
    assert set(payload["best_responses"]["against_defender"]) == {"none", "noise-0.1"}
    from matplotlib.image import imread

    assert imread(tmp_path / "payoff.png").ndim == 3 and imread(tmp_path / "gallery.png").ndim == 3
    printed = capsys.readouterr()
    assert "best attacker against each defender" in printed.out and "pure-strategy equilibria" in printed.out
    # The payoff table itself, one line per attacker with each defender's mean and interval.
    table_lines = printed.out.splitlines()
    start = next(i for i, line in enumerate(table_lines) if line.startswith("mean leakage_ssim [95% t-interval over 2"))
    assert table_lines[start + 1].split() == ["attacker", "none", "noise-0.1"]
    random_row = next(r for r in rows if r["attacker"] == "random" and r["defender"] == "none")
    assert table_lines[start + 2].split()[:2] == ["random", f"{float(random_row['leakage_ssim_mean']):.3f}"]
    assert "warning: payoff heatmap: only 2 episodes per pair (fewer than 5)" in printed.err


def test_same_seed_same_table_and_common_random_numbers():
    kwargs = {"episodes": 1, "seed": 5, "overrides": TINY, "progress": False}
    a = ev.evaluate("digits", ["fixed:1,0,0,0"], ["none", "fixed:0,0,0,0,0,0"], **kwargs)
    b = ev.evaluate("LeakGym-Digits-v0", ["fixed:1,0,0,0"], ["none"], **kwargs)
    # "none" and "fixed:0,...,0" are the same action, so with common random numbers they score the same.
    ssim = a.matrix("leakage_ssim_mean")
    assert ssim[0, 0] == pytest.approx(ssim[0, 1])
    assert b.matrix("leakage_ssim_mean")[0, 0] == pytest.approx(ssim[0, 0])


def test_best_responses_on_a_constructed_table():
    def pair(a, d, ra, rd):
        metrics = {m: 0.0 for m in ev.METRICS}
        metrics.update(attacker_return=ra, defender_return=rd, leakage_ssim=ra)
        return ev.PairResult(a, d, [ev.EpisodeStats(metrics, 1)])

    # attacker returns: A1 best vs D1, A2 best vs D2; defender returns: D2 best vs A1 and vs A2.
    table = ev.PayoffTable(
        "x", "x", ["A1", "A2"], ["D1", "D2"],
        [pair("A1", "D1", 0.9, -0.9), pair("A1", "D2", 0.2, -0.2), pair("A2", "D1", 0.5, -0.5), pair("A2", "D2", 0.4, -0.4)],
        0, {},
    )
    br = ev.best_responses(table)
    assert {d: r["attacker"] for d, r in br["against_defender"].items()} == {"D1": "A1", "D2": "A2"}
    assert {a: r["defender"] for a, r in br["against_attacker"].items()} == {"A1": "D2", "A2": "D2"}
    assert br["pure_equilibria"] == [{"attacker": "A2", "defender": "D2", "clear": False}]  # one episode: no interval


def test_ties_and_noise_are_said_not_decided_by_list_order():
    """Two attackers with the same returns (the same action) were decided by their order in the list,
    and a winner inside the runner-up's 95% interval was printed as the best response."""
    def pair(a, d, ra, rd, spread=0.0):
        eps = []
        for k in range(4):  # four episodes: a t-interval of width ~spread
            metrics = {m: 0.0 for m in ev.METRICS}
            metrics.update(attacker_return=ra + spread * (k - 1.5), defender_return=rd, leakage_ssim=0.5)
            eps.append(ev.EpisodeStats(metrics, 1))
        return ev.PairResult(a, d, eps)

    tied = ev.PayoffTable("x", "x", ["A1", "A2"], ["D1"], [pair("A1", "D1", 0.3, -0.3), pair("A2", "D1", 0.3, -0.3)],
                          0, {})
    br = ev.best_responses(tied)
    assert br["against_defender"]["D1"]["tied"] == ["A1", "A2"] and not br["against_defender"]["D1"]["clear"]
    assert [e["attacker"] for e in br["pure_equilibria"]] == ["A1", "A2"]  # both are equilibria
    assert "(tie: A1, A2)" in ev.who_beats_whom(tied)
    noisy = ev.PayoffTable("x", "x", ["A1", "A2"], ["D1"], [pair("A1", "D1", 0.31, -0.3, spread=0.2),
                                                             pair("A2", "D1", 0.30, -0.3, spread=0.2)], 0, {})
    assert not ev.best_responses(noisy)["against_defender"]["D1"]["clear"]
    assert "(within noise: 95% intervals overlap)" in ev.who_beats_whom(noisy)
    # no finite return in a column: no best response (it was the first agent by list order) and no equilibrium
    none = ev.PayoffTable("x", "x", ["A1", "A2"], ["D1"], [pair("A1", "D1", float("nan"), -0.3),
                                                            pair("A2", "D1", float("nan"), -0.3)], 0, {})
    br = ev.best_responses(none)
    assert br["against_defender"]["D1"]["attacker"] is None and br["pure_equilibria"] == []
    assert "(no finite return)" in ev.who_beats_whom(none)
    sure = ev.PayoffTable("x", "x", ["A1", "A2"], ["D1"], [pair("A1", "D1", 0.9, -0.3, spread=0.01),
                                                            pair("A2", "D1", 0.1, -0.3, spread=0.01)], 0, {})
    assert ev.best_responses(sure)["against_defender"]["D1"]["clear"]


def test_eval_rejects_bad_input(tmp_path):
    (tmp_path / "run.json").write_text("an earlier run")
    with pytest.raises(ValueError, match="unknown agent 'nobody'"):  # before the log in out/ is replaced
        ev.evaluate("digits", ["random"], ["none", "nobody"], episodes=1, overrides=TINY, progress=False, out=tmp_path)
    assert (tmp_path / "run.json").read_text() == "an earlier run"
    with pytest.raises(ValueError, match="unknown environment 'Nope-v0'"):
        ev.evaluate("Nope-v0", ["random"], ["none"], episodes=1, progress=False)
    with pytest.raises(ValueError, match="episodes=0"):
        ev.evaluate("digits", ["random"], ["none"], episodes=0, progress=False)
    with pytest.raises(ValueError, match="unknown agent 'nobody'"):
        ev.evaluate("digits", ["nobody"], ["none"], episodes=1, overrides=TINY, progress=False)


def test_bandit_adapts_in_the_environment():
    """An attacker bandit over {IG, DLG, prior-init} (1 iteration each) against no defense.

    With one iteration only prior-init (started from the public class-mean image) leaks much: measured
    over 8 rounds (seeds 0-3) mean rewards IG 0.10 (2 pulls), DLG -0.00 (1), prior-init 0.64 (5).
    Bar: the greedy arm is prior-init and it is pulled most.
    """
    env = parallel_env("digits", **TINY)
    sc = env.scenario
    arms = [sc.encode_attacker({"strategy": s, "iterations": 1}) for s in ("inverting-gradients", "dlg", "prior-init")]
    bandit = EpsilonGreedyBandit(arms, epsilon=0.1)
    defender = make_agent("none", role="defender", scenario=sc)
    for e in range(4):
        ev.play_episode(env, bandit, defender, seed=e)
    assert bandit.counts.sum() == 8
    assert bandit.best_arm == 2 and bandit.counts[2] == bandit.counts.max(), (bandit.means, bandit.counts)


# ------------------------------------------------------------------ figures from constructed tables
def _table(attackers, defenders, ssim_by_pair, episodes=6, spread=0.3, labels=True):
    """A table whose pair (a, d) has episodes of SSIM ssim_by_pair[(a, d)] +- spread and return = SSIM."""
    rng = np.random.default_rng(0)
    pairs = []
    originals = rng.random((3, 1, 8, 8)).astype(np.float32)
    for a in attackers:
        for d in defenders:
            values = np.clip(ssim_by_pair[(a, d)] + spread * rng.standard_normal(episodes), -1, 1)
            stats_ = []
            for v in values:
                metrics = {m: 0.5 for m in ev.METRICS}
                metrics.update(leakage_ssim=float(v), attacker_return=float(v), defender_return=-float(v))
                stats_.append(ev.EpisodeStats(metrics, 4))
            last = ev.LastRound(originals, np.clip(originals + 0.1, 0, 1), np.full(3, ssim_by_pair[(a, d)]),
                                np.full(3, 20.0), np.array([1, 7, 3]) if labels else None)
            pairs.append(ev.PairResult(a, d, stats_, last))
    return ev.PayoffTable("LeakGym-Digits-v0", "digits", list(attackers), list(defenders), pairs, 0, {})


def _inside(fig, artist) -> bool:
    box, page = artist.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    return box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1 and box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1


def _cells(ax, marker, dx, dy):
    """(column, row) of every marker of this shape (markers sit at (column + dx, row + dy))."""
    return sorted((round(x - dx), round(y - dy)) for line in ax.lines if line.get_marker() == marker
                  for x, y in [line.get_xydata()[0]])


def test_heatmap_prints_intervals_in_ssim_units_and_marks_best_responses():
    import warnings

    ssim = {("A1", "D1"): 0.98, ("A1", "D2"): 0.2, ("A2", "D1"): 0.5, ("A2", "D2"): 0.4}
    table = _table(["A1", "A2"], ["D1", "D2"], ssim)
    row = {(r["attacker"], r["defender"]): r for r in table.rows()}[("A1", "D1")]
    raw = ev.t_interval([e.metrics["leakage_ssim"] for e in table.pairs[0].episodes])
    assert raw[2] > 1.0 and row["leakage_ssim_ci95_high"] == 1.0  # payoff.csv: clipped to SSIM's range
    assert row["leakage_ssim_ci95_low"] == raw[1] and row["leakage_ssim_mean"] == raw[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # six episodes: no warning
        fig = ev.heatmap_figure(table)
    fig.canvas.draw()
    title = fig.get_suptitle()
    assert "half-width of the 95% t-interval over 6 episodes, in SSIM units" in title
    assert _inside(fig, fig._suptitle)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    # the figure prints mean ± the unclipped half-width, in SSIM units (not the clipped "[.., 1.00]" bounds)
    assert f"{raw[0]:.3f}\n± {(raw[2] - raw[1]) / 2:.2f}" in texts, texts
    assert not any("[" in t for t in texts)
    assert min(t.get_fontsize() for t in ax.texts) >= 9
    # the colour scale covers the means (from 0 here: none is negative)
    assert ax.images[0].get_clim() == (0.0, 1.0)
    # Attacker best responses (highest attacker return per column): A1 vs D1, A2 vs D2; the defender's
    # best response (highest defender return per row) is D2 for both, so (A2, D2) is the equilibrium.
    assert _cells(ax, "^", -0.34, -0.27) == [(0, 0), (1, 1)] and _cells(ax, "s", 0.34, -0.27) == [(1, 0), (1, 1)]
    assert all(line.get_markersize() >= 11 for line in ax.lines)  # visible, not corner dots
    frames = [p for p in ax.patches if not p.get_fill()]
    assert [(p.get_x() + 0.48, p.get_y() + 0.48, p.get_edgecolor()[:3]) for p in frames] == [(1, 1, (1, 0, 0))]
    assert frames[0].get_linewidth() >= 4

    few = _table(["A1"], ["D1"], {("A1", "D1"): 0.5}, episodes=3)
    with pytest.warns(UserWarning, match="only 3 episodes per pair \\(fewer than 5\\)"):
        fig = ev.heatmap_figure(few)
    assert "unreliable" in fig.get_suptitle()


def test_heatmap_colour_scale_reaches_a_negative_mean():
    table = _table(["A1"], ["D1", "D2"], {("A1", "D1"): -0.4, ("A1", "D2"): 0.5}, spread=0.0)
    ax = ev.heatmap_figure(table).axes[0]
    assert ax.images[0].get_clim() == pytest.approx((-0.4, 1.0))


def test_heatmap_outlines_the_support_of_mixed_equilibria():
    ssim = {(a, d): 0.5 for a in ("A1", "A2", "A3") for d in ("D1", "D2")}
    table = _table(["A1", "A2", "A3"], ["D1", "D2"], ssim)
    mixed = [(np.array([0.5, 0.5, 0.0]), np.array([0.0, 1.0])), (np.array([0.0, 0.0, 1.0]), np.array([1.0, 0.0]))]
    fig = ev.heatmap_figure(table, mixed=mixed)
    dashed = [p for p in fig.axes[0].patches if p.get_linestyle() == "--"]
    assert sorted((round(p.get_x() + 0.42), round(p.get_y() + 0.42)) for p in dashed) == [(0, 2), (1, 0), (1, 1)]
    assert "in a mixed equilibrium's support (row and column)" in [t.get_text() for t in fig.legends[0].texts]
    # without mixed=, no dashed frame and no legend entry (the call of before)
    assert not [p for p in ev.heatmap_figure(table).axes[0].patches if p.get_linestyle() == "--"]
    with pytest.raises(ValueError, match=r"mixed equilibrium of shapes \(2,\), \(2,\); allowed: \(3,\) attacker"):
        ev.heatmap_figure(table, mixed=[(np.ones(2) / 2, np.ones(2) / 2)])


@pytest.mark.parametrize("attackers,defenders", [(["ig-paper"], ["none"]),
                                                 (["random", "a-very-long-attacker-name-indeed", "ig-paper"], ["none"]),
                                                 (["random", "ig-paper"], ["none", "noise-0.1", "dcs2-paper"])])
def test_gallery_has_one_readable_panel_per_pair(attackers, defenders):
    table = _table(attackers, defenders, {(a, d): 0.5 for a in attackers for d in defenders})
    fig = ev.gallery_figure(table)
    fig.canvas.draw()
    assert _inside(fig, fig._suptitle), fig.get_suptitle()
    assert fig.get_suptitle().count("\n") <= 2  # a one-column gallery is wide enough for its title
    panels = [sub for row in fig.subfigs for sub in ([row] if not isinstance(row, np.ndarray) else row)]
    assert len(panels) == len(attackers) * len(defenders)
    n_images = 3
    assert [p.get_suptitle() for p in panels] == [f"{a}\nvs {d}" for a in attackers for d in defenders]
    for panel in panels:
        assert _inside(fig, panel._suptitle) and panel._suptitle.get_fontsize() >= 9
        assert len(panel.axes) == 2 * n_images  # each image beside its reconstruction
        labels = [ax.xaxis.label for ax in panel.axes]
        assert min(label.get_fontsize() for label in labels) >= 8
        assert [t.get_text() for t in labels[::2]] == ["original, class 1", "original, class 7", "original, class 3"]
        assert labels[1].get_text() == "SSIM 0.50, 20.0 dB"


def test_gallery_without_labels_says_original():
    table = _table(["A1", "A2"], ["D1"], {("A1", "D1"): 0.5, ("A2", "D1"): 0.5}, labels=False)
    assert ev.gallery_figure(table).axes[0].get_xlabel() == "original"


def test_neighbouring_pairs_keep_rounds_of_different_episodes():
    """Pair (i, j) keeps the last round of its episode (i + j) mod episodes: with common random numbers the
    gallery showed every pair the same private image. The payoff numbers do not depend on the choice."""
    from leakgym.agents.experiments.evaluation.payoff import gallery_episode

    assert [gallery_episode(i, j, 2) for i in range(2) for j in range(3)] == [0, 1, 0, 1, 0, 1]
    table = ev.evaluate("digits", ["random", "fixed:1,0,0,0"], ["none", "fixed:0,0,0,0,0,0"], episodes=2,
                        overrides=TINY, progress=False)
    last = {(p.attacker, p.defender): p.last_round.originals for p in table.pairs}
    assert not np.array_equal(last[("random", "none")], last[("random", "fixed:0,0,0,0,0,0")])
    assert not np.array_equal(last[("random", "none")], last[("fixed:1,0,0,0", "none")])
    np.testing.assert_array_equal(last[("random", "none")], last[("fixed:1,0,0,0", "fixed:0,0,0,0,0,0")])


def test_lockstep_pairs_match_pair_by_pair_play():
    """Lockstep groups change only the rounding of the shared attack computations: the same table as
    pair after pair (accuracies exactly: the federated rounds do not depend on the attacks)."""
    kwargs = {"episodes": 1, "seed": 2, "overrides": {**TINY, "rounds": 2}, "progress": False}
    attackers, defenders = ["random", "bandit", "fixed:1,1,0,1"], ["none", "random"]
    alone = ev.evaluate("digits", attackers, defenders, lockstep=1, **kwargs)
    together = ev.evaluate("digits", attackers, defenders, **kwargs)
    for metric in ("leakage_ssim_mean", "attacker_return_mean", "defender_return_mean"):
        np.testing.assert_allclose(together.matrix(metric), alone.matrix(metric), rtol=0, atol=1e-3)
    np.testing.assert_array_equal(together.matrix("accuracy_mean"), alone.matrix("accuracy_mean"))
    with pytest.raises(ValueError, match="lockstep=0; allowed: integers >= 1"):
        ev.evaluate("digits", attackers, defenders, lockstep=0, **kwargs)


def test_episodic_pairs_play_their_episodes_at_once_and_each_pair_its_own_copy_of_a_learner():
    """A learning agent given as an object plays each pair from the object as given, as a name builds a
    fresh agent per pair: it used to play every pair itself, carrying what it learnt from one pair
    into the next (and from one call of evaluate into the next, same seed, other numbers)."""
    from leakgym.agents.experiments.evaluation.play import _groups, _tracks
    from leakgym.agents.policies.base import UniformRandomAgent
    from leakgym.envs import parallel_env

    penv = parallel_env("digits", **TINY)
    learner = EpsilonGreedyBandit(scenario=penv.scenario, role="attacker")  # learns across episodes
    before = learner.get_state()
    table = [(learner, "b", "none", "n"), (learner, "b", "random", "r"), ("random", "a", "none", "n")]
    tracks = _tracks(table, 3, penv)
    # The bandit's pairs: one track of three episodes each, each with its own copy; the episodic pair:
    # three one-episode tracks, each with its own copies.
    assert [(t.pair, t.episodes) for t in tracks] == [(0, [0, 1, 2]), (1, [0, 1, 2]), (2, [0]), (2, [1]), (2, [2])]
    assert len({id(learner), *(id(t.attacker) for t in tracks[:2])}) == 3
    assert len({id(t.attacker) for t in tracks[2:]}) == 3
    assert all(isinstance(t.attacker, UniformRandomAgent) for t in tracks[2:])
    assert [[(t.pair, t.episodes[0]) for t in g] for g in _groups(tracks, 16)] == [[(0, 0), (1, 0), (2, 0), (2, 1),
                                                                                    (2, 2)]]
    assert [len(g) for g in _groups(_tracks(table[2:], 6, penv), 4)] == [4, 2]
    both = ev.evaluate("digits", [learner], ["none", "prune-0.9"], episodes=2, overrides=TINY, progress=False)
    np.testing.assert_array_equal(learner.get_state()["counts"], before["counts"])  # the template never plays
    alone = ev.evaluate("digits", [learner], ["prune-0.9"], episodes=2, overrides=TINY, progress=False)
    assert both.matrix("attacker_return_mean")[0, 1] == pytest.approx(alone.matrix("attacker_return_mean")[0, 0],
                                                                      rel=1e-5)


def test_a_pair_split_across_groups_is_recorded_once_whole(tmp_path):
    """Five one-episode tracks per pair in groups of three: pairs end in the middle of groups."""
    kwargs = {"episodes": 5, "seed": 1, "overrides": {**TINY, "rounds": 1}, "progress": False}
    split = ev.evaluate("digits", ["random"], ["none", "noise-0.1"], lockstep=3, out=tmp_path, **kwargs)
    with open(tmp_path / "episodes.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["defender"], r["episode"]) for r in rows] == [("none", str(e)) for e in range(5)] + [
        ("noise-0.1", str(e)) for e in range(5)]
    alone = ev.evaluate("digits", ["random"], ["none", "noise-0.1"], lockstep=1, **kwargs)
    np.testing.assert_array_equal(split.matrix("accuracy_mean"), alone.matrix("accuracy_mean"))
    np.testing.assert_allclose(split.matrix("leakage_ssim_mean"), alone.matrix("leakage_ssim_mean"), atol=1e-3)


def test_step_together_validates_every_env_first_and_restores_every_game_on_failure():
    from leakgym.envs import RoundError, parallel_env, step_together

    envs = [parallel_env("digits", **TINY) for _ in range(2)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    zero = {a: np.zeros(len(envs[0].action_space(a).nvec), dtype=np.int64) for a in envs[0].possible_agents}
    def state(env):
        return (env.round, env.games.rngs[env.row].bit_generator.state,
                {k: v.clone() for k, v in env.games.model(env.row).state_dict().items()})

    before = [state(env) for env in envs]
    bad = {**zero, "attacker": np.full_like(zero["attacker"], 99)}
    with pytest.raises(ValueError, match="environment 1: "):
        step_together(envs, [zero, bad])
    with pytest.raises(ValueError, match="appear once"):
        step_together([envs[0], envs[0]], [zero, zero])
    from leakgym.game import round as round_module

    real = round_module._conclude

    def second_env_fails(games, *args, **kwargs):
        if games is envs[1].games:  # the first env's round (a batch of its own) has been played by now
            raise RuntimeError("boom")
        return real(games, *args, **kwargs)

    round_module._conclude = second_env_fails
    try:
        with pytest.raises(RoundError):
            step_together(envs, [zero, zero])
    finally:
        round_module._conclude = real
    for env, (rnd, rng, model) in zip(envs, before):
        now_round, now_rng, now_model = state(env)
        assert now_round == rnd == 0 and now_rng == rng
        assert all(torch.equal(now_model[k], model[k]) for k in model)
    together = step_together(envs, [zero, zero])
    alone = parallel_env("digits", **TINY)
    alone.reset(seed=1)
    np.testing.assert_allclose(together[1][1]["attacker"], alone.step(zero)[1]["attacker"], atol=1e-4)

"""LPIPS is reported wherever SSIM/PSNR are (issue 36 item 5): ``leakgym reproduce``, ``leakgym bench
defenses``, ``leakgym selfplay``'s summary and ``leakgym eval``'s gallery (and the last rounds it keeps).

Where weights are given they are a randomly initialised torchvision AlexNet in the real file format
(tests/test_data_lpips.py), so these tests check that an LPIPS value is present and finite, never which
value it is; without weights they check that no LPIPS number appears and that the reason is given once.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import warnings

import numpy as np
import pytest
import torch
from test_data_lpips import _accept, _alexnet_checkpoint, clean  # noqa: F401 - clean is a fixture

from leakgym.metrics import LPIPS_WEIGHTS_ENV, LPIPSWeightsMissingWarning

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NO_WEIGHTS = "LPIPS (alex) is not reported: no backbone weights"


@pytest.fixture
def weights(clean, monkeypatch):  # noqa: F811 - the imported fixture
    """``$LEAKGYM_LPIPS_WEIGHTS`` names a (random-valued) AlexNet checkpoint that the loader accepts."""
    path = clean / "alexnet.pth"
    _alexnet_checkpoint(path)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(path))
    _accept(monkeypatch, path)
    return path


@pytest.fixture
def no_weights(clean):  # noqa: F811
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LPIPSWeightsMissingWarning)
        yield clean


def _columns(md: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and the body rows' cells of the markdown table whose header starts ``header_start``."""
    lines = md.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    body = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        body.append(cells(line))
    return cells(lines[i]), body


# -- leakgym reproduce ----------------------------------------------------------------------------------
TINY = {"iterations": 10, "utility_rounds": 2, "eval_size": 50, "utility_eval_every": 1}


def _reproduce(out, **kwargs):
    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.runner import run_paper

    return run_paper(paper_spec("dcs2"), seeds=(0,), images=1, out=out, scale_overrides=TINY, utility=False,
                     progress=False, **kwargs)


def test_reproduce_without_weights_records_lpips_as_null_with_the_reason_once(no_weights, tmp_path):
    _reproduce(tmp_path)
    on_disk = json.loads((tmp_path / "reproduce_dcs2.json").read_text())
    assert on_disk["lpips"] is None and on_disk["lpips_note"].startswith(NO_WEIGHTS)
    assert all("lpips" not in c["per_image"] and "lpips" not in c["per_seed"] for c in on_disk["cells"])
    md = (tmp_path / "reproduce_dcs2.md").read_text()
    assert md.count(NO_WEIGHTS) == 1  # said once: no column, no other mention
    assert [line for line in md.splitlines() if "LPIPS" in line] == [f"* {on_disk['lpips_note']}"]
    header, _ = _columns(md, "| defense | PSNR↓ ours")
    assert not [h for h in header if "LPIPS" in h]


def test_reproduce_with_weights_reports_lpips_beside_ssim_and_psnr(weights, tmp_path):
    from leakgym.reproduce.runner import est

    result = _reproduce(tmp_path)
    on_disk = json.loads((tmp_path / "reproduce_dcs2.json").read_text())
    assert on_disk["lpips"] == "alex" and on_disk["lpips_note"] == f"LPIPS (alex) is reported, from {weights}"
    for c in on_disk["cells"]:  # present and finite (the random backbone's values are not checked)
        assert len(c["per_image"]["lpips"]) == c["n_images"] == len(c["per_image"]["ssim"])
        assert all(math.isfinite(v) for v in c["per_image"]["lpips"] + c["per_seed"]["lpips"])
    md = (tmp_path / "reproduce_dcs2.md").read_text()
    assert md.count(f"LPIPS (alex) is reported, from {weights}") == 1
    header, body = _columns(md, "| defense | PSNR↓ ours")
    k = header.index("LPIPS↑ ours")
    assert header[k - 3] == "SSIM↓ ours" and all(len(r) == len(header) for r in body)
    gs = "GS (Inverting Gradients)"
    assert body[0][0] == "None" and body[0][k] == est(result, "None", gs, "lpips").fmt(2)


def test_reproduce_resume_refuses_a_run_recorded_with_the_other_lpips_setting(clean, monkeypatch, tmp_path):  # noqa: F811
    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.runner import RUN_FIELDS, run_paper

    assert "lpips" in RUN_FIELDS
    path = tmp_path / "reproduce_dcs2.json"
    path.write_text(json.dumps({"paper": "dcs2", "complete": False, "progress": {}}))
    w = clean / "w.pth"
    _alexnet_checkpoint(w)
    monkeypatch.setenv(LPIPS_WEIGHTS_ENV, str(w))
    _accept(monkeypatch, w)
    with pytest.raises(ValueError, match=r"\(.*lpips.*differ\)"):
        run_paper(paper_spec("dcs2"), seeds=(0,), images=1, out=tmp_path, scale_overrides=TINY, utility=False,
                  progress=False, resume=True)


@pytest.mark.parametrize("key", ["censor", "dcs2", "loda", "oasis", "ppp"])
def test_every_papers_tables_have_an_lpips_column_of_ours_only_where_the_run_had_the_weights(key):
    """The stored runs (no LPIPS) print no LPIPS of ours; the same results with an LPIPS entry per image
    (placeholder values: what is checked is the layout, not a score) print it in every privacy table."""
    from pathlib import Path

    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.runner import lpips_line, markdown

    paper = paper_spec(key)
    result = json.loads((Path(__file__).parents[1] / "docs" / "results" / f"reproduce_{key}.json").read_text())
    result["verdicts"] = paper.verdicts(result)
    plain = markdown(paper, result)
    assert "LPIPS↑ ours" not in plain and "LPIPS ours" not in plain and ", LPIPS" not in plain
    assert plain.count(lpips_line(result)) == 1 and "not reported" in lpips_line(result)
    for c in result["cells"]:
        c["per_image"]["lpips"] = [0.25 + 0.5 * (i % 2) for i in range(len(c["per_image"]["ssim"]))]
    result |= {"lpips": "alex", "lpips_note": "LPIPS (alex) is reported, from /w/alexnet-owt-7be5be79.pth"}
    md = markdown(paper, result)
    assert md.count("LPIPS (alex) is reported, from /w/alexnet-owt-7be5be79.pth") == 1
    ours = {"censor": "IG LPIPS↑ ours", "dcs2": "LPIPS↑ ours", "loda": "Avg LPIPS↑ ours", "ppp": "LPIPS ours",
            "oasis": "RTF B=8 PSNR (share recovered), LPIPS"}[key]
    header_start = {"censor": "| defense | IG SSIM", "dcs2": "| defense | PSNR↓", "loda": "| defense | attack",
                    "ppp": "| defense | attack", "oasis": "| transformation |"}[key]
    header, body = _columns(md, header_start)
    assert ours in header and body and all(len(r) == len(header) for r in body)
    k = header.index(ours)
    values = [r[k].split(", ")[-1] for r in body if r[k] not in ("n/a", "")]
    assert values and all(re.fullmatch(r"0\.\d\d( ± 0\.\d\d)?", v) for v in values), values


# -- leakgym bench defenses -----------------------------------------------------------------------------
def _bench(tmp_path):
    from leakgym.bench import defenses as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--json", str(tmp_path / "bench.json"), "--no-progress", "--defenses", "none,gaussian",
                              "--rounds", "2", "--clients", "2", "--batch-size", "4", "--victim-batch", "2",
                              "--attack-rounds", "2", "--attack-iterations", "2", "--eval-every", "1",
                              "--eval-size", "32", "--utility", "victim"])
    assert bench.main(args) == 0
    return json.loads((tmp_path / "bench.json").read_text()), (tmp_path / "bench.md").read_text()


def test_bench_defenses_without_weights_has_no_lpips_column_and_says_why_once(no_weights, tmp_path):
    result, md = _bench(tmp_path)
    assert result["settings"]["lpips"] is None and result["settings"]["lpips_note"].startswith(NO_WEIGHTS)
    assert all("lpips" not in r and all("lpips" not in s for s in r["leakage"]) for r in result["results"])
    assert md.count(NO_WEIGHTS) == 1 and sum("LPIPS" in line for line in md.splitlines()) == 1
    header, body = _columns(md, "| defense |")
    assert "LPIPS ↑" not in header and all(len(r) == len(header) for r in body)


def test_bench_defenses_with_weights_reports_lpips_beside_ssim_and_psnr(weights, tmp_path):
    result, md = _bench(tmp_path)
    assert result["settings"]["lpips"] == "alex"
    for r in result["results"]:
        assert len(r["leakage"]) == 2 and all(math.isfinite(s["lpips"]) for s in r["leakage"])
        assert r["lpips"] == pytest.approx(np.mean([s["lpips"] for s in r["leakage"]]))
    header, body = _columns(md, "| defense |")
    k = header.index("LPIPS ↑")
    assert header[k - 1] == "PSNR ↓" and all(len(r) == len(header) for r in body)
    assert [r[k] for r in body] == [format(r["lpips"], ".3f") for r in result["results"]]
    assert "not reported" not in md


# -- leakgym selfplay -----------------------------------------------------------------------------------
SELFPLAY = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}


def test_selfplay_summary_reports_lpips_where_the_weights_are(weights, tmp_path):
    from leakgym.agents.experiments import selfplay as sp

    summary = sp.selfplay("LeakGym-Digits-v0", iterations=1, timesteps=16, out=tmp_path, overrides=SELFPLAY,
                          hyperparams={"n_steps": 16, "batch_size": 16, "n_epochs": 1}, eval_episodes=1,
                          progress=False)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["lpips"] == "alex" and saved["lpips_note"] == f"LPIPS (alex) is reported, from {weights}"
    for entry in (summary["history"][0], saved["history"][0]):
        for pair in ("attacker_vs_previous_defender", "attacker_vs_new_defender"):
            assert {"leakage_ssim", "leakage_psnr", "leakage_lpips"} <= set(entry[pair])
            assert math.isfinite(entry[pair]["leakage_lpips"])


def test_selfplay_pairs_carry_no_lpips_without_the_weights(no_weights):
    from leakgym.agents.experiments import selfplay as sp

    pairs = sp._eval_pairs("LeakGym-Digits-v0", "fixed:1,0,0,0", ["none"], 1, 0, SELFPLAY)
    assert "leakage_ssim" in pairs[0] and "leakage_lpips" not in pairs[0]


def test_selfplay_summary_records_lpips_as_null_with_the_reason(no_weights, tmp_path, monkeypatch):
    """(training replaced: what is checked is the summary's LPIPS fields, not the learning)"""
    from leakgym.agents.experiments import selfplay as sp

    class Trained:
        def __init__(self, path):
            self.policy_path, self.metadata = path, {"overrides": SELFPLAY}

    monkeypatch.setattr(sp, "train", lambda cfg: Trained("fixed:1,0,0,0" if cfg.role == "attacker" else "none"))
    sp.selfplay("LeakGym-Digits-v0", iterations=1, timesteps=16, out=tmp_path, overrides=SELFPLAY,
                eval_episodes=1, progress=False)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["lpips"] is None and saved["lpips_note"].startswith(NO_WEIGHTS)
    assert "leakage_lpips" not in saved["history"][0]["attacker_vs_new_defender"]


# -- leakgym eval: the gallery and the last rounds it keeps -----------------------------------------------
def _eval(tmp_path):
    from leakgym.agents.experiments.evaluation import cli as ev

    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    args = parser.parse_args(["--env", "LeakGym-Digits-v0", "--attackers", "random", "--defenders", "none",
                              "--episodes", "1", "--out", str(tmp_path), "--no-progress", "--overrides"]
                             + [f"{k}={v}" for k, v in SELFPLAY.items()])
    assert ev.main(args) == 0


def _gallery_labels(tmp_path):
    from leakgym.agents.experiments.evaluation import episode_log as el
    from leakgym.agents.experiments.evaluation.payoff import PayoffTable
    from leakgym.agents.experiments.evaluation.reporting import gallery_figure

    saved = json.loads((tmp_path / el.RUN_FILE).read_text())
    settings = saved["settings"]
    log = el.EpisodeLog.open(tmp_path, settings, resume=True, files=saved["files"])  # as --resume reads it
    (pair,) = log.finished.values()

    table = PayoffTable(settings["env_id"], settings["scenario"], settings["attackers"], settings["defenders"],
                        [pair], settings["seed"], settings["overrides"])
    fig = gallery_figure(table)
    labels = [ax.get_xlabel() for sub in fig.subfigs for ax in sub.axes if "SSIM" in ax.get_xlabel()]
    return pair.last_round, labels, fig._suptitle.get_text()


def test_eval_gallery_shows_lpips_per_image_and_keeps_it_for_resume(weights, tmp_path):
    _eval(tmp_path)
    (npz,) = (tmp_path / "last_round").glob("*.npz")
    with np.load(npz) as data:
        assert "lpips" in data.files and np.isfinite(data["lpips"]).all() and data["lpips"].shape == data["ssim"].shape
        saved = data["lpips"].copy()
    last, labels, title = _gallery_labels(tmp_path)
    np.testing.assert_array_equal(last.lpips, saved)  # read back for --resume
    assert labels and all(f"\nLPIPS {v:.2f}" in label for v, label in zip(saved, labels))
    assert "SSIM, PSNR and LPIPS" in title.replace("\n", " ")


def test_eval_gallery_without_weights_and_old_last_rounds_say_lpips_is_not_available(no_weights, tmp_path):
    _eval(tmp_path)
    (npz,) = (tmp_path / "last_round").glob("*.npz")
    with np.load(npz) as data:
        assert "lpips" not in data.files  # an old run folder's file looks the same: read back as not available
    last, labels, title = _gallery_labels(tmp_path)
    assert last.lpips is None and labels and not any("LPIPS" in label for label in labels)
    assert "LPIPS not available" in title.replace("\n", " ")


def test_last_round_keeps_lpips_only_when_scored_with_weights():
    from types import SimpleNamespace

    from leakgym.agents.experiments.evaluation.payoff import LastRound
    from leakgym.metrics import score_reconstruction

    x = torch.rand(2, 1, 8, 8)
    scores = score_reconstruction(x.flip(0), x)
    record = SimpleNamespace(originals=x, reconstructions=x.flip(0), scores=scores, labels=None)
    assert LastRound.from_game(record).lpips is None  # not scored
    scores.per_image["lpips"] = np.array([float("nan")] * 2)  # scored without the weights
    assert LastRound.from_game(record).lpips is None
    scores.per_image["lpips"] = np.array([0.3, 0.6])  # (values placed by the test; their order is followed)
    np.testing.assert_array_equal(LastRound.from_game(record).lpips, [0.3, 0.6])


def test_a_damaged_lpips_entry_reads_back_as_not_available(tmp_path):
    from leakgym.agents.experiments.evaluation import episode_log as el
    from leakgym.agents.experiments.evaluation.payoff import METRICS, EpisodeStats, LastRound, PairResult

    settings = {"env_id": "X-v0", "scenario": "x", "attackers": ["A"], "defenders": ["D"], "episodes": 1, "seed": 0,
                "overrides": {}}
    log = el.EpisodeLog.open(tmp_path, settings, resume=False)
    images = np.full((2, 1, 4, 4), 0.5, np.float32)
    good = LastRound(images, 1 - images, np.array([0.5, 0.25]), np.array([12.5, 9.0]), lpips=np.array([0.1, 0.2]))
    log.append(PairResult("A", "D", [EpisodeStats({m: 0.5 for m in METRICS}, 1)], good))
    back = el.EpisodeLog.open(tmp_path, settings, resume=True).finished[("A", "D")].last_round
    np.testing.assert_array_equal(back.lpips, [0.1, 0.2])
    (npz,) = (tmp_path / "last_round").glob("*.npz")
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(npz, **(arrays | {"lpips": np.array([0.1])}))  # wrong shape
    back = el.EpisodeLog.open(tmp_path, settings, resume=True).finished[("A", "D")].last_round
    assert back is not None and back.lpips is None
    np.testing.assert_array_equal(back.ssim, [0.5, 0.25])


def test_lodas_lpips_claim_is_checked_only_where_the_run_had_lpips():
    """LODA's claim is made on LPIPS: not checkable without it; with it (placeholder values per image, LODA's
    rows placed above every other row) it is computed, here as holding."""
    from pathlib import Path

    from leakgym.reproduce import paper_spec
    from leakgym.reproduce.loda import LODAS
    from leakgym.reproduce.stats import FAILS, HOLDS, UNCHECKED

    paper = paper_spec("loda")
    result = json.loads((Path(__file__).parents[1] / "docs" / "results" / "reproduce_loda.json").read_text())
    claim = "LODA protects best under the adaptive attacks (the paper's claim, made on LPIPS)"
    (v,) = [v for v in paper.verdicts(result) if v["claim"] == claim]
    assert v["status"] == UNCHECKED and "no backbone weights" in v["why"]
    for c in result["cells"]:
        n = len(c["per_image"]["ssim"])
        c["per_image"]["lpips"] = [(0.8 if c["defense"] in LODAS else 0.2) + 0.01 * (i % 2) for i in range(n)]
    result["lpips"] = "alex"
    (v,) = [v for v in paper.verdicts(result) if v["claim"] == claim]
    assert v["status"] == HOLDS and "LODA1 0.8" in v["ours"] and "InstaHide k=4 0.2" in v["ours"]
    moved = {("LODA2", "LODA inversion (all layers)"): 0.5, ("InstaHide k=6", "Mixup decoding"): 0.6}
    for c in result["cells"]:  # LODA2 below InstaHide k=6 only: the claim fails and names that pair alone
        if (c["defense"], c["attack"]) in moved:
            base = moved[(c["defense"], c["attack"])]
            c["per_image"]["lpips"] = [base + 0.01 * (i % 2) for i in range(len(c["per_image"]["ssim"]))]
    (v,) = [v for v in paper.verdicts(result) if v["claim"] == claim]
    assert v["status"] == FAILS and v["why"].startswith("LODA2 vs InstaHide k=6: does not hold. ")


def test_run_grid_asked_for_lpips_without_weights_refuses_before_any_work(no_weights):
    from leakgym.data import federated_split, load_dataset
    from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, run_grid

    split = federated_split(load_dataset("digits", image_size=16), num_clients=4, seed=0)
    with pytest.raises(ValueError, match=rf"run_grid\(lpips=True\): {re.escape(NO_WEIGHTS)}"):
        run_grid([DefenseRow("none")], [AttackColumn("IG", "inverting-gradients")], Scale(images=1, iterations=1),
                 split=split, lpips=True, progress=False)
    cells = run_grid([DefenseRow("none")], [AttackColumn("IG", "inverting-gradients")], Scale(images=1, iterations=1),
                     split=split, progress=False)  # default: LPIPS where the weights are, here none
    assert set(cells[("none", "IG")].per_image) == {"psnr", "ssim", "mse"}

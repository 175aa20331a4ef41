"""`leakgym reproduce`: the generic harness, the results schema, and one reduced run per paper (slow)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from leakgym.reproduce import PAPERS, add_arguments, paper_spec
from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, run_grid, victim_batches
from leakgym.reproduce.runner import cell, est, run_paper
from leakgym.reproduce.stats import FAILS, STATUSES, TIE, UNDECIDED

TINY = {"iterations": 10, "utility_rounds": 2, "eval_size": 50, "utility_eval_every": 1}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def split():
    from leakgym.data import federated_split, load_dataset

    return federated_split(load_dataset("digits", image_size=16), num_clients=4, seed=0)


def test_grid_cell_equals_a_hand_run_round(split):
    """The harness's numbers are the round run by hand: apply_defense -> attack -> score_reconstruction."""
    from leakgym.attacks import AttackerKnowledge, build_attack
    from leakgym.defenses import DefenseConfig, apply_defense
    from leakgym.metrics import score_reconstruction
    from leakgym.models import build_model

    scale = Scale(images=2, batch_size=2, iterations=15)
    cfg = DefenseConfig(noise_sigma=0.05)
    cells = run_grid([DefenseRow("noise", cfg)], [AttackColumn("IG", "inverting-gradients")], scale, split=split,
                     seed=3, progress=False)
    got = cells[("noise", "IG")]

    spec = split.spec
    (xu, y), = victim_batches(split, scale, 3)
    model = build_model("lenet", spec, seed=3)
    upd, _ = apply_defense(model, spec.normalize(xu), y, cfg, seed=3000, public_x=split.public_x,
                           public_y=split.public_y)
    kn = AttackerKnowledge(model=model, spec=spec, batch_size=2, labels=y, public_x=split.public_x,
                           public_y=split.public_y)
    res = build_attack("inverting-gradients", iterations=15, restarts=1).reconstruct_batch([upd], [kn], seeds=[3 * 100_003])[0]
    want = score_reconstruction(spec.denormalize(res.images), xu)
    for k in ("psnr", "ssim", "mse"):
        np.testing.assert_allclose(got.per_image[k], want.per_image[k], rtol=1e-6)
    assert 0.0 < got.fidelity < 1.0  # the noise really changed the update


def test_smoke_run_writes_schema_and_computed_numbers(tmp_path):
    """DCS² table with 1 victim image per seed, 2 seeds, 10 attack iterations and 2 FedSGD rounds: every
    file and field is there, every cell pools the seeds' images, and the rows differ (nothing is a constant)."""
    result = run_paper(paper_spec("dcs2"), seeds=(0, 1), images=1, out=tmp_path, scale_overrides=TINY,
                       progress=False)
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"reproduce_dcs2.{ext}").stat().st_size > 0
    on_disk = json.loads((tmp_path / "reproduce_dcs2.json").read_text())
    assert on_disk["cells"] == json.loads(json.dumps(result["cells"]))
    for key in ("paper", "size", "seeds", "settings", "rows", "columns", "cells", "utility", "paper_numbers",
                "verdicts", "deviations", "cifar10", "wall_s", "plateau"):
        assert key in on_disk, key
    assert on_disk["seeds"] == [0, 1]
    assert on_disk["settings"]["B=1"]["iterations"] == 10 and on_disk["settings"]["B=1"]["images"] == 1
    assert len(on_disk["cells"]) == 5
    for c in on_disk["cells"]:
        assert c["n_images"] == 2 and len(c["per_image"]["psnr"]) == 2 and len(c["per_seed"]["psnr"]) == 2
        psnr, mse = np.asarray(c["per_image"]["psnr"]), np.asarray(c["per_image"]["mse"])
        assert np.isfinite(psnr).all() and (mse >= 0).all()
        np.testing.assert_allclose(psnr, np.minimum(100.0, -10 * np.log10(mse)), atol=1e-3)
        assert c["sent"] == ["update", "update"]
    gs = "GS (Inverting Gradients)"
    none, dp = cell(result, "None", gs), cell(result, "DP-Gaussian", gs)
    assert none["fidelity"] == 1.0 and dp["fidelity"] < 1.0
    assert len({round(float(np.mean(c["per_image"]["psnr"])), 6) for c in on_disk["cells"]}) > 1
    e = est(result, "None", gs, "psnr")
    assert e.n == 2 and e.mean == pytest.approx(np.mean(none["per_image"]["psnr"]))
    for name, n_seeds in (("None", 2), ("DCS²", 2)):  # every row trains with every seed
        u = on_disk["utility"][name]
        assert 0.0 <= u["accuracy"] <= 1.0 and u["rounds"] == 2 and len(u["accuracy_per_seed"]) == n_seeds
        assert u["curve"]["rounds"] == [0, 1, 2] and len(u["curve"]["accuracy"]) == 3
    for v in on_disk["verdicts"]:
        assert set(v) == {"claim", "status", "ours", "paper", "why"} and v["status"] in STATUSES
        assert v["status"] not in (FAILS, TIE, UNDECIDED) or v["why"]  # a failed, tied or undecided claim says why
    md = (tmp_path / "reproduce_dcs2.md").read_text()
    assert "Does the ordering/trend hold?" in md and "| DCS² |" in md and "±" in md
    # scale_overrides have no flag: the markdown gives the call that makes the run again, not a CLI that does not
    assert ("Generated by the Python call `leakgym.reproduce.runner.run_paper(paper_spec('dcs2'), size='small', "
            "seeds=(0, 1), images=1, scale_overrides={'iterations': 10, 'utility_rounds': 2, 'eval_size': 50, "
            "'utility_eval_every': 1})`") in md
    assert on_disk["complete"] is True and on_disk["images_requested"] == 1 and on_disk["utility_measured"] is True


def test_censor_cells_record_what_was_sent(split):
    """The paper's CENSOR sends candidates at round 0; a skipped update is left out of the leakage."""
    from leakgym.defenses import DefenseConfig

    scale = Scale(images=2, batch_size=1, iterations=3)
    rows = [DefenseRow("censor", DefenseConfig.preset("censor-paper")),
            DefenseRow("skip", DefenseConfig.preset("censor-paper").replace(censor_fallback="skip", censor_trials=1,
                                                                            censor_step=1e-9))]
    cells = run_grid(rows, [AttackColumn("IG", "inverting-gradients")], scale, split=split, seed=0, progress=False)
    assert set(cells[("censor", "IG")].sent) <= {"candidate", "original"}
    skip = cells[("skip", "IG")]
    result = {"utility_setting": "s", "cells": [{"setting": "s", **skip.summary()}]}
    kept = [v for v, s in zip(skip.per_image["ssim"], skip.sent) if s != "skip"]
    e = est(result, "skip", "IG", "ssim")
    assert (e is None) == (not kept) and (e is None or e.n == len(kept))


def test_utility_curve_and_pretrained_served_model(split):
    """measure_utility evaluates every utility_eval_every rounds; pretrain_rounds trains the served model."""
    from leakgym.defenses import DefenseConfig
    from leakgym.reproduce.harness import build_models, measure_utility

    scale = Scale(utility_rounds=4, utility_eval_every=2, eval_size=30)
    u = measure_utility(DefenseRow("none", DefenseConfig()), scale, split=split, seed=0, progress=False)
    assert [r for r, _ in u["curve"]] == [0, 2, 4] and u["sent"] == {"update": 4 * scale.utility_clients}
    fresh = build_models(scale, split.spec, 0, {False})[False]
    trained = build_models(scale.replace(pretrain_rounds=2), split.spec, 0, {False}, split)[False]
    assert any(not torch.equal(a, b) for a, b in zip(fresh.parameters(), trained.parameters()))


def test_every_paper_spec_is_consistent():
    """Every row's columns exist, every table row has the paper's numbers, both sizes are defined."""
    for name in PAPERS:
        paper = paper_spec(name)
        assert paper.key == name and set(paper.scales) == {"small", "full"}
        for size in ("small", "full"):
            cols = {c.name for c in paper.columns(size)}
            for row in paper.rows(size):
                assert row.attacks is None or set(row.attacks) <= cols, (name, row.name)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="unknown paper"):
        paper_spec("soteria")
    with pytest.raises(ValueError, match="multiple of batch_size"):
        Scale(images=5, batch_size=2)
    with pytest.raises(ValueError, match="iterations"):
        Scale(iterations=0)
    with pytest.raises(ValueError, match="size="):
        run_paper(paper_spec("dcs2"), size="huge", out=None)
    with pytest.raises(ValueError, match="seeds="):
        run_paper(paper_spec("dcs2"), seeds=(1, 1), out=None)
    with pytest.raises(ValueError, match="pretrain_rounds"):
        Scale(pretrain_rounds=-1)
    # found in review: each of these failed only after (or in the middle of) the work
    with pytest.raises(ValueError, match=r"seeds=\[0, -1\]; allowed: one or more distinct integers in \[0, "):
        run_paper(paper_spec("dcs2"), seeds=(0, -1), out=None)
    with pytest.raises(ValueError, match="eval_size=0"):
        Scale(eval_size=0)
    with pytest.raises(ValueError, match="eval_size=-250"):
        Scale(eval_size=-250)
    with pytest.raises(ValueError, match="unknown column"):
        run_grid([DefenseRow("x", attacks=("nope",))], [AttackColumn("IG", "inverting-gradients")], Scale(),
                 split=None, progress=False)


def test_cli_arguments():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["oasis", "--size", "full", "--seeds", "2,5", "--images", "16", "--out", "x"])
    assert (args.paper, args.size, args.seeds, args.images, str(args.out)) == ("oasis", "full", (2, 5), 16, "x")
    assert parser.parse_args(["all"]).seeds == (0, 1, 2)
    for bad in (["nope"], ["dcs2", "--seeds", "a,b"], ["dcs2", "--seeds", "1,1"], ["dcs2", "--seeds", "0,-1"],
                ["dcs2", "--seeds", str(2**50)]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)

# The reduced per-paper ordering checks run in the default suite: tests/test_paper_claims.py.


def test_an_unusable_out_fails_before_the_work_and_outputs_are_replaced_together(tmp_path, monkeypatch):
    """``out`` is checked when the run starts (a file there used to fail after every seed's grid), and
    the three files are renamed into place only once all are written: a failing figure leaves the
    earlier run's JSON, table and picture as they were."""
    from leakgym.reproduce import plots, runner

    a_file = tmp_path / "afile"
    a_file.write_text("x")
    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: pytest.fail("the grid ran before out was checked"))
    with pytest.raises(FileExistsError):
        run_paper(paper_spec("dcs2"), seeds=(0,), images=1, out=a_file, scale_overrides=TINY, progress=False)
    monkeypatch.undo()
    earlier = {ext: f"earlier {ext}" for ext in ("json", "md", "png")}
    for ext, text in earlier.items():
        (tmp_path / f"reproduce_dcs2.{ext}").write_text(text)

    def broken_figure(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "figure", broken_figure)
    with pytest.raises(KeyboardInterrupt):
        runner.write_outputs(paper_spec("dcs2"), {"seeds": [5]}, tmp_path)
    for ext, text in earlier.items():
        assert (tmp_path / f"reproduce_dcs2.{ext}").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "reproduce_dcs2.json", "reproduce_dcs2.md",
                                                          "reproduce_dcs2.png"]


def test_ctrl_c_in_reproduce_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    from leakgym import reproduce
    from leakgym.reproduce import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_paper", interrupted)
    args = argparse.Namespace(paper="dcs2", size="small", seeds=(0,), images=1, out=tmp_path, no_utility=True,
                              no_progress=True, rerender=False)
    assert reproduce.main(args) == 130
    assert "interrupted during dcs2" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--seeds", "4,5"], ["--size", "full"], ["--images", "2"], ["--no-utility"]])
def test_rerender_refuses_the_options_of_a_run_it_does_not_make(tmp_path, monkeypatch, capsys, flags):
    from leakgym import cli
    from leakgym.reproduce import runner

    # --rerender used to rewrite the recorded run silently, whatever --seeds/--size/--images said.
    monkeypatch.setattr(runner, "rerender", lambda *a, **k: pytest.fail("rerender ran with run options"))
    assert cli.main(["reproduce", "dcs2", "--rerender", "--out", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert f"{flags[0]} cannot change it" in err and "run without --rerender" in err


def test_rerender_alone_rewrites_from_the_recorded_json(tmp_path, monkeypatch):
    from leakgym import cli
    from leakgym.reproduce import runner

    calls = []
    monkeypatch.setattr(runner, "rerender", lambda paper, path: calls.append(path))
    assert cli.main(["reproduce", "dcs2", "--rerender", "--out", str(tmp_path)]) == 0
    assert calls == [tmp_path / "reproduce_dcs2.json"]


@pytest.mark.parametrize(("content", "message"), [
    (None, "no results file to re-render"),
    ("[1]", "holds a JSON list, not the results object"),
    ('{"a": 1}', "missing ['paper']"),
    ('{"paper": "dcs2"}', "not a complete results file"),
    ("{not json", "not a readable results file"),
])
def test_rerender_of_a_missing_or_foreign_file_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    """Found in an audit: these were exit 1 with a raw FileNotFoundError, AttributeError or KeyError."""
    from leakgym import cli

    if content is not None:
        (tmp_path / "reproduce_dcs2.json").write_text(content)
    assert cli.main(["reproduce", "dcs2", "--rerender", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leakgym: error: ") and message in err and err.count("\n") == 1


def test_reproduce_into_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    from leakgym import cli

    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as exc:  # (the parser's --out type refuses it: tests/test_cli.py)
        cli.main(["reproduce", "dcs2", "--out", str(tmp_path / "afile")])
    assert exc.value.code == 2 and "argument --out:" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "x"


def test_the_utility_run_takes_the_fl_protocol(split, monkeypatch):
    """Scale's FedAvg protocol (issue 36): every client trains with the local optimiser and the server
    applies the mean model difference; the protocol is checked when the scale is built."""
    from leakgym.defenses import DefenseConfig, pipeline
    from leakgym.fl.optim import LocalOptimizer
    from leakgym.reproduce.harness import measure_utility

    seen = []
    real = pipeline.compute_update
    monkeypatch.setattr(pipeline, "compute_update", lambda *a, **k: seen.append(
        (k["kind"], k["local_steps"], k["local_lr"], k["optimizer"])) or real(*a, **k))
    scale = Scale(utility_rounds=2, utility_eval_every=2, eval_size=30, utility_update_kind="model_delta",
                  utility_local_steps=3, utility_local_lr=1e-3, utility_optimizer="adam")
    u = measure_utility(DefenseRow("none", DefenseConfig()), scale, split=split, seed=0, progress=False)
    assert set(seen) == {("model_delta", 3, 1e-3, LocalOptimizer("adam"))}
    assert len(seen) == 2 * scale.utility_clients and 0 <= u["accuracy"] <= 1
    with pytest.raises(ValueError, match="need utility_update_kind='model_delta'"):
        Scale(utility_optimizer="adam")
    with pytest.raises(ValueError, match="utility_optimizer='lbfgs'"):
        Scale(utility_update_kind="model_delta", utility_optimizer="lbfgs")
    with pytest.raises(ValueError, match="utility_local_steps=0"):
        Scale(utility_update_kind="model_delta", utility_local_steps=0)

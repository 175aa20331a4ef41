"""`leakgym reproduce`: the generic harness, the results schema, and one reduced run per paper (slow)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from leakgym.reproduce import PAPERS, add_arguments, paper_spec
from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, run_grid, victim_batches
from leakgym.reproduce.runner import cell, run_paper

TINY = {"iterations": 10, "utility_rounds": 1, "eval_size": 50}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    res = build_attack("inverting-gradients", iterations=15, restarts=1).reconstruct_batch([upd], [kn], seed=3)[0]
    want = score_reconstruction(spec.denormalize(res.images), xu)
    for k in ("psnr", "ssim", "mse"):
        np.testing.assert_allclose(got.per_image[k], want.per_image[k], rtol=1e-6)
    assert 0.0 < got.fidelity < 1.0  # the noise really changed the update


def test_smoke_run_writes_schema_and_computed_numbers(tmp_path):
    """DCS² table with 1 victim image, 10 attack iterations and 1 FedSGD round: every file and field is
    there, every cell holds one image's real scores, and the rows differ (nothing is a constant)."""
    result = run_paper(paper_spec("dcs2"), images=1, out=tmp_path, scale_overrides=TINY, progress=False)
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"reproduce_dcs2.{ext}").stat().st_size > 0
    on_disk = json.loads((tmp_path / "reproduce_dcs2.json").read_text())
    assert on_disk["cells"] == json.loads(json.dumps(result["cells"]))
    for key in ("paper", "size", "seed", "settings", "rows", "columns", "cells", "utility", "paper_numbers",
                "verdicts", "deviations", "cifar10", "wall_s"):
        assert key in on_disk, key
    assert on_disk["settings"]["B=1"]["iterations"] == 10 and on_disk["settings"]["B=1"]["images"] == 1
    assert len(on_disk["cells"]) == 5
    for c in on_disk["cells"]:
        assert c["n_images"] == 1 and len(c["per_image"]["psnr"]) == 1
        assert np.isfinite(c["psnr"]) and -1.0 <= c["ssim"] <= 1.0 and c["mse"] >= 0
        assert c["psnr"] == pytest.approx(min(100.0, -10 * np.log10(c["mse"])), abs=1e-3)
    none, dp = cell(result, "None", "GS (Inverting Gradients)"), cell(result, "DP-Gaussian", "GS (Inverting Gradients)")
    assert none["fidelity"] == 1.0 and dp["fidelity"] < 1.0
    assert len({round(c["psnr"], 6) for c in on_disk["cells"]}) > 1
    for name in ("None", "DCS²"):
        acc = on_disk["utility"][name]["accuracy"]
        assert 0.0 <= acc <= 1.0 and on_disk["utility"][name]["rounds"] == 1
    for v in on_disk["verdicts"]:
        assert set(v) == {"claim", "holds", "ours", "paper", "why"} and v["holds"] in (True, False, None)
        assert v["holds"] is not False or v["why"]  # a failed claim always says why
    md = (tmp_path / "reproduce_dcs2.md").read_text()
    assert "Does the ordering/trend hold?" in md and "| DCS² |" in md


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
    with pytest.raises(ValueError, match="unknown column"):
        run_grid([DefenseRow("x", attacks=("nope",))], [AttackColumn("IG", "inverting-gradients")], Scale(),
                 split=None, progress=False)


def test_cli_arguments():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["oasis", "--size", "full", "--seed", "2", "--images", "16", "--out", "x"])
    assert (args.paper, args.size, args.seed, args.images, str(args.out)) == ("oasis", "full", 2, 16, "x")
    assert parser.parse_args(["all"]).paper == "all"
    with pytest.raises(SystemExit):
        parser.parse_args(["nope"])


# -- one reduced run per paper (slow) ------------------------------------------------------------------
def _reduced(name: str, images: int, tmp_path) -> dict:
    return run_paper(paper_spec(name), images=images, out=tmp_path, utility=False, progress=False)


def _m(result, defense, attack, key, setting=None):
    return cell(result, defense, attack, setting)[key]


@pytest.mark.slow
def test_dcs2_reduced(tmp_path):
    """DCS² Table 1, 4 images, no utility. Default run (8 images): SSIM None 1.00, DP-Gaussian 0.99,
    Prune 0.45, Soteria 0.47, DCS² 0.35; PSNR None 45.9, DP-Gaussian 30.6."""
    r = _reduced("dcs2", 4, tmp_path)
    gs = "GS (Inverting Gradients)"
    assert _m(r, "None", gs, "ssim") > 0.9
    assert _m(r, "DCS²", gs, "ssim") < _m(r, "None", gs, "ssim") - 0.4
    assert _m(r, "DP-Gaussian", gs, "psnr") < _m(r, "None", gs, "psnr")


@pytest.mark.slow
def test_ppp_reduced(tmp_path):
    """PPP Tables I-II, 4 images, no utility. Default run (8 images): SSIM Baseline 1.00, PRECODE* (plain
    IG) -0.02, PRECODE (layer skipping) 0.96, NG1 0.06, PPP-NG1 0.01, GC99 0.33; Kendall tau 0.98."""
    r = _reduced("ppp", 4, tmp_path)
    assert _m(r, "Baseline", "IG", "ssim") > 0.9
    assert _m(r, "PRECODE*", "IG", "ssim") < 0.3
    assert _m(r, "PRECODE", "IG layer-skipping", "ssim") > 0.8
    assert _m(r, "PPP-NG1", "IG layer-skipping", "ssim") < 0.2


@pytest.mark.slow
def test_oasis_reduced(tmp_path):
    """OASIS Figs. 5-6, 16 images at B=8 (64 at B=64), no utility. Default run (64 images at B=8): RTF
    WO 97.3 dB mean (62/64 recovered), MR 18.5 dB; CAH MR+SH 19.9 dB (B=8), 11.4 dB (B=64)."""
    r = _reduced("oasis", 16, tmp_path)
    rtf, cah = "RTF (imprint)", "CAH (trap weights)"
    assert _m(r, "WO", rtf, "psnr", "B=8") >= 60
    assert _m(r, "MR", rtf, "psnr", "B=8") < 30
    for setting in ("B=8", "B=64"):
        assert _m(r, "MR+SH", cah, "psnr", setting) < 30
        assert _m(r, "MR+SH", cah, "psnr", setting) < _m(r, "WO", cah, "psnr", setting)


@pytest.mark.slow
def test_censor_reduced(tmp_path):
    """CENSOR Table I, 4 images, no utility. Default run (8 images), SSIM: IG No Defense 1.00, Noise 0.61,
    Clipping 1.00, Sparsi 0.28, Soteria 0.47, Censor -0.02; GI No Defense 0.99, Censor -0.04."""
    r = _reduced("censor", 4, tmp_path)
    for attack in ("IG", "GI"):
        assert _m(r, "No Defense", attack, "ssim") > 0.8
        assert _m(r, "Censor", attack, "ssim") < 0.2
        assert _m(r, "Censor", attack, "ssim") < _m(r, "Noise", attack, "ssim")
    # Global L2 clipping only rescales the update: IG's cosine loss ignores it.
    assert _m(r, "Clipping", "IG", "ssim") > 0.8


@pytest.mark.slow
def test_loda_reduced(tmp_path):
    """LODA Tables 1-2, 6 images (one batch), no utility. Default run (12 images): IG on no defense PSNR
    21.9 dB / SSIM 0.87, pruning p=0.99 6.1 dB; adaptive decoding SSIM Mixup k=4 0.60 vs InstaHide k=4 0.22
    (the sign flips survive demixing)."""
    r = _reduced("loda", 6, tmp_path)
    assert _m(r, "No Defense", "IG", "ssim") > 0.5
    assert _m(r, "GradPruning p=0.99", "IG", "psnr") < _m(r, "No Defense", "IG", "psnr") - 5
    assert _m(r, "Mixup k=4", "Mixup decoding", "ssim") > _m(r, "InstaHide k=4", "Mixup decoding", "ssim")

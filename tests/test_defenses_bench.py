"""`leakgym bench defenses` with tiny settings: JSON schema and markdown table (not the numbers)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from leakgym.bench import defenses as bench


def test_bench_defenses_tiny_run_writes_json_and_markdown(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([
        "--json", str(tmp_path / "bench.json"), "--defenses", "none,gaussian,PPP-NG1",
        "--rounds", "2", "--clients", "2", "--batch-size", "4", "--victim-batch", "2",
        "--attack-rounds", "2", "--attack-iterations", "2", "--eval-every", "1", "--eval-size", "32",
        "--no-progress",
    ])
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["benchmark"] == "defenses" and result["settings"]["attack_rounds"] == [0, 1]
    rows = result["results"]
    assert [r["defense"] for r in rows] == ["none", "gaussian", "PPP-NG1"]
    for r in rows:
        assert {"setting", "accuracy", "test_loss", "accuracy_curve", "fidelity", "overhead_ms", "wall_s",
                "ssim", "psnr", "leakage", "applied", "precode"} <= set(r)
        assert 0.0 <= r["accuracy"] <= 1.0 and len(r["accuracy_curve"]) == 2
        assert len(r["leakage"]) == 2 and all(math.isfinite(s["ssim"]) for s in r["leakage"])
    assert rows[0]["fidelity"] == 1.0 and rows[0]["applied"] == [] and rows[2]["precode"]
    md = (tmp_path / "bench.md").read_text()
    assert "| defense | setting | accuracy |" in md and "| PPP-NG1 | ppp=ng" in md


def test_bench_rejects_unknown_defense_names(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--json", str(tmp_path / "x.json"), "--defenses", "none,bogus"])
    with pytest.raises(ValueError, match=r"unknown name\(s\) \['bogus'\]"):
        bench.main(args)
    assert bench.attack_rounds(100, 3) == [0, 50, 99] and bench.attack_rounds(5, 0) == []

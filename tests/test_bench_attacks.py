"""``leakgym bench attacks`` with tiny settings: file schema only (timings are machine-dependent)."""

from __future__ import annotations

import argparse
import json

import pytest

from leakgym.bench import attacks as bench


def parse(argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_bench_attacks_writes_json_and_markdown(tmp_path):
    out = tmp_path / "bench_attacks.json"
    args = parse(["--json", str(out), "--models", "lenet", "--ns", "1,2", "--iterations", "1",
                  "--image-size", "16"])
    assert bench.main(args) == 0
    data = json.loads(out.read_text())
    assert isinstance(data["machine"], str)
    rows = data["rows"]
    assert [(r["model"], r["n"]) for r in rows] == [("lenet", 1), ("lenet", 2)]
    for r in rows:
        assert set(r) >= {"model", "n", "batched_ms_per_iter", "sequential_ms_per_iter", "speedup", "device"}
        assert r["batched_ms_per_iter"] > 0 and r["sequential_ms_per_iter"] > 0
        assert r["speedup"] == pytest.approx(r["sequential_ms_per_iter"] / r["batched_ms_per_iter"])
        assert r["device"] == "cpu"
    table = out.with_suffix(".md").read_text()
    assert "| lenet | 2 |" in table and "speedup" in table


def test_bench_attacks_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="--ns"):
        bench.main(parse(["--json", str(tmp_path / "x.json"), "--ns", "0"]))

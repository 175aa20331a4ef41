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


def _strict(constant):
    raise ValueError(f"non-finite number {constant} in JSON")


@pytest.mark.parametrize(("extra", "message"), [
    (["--models", "lenet,foo"], r"--models='lenet,foo': unknown model\(s\) \['foo'\]"),
    (["--models", ","], "--models=',': names no model"),
    (["--ns", "1,x"], "--ns entry 'x'"),
    (["--iterations", "0"], "--iterations=0"),
    (["--iterations", "-1", "--quick"], "--iterations=-1"),  # (--quick replaced the value before its check)
    (["--resnet-iterations", "0", "--quick"], "--resnet-iterations=0"),
])
def test_bench_attacks_rejects_bad_inputs_before_measuring(tmp_path, monkeypatch, extra, message):
    def no_measure(*a, **k):
        raise AssertionError("measured before the arguments were checked")

    monkeypatch.setattr(bench, "measure", no_measure)
    with pytest.raises(ValueError, match=message):
        bench.main(parse(["--json", str(tmp_path / "x.json"), "--no-progress", *extra]))
    assert not (tmp_path / "x.json").exists()


def test_bench_attacks_image_size_below_a_models_minimum_is_refused_before_measuring(tmp_path, monkeypatch):
    """Found in an audit: ``--models lenet,convnet --image-size 8`` passed the fixed ``>= 8`` check, measured
    the LeNet row, then died on ConvNet ("needs images of at least 9x9"); the bound is now the largest
    ``min_image_size`` of the chosen models (LeNet alone takes 4), checked before any row."""
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("measured"))
    out = tmp_path / "x.json"
    with pytest.raises(ValueError, match=r"--image-size=8; allowed: integers >= 9 \(smallest image side of "
                       r"LeNet 4, ConvNet 9\)"):
        bench.main(parse(["--json", str(out), "--models", "lenet,convnet", "--ns", "1", "--image-size", "8",
                          "--no-progress"]))
    assert not out.exists()
    rows = []
    monkeypatch.setattr(bench, "measure", lambda model, n, its, size, device: rows.append((model, size)) or
                        {"model": model, "n": n, "iterations": its, "batched_ms_per_iter": 1.0,
                         "sequential_ms_per_iter": 1.0, "speedup": 1.0, "device": "cpu"})
    assert bench.main(parse(["--json", str(out), "--models", "lenet", "--ns", "1", "--image-size", "4",
                             "--no-progress"])) == 0
    assert rows == [("lenet", 4)]


def test_bench_attacks_unwritable_json_is_refused_before_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("measured"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--json=.*is a file"):
        bench.main(parse(["--json", str(tmp_path / "file" / "x.json"), "--models", "lenet", "--ns", "1"]))


def test_bench_attacks_ctrl_c_keeps_the_finished_rows(tmp_path, monkeypatch, capsys):
    def fake_measure(model_name, n, iterations, image_size, device):
        if n == 2:
            raise KeyboardInterrupt
        return {"model": model_name, "n": n, "iterations": iterations, "batched_ms_per_iter": 1.0,
                "sequential_ms_per_iter": float("nan"), "speedup": float("nan"), "device": "cpu"}

    monkeypatch.setattr(bench, "measure", fake_measure)
    out = tmp_path / "b.json"
    assert bench.main(parse(["--json", str(out), "--models", "lenet", "--ns", "1,2,4", "--no-progress"])) == 130
    rows = json.loads(out.read_text(), parse_constant=_strict)["rows"]
    assert [(r["n"], r["speedup"]) for r in rows] == [(1, None)]
    md = out.with_suffix(".md").read_text()
    assert "| lenet | 1 | 20 | 1.0 | - | - | cpu |" in md and "| lenet | 2 |" not in md
    assert "interrupted: 1 of 3 rows" in capsys.readouterr().err

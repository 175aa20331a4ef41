"""`leakgym bench defenses` with tiny settings: JSON schema, markdown table, and that the PRECODE rows
train a model where PRECODE learns, compared with an undefended row of that same model."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from leakgym.bench import defenses as bench


def _args(tmp_path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--json", str(tmp_path / "bench.json"), "--no-progress", *extra])


def test_bench_defenses_tiny_run_writes_json_and_markdown(tmp_path):
    args = _args(tmp_path, "--defenses", "none,gaussian,PPP-NG1",
                 "--rounds", "2", "--clients", "2", "--batch-size", "4", "--victim-batch", "2",
                 "--attack-rounds", "2", "--attack-iterations", "2", "--eval-every", "1", "--eval-size", "32")
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    settings = result["settings"]
    assert result["benchmark"] == "defenses" and settings["attack_rounds"] == [0, 1]
    assert (settings["precode_model"], settings["precode_width"], settings["precode_lr"]) == ("mlp", 128, 0.1)
    rows = result["results"]
    # The PRECODE row's own undefended baseline is inserted before it.
    assert [(r["defense"], r["model"], r["precode"]) for r in rows] == [
        ("none", "lenet", False), ("gaussian", "lenet", False), ("none", "mlp", False), ("PPP-NG1", "mlp", True)]
    for r in rows:
        assert {"setting", "accuracy", "test_loss", "accuracy_curve", "fidelity", "overhead_ms", "wall_s",
                "ssim", "psnr", "leakage", "applied", "precode", "model", "width", "lr", "baseline",
                "delta_acc"} <= set(r)
        assert 0.0 <= r["accuracy"] <= 1.0 and len(r["accuracy_curve"]) == 2
        assert len(r["leakage"]) == 2 and all(math.isfinite(s["ssim"]) for s in r["leakage"])
    assert rows[0]["fidelity"] == 1.0 and rows[0]["applied"] == []
    assert rows[1]["baseline"]["model"] == "lenet" and rows[3]["baseline"] == {
        "defense": "none", "model": "mlp", "width": 128, "lr": 0.1}
    assert rows[3]["delta_acc"] == pytest.approx(100 * (rows[3]["accuracy"] - rows[2]["accuracy"]))
    md = (tmp_path / "bench.md").read_text()
    assert "| defense | model | setting | accuracy |" in md
    assert "| PPP-NG1 | mlp-128, lr 0.1 + PRECODE | ppp=ng |" in md and "| none | mlp-128, lr 0.1 | - |" in md
    assert "| none | lenet | - |" in md


def test_bench_precode_rows_train_above_chance_next_to_their_own_baseline(tmp_path):
    """With the default PRECODE model the PRECODE row learns (the PRECODE LeNet stays at 10%) and loses
    little against the undefended row of the same architecture; its leakage is measured by the same
    attack at the same rounds as the other rows."""
    args = _args(tmp_path, "--defenses", "none,precode", "--rounds", "30", "--clients", "2",
                 "--attack-rounds", "1", "--attack-iterations", "2", "--eval-every", "30", "--eval-size", "200")
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    pre = next(r for r in result["results"] if r["defense"] == "precode")
    assert pre["precode"] and pre["accuracy"] >= 0.5, f"PRECODE row at {pre['accuracy']:.0%}: near chance (10%)"
    rows = {(r["defense"], r["model"]): r for r in result["results"]}
    assert set(rows) == {("none", "lenet"), ("none", "mlp"), ("precode", "mlp")}
    base = rows[("none", "mlp")]
    assert not base["precode"] and pre["lr"] == base["lr"] and pre["width"] == base["width"]
    assert pre["baseline"]["model"] == "mlp"
    assert pre["delta_acc"] == pytest.approx(100 * (pre["accuracy"] - base["accuracy"]))
    assert abs(pre["delta_acc"]) <= 15.0
    assert result["settings"]["attack"] == "inverting-gradients"
    assert [s["round"] for s in pre["leakage"]] == [s["round"] for s in rows[("none", "lenet")]["leakage"]] == [0]


def test_delta_acc_is_against_the_same_architecture():
    def rec(defense, model, width, lr, precode, acc):
        return {"defense": defense, "model": model, "width": width, "lr": lr, "precode": precode, "accuracy": acc,
                "model_label": bench.Setup(model, width, lr, precode).label(0.5), "setting": "-",
                "bench_override": {}, "ssim": 0.1, "psnr": 7.0, "fidelity": 1.0, "overhead_ms": 0.0}

    records = [rec("none", "lenet", None, 0.5, False, 0.76), rec("gaussian", "lenet", None, 0.5, False, 0.75),
               rec("none", "mlp", 128, 0.1, False, 0.98), rec("precode", "mlp", 128, 0.1, True, 0.97),
               rec("PPP-NG1", "mlp", 64, 0.1, True, 0.90)]
    md = bench.markdown_table(records, {"image_size": 16, "rounds": 100, "clients": 4, "batch_size": 16,
                                        "victim_batch": 4, "lr": 0.5, "model": "lenet", "precode_model": "mlp",
                                        "precode_width": 128, "precode_lr": 0.1, "all_clients": False,
                                        "attack_iterations": 200, "attack_rounds": [0, 50, 99]})
    assert records[1]["delta_acc"] == pytest.approx(-1.0) and records[3]["delta_acc"] == pytest.approx(-1.0)
    assert records[3]["baseline"]["model"] == "mlp"
    assert records[4]["baseline"] is None and records[4]["delta_acc"] is None  # no mlp-64 baseline: no Δ
    assert "| precode | mlp-128, lr 0.1 + PRECODE | - | 97.0% | -1.0 |" in md
    assert "| PPP-NG1 | mlp-64, lr 0.1 + PRECODE | - | 90.0% |  |" in md


def test_plan_puts_precode_rows_on_the_ppp_reproduction_model():
    from leakgym.reproduce.ppp import SCALES

    small = SCALES["small"]["B=1"]
    assert (bench.PRECODE_MODEL, bench.PRECODE_WIDTH, bench.PRECODE_LR) == (
        small.model, small.model_width, small.utility_lr)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    plan = bench.plan(["none", "gaussian", "precode", "PPP-GC90"], parser.parse_args([]))
    assert [(n, s.model, s.width, s.lr, s.precode) for n, s in plan] == [
        ("none", "lenet", None, 0.5, False), ("gaussian", "lenet", None, 0.5, False),
        ("none", "mlp", 128, 0.1, False), ("precode", "mlp", 128, 0.1, True), ("PPP-GC90", "mlp", 128, 0.1, True)]
    # The old setting on request: PRECODE on the main LeNet, compared with the main `none` row.
    old = bench.plan(["none", "precode"], parser.parse_args(["--precode-model", "lenet", "--precode-width", "0",
                                                              "--precode-lr", "0.5"]))
    assert [(n, s.model, s.width, s.precode) for n, s in old] == [("none", "lenet", None, False),
                                                                ("precode", "lenet", None, True)]


def test_bench_rejects_unknown_defense_names(tmp_path):
    args = _args(tmp_path, "--defenses", "none,bogus")
    with pytest.raises(ValueError, match=r"unknown name\(s\) \['bogus'\]"):
        bench.main(args)
    with pytest.raises(ValueError, match=r"--precode-model='vgg'"):
        bench.main(_args(tmp_path, "--precode-model", "vgg"))
    assert bench.attack_rounds(100, 3) == [0, 50, 99] and bench.attack_rounds(5, 0) == []


def _strict(constant):
    raise ValueError(f"non-finite number {constant} in JSON")


@pytest.mark.parametrize(("extra", "message"), [
    (["--eval-size", "0"], "--eval-size=0"),
    (["--eval-size", "-300"], "--eval-size=-300"),
])
def test_bench_defenses_rejects_bad_eval_size_before_training(tmp_path, monkeypatch, extra, message):
    monkeypatch.setattr(bench, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(ValueError, match=message):
        bench.main(_args(tmp_path, *extra))


def test_bench_defenses_unwritable_output_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    (tmp_path / "file").write_text("x")
    args = _args(tmp_path, "--defenses", "none")
    args.json = tmp_path / "file" / "bench.json"
    with pytest.raises(ValueError, match="--json="):
        bench.main(args)
    args = _args(tmp_path, "--defenses", "none", "--markdown", str(tmp_path / "file" / "t.md"))
    with pytest.raises(ValueError, match="--markdown="):
        bench.main(args)
    # the table replaced the JSON: both paths the same file, given or by --json ending in .md
    args = _args(tmp_path, "--defenses", "none", "--markdown", str(tmp_path / "bench.json"))
    with pytest.raises(ValueError, match=r"--markdown=.*is the --json file"):
        bench.main(args)
    args = _args(tmp_path, "--defenses", "none")
    args.json = tmp_path / "bench.md"
    with pytest.raises(ValueError, match=r"--json=.*bench.md'.*its markdown table goes to the same path"):
        bench.main(args)


def test_bench_defenses_records_the_machine_and_writes_atomically(tmp_path, monkeypatch):
    """Its timings (wall_s, overhead_ms) said nothing of where they were measured, and a Ctrl-C while the
    JSON was rewritten after a row left a truncated file (losing the rows before it too)."""
    import leakgym.bench.defenses as module

    written = []
    monkeypatch.setattr(module, "write_atomically", lambda path, data: written.append(path))
    assert bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0")) == 0
    assert tmp_path / "bench.json" in written and tmp_path / "bench.md" in written
    monkeypatch.undo()
    bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0"))
    machine = json.loads((tmp_path / "bench.json").read_text())["settings"]["machine"]
    assert "cores" in machine and "torch thread(s)" in machine and machine.endswith("device cpu")


TINY = ("--rounds", "2", "--clients", "2", "--batch-size", "4", "--victim-batch", "2", "--attack-iterations", "1",
        "--eval-every", "1", "--eval-size", "16")


def test_bench_defenses_without_attacks_writes_null_and_dash(tmp_path):
    assert bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0")) == 0
    result = json.loads((tmp_path / "bench.json").read_text(), parse_constant=_strict)
    (row,) = result["results"]
    assert result["complete"] is True and row["ssim"] is None and row["psnr"] is None and row["leakage"] == []
    assert "| none | lenet | - |" in (tmp_path / "bench.md").read_text()
    assert "| - | - | 1.000 |" in (tmp_path / "bench.md").read_text() and "nan" not in (tmp_path / "bench.md").read_text()


def test_bench_defenses_ctrl_c_keeps_the_trained_rows(tmp_path, monkeypatch, capsys):
    real = bench.run_defense
    calls = []

    def second_interrupts(name, *a, **k):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(name, *a, **k)

    monkeypatch.setattr(bench, "run_defense", second_interrupts)
    assert bench.main(_args(tmp_path, "--defenses", "none,gaussian,prune", *TINY)) == 130
    result = json.loads((tmp_path / "bench.json").read_text(), parse_constant=_strict)
    assert result["complete"] is False and [r["defense"] for r in result["results"]] == ["none"]
    assert result["results"][0]["ssim"] is None and result["results"][0]["accuracy"] >= 0
    md = (tmp_path / "bench.md").read_text()
    assert "| none | lenet | - |" in md and "gaussian" not in md and "Partial results" in md
    assert "interrupted: 1 of 3 rows" in capsys.readouterr().err

"""`leakgym bench eval`: an evaluation in lockstep beside the same evaluation one game at a time (tiny run)."""

import json

import pytest

from leakgym.bench import eval as bench_eval
from leakgym.cli import main


def test_bench_eval_tiny_run(tmp_path):
    out = tmp_path / "bench_eval.json"
    argv = ["bench", "eval", "--json", str(out), "--attackers", "random,fixed:1,0,0,0", "--defenders", "none,noise-0.1",
            "--episodes", "1", "--lockstep", "4", "--overrides", "rounds=2", "num_clients=1", "iterations=[2,4]",
            "eval_size=64"]
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["env"] == "LeakGym-Digits-v0" and row["pairs"] == 4 and row["lockstep"] == 4
    assert row["seconds"] > 0 and row["baseline_seconds"] > 0
    assert row["speedup"] == pytest.approx(row["baseline_seconds"] / row["seconds"])
    # The same games, the attacks batched: equal to rounding, the federated rounds exactly.
    assert row["max_diff_leakage_ssim"] < 1e-3 and row["max_diff_attacker_return"] < 1e-2
    assert row["accuracy_equal"] is True
    assert "one at a time" in out.with_suffix(".md").read_text()


def test_bench_eval_rejects_bad_numbers_before_playing(tmp_path, monkeypatch):
    played = []
    monkeypatch.setattr(bench_eval, "measure", lambda *a, **k: played.append(1))
    with pytest.raises(ValueError, match="--lockstep=0"):
        bench_eval.main(bench_eval_args(tmp_path, "--lockstep", "0"))
    assert played == []


def bench_eval_args(tmp_path, *extra):
    import argparse

    parser = argparse.ArgumentParser()
    bench_eval.add_arguments(parser)
    return parser.parse_args(["--json", str(tmp_path / "b.json"), *extra])


@pytest.mark.parametrize(("extra", "message"), [
    (["--env", "Bogus-v0"], "--env: unknown environment 'Bogus-v0'"),
    (["--episodes", "0"], "--episodes=0"),
    (["--attackers", ","], "agent list"),
    (["--attackers", "random,nosuchagent"], "nosuchagent"),  # was refused after the warm-up game
    (["--overrides", "rounds=0"], "rounds=0"),
])
def test_bench_eval_rejects_bad_inputs_before_playing(tmp_path, monkeypatch, extra, message):
    monkeypatch.setattr(bench_eval, "measure", lambda *a, **k: pytest.fail("played before the check"))
    with pytest.raises(ValueError, match=message):
        bench_eval.main(bench_eval_args(tmp_path, *extra))


def test_bench_eval_unwritable_json_and_ctrl_c(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(bench_eval, "measure", lambda *a, **k: pytest.fail("played before the check"))
    args = bench_eval_args(tmp_path, "--no-progress")
    args.json = str(tmp_path / "file" / "b.json")
    with pytest.raises(ValueError, match="--json="):
        bench_eval.main(args)

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_eval, "measure", interrupt)
    assert bench_eval.main(bench_eval_args(tmp_path, "--no-progress")) == 130
    assert "interrupted" in capsys.readouterr().err and not (tmp_path / "b.json").exists()


def test_bench_eval_writes_strict_json(tmp_path, monkeypatch):
    row = {"env": "LeakGym-Digits-v0", "pairs": 1, "episodes": 1, "lockstep": 2, "overrides": {}, "seconds": 1.0,
           "baseline_seconds": 2.0, "speedup": 2.0, "max_diff_leakage_ssim": float("nan"),
           "max_diff_leakage_psnr": 0.0, "max_diff_attacker_return": 0.0, "max_diff_defender_return": 0.0,
           "accuracy_equal": True, "device": "cpu"}
    monkeypatch.setattr(bench_eval, "measure", lambda *a, **k: row)
    assert bench_eval.main(bench_eval_args(tmp_path, "--no-progress")) == 0

    def strict(constant):
        raise ValueError(constant)

    (saved,) = json.loads((tmp_path / "b.json").read_text(), parse_constant=strict)["rows"]
    assert saved["max_diff_leakage_ssim"] is None
    assert "| 2.00x | - | 0.00 |" in (tmp_path / "b.md").read_text()

"""`leakgym bench env`: batched rows beside the sequential baseline, JSON + markdown (tiny runs)."""

import json

import pytest

from leakgym.bench import env as bench_env
from leakgym.cli import main


@pytest.mark.parametrize(("actions", "batch_clients", "defender"),
                         [("fixed", "on", "none"), ("random", "on", "random"), ("fixed", "off", "none")])
def test_bench_env_tiny_run(tmp_path, actions, batch_clients, defender):
    out = tmp_path / "bench_env.json"
    argv = ["bench", "env", "--json", str(out), "--envs", "LeakGym-Digits-v0", "--steps", "1", "--num-envs", "1,2",
            "--actions", actions, "--baseline-games", "1", "--batch-clients", batch_clients, "--defender", defender]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["num_envs"] for r in rows] == [1, 2]
    for r in rows:
        assert "error" not in r, r
        assert r["actions"] == actions and r["data"] == "real" and r["threads"] == 1
        assert r["batch_clients"] == (batch_clients == "on") and r["defender"] == defender
        assert r["env_steps_per_s"] > 0 and r["baseline_env_steps_per_s"] > 0 and r["peak_rss_mb"] > 0
        assert r["baseline_games"] == 1 and r["speedup"] == pytest.approx(
            r["env_steps_per_s"] / r["baseline_env_steps_per_s"])
        assert r["peak_device_mb"] is None  # CPU
        shares = [r[f"share_{k}"] for k in ("defense", "attack", "fl", "score", "overhead")]
        assert abs(sum(shares) - 1) < 1e-6 and abs(sum(r["baseline_split"].values()) - 1) < 1e-6
    table = out.with_suffix(".md").read_text()
    assert "sequential steps/s" in table and "ratio" in table and "Python overhead" in table
    assert ("batch_clients off" in table) == (batch_clients == "off")
    assert ("random defender" in table) == (defender == "random")


@pytest.mark.parametrize(("text", "sizes"), [("1,16,256,1024", [1, 16, 256, 1024]), (" 4 ", [4])])
def test_num_envs_list(text, sizes):
    assert bench_env.parse_sizes(text) == sizes


@pytest.mark.parametrize("bad", ["0", "1,x", "", "2,-1"])
def test_bad_num_envs_are_rejected(bad):
    with pytest.raises(ValueError, match="--num-envs"):
        bench_env.parse_sizes(bad)


def test_missing_dataset_is_timed_on_labelled_synthetic_images(monkeypatch):
    from leakgym.envs import game as game_module

    monkeypatch.setattr(game_module, "_dataset", game_module._dataset)  # restored after the test
    label = bench_env._use_synthetic_data_if_missing("LeakGym-CIFAR-v0")
    data = game_module._dataset("cifar10", 32)
    assert tuple(data.train_x.shape[1:]) == (3, 32, 32) and data.spec.num_classes == 10
    assert label in ("real", bench_env.SYNTHETIC)
    assert bench_env._use_synthetic_data_if_missing("LeakGym-Digits-v0") == "real"


@pytest.mark.cuda
def test_bench_env_on_cuda_reports_device_memory(tmp_path, cuda_device):
    out = tmp_path / "bench_env.json"
    argv = ["bench", "env", "--json", str(out), "--envs", "LeakGym-Digits-v0", "--steps", "1", "--num-envs", "2",
            "--baseline-games", "1", "--device", str(cuda_device)]
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row, row
    assert row["peak_device_mb"] > 0 and row["baseline_peak_device_mb"] > 0 and "cuda" in row["device"]


def test_bench_env_overrides_are_validated_first_and_name_the_row(tmp_path, capsys):
    out = tmp_path / "bench_env.json"
    argv = ["bench", "env", "--json", str(out), "--envs", "LeakGym-Digits-v0", "--steps", "1", "--num-envs", "2",
            "--actions", "fixed", "--baseline-games", "1", "--overrides", "iterations=[1]", "num_clients=1"]
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row and row["overrides"] == {"iterations": [1], "num_clients": 1}
    assert "LeakGym-Digits-v0, iterations=[1], num_clients=1 | 2 | fixed" in out.with_suffix(".md").read_text()
    bad = tmp_path / "bad.json"
    assert main(["bench", "env", "--json", str(bad), "--envs", "LeakGym-Digits-v0", "--overrides", "rounds=0"]) != 0
    assert "rounds" in capsys.readouterr().err and not bad.exists()  # refused before any worker ran

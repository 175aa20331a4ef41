"""`leakgym bench env`: batched rows beside the sequential baseline, JSON + markdown (tiny runs)."""

import json

import pytest

from leakgym.bench import env as bench_env
from leakgym.cli import main


@pytest.mark.parametrize(("actions", "batch_clients", "defender", "graphs"),
                         [("fixed", "on", "none", "on"), ("random", "on", "random", "on"), ("fixed", "off", "none", "off")])
def test_bench_env_tiny_run(tmp_path, actions, batch_clients, defender, graphs):
    out = tmp_path / "bench_env.json"
    argv = ["bench", "env", "--json", str(out), "--envs", "LeakGym-Digits-v0", "--steps", "1", "--num-envs", "1,2",
            "--actions", actions, "--baseline-games", "1", "--batch-clients", batch_clients, "--defender", defender,
            "--warmup-steps", "1", "--cuda-graphs", graphs]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["num_envs"] for r in rows] == [1, 2]
    for r in rows:
        assert "error" not in r, r
        assert r["actions"] == actions and r["data"] == "real" and r["threads"] == 1
        assert r["batch_clients"] == (batch_clients == "on") and r["defender"] == defender
        assert r["cuda_graphs"] is (graphs == "on")  # the engine's replay switch as the worker ran (a CPU: no effect)
        assert r["env_steps_per_s"] > 0 and r["baseline_env_steps_per_s"] > 0 and r["peak_rss_mb"] > 0
        assert r["baseline_games"] == 1 and r["speedup"] == pytest.approx(
            r["env_steps_per_s"] / r["baseline_env_steps_per_s"])
        assert r["peak_device_mb"] is None  # CPU
        assert r["warmup_steps"] == 1 and r["rounds_played"] == r["num_envs"]  # the warm-up round is not counted
        shares = [r[f"share_{k}"] for k in ("defense", "attack", "fl", "score", "reward", "overhead")]
        assert abs(sum(shares) - 1) < 1e-6 and abs(sum(r["baseline_split"].values()) - 1) < 1e-6
        assert r["share_reward"] > 0 and r["baseline_split"]["reward"] > 0  # the reward phase has its own timer
        # the arithmetic floor: LeNet's products, measured against this CPU's GEMM rate
        assert 1e-4 < r["gflop_per_env_step"] < 1 and r["gemm_gflops"] > 0
        assert r["floor_share"] == pytest.approx(r["gflop_per_env_step"] / r["gemm_gflops"] * r["env_steps_per_s"])
    table = out.with_suffix(".md").read_text()
    assert "sequential steps/s" in table and "ratio" in table and "| reward |" in table and "Python overhead" in table
    assert "GFLOP/env step" in table and "floor/wall" in table
    assert ("batch_clients off" in table) == (batch_clients == "off")
    assert ("CUDA graphs off" in table) == (graphs == "off")
    assert ("random defender" in table) == (defender == "random")


@pytest.mark.parametrize(("text", "sizes"), [("1,16,256,1024", [1, 16, 256, 1024]), (" 4 ", [4])])
def test_num_envs_list(text, sizes):
    assert bench_env.parse_sizes(text) == sizes


@pytest.mark.parametrize("bad", ["0", "1,x", "", "2,-1"])
def test_bad_num_envs_are_rejected(bad):
    with pytest.raises(ValueError, match="--num-envs"):
        bench_env.parse_sizes(bad)


def test_missing_dataset_is_timed_on_labelled_synthetic_images(monkeypatch):
    from leakgym.game import batch as game_module

    monkeypatch.setattr(game_module, "_dataset", game_module._dataset)  # restored after the test
    label = bench_env._use_synthetic_data_if_missing("LeakGym-CIFAR-v0")
    data = game_module._dataset("cifar10", 32)
    assert tuple(data.train_x.shape[1:]) == (3, 32, 32) and data.spec.num_classes == 10
    assert label in ("real", bench_env.SYNTHETIC)
    assert bench_env._use_synthetic_data_if_missing("LeakGym-Digits-v0") == "real"


def test_synthetic_images_sets_the_size_of_the_synthetic_training_set(monkeypatch):
    """``--synthetic-images`` gives the synthetic set the given size (each game's public split is then
    ``public_fraction`` of it), and the row names it; the smallest size the scenario can split passes."""
    from leakgym.data.loading import DatasetUnavailableError
    from leakgym.game import batch as game_module

    def missing(*args, **kwargs):
        raise DatasetUnavailableError("cifar10", [], "not on disk in this test", "")

    monkeypatch.setattr(game_module, "_dataset", game_module._dataset)  # restored after the test
    monkeypatch.setattr("leakgym.data.load_dataset", missing)
    label = bench_env._use_synthetic_data_if_missing("LeakGym-CIFAR-v0", 3_000)
    assert label == f"{bench_env.SYNTHETIC}, 3,000 training images"
    assert game_module._dataset("cifar10", 32).train_x.shape[0] == 3_000
    assert bench_env._use_synthetic_data_if_missing("LeakGym-CIFAR-v0") == bench_env.SYNTHETIC
    assert game_module._dataset("cifar10", 32).train_x.shape[0] == 600 * (8 + 2)
    from leakgym.game.scenario import load_scenario

    bench_env.check_synthetic_images(10, load_scenario("cifar10"))  # 1 public, 9 private: passes


@pytest.mark.cuda
def test_bench_env_on_cuda_reports_device_memory(tmp_path, cuda_device):
    out = tmp_path / "bench_env.json"
    argv = ["bench", "env", "--json", str(out), "--envs", "LeakGym-Digits-v0", "--steps", "1", "--num-envs", "2",
            "--baseline-games", "1", "--device", str(cuda_device)]
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row, row
    assert row["peak_device_mb"] > 0 and row["baseline_peak_device_mb"] > 0 and "cuda" in row["device"]
    assert row["gflop_per_env_step"] > 0 and row["gemm_gflops"] > 0 and row["floor_share"] > 0  # counted on the GPU


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


def _no_worker(*args, **kwargs):
    raise AssertionError("a worker ran before the arguments were checked")


@pytest.mark.parametrize(("extra", "message"), [
    (["--envs", "Bogus-v0"], "--envs entry 'Bogus-v0'"),
    (["--envs", ","], "--envs=',' names no environment"),
    (["--envs", "digits", "--steps", "0"], "--steps=0"),
    (["--envs", "digits", "--warmup-steps", "-1"], "--warmup-steps=-1; allowed: integers >= 0"),
    (["--envs", "cifar10", "--synthetic-images", "9"], "--synthetic-images=9 gives scenario 'cifar10' 0 public"),
    (["--envs", "cifar10", "--synthetic-images", "10", "--overrides", "public_fraction=0.5"],
     ("5 public and 5 private images; allowed: sizes N with floor(public_fraction * N) >= 1 (public_fraction=0.5) "
      "and at least 9 private images (8 clients and the victim)")),
])
def test_bench_env_rejects_bad_inputs_before_any_worker(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.setattr(bench_env, "run", _no_worker)
    out = tmp_path / "e.json"
    assert main(["bench", "env", "--json", str(out), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


def test_bench_env_accepts_scenario_names(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(bench_env, "run", lambda ids, *a, **k: seen.append(ids) or [])
    assert main(["bench", "env", "--json", str(tmp_path / "e.json"), "--envs", "digits", "--no-progress"]) == 0
    assert seen == [["LeakGym-Digits-v0"]]


def test_bench_env_unwritable_json_is_refused_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_env, "run", _no_worker)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["bench", "env", "--json", str(blocker / "e.json"), "--envs", "digits"]) == 2
    assert "--json=" in capsys.readouterr().err


def _fake_row(args: tuple, rate: float) -> dict:
    """A finished row as a worker of ``_measure(*args)`` puts it on its queue (``args[7]``)."""
    return {"env": args[0], "num_envs": args[1], "actions": "fixed", "data": "real", "env_steps_per_s": rate,
            "baseline_env_steps_per_s": 1.0, "baseline_games": 1, "speedup": rate, "peak_rss_mb": 1.0,
            "peak_device_mb": None, **{f"share_{k}": 0.2 for k in ("defense", "attack", "fl", "score", "overhead")}}


def _fake_spawn(monkeypatch, process: type) -> None:
    """The bench's worker processes replaced by ``process`` (no worker: its start() runs the row)."""
    import queue

    class FakeContext:
        Process = process
        Queue = queue.Queue

    monkeypatch.setattr(bench_env.mp, "get_context", lambda method: FakeContext)


def test_bench_env_ctrl_c_keeps_the_finished_rows(tmp_path, monkeypatch, capsys):
    """The row measurement is stubbed (no worker): the 2nd row raises KeyboardInterrupt."""
    calls = []

    class FakeProcess:
        def __init__(self, target, args):
            self.args = args

        def start(self):
            calls.append(self.args[1])
            if len(calls) == 2:
                raise KeyboardInterrupt
            self.args[7].put(_fake_row(self.args, float("nan")) | {"speedup": float("inf")})

        def join(self):
            """Nothing to wait for: start() ran the row."""

    _fake_spawn(monkeypatch, FakeProcess)
    out = tmp_path / "e.json"
    code = main(["bench", "env", "--json", str(out), "--envs", "digits", "--num-envs", "1,2,3", "--no-progress"])
    assert code == 130 and calls == [1, 2]
    rows = json.loads(out.read_text(), parse_constant=_strict)["rows"]
    assert [r["num_envs"] for r in rows] == [1] and rows[0]["env_steps_per_s"] is None
    md = out.with_suffix(".md").read_text()
    assert "| LeakGym-Digits-v0 | 1 | fixed | - |" in md and "| 2 |" not in md
    assert "interrupted: 1 of 3 rows" in capsys.readouterr().err


def test_bench_env_ctrl_c_while_a_worker_exits_keeps_its_row(tmp_path, monkeypatch, capsys):
    """Found in an audit: a row was saved only after its worker had exited (a second or more), so a Ctrl-C in
    that wait lost the row while the message counted it. Here the 2nd worker's exit is interrupted."""
    class FakeProcess:
        def __init__(self, target, args):
            self.args = args

        def start(self):
            self.args[7].put(_fake_row(self.args, 2.0))

        def join(self):
            if self.args[1] == 2 and not getattr(self, "stopped", False):
                raise KeyboardInterrupt

        def terminate(self):
            self.stopped = True

    _fake_spawn(monkeypatch, FakeProcess)
    out = tmp_path / "e.json"
    code = main(["bench", "env", "--json", str(out), "--envs", "digits", "--num-envs", "1,2,3", "--no-progress"])
    assert code == 130
    rows = json.loads(out.read_text(), parse_constant=_strict)["rows"]
    assert [r["num_envs"] for r in rows] == [1, 2]
    assert "interrupted: 2 of 3 rows" in capsys.readouterr().err


def test_worker_ignores_ctrl_c(monkeypatch):
    import signal

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda sig, handler: seen.setdefault(sig, handler))
    monkeypatch.setattr(bench_env, "_measure_row", lambda *a, **k: {"env": a[0]})

    class Q:
        def put(self, row):
            seen["row"] = row

    bench_env._measure("LeakGym-Digits-v0", 1, 1, "fixed", 1, "cpu", 1, Q())
    assert seen[signal.SIGINT] is signal.SIG_IGN and seen["row"]["env"] == "LeakGym-Digits-v0"


def _strict(constant):
    raise ValueError(f"non-finite number {constant} in JSON")


def test_autoreset_steps_are_not_counted_as_played_rounds():
    """With more steps than rounds, a vector step that only resets finished games played no round but was
    counted as N env steps (a 1.9x 'speed-up' from nothing)."""
    row = bench_env._measure_row("LeakGym-Digits-v0", 2, 3, "fixed", 2, "cpu", True, "none",
                                 {"rounds": 1, "iterations": [1], "num_clients": 1, "eval_size": 16})
    assert row["rounds_played"] == 6  # steps 1, 3 and 5 play both games; steps 2 and 4 reset them
    assert row["vector_steps"] == 5
    # the step after them only resets the games; the counted step is the one after that
    assert row["gflop_per_env_step"] > 0
    assert row["env_steps_per_s"] == pytest.approx(6 / row["seconds"]["batched"])
    assert row["baseline_env_steps_per_s"] == pytest.approx(5 * 2 / row["seconds"]["sequential"])


def test_a_timed_step_that_only_resets_is_followed_by_one_that_plays():
    """Found in an audit: ``--num-envs 2 --steps 1 --warmup-steps 1`` with ``rounds=1`` timed one step, the
    autoreset step after the warm-up round, and wrote a row of zeros (0 rounds played, 0.0 env steps/s and
    speed-up, 100% overhead); the timing now goes on until ``--steps`` steps have played a round."""
    row = bench_env._measure_row("LeakGym-Digits-v0", 2, 1, "fixed", 2, "cpu", True, "none",
                                 {"rounds": 1, "iterations": [1], "num_clients": 1, "eval_size": 16}, warmup=1)
    assert (row["steps"], row["vector_steps"], row["rounds_played"]) == (1, 2, 2)
    assert row["env_steps_per_s"] > 0 and row["speedup"] > 0 and row["share_overhead"] < 1


def test_the_table_shows_a_dash_for_fields_a_row_lacks():
    """Rows written before the reward timer and the arithmetic floor (no share_reward, gflop_per_env_step,
    floor_share), and a row whose counted step played no round (gflop_per_env_step None): a dash, no error
    (markdown_table's rule for a missing value, which these columns rely on)."""
    row = bench_env._measure_row("LeakGym-Digits-v0", 1, 1, "fixed", 1, "cpu", True, "none",
                                 {"rounds": 2, "iterations": [1], "num_clients": 1, "eval_size": 16})
    old = {k: v for k, v in row.items() if k not in ("share_reward", "gflop_per_env_step", "floor_share")}
    uncounted = dict(row, gflop_per_env_step=None, floor_share=None)
    lines = bench_env.to_markdown([old, uncounted], "test machine").splitlines()
    assert lines[-2].endswith("| - | " + f"{old['share_overhead']:.0%}" + " | - | - |")
    assert lines[-1].endswith(" | - | - |") and f"| {row['share_reward']:.0%} |" in lines[-1]


def test_interrupted_saves_the_finished_rows_once_more_and_nothing_without_rows(capsys):
    """Every bench command's Ctrl-C path: the rows are written again (the interrupt may have come between a
    row's arrival and its save), and an interrupt before any row writes nothing."""
    from leakgym.bench import INTERRUPTED, interrupted

    saved = []
    assert interrupted(2, 3, "a.json", "a.md", save=lambda: saved.append("rows")) == INTERRUPTED
    assert saved == ["rows"] and "interrupted: 2 of 3 rows finished; they are in a.json and a.md" in capsys.readouterr().err
    assert interrupted(0, 3, "a.json", save=lambda: saved.append("none")) == INTERRUPTED
    assert saved == ["rows"] and "none of 3 rows finished; nothing written" in capsys.readouterr().err

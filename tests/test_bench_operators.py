"""``leakgym bench operators``: the operators one vector step dispatches, by phase of the round."""

import json

import pytest

from leakgym.bench import operators as bench_operators
from leakgym.cli import main
from leakgym.game import round as game_round

CHEAP = {"num_clients": 1, "eval_size": 16}


def _row(iterations: int, n: int = 2, actions: str = "fixed") -> dict:
    return bench_operators.measure("LeakGym-Digits-v0", n, actions, "none", "cpu",
                                   {**CHEAP, "iterations": [iterations]})


def test_the_count_is_attributed_to_the_phase_that_dispatched_it():
    """More attack iterations add attack operators only: each phase is counted where it ran (a count that
    ignored the phases, or attributed by wall order, would move the other columns too)."""
    short, long = _row(1), _row(4)
    for row in (short, long):
        assert row["total"] == sum(p["operators"] for p in row["phases"].values())
        assert row["views"] == sum(p["views"] for p in row["phases"].values()) < row["total"]
        assert set(row["phases"]) <= {*bench_operators.PHASES, "other"} and row["host_waits"] is None  # (CPU)
    extra = long["phases"]["attack"]["operators"] - short["phases"]["attack"]["operators"]
    assert extra > 0 and long["total"] - short["total"] == extra  # three more iterations, nothing else
    for phase in ("defend", "score", "aggregate", "reward"):
        assert long["phases"][phase] == short["phases"][phase], phase


def test_a_step_that_only_resets_games_is_not_the_one_counted():
    """Found in an audit: with rounds=2 the third step only resets the games, and the row counted it (every phase
    0). The fourth step, which plays a round, is counted then, the same step as with longer episodes."""
    two = bench_operators.measure("LeakGym-Digits-v0", 2, "fixed", "none", "cpu", {**CHEAP, "iterations": [1], "rounds": 2})
    assert two["phases"]["attack"]["operators"] > 0 and two["phases"]["aggregate"]["operators"] > 0
    assert two["total"] == _row(1)["total"]


def test_the_count_is_the_same_every_run_and_the_phases_are_restored():
    originals = {name: getattr(game_round, name) for name in bench_operators.PHASES}
    first, second = _row(2, n=3, actions="random"), _row(2, n=3, actions="random")
    assert first == second
    assert {name: getattr(game_round, name) for name in bench_operators.PHASES} == originals


def test_the_command_writes_json_and_markdown(tmp_path):
    out = tmp_path / "ops.json"
    argv = ["bench", "operators", "--json", str(out), "--num-envs", "1,2", "--actions", "fixed", "--no-progress",
            "--overrides", "iterations=[1]", "num_clients=1", "eval_size=16"]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["num_envs"] for r in rows] == [1, 2] and all(r["phases"]["attack"]["operators"] > 0 for r in rows)
    assert rows[1]["per_game"] == rows[1]["total"] / 2
    table = out.with_suffix(".md").read_text()
    assert "| LeakGym-Digits-v0, iterations=[1], num_clients=1, eval_size=16 | 2 | fixed |" in table
    assert "| host waits |" in table and f"| {rows[1]['per_game']:,.1f} | - |" in table  # no waits on a CPU


@pytest.mark.parametrize(("extra", "message"), [
    (["--envs", "Bogus-v0"], "--envs entry 'Bogus-v0'"),
    (["--num-envs", "0"], "--num-envs"),
    (["--overrides", "rounds=0"], "rounds"),
])
def test_bad_inputs_are_refused_before_anything_is_played(tmp_path, monkeypatch, capsys, extra, message):
    def never(*args, **kwargs):
        raise AssertionError("a row was measured before the arguments were checked")

    monkeypatch.setattr(bench_operators, "measure", never)
    out = tmp_path / "ops.json"
    assert main(["bench", "operators", "--json", str(out), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


@pytest.mark.cuda
def test_the_count_on_cuda_attributes_the_backward_to_the_attack(cuda_device):
    """On a GPU the backward runs on the device's autograd thread: its operators still count for the
    phase that waits on them (more iterations: more attack operators, the other phases unchanged)."""
    def row(iterations):
        return bench_operators.measure("LeakGym-Digits-v0", 2, "fixed", "none", str(cuda_device),
                                       {**CHEAP, "iterations": [iterations]})

    short, long = row(1), row(4)
    assert long["phases"]["attack"]["operators"] > short["phases"]["attack"]["operators"]
    # the host waits for the device (scoring reads the images), but never once per attack iteration
    assert short["host_waits"]["total"] >= 1
    assert long["host_waits"]["phases"].get("attack", 0) == short["host_waits"]["phases"].get("attack", 0)
    assert long.get("phases", {}).get("other") == short.get("phases", {}).get("other")
    for phase in ("defend", "score", "aggregate", "reward"):
        assert long["phases"][phase] == short["phases"][phase], phase

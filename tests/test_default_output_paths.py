"""`leakgym reproduce` and `leakgym bench` write under runs/ unless told otherwise: the committed
results in docs/results change only when their path is given explicitly."""

from pathlib import Path

import pytest

from leakgym.cli import build_parser
from leakgym.reproduce.runner import run_paper


@pytest.mark.parametrize("argv,option,default", [
    (["reproduce", "dcs2"], "out", Path("runs/reproduce")),
    (["bench", "attacks"], "json", "runs/bench/bench_attacks.json"),
    (["bench", "defenses"], "json", Path("runs/bench/bench_defenses.json")),
    (["bench", "env"], "json", "runs/bench/bench_env.json"),
])
def test_reproduce_and_bench_default_to_runs(argv, option, default):
    args = build_parser().parse_args(argv)
    assert getattr(args, option) == default
    explicit = build_parser().parse_args([*argv, f"--{option}", "docs/results/x.json"])
    assert str(getattr(explicit, option)) == "docs/results/x.json"


def test_run_paper_defaults_to_runs():
    import inspect

    assert inspect.signature(run_paper).parameters["out"].default == Path("runs/reproduce")

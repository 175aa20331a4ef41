"""Inputs every ``leakgym bench`` refuses before it measures anything: output paths, duplicates, contradictions."""

from __future__ import annotations

import importlib

import pytest

from leakgym import cli

#: each bench: the function that does its work (must not run) and flags for a tiny run
BENCHES = {
    "attacks": ("measure", ["--models", "lenet", "--ns", "1", "--iterations", "1", "--no-progress"]),
    "env": ("run", ["--envs", "digits", "--num-envs", "1", "--steps", "1", "--no-progress"]),
    "eval": ("measure", ["--episodes", "1", "--no-progress"]),
    "operators": ("measure", ["--envs", "digits", "--num-envs", "1", "--no-progress"]),
    "trace": ("trace_round", []),
}


def _no_work(monkeypatch, bench: str) -> None:
    module = importlib.import_module(f"leakgym.bench.{bench}")
    monkeypatch.setattr(module, BENCHES[bench][0], lambda *a, **k: pytest.fail(f"bench {bench} started measuring"))


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_a_folder_where_the_markdown_table_goes_is_refused_before_measuring(tmp_path, monkeypatch, capsys, bench):
    """Found in an audit: ``--json mdd/x.json`` with a folder ``mdd/x.md`` measured everything, then failed with
    "[Errno 21] Is a directory" writing the table beside the JSON (:func:`leakgym.bench.check_output` checked the
    JSON path only)."""
    _no_work(monkeypatch, bench)
    (tmp_path / "x.md").mkdir()
    out = tmp_path / "x.json"
    assert cli.main(["bench", bench, "--json", str(out), *BENCHES[bench][1]]) == 2
    err = capsys.readouterr().err
    assert f"--json={str(out)!r}: its markdown table goes to {str(tmp_path / 'x.md')!r}, which is a folder" in err
    assert not out.exists()


class Started(Exception):
    """Raised where a bench starts its work: every check before it passed."""


def _defenses_args(tmp_path, *extra: str):
    import argparse

    from leakgym.bench import defenses

    parser = argparse.ArgumentParser()
    defenses.add_arguments(parser)
    return parser.parse_args(["--json", str(tmp_path / "bench.json"), "--no-progress", "--rounds", "1",
                              "--clients", "2", "--attack-iterations", "1", "--eval-size", "8", *extra])


def test_bench_defenses_checks_its_markdown_path_not_the_json_sibling(tmp_path, monkeypatch):
    """``bench defenses`` writes its table to ``--markdown`` where given: a folder beside the JSON is no obstacle
    then, and the default table path (the JSON's ``.md``) is still refused when it is a folder."""
    from leakgym.bench import defenses

    def start(*a, **k):
        raise Started

    monkeypatch.setattr(defenses, "split_on", start)  # (after every check: the split goes to the device)
    (tmp_path / "bench.md").mkdir()
    with pytest.raises(ValueError, match=r"--json \(its \.md table\)=.*bench\.md' is a folder"):
        defenses.main(_defenses_args(tmp_path, "--defenses", "none"))
    with pytest.raises(Started):
        defenses.main(_defenses_args(tmp_path, "--defenses", "none", "--markdown", str(tmp_path / "table.md")))


@pytest.mark.parametrize(("bench", "extra", "message"), [
    ("env", ["--num-envs", "1,1"], "--num-envs='1,1' names 1 more than once"),
    ("env", ["--envs", "digits,LeakGym-Digits-v0"],
     "--envs='digits,LeakGym-Digits-v0' names 'digits' = 'LeakGym-Digits-v0' more than once"),
    ("operators", ["--num-envs", "4,2,4"], "--num-envs='4,2,4' names 4 more than once"),
    ("attacks", ["--ns", "1,1"], "--ns='1,1' names 1 more than once"),
    ("attacks", ["--models", "lenet,lenet"], "--models='lenet,lenet' names lenet more than once"),
    ("env", ["--overrides", "rounds=1", "rounds=2"], "override 'rounds=2': rounds is already given ('rounds=1')"),
    ("eval", ["--overrides", "rounds=1", "rounds=2"], "override 'rounds=2': rounds is already given ('rounds=1')"),
])
def test_an_entry_given_twice_is_refused_before_measuring(tmp_path, monkeypatch, capsys, bench, extra, message):
    """Found in an audit: ``--num-envs 1,1``, ``--envs digits,LeakGym-Digits-v0`` (one environment, two names) and
    ``--ns 1,1`` measured the same row twice, and ``--overrides rounds=1 rounds=2`` ran with the last value."""
    _no_work(monkeypatch, bench)
    out = tmp_path / "x.json"
    assert cli.main(["bench", bench, "--json", str(out), *BENCHES[bench][1], *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"leakgym: error: {message}") and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_a_scenario_override_given_twice_is_refused(capsys):
    """The same rule for every command that takes ``--overrides`` (:func:`parse_overrides`)."""
    assert cli.main(["describe", "LeakGym-Digits-v0", "--overrides", "rounds=1", "eval_size=16", "rounds=2"]) == 2
    assert "override 'rounds=2': rounds is already given ('rounds=1'); allowed: each key once" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    (["--defenses", "none,gaussian,None"], r"--defenses='none,gaussian,None' names none more than once"),
    (["--defenses", ""], r"--defenses='' names no defense; allowed: comma-separated names of \["),
    (["--defenses", " , "], r"--defenses=' , ' names no defense"),
    (["--defenses", "none", "--all-clients", "--utility", "victim"],
     r"--all-clients \(= --utility all\) with --utility victim: they disagree"),
    (["--defenses", "none", "--all-clients", "--utility", "both"],
     r"--all-clients \(= --utility all\) with --utility both: they disagree"),
])
def test_bench_defenses_refuses_duplicates_empty_lists_and_contradictions(tmp_path, monkeypatch, extra, message):
    """Found in an audit: ``--defenses none,none`` trained the row twice, ``--all-clients --utility victim`` ran
    as ``--utility all`` without a word, and ``--defenses ''`` said "unknown name(s) []"."""
    from leakgym.bench import defenses

    monkeypatch.setattr(defenses, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(ValueError, match=message):
        defenses.main(_defenses_args(tmp_path, *extra))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("extra", "modes"), [
    ([], [False, True]), (["--all-clients"], [True]), (["--all-clients", "--utility", "all"], [True]),
    (["--utility", "victim"], [False]),
])
def test_bench_defenses_utility_modes_agree_with_all_clients(tmp_path, monkeypatch, extra, modes):
    from leakgym.bench import defenses

    def start(*a, **k):
        raise Started

    monkeypatch.setattr(defenses, "split_on", start)  # (after every check: the split goes to the device)
    args = _defenses_args(tmp_path, "--defenses", "none", *extra)
    with pytest.raises(Started):  # every check passed
        defenses.main(args)
    assert defenses.utility_modes(args) == modes

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

    monkeypatch.setattr("leakgym.data.load_dataset", start)
    (tmp_path / "bench.md").mkdir()
    with pytest.raises(ValueError, match=r"--json \(its \.md table\)=.*bench\.md' is a folder"):
        defenses.main(_defenses_args(tmp_path, "--defenses", "none"))
    with pytest.raises(Started):
        defenses.main(_defenses_args(tmp_path, "--defenses", "none", "--markdown", str(tmp_path / "table.md")))

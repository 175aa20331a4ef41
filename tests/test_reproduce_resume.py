"""`leakgym reproduce` keeps its finished work (Ctrl-C, ``--resume``) and its table states the run it made.

Found in review: an interrupted ``leakgym reproduce dcs2 --seeds 0,1 --images 1`` wrote nothing, even with
both seeds' attack grids done; the markdown printed ``--size small --seeds 0,1`` for a run with
``--images 1 --no-utility``, a FedSGD utility line for a run without utility, and "2 CPU cores shared with
other jobs" whatever the machine. Every run here is tiny (1 victim image, 3 attack iterations, 2 FedSGD rounds).
"""

from __future__ import annotations

import json
import os

import pytest
from test_reproduce_quotes import fake_result

from leakgym.reproduce import PAPERS, dcs2, paper_spec, runner
from leakgym.reproduce.runner import Interrupted, command_line, markdown, rerender, run_paper

TINY = {"iterations": 3, "utility_rounds": 2, "eval_size": 50, "utility_eval_every": 1}
TIMINGS = ("attack_s", "overhead_ms", "wall_s")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _measured(obj):
    """``obj`` without its timings (they differ between any two runs)."""
    if isinstance(obj, dict):
        return {k: _measured(v) for k, v in obj.items() if k not in TIMINGS}
    if isinstance(obj, list):
        return [_measured(v) for v in obj]
    return obj


REAL = {name: getattr(runner, name) for name in ("run_grid", "measure_utility")}


def _interrupt_at(monkeypatch, name: str, n: int) -> list:
    """Make the ``n``-th call of ``runner.<name>`` raise KeyboardInterrupt (n=0: never); returns the call log."""
    real, calls = REAL[name], []

    def wrapped(*args, **kwargs):
        calls.append(kwargs.get("seed"))
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, name, wrapped)
    return calls


def test_ctrl_c_keeps_the_finished_seeds_and_resume_finishes_with_the_same_numbers(tmp_path, monkeypatch):
    """Ctrl-C at the third utility run: both seeds' grids and two utility runs are on disk (``"complete":
    false``), the earlier run's table and figure are gone, ``--resume`` runs only the rest and gives the
    numbers of an uninterrupted run; another run's options, and ``--rerender``, are refused."""
    spec = paper_spec("dcs2")
    whole = run_paper(spec, seeds=(0, 1), images=1, out=tmp_path / "whole", scale_overrides=TINY, progress=False)

    out = tmp_path / "cut"
    out.mkdir()
    for ext in ("json", "md", "png"):
        (out / f"reproduce_dcs2.{ext}").write_text(f"an earlier run's {ext}")
    _interrupt_at(monkeypatch, "measure_utility", 3)
    with pytest.raises(Interrupted) as caught:
        run_paper(spec, seeds=(0, 1), images=1, out=out, scale_overrides=TINY, progress=False)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert caught.value.path == out / "reproduce_dcs2.json"
    assert caught.value.kept == "attack grid of seed(s) 0,1 of 0,1; 2 of 10 utility runs"
    assert sorted(p.name for p in out.iterdir()) == ["reproduce_dcs2.json"]  # the stale table/figure removed
    partial = json.loads((out / "reproduce_dcs2.json").read_text())
    assert partial["complete"] is False and partial["seeds"] == [0, 1]
    assert partial["done"]["grids"] == {"B=1": [0, 1]}
    assert partial["done"]["utility_runs"]["None"] == [0, 1] and partial["done"]["utility_runs"]["DCS²"] == []
    assert [(g["setting"], g["seed"], len(g["cells"])) for g in partial["progress"]["grids"]] == [("B=1", 0, 5),
                                                                                                  ("B=1", 1, 5)]
    with pytest.raises(ValueError, match="unfinished run"):
        rerender(spec, out / "reproduce_dcs2.json")
    utility_calls = _interrupt_at(monkeypatch, "measure_utility", 0)

    for other in ({"seeds": (0, 1), "images": 3}, {"seeds": (0,), "images": 1}):
        with pytest.raises(ValueError, match=r"other settings \((settings|seeds) differ\)"):
            run_paper(spec, out=out, scale_overrides=TINY, progress=False, resume=True, **other)
    with pytest.raises(ValueError, match="other settings"):
        run_paper(spec, seeds=(0, 1), images=1, out=out, scale_overrides=TINY, progress=False, resume=True,
                  utility=False)

    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: pytest.fail("a finished grid ran again"))
    resumed = run_paper(spec, seeds=(0, 1), images=1, out=out, scale_overrides=TINY, progress=False, resume=True)
    assert len(utility_calls) == 8  # the 10 runs less the 2 kept
    on_disk = json.loads((out / "reproduce_dcs2.json").read_text())
    assert on_disk["complete"] is True and "progress" not in on_disk and on_disk["invocations"] == 2
    assert set(on_disk) == set(json.loads((tmp_path / "whole" / "reproduce_dcs2.json").read_text()))
    for key in ("cells", "utility", "verdicts", "settings", "plateau"):
        assert _measured(resumed[key]) == _measured(whole[key]), key
    assert (out / "reproduce_dcs2.md").read_text().count("over 2 invocations") == 1

    # A complete run is left as it is: nothing runs, nothing is written.
    monkeypatch.setattr(runner, "measure_utility", lambda *a, **k: pytest.fail("a complete run ran again"))
    before = (out / "reproduce_dcs2.json").stat().st_mtime_ns
    again = run_paper(spec, seeds=(0, 1), images=1, out=out, scale_overrides=TINY, progress=False, resume=True)
    assert again["cells"] == on_disk["cells"] and (out / "reproduce_dcs2.json").stat().st_mtime_ns == before


@pytest.fixture
def tiny_dcs2(monkeypatch):
    """The CLI's dcs2 run made tiny (the CLI has no flag for attack iterations or rounds)."""
    for scales in dcs2.SCALES.values():
        monkeypatch.setitem(scales, "B=1", scales["B=1"].replace(**TINY))


def test_cli_ctrl_c_says_what_it_kept_and_resume_finishes_it(tmp_path, monkeypatch, capsys, tiny_dcs2):
    from leakgym import cli

    args = ["reproduce", "dcs2", "--seeds", "0,1", "--images", "1", "--no-utility", "--no-progress",
            "--out", str(tmp_path)]
    _interrupt_at(monkeypatch, "run_grid", 2)  # Ctrl-C during seed 1's grid
    assert cli.main(args) == 130
    err = capsys.readouterr().err
    assert (f"interrupted during dcs2; kept its finished part in {tmp_path / 'reproduce_dcs2.json'} (incomplete: "
            "attack grid of seed(s) 0 of 0,1;") in err and "--resume" in err
    assert "nothing of it was written" not in err
    partial = json.loads((tmp_path / "reproduce_dcs2.json").read_text())
    assert partial["complete"] is False and partial["done"]["grids"] == {"B=1": [0]}

    grids = _interrupt_at(monkeypatch, "run_grid", 0)
    assert cli.main([*args, "--resume"]) == 0
    assert grids == [1]  # only the missing seed ran
    md = (tmp_path / "reproduce_dcs2.md").read_text()
    assert "Generated by `leakgym reproduce dcs2 --size small --seeds 0,1 --images 1 --no-utility`" in md
    assert "* Utility: not run (`--no-utility`)" in md and "* Utility: FedSGD" not in md
    assert cli.main([*args, "--resume"]) == 0
    assert "already complete" in capsys.readouterr().err and grids == [1]


def test_ctrl_c_during_the_extra_measurements_keeps_their_finished_parts(tmp_path, monkeypatch):
    """Found in an audit: a paper's extra measurements (LODA's: about 800 s of its 1249 s run) were saved only
    once all had finished, so Ctrl-C lost all of them and ``--resume`` began them again. Each part is now
    saved when it finishes, and a resumed run computes only the missing ones."""
    import dataclasses

    computed: list[str] = []
    stop_at: list[str] = ["second"]

    def fake_extra(split, scale, seeds, *, size, progress, parts, keep):
        def compute(name):
            def run():
                if name in stop_at:
                    raise KeyboardInterrupt
                computed.append(name)
                return {"value": len(name), "seeds": list(seeds)}
            return run
        return {name: runner.extra_part(parts, keep, name, compute(name)) for name in ("first", "second")}

    spec = dataclasses.replace(paper_spec("dcs2"), extra=fake_extra)
    monkeypatch.setattr(runner, "measure_utility", lambda *a, **k: {"accuracy": None})  # (utility: not the point)
    out = tmp_path / "cut"
    with pytest.raises(Interrupted) as caught:
        run_paper(spec, seeds=(0,), images=1, out=out, scale_overrides=TINY, progress=False)
    assert caught.value.kept.endswith("the extra measurements' first") and computed == ["first"]
    partial = json.loads((out / "reproduce_dcs2.json").read_text())
    assert partial["progress"]["extra_parts"] == {"first": {"value": 5, "seeds": [0]}}

    stop_at.clear()
    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: pytest.fail("a finished grid ran again"))
    resumed = run_paper(spec, seeds=(0,), images=1, out=out, scale_overrides=TINY, progress=False, resume=True)
    assert computed == ["first", "second"]  # the kept part was not computed again
    assert resumed["extras"] == {"first": {"value": 5, "seeds": [0]}, "second": {"value": 6, "seeds": [0]}}
    assert "progress" not in json.loads((out / "reproduce_dcs2.json").read_text())


def test_lodas_extra_measurements_are_saved_part_by_part(monkeypatch):
    """LODA's extras go through extra_part: every utility run of a once-obscured row, the LODA diagnosis and
    the encoding diagnosis; with every part kept, nothing is computed (not even the obscured shards)."""
    from leakgym.reproduce import encoding_diagnosis, loda, loda_diagnosis

    kept: dict[str, object] = {}

    def keep(name, value):
        kept[name] = value
        return value

    monkeypatch.setattr(loda_diagnosis, "obscure_split", lambda split, config, seed: (f"shard {seed}", {}))
    monkeypatch.setattr(loda, "measure_utility", lambda row, scale, *, split, seed, progress: {
        "accuracy": None, "split": split})
    monkeypatch.setattr(loda_diagnosis, "diagnose", lambda *a, **k: {"loda": sorted(k["shards"])})
    monkeypatch.setattr(encoding_diagnosis, "diagnose", lambda *a, **k: {"encoding": k["seeds"]})
    scale = loda.SCALES["small"]["B=6"]
    split = type("Split", (), {"spec": None})()
    monkeypatch.setattr(loda, "_subsets", lambda spec: {})
    out = loda.extra(split, scale, [0, 1], size="small", progress=False, parts={}, keep=keep)
    once = [r.name for r in loda.rows("small") if r.name in loda.ONCE]
    assert once and list(kept) == [f"{r} utility seed {s}" for r in once for s in (0, 1)] + [
        "loda_diagnosis", "encoding_diagnosis"]
    assert kept[f"{once[0]} utility seed 1"]["split"] == "shard 1"
    assert out["loda_diagnosis"] == {"loda": sorted(once)} and out["encoding_diagnosis"] == {"encoding": [0, 1]}

    for name in ("obscure_split", "diagnose"):
        monkeypatch.setattr(loda_diagnosis, name, lambda *a, **k: pytest.fail("a kept part ran again"))
    monkeypatch.setattr(loda, "measure_utility", lambda *a, **k: pytest.fail("a kept part ran again"))
    monkeypatch.setattr(encoding_diagnosis, "diagnose", lambda *a, **k: pytest.fail("a kept part ran again"))
    again = loda.extra(split, scale, [0, 1], size="small", progress=False, parts=dict(kept),
                       keep=lambda n, v: pytest.fail(f"{n} kept again"))
    assert again["loda_diagnosis"] == out["loda_diagnosis"]

def test_the_markdown_states_the_options_the_utility_and_the_machine_of_the_run(tmp_path, tiny_dcs2):
    """The command printed reproduces the run (every option that changes a number), the utility line says
    whether it ran, and the machine line is the measured one (no "2 CPU cores shared")."""
    spec = paper_spec("dcs2")
    result = run_paper(spec, seeds=(0, 1), images=1, utility=False, out=tmp_path, progress=False)
    md = (tmp_path / "reproduce_dcs2.md").read_text()
    assert "Generated by `leakgym reproduce dcs2 --size small --seeds 0,1 --images 1 --no-utility`" in md
    assert "* Utility: not run (`--no-utility`)" in md and "FedSGD, 2 rounds" not in md
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert result["machine"]["torch_threads"] == 1 and result["machine"]["cpu_count"] == os.cpu_count()
    assert f"({cores} CPU core" in md and "one torch thread" in md and "shared" not in md

    with_utility = {**result, "utility_measured": True, "images_requested": None}
    assert command_line(spec, with_utility) == "`leakgym reproduce dcs2 --size small --seeds 0,1`"
    overridden = {**result, "scale_overrides": {"iterations": 3}}
    assert command_line(spec, overridden) == (
        "the Python call `leakgym.reproduce.runner.run_paper(paper_spec('dcs2'), size='small', seeds=(0, 1), "
        "images=1, utility=False, scale_overrides={'iterations': 3})` (its scale overrides have no command-line flag)")
    machine = {"cpu_count": 64, "usable_cores": 3, "cpu_quota": 1.5, "torch_threads": 1}
    assert ("(3 CPU cores available to the process (of 64), CPU quota 1.5 cores, one torch thread;"
            in markdown(spec, {**result, "machine": machine}))


def test_results_written_before_the_options_were_recorded_still_print_a_true_command():
    """Older results (docs/results) lack ``images_requested``, ``utility_measured`` and ``machine``: the
    command is inferred from the recorded settings and the core count is "not recorded", not invented."""
    spec = paper_spec("oasis")
    old = fake_result(spec, seeds=(0, 1))
    md = markdown(spec, old)
    assert "Generated by `leakgym reproduce oasis --size small --seeds 0,1` in 1 s (CPU cores not recorded" in md
    assert "* Utility: FedSGD, 150 rounds" in md
    # --images 16 gives B=8 16 images and B=64 64 (rounded up to the batch)
    fewer = {**old, "settings": {k: {**s, "images": n} for (k, s), n in zip(old["settings"].items(), (16, 64))}}
    assert command_line(spec, fewer) == "`leakgym reproduce oasis --size small --seeds 0,1 --images 16`"
    odd = {**old, "settings": {k: {**s, "images": 3 * s["batch_size"]} for k, s in old["settings"].items()}}
    assert command_line(spec, odd).endswith("(the option that set them was not recorded)")
    skipped = {**old, "utility": {k: {"accuracy": None, "note": "not measured (--no-utility)"} for k in old["utility"]}}
    assert command_line(spec, skipped).endswith("--seeds 0,1 --no-utility`")
    assert "* Utility: not run" in markdown(spec, skipped)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_no_paper_claims_a_machine_or_one_size_for_both(name):
    """No table or deviation states the machine ("2 CPU cores", "contended", "shared with other jobs"), and the
    deviations that give the utility rounds (or OASIS's MLP width) give those of both sizes."""
    paper = paper_spec(name)
    result = fake_result(paper)
    result["machine"] = {"cpu_count": 8, "usable_cores": 8, "cpu_quota": None, "torch_threads": 1}
    md = markdown(paper, result)
    for claim in ("2 CPU", "2-core", "contended", "shared with other jobs"):
        assert claim not in md, (name, claim)
    skipped = {**result, "utility_measured": False,
               "utility": {k: {"accuracy": None, "note": "not measured (--no-utility)"} for k in result["utility"]}}
    skipped["plateau"], skipped["verdicts"] = None, paper.verdicts(skipped)
    md = markdown(paper, skipped)
    assert "* Utility: not run (`--no-utility`)" in md and "Utility: FedSGD," not in md
    assert "ours from FedSGD" not in md  # OASIS's accuracy note
    deviations = " ".join(paper.deviations)
    if name in ("dcs2", "ppp", "loda"):
        for size in ("small", "full"):
            rounds = next(iter(paper.scales[size].values())).utility_rounds
            assert str(rounds) in deviations, (name, size, rounds)
    if name == "oasis":
        assert all(f"{s['B=8'].model_width}" in deviations for s in paper.scales.values())
    if name == "dcs2":
        assert "stopped once" not in deviations  # a fixed number of rounds; the plateau line says if it plateaued

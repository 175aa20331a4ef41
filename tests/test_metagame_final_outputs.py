"""Found in an audit: ``leakgym metagame``'s final files were written straight to their names, so a Ctrl-C
(or a failing figure) while they were written left a new run's tables beside an earlier run's figures, and
said only ``leakgym metagame: interrupted``; and ``--resume`` refused an ``episodes.csv`` of an earlier
version whose SSIM had float-rounded just past 1 (1.0000000596046448)."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest

from leakgym.agents.experiments.evaluation import episode_log as el
from leakgym.agents.experiments.evaluation.payoff import METRICS, EpisodeStats, PairResult
from leakgym.agents.experiments.metagame import CellSamples, Member, run_psro
from leakgym.cli import main as cli_main

# the final files of a run (written at its end); spelled out here, not imported, so that the test runs on
# the code before the fix too
FINAL = ("payoff.csv", "report_card.csv", "report_card.md", "metagame.md", "exploitability.png",
         "meta_strategies.png", "payoff.png", "report_card.png")
EARLIER = b"an earlier command's file\n"
TINY = ["--overrides", "rounds=1", "iterations=[2]", "num_clients=1", "eval_size=16", "--hyperparams", "n_steps=8",
        "n_envs=2", "batch_size=16", "--timesteps", "32", "--episodes", "2", "--no-progress"]


def _command(out):
    return ["metagame", "--env", "LeakGym-Digits-v0", "--iterations", "1", "--out", str(out), "--attackers", "random",
            "--defenders", "none", *TINY]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 1-iteration run (its report card's presets simulated too)."""
    out = tmp_path_factory.mktemp("metagame") / "run"
    assert cli_main(_command(out)) == 0
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run whose final files are an earlier command's (their content marks them)."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    for name in FINAL:
        (out / name).write_bytes(EARLIER)
    return out


def _partials(out):
    return sorted(p.name for p in out.iterdir() if ".partial" in p.name)


def _interrupt_savefig(monkeypatch, at, error=KeyboardInterrupt):
    """Figure.savefig raises ``error`` on its call number ``at``."""
    from matplotlib.figure import Figure

    real, calls = Figure.savefig, []

    def savefig(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise error("stopped here")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)


def _finishes(out, monkeypatch):
    monkeypatch.undo()
    assert cli_main([*_command(out), "--resume"]) == 0
    for name in FINAL:
        assert (out / name).is_file() and (out / name).read_bytes() != EARLIER, name
    assert _partials(out) == []


@pytest.mark.parametrize("earlier", [True, False], ids=["earlier files there", "none there"])
def test_a_ctrl_c_while_the_figures_are_drawn_leaves_the_earlier_set_and_says_resume_finishes(
        run, earlier, monkeypatch, capsys):
    """Interrupted at the second figure: before, payoff.csv, the report card, metagame.md and the first figure
    were this run's, the other figures an earlier run's (or missing), and the message said nothing more."""
    if not earlier:
        for name in FINAL:
            (run / name).unlink()
    _interrupt_savefig(monkeypatch, at=2)
    capsys.readouterr()
    assert cli_main([*_command(run), "--resume"]) == 130
    there = {name: (run / name).read_bytes() for name in FINAL if (run / name).is_file()}
    assert there == ({name: EARLIER for name in FINAL} if earlier else {})
    assert _partials(run) == []
    err = " ".join(capsys.readouterr().err.split())
    assert "interrupted while writing the final files" in err, err
    assert f"every cell and iteration is in {run / 'metagame.json'}" in err
    assert "none of its final files was written" in err
    assert ("are an earlier command's)" in err) == earlier
    assert err.endswith("run the same command with --resume to finish")
    _finishes(run, monkeypatch)


def test_a_ctrl_c_while_the_new_files_are_renamed_in_leaves_none_of_the_earlier_ones(run, monkeypatch, capsys):
    """The new set goes in by renames, after the earlier set was removed: an interrupt among them leaves only
    new files (some missing), and the message names them."""
    real, calls = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if os.path.basename(dst) in FINAL:
            calls.append(dst)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    capsys.readouterr()
    assert cli_main([*_command(run), "--resume"]) == 130
    err = " ".join(capsys.readouterr().err.split())
    there = [name for name in FINAL if (run / name).is_file()]
    assert len(there) == 2 and all((run / name).read_bytes() != EARLIER for name in there)
    assert f"its final files written: {', '.join(there)}; not yet: " in err, err
    assert err.endswith("run the same command with --resume to finish")
    assert _partials(run) == []
    _finishes(run, monkeypatch)


def test_a_failing_figure_leaves_the_earlier_set_and_no_partial_file(run, monkeypatch):
    _interrupt_savefig(monkeypatch, at=3, error=RuntimeError)
    with pytest.raises(RuntimeError, match="stopped here"):
        cli_main([*_command(run), "--resume"])
    assert {name: (run / name).read_bytes() for name in FINAL} == {name: EARLIER for name in FINAL}
    assert _partials(run) == []


# ---------------------------------------------------------------- SSIM rounded past its range (--resume)
SETTINGS = {"env_id": "X-v0", "scenario": "x", "attackers": ["A1"], "defenders": ["D1"], "episodes": 2, "seed": 7,
            "overrides": {}}


def _log_with_ssim(out, ssim: float):
    """An episodes.csv (as an earlier version wrote it) whose pair has an SSIM of ``ssim`` in episode 1."""
    episodes = [EpisodeStats({m: 0.5 for m in METRICS} | {"leakage_ssim": v}, 1) for v in (0.25, ssim)]
    el.EpisodeLog.open(out, SETTINGS, resume=False).append(PairResult("A1", "D1", episodes, None))


@pytest.mark.parametrize("ssim, read", [(1.0000000596046448, 1.0), (1.0000001192092896, 1.0),
                                        (-1.0000000596046448, -1.0), (1.0 + 9e-7, 1.0)])
def test_an_ssim_float_rounded_past_its_range_is_read_clamped(tmp_path, ssim, read):
    _log_with_ssim(tmp_path, ssim)
    assert repr(ssim) in (tmp_path / "episodes.csv").read_text()
    resumed = el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    got = [e.metrics["leakage_ssim"] for e in resumed.finished[("A1", "D1")].episodes]
    assert got == [0.25, read]
    assert el.metric_value_error("leakage_ssim", ssim) is None


@pytest.mark.parametrize("ssim", [1.01, 7.0, -1.5, 1.00001, -1.0 - 2e-6])
def test_an_ssim_really_outside_its_range_is_still_refused(tmp_path, ssim):
    _log_with_ssim(tmp_path, ssim)
    with pytest.raises(ValueError, match=r"line 3: leakage_ssim = .* is outside its range \[-1\.0, 1\.0\]"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)


def test_only_ssim_gets_the_rounding_slack():
    assert el.metric_value_error("accuracy", 1.0000000596046448) is not None
    assert el.metric_value_error("label_accuracy", -1e-9) is not None


class _RoundedSsim:
    """Cells whose SSIM is 1.0000000596046448 (what an earlier version saved in metagame.json)."""

    def play(self, attackers, defenders, tag):
        values = {"attacker_return": 1.0, "defender_return": -1.0, "leakage_ssim": 1.0000000596046448,
                  "leakage_psnr": 30.0, "accuracy": 0.5}
        return {(a.name, d.name): CellSamples({k: [v, v] for k, v in values.items()}, 2)
                for a in attackers for d in defenders}


class _SameMember:
    def best_response(self, role, opponents, mixture, *, iteration, name):
        return Member(name, "0", iteration), 0


def test_a_metagame_state_with_such_an_ssim_resumes(tmp_path):
    kw = {"settings": {"game": "constant"}, "initial": {"attacker": [Member("a0", "0")], "defender": [Member("d0", "0")]},
          "simulator": _RoundedSsim(), "oracle": _SameMember(), "iterations": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_psro(tmp_path, **kw)
        state = run_psro(tmp_path, resume=True, **kw)
    assert state.status == "finished"
    assert np.allclose(state.game.means(["a0"], ["d0"], "leakage_ssim"), 1.0)
    # read clamped into its range, as episodes.csv's reader does, and written back so
    saved = json.loads((tmp_path / "metagame.json").read_text())
    assert max(v for c in saved["cells"] for v in c["leakage_ssim"]) <= 1.0


def test_a_ctrl_c_while_an_iteration_joins_the_state_is_raised_after_it(monkeypatch):
    """An iteration's members, record and cleared pending join the state as one step: a Ctrl-C among those
    statements saved the new members both in the populations and as pending, a state --resume refused
    (found in an audit). A SIGINT sent inside the held block is raised when the block ends."""
    import signal

    from leakgym.agents.experiments.metagame import psro

    # Python's default handler, as in a terminal (a background job, as CI runs, starts with SIGINT ignored)
    caller = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt), psro._interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append(1)
            done.append(2)
        assert done == [1, 2] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, caller)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_ctrl_c_at_either_side_of_an_iteration_joining_resumes(tmp_path, monkeypatch, when):
    """The states saved by a Ctrl-C just before and just after an iteration joins the state both resume, to a
    run whose populations name each member once."""
    import contextlib

    from leakgym.agents.experiments.metagame import psro

    @contextlib.contextmanager
    def interrupted():
        if when == "before":
            raise KeyboardInterrupt
        yield
        raise KeyboardInterrupt

    kw = {"settings": {"game": "constant"}, "initial": {"attacker": [Member("a0", "0")], "defender": [Member("d0", "0")]},
          "simulator": _RoundedSsim(), "oracle": _SameMember(), "iterations": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with monkeypatch.context() as m:
            m.setattr(psro, "_interrupts_held", interrupted)
            with pytest.raises(KeyboardInterrupt):
                run_psro(tmp_path, **kw)
        state = run_psro(tmp_path, resume=True, **kw)
    assert state.status == "finished" and len(state.iterations) == 2
    for role in ("attacker", "defender"):
        names = [m.name for m in state.populations[role]]
        assert len(names) == len(set(names)) == 3

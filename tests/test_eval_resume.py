"""``leakgym eval`` writes each finished pair to episodes.csv at once (pairs play in lockstep groups, which
end together), and ``--resume`` continues an interrupted run to the same payoff table as an uninterrupted
one."""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest

from leakgym.agents.experiments.evaluation import cli as ev
from leakgym.agents.experiments.evaluation import episode_log as el
from leakgym.agents.experiments.evaluation import play
from leakgym.agents.experiments.evaluation.payoff import METRICS, EpisodeStats, LastRound, PairResult

TINY = {"rounds": 1, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}


def _args(out, *extra: str, seed: int = 3, lockstep: int = 2) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    return parser.parse_args(
        ["--env", "LeakGym-Digits-v0", "--attackers", "random,bandit", "--defenders", "none,noise-0.1",
         "--episodes", "2", "--seed", str(seed), "--out", str(out), "--no-progress", "--lockstep", str(lockstep),
         *extra, "--overrides"]
        + [f"{k}={v}" for k, v in TINY.items()]
    )


def _count_episodes(monkeypatch, interrupt_at: int | None = None) -> list[int]:
    """Count play_episodes calls (one episode of a lockstep group each); raise KeyboardInterrupt on call
    number ``interrupt_at`` (1-based)."""
    calls: list[int] = []
    real = play.play_episodes

    def counting(*args, **kwargs):
        calls.append(1)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(play, "play_episodes", counting)
    return calls


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_interrupted_eval_resumes_to_the_uninterrupted_table(tmp_path, monkeypatch, capsys):
    reference = tmp_path / "reference"
    assert ev.main(_args(reference)) == 0

    out = tmp_path / "interrupted"
    calls = _count_episodes(monkeypatch, interrupt_at=3)  # the first episode of the second group of two pairs
    assert ev.main(_args(out)) == ev.INTERRUPTED
    assert "--resume" in capsys.readouterr().err
    # The first group's pairs (two episodes each) were on disk before the interrupt; no payoff file was written.
    assert [(r["attacker"], r["defender"], r["episode"]) for r in _rows(out / "episodes.csv")] == [
        ("random", "none", "0"), ("random", "none", "1"), ("random", "noise-0.1", "0"), ("random", "noise-0.1", "1")
    ]
    assert not (out / "payoff.csv").exists() and (out / "last_round" / "a000_d001.npz").is_file()

    # Other settings (the lockstep groups too: they decide the rounding) are refused before anything is played.
    calls = _count_episodes(monkeypatch)
    with pytest.raises(ValueError, match="seed: saved 3, now 4"):
        ev.main(_args(out, "--resume", seed=4))
    with pytest.raises(ValueError, match="lockstep: saved 2, now 4"):
        ev.main(_args(out, "--resume", lockstep=4))
    assert calls == []

    assert ev.main(_args(out, "--resume")) == 0
    assert len(calls) == 2  # the unfinished group of two pairs, two episodes
    assert (out / "payoff.csv").read_text() == (reference / "payoff.csv").read_text()
    assert json.loads((out / "payoff.json").read_text()) == json.loads((reference / "payoff.json").read_text())
    assert _rows(out / "episodes.csv") == _rows(reference / "episodes.csv")
    from matplotlib.image import imread

    np.testing.assert_array_equal(imread(out / "gallery.png"), imread(reference / "gallery.png"))

    # Resuming a finished run plays nothing and writes the same table again (on the same device under
    # another name too: "cpu:0" was refused as other than "cpu"); a run without --resume starts over.
    assert ev.main(_args(out, "--resume", "--device", "cpu:0")) == 0 and len(calls) == 2
    assert (out / "payoff.csv").read_text() == (reference / "payoff.csv").read_text()
    _count_episodes(monkeypatch, interrupt_at=1)
    assert ev.main(_args(out)) == ev.INTERRUPTED
    assert _rows(out / "episodes.csv") == [] and not list((out / "last_round").iterdir())
    # ... and an earlier run's tables go with it (they would pass for this run's)
    assert not [p for p in out.iterdir() if p.name.startswith(("payoff", "gallery"))]


def test_ctrl_c_while_the_tables_are_written_leaves_no_half_file_and_resume_writes_them(tmp_path, monkeypatch, capsys):
    from leakgym.agents.experiments.evaluation import reporting

    out = tmp_path / "run"
    real = reporting.write_heatmap

    def interrupted(table, path):
        path.write_bytes(b"half a png")
        raise KeyboardInterrupt

    monkeypatch.setattr(reporting, "write_heatmap", interrupted)
    assert ev.main(_args(out)) == ev.INTERRUPTED
    assert "interrupted while writing the tables" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if not p.is_dir()) == ["episodes.csv", "payoff.csv", "payoff.json",
                                                                     "run.json"]
    monkeypatch.setattr(reporting, "write_heatmap", real)
    calls = _count_episodes(monkeypatch)
    assert ev.main(_args(out, "--resume")) == 0 and calls == []
    assert (out / "payoff.png").is_file() and (out / "gallery.png").is_file()


def test_a_group_with_an_unfinished_pair_is_replayed_whole_and_only_that_pair_recorded(tmp_path, monkeypatch):
    """A crash between two pairs' rows of one group leaves the group half on disk: the resume replays
    the whole group (its make-up decides the rounding), so the table is the uninterrupted one."""
    reference = tmp_path / "reference"
    assert ev.main(_args(reference)) == 0
    out = tmp_path / "cut"
    assert ev.main(_args(out)) == 0
    rows = (out / "episodes.csv").read_text().splitlines(keepends=True)
    (out / "episodes.csv").write_text("".join(rows[:-2]))  # the last pair (bandit, noise-0.1) lost
    (out / "payoff.csv").unlink()
    calls = _count_episodes(monkeypatch)
    assert ev.main(_args(out, "--resume")) == 0
    assert len(calls) == 2  # its group (bandit vs none, bandit vs noise-0.1), both episodes
    assert (out / "payoff.csv").read_text() == (reference / "payoff.csv").read_text()
    assert _rows(out / "episodes.csv") == _rows(reference / "episodes.csv")


# ------------------------------------------------------------------ the log itself, without playing
SETTINGS = {"env_id": "X-v0", "scenario": "x", "attackers": ["A1", "A2"], "defenders": ["D1"], "episodes": 2,
            "seed": 7, "overrides": {"rounds": 2, "iterations": (1, 2)}}


def _pair(attacker: str, value: float) -> PairResult:
    episodes = [EpisodeStats({m: value + e / 3 for m in METRICS} | {"leakage_lpips": float("nan")}, 2) for e in range(2)]
    images = np.full((2, 1, 4, 4), value, np.float32)
    labels = np.array([3, 7]) if attacker == "A1" else None
    return PairResult(attacker, "D1", episodes,
                      LastRound(images, 1 - images, np.array([0.5, 0.25]), np.array([12.5, 9.0]), labels))


def test_log_round_trips_exactly_and_drops_a_cut_off_line(tmp_path):
    log = el.EpisodeLog.open(tmp_path, SETTINGS, resume=False)
    first = _pair("A1", 0.1)
    log.append(first)
    with open(tmp_path / "episodes.csv", "a") as fh:
        fh.write("A2,D1,0,7,2,0.3")  # a crash in the middle of the second pair's rows
    resumed = el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    assert list(resumed.finished) == [("A1", "D1")]
    back = resumed.finished[("A1", "D1")]
    for got, want in zip(back.episodes, first.episodes):
        assert got.rounds == want.rounds
        assert [got.metrics[m] for m in METRICS if m != "leakage_lpips"] == [
            want.metrics[m] for m in METRICS if m != "leakage_lpips"
        ]  # bit-exact floats
        assert np.isnan(got.metrics["leakage_lpips"])
    for name in ("matched", "ssim", "psnr", "labels"):
        np.testing.assert_array_equal(getattr(back.last_round, name), getattr(first.last_round, name))
    # The cut-off line is gone from the file, so the replayed pair is not counted twice.
    assert (tmp_path / "episodes.csv").read_text().count("\n") == 1 + 2


def test_a_last_round_entry_that_is_not_an_array_is_ignored(tmp_path):
    """Found in an audit: numpy hands back the raw bytes of a zip entry without a .npy header, and resuming
    failed with an AttributeError on them; a damaged last round is ignored (the pair's rows still count)."""
    import zipfile

    log = el.EpisodeLog.open(tmp_path, SETTINGS, resume=False)
    log.append(_pair("A1", 0.1))
    path = next((tmp_path / el.LAST_ROUND_DIR).iterdir())
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, b"junk" if name in ("originals.npy", "matched.npy") else data)
    resumed = el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    assert list(resumed.finished) == [("A1", "D1")] and resumed.finished[("A1", "D1")].last_round is None


def test_log_rejects_malformed_rows_and_incomplete_pairs_are_replayed(tmp_path):
    log = el.EpisodeLog.open(tmp_path, SETTINGS, resume=False)
    log.append(_pair("A1", 0.1))
    text = (tmp_path / "episodes.csv").read_text()
    lines = text.splitlines(keepends=True)

    (tmp_path / "episodes.csv").write_text(lines[0] + lines[1])  # only episode 0 of the pair
    assert el.EpisodeLog.open(tmp_path, SETTINGS, resume=True).finished == {}

    bad = lines[0] + lines[1].replace("A1,D1,0,7", "A1,D1,0,8")
    (tmp_path / "episodes.csv").write_text(bad)
    with pytest.raises(ValueError, match=r"episodes\.csv, line 2: .*seed 8 \(expected 7\)"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    (tmp_path / "episodes.csv").write_text(lines[0] + lines[1].replace("A1,", "Z9,", 1))
    with pytest.raises(ValueError, match=r"line 2: pair \(Z9, D1\) is not in this run"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    (tmp_path / "episodes.csv").write_text(lines[0] + lines[1].replace(",2,", ",two,", 1))
    with pytest.raises(ValueError, match="line 2: invalid literal"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    (tmp_path / "episodes.csv").write_text(lines[0] + lines[1] + lines[1])
    with pytest.raises(ValueError, match="line 3: episode 0 of \\(A1, D1\\) appears twice"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*run.json"):
        el.EpisodeLog.open(tmp_path, SETTINGS, resume=True)


def test_resume_without_an_earlier_run_starts_one_and_needs_out(tmp_path):
    log = el.EpisodeLog.open(tmp_path / "new", SETTINGS, resume=True)
    assert log.finished == {} and (tmp_path / "new" / "run.json").is_file()
    assert json.loads((tmp_path / "new" / "run.json").read_text())["settings"]["overrides"]["iterations"] == [1, 2]
    with pytest.raises(ValueError, match="resume=True needs out="):
        ev.evaluate("digits", ["random"], ["none"], episodes=1, resume=True, progress=False)


def test_resume_on_another_device_is_refused_and_old_logs_count_as_cpu(tmp_path):
    """The device decides the rounding, so it is one of the run's settings (``leakgym eval --device``
    was not recorded: a resume on another device mixed two runs' numbers silently). A log written
    before the device was recorded ran on the CPU (CUDA games did not run then)."""
    cpu = {**SETTINGS, "device": "cpu"}
    el.EpisodeLog.open(tmp_path / "run", cpu, resume=False)
    with pytest.raises(ValueError, match="device: saved 'cpu', now 'cuda:1'"):
        el.EpisodeLog.open(tmp_path / "run", {**SETTINGS, "device": "cuda:1"}, resume=True)
    run = tmp_path / "run" / "run.json"
    saved = json.loads(run.read_text())
    del saved["settings"]["device"]
    run.write_text(json.dumps(saved))
    assert el.EpisodeLog.open(tmp_path / "run", cpu, resume=True).finished == {}
    with pytest.raises(ValueError, match="device: saved 'cpu', now 'cuda'"):
        el.EpisodeLog.open(tmp_path / "run", {**SETTINGS, "device": "cuda"}, resume=True)
    ev.evaluate("digits", ["random"], ["none"], episodes=1, out=tmp_path / "eval", progress=False,
                overrides={"rounds": 1, "num_clients": 1, "iterations": [1], "eval_size": 32})
    assert json.loads((tmp_path / "eval" / "run.json").read_text())["settings"]["device"] == "cpu"


@pytest.mark.cuda
def test_a_log_recorded_as_cuda_resumes_under_the_index_of_the_current_device(tmp_path, cuda_device):
    import torch

    run = tmp_path / "run"
    el.EpisodeLog.open(run, {**SETTINGS, "device": "cuda"}, resume=False)  # as versions before canonical names wrote
    current = {**SETTINGS, "device": f"cuda:{torch.cuda.current_device()}"}
    assert el.EpisodeLog.open(run, current, resume=True).finished == {}


def test_resume_recreates_a_removed_last_round_folder(tmp_path, monkeypatch):
    """A missing last_round/ was fatal only after the resumed group had been played, every time."""
    import shutil

    out = tmp_path / "run"
    _count_episodes(monkeypatch, interrupt_at=3)
    assert ev.main(_args(out)) == ev.INTERRUPTED
    shutil.rmtree(out / "last_round")
    monkeypatch.undo()
    assert ev.main(_args(out, "--resume")) == 0 and (out / "payoff.csv").is_file()


def test_ctrl_c_before_the_log_exists_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ev, "evaluate", interrupt)  # while the games are being built
    assert ev.main(_args(tmp_path / "never")) == ev.INTERRUPTED
    err = capsys.readouterr().err
    assert "nothing was written" in err and "--resume" not in err
    # an earlier run's log in the folder is not this run's: --resume would be refused (other settings)
    import os

    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "episodes.csv").write_text("an earlier run's\n")
    os.utime(tmp_path / "earlier" / "episodes.csv", (1e9, 1e9))
    assert ev.main(_args(tmp_path / "earlier")) == ev.INTERRUPTED
    err = capsys.readouterr().err
    assert "nothing was written" in err and "--resume" not in err


def test_resume_with_other_torch_threads_is_refused(tmp_path, one_torch_thread):
    """The torch threads decide the rounding of CPU reductions, but `leakgym eval --threads` was not
    recorded: a resume with other threads mixed two runs' numbers silently. A log written before the
    threads were recorded is not held to them."""
    import torch

    overrides = {"rounds": 1, "num_clients": 1, "iterations": [1], "eval_size": 32}
    ev.evaluate("digits", ["random"], ["none"], episodes=1, out=tmp_path / "eval", progress=False, overrides=overrides)
    run = tmp_path / "eval" / "run.json"
    assert json.loads(run.read_text())["settings"]["threads"] == 1
    torch.set_num_threads(2)
    with pytest.raises(ValueError, match="threads: saved 1, now 2"):
        ev.evaluate("digits", ["random"], ["none"], episodes=1, out=tmp_path / "eval", progress=False,
                    overrides=overrides, resume=True)
    saved = json.loads(run.read_text())
    del saved["settings"]["threads"]
    run.write_text(json.dumps(saved))
    ev.evaluate("digits", ["random"], ["none"], episodes=1, out=tmp_path / "eval", progress=False,
                overrides=overrides, resume=True)


# ------------------------------------------------------------------ issue 38, item 5: --resume checks contents
def _save_policy(path, seed: int):
    import gymnasium as gym
    from stable_baselines3 import PPO

    from leakgym.agents.policies import learned

    env = gym.make("LeakGym-Digits-v0", role="attacker", **TINY)
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=8, seed=seed, device="cpu", policy_kwargs={"net_arch": [8]})
    learned.save_policy(model, path, {"algo": "ppo", "role": "attacker", "env_id": "LeakGym-Digits-v0"})
    env.close()


def test_resume_refuses_a_policy_or_scenario_file_that_changed_naming_it(tmp_path, monkeypatch):
    """``--resume`` trusted a policy's path, not its contents: one retrained at the same path between the
    interrupt and the resume was mixed into the same table. run.json records a hash of every policy file
    and of the scenario file; a resume whose files differ is refused, naming them."""
    from leakgym.game import scenario as scenario_module

    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    toml = scenarios / "digits.toml"
    toml.write_text((scenario_module.SCENARIO_DIR / "digits.toml").read_text())
    monkeypatch.setattr(scenario_module, "SCENARIO_DIR", scenarios)
    policy = tmp_path / "attacker.zip"
    _save_policy(policy, seed=1)
    out = tmp_path / "run"

    def run(resume):
        return ev.evaluate("digits", [str(policy), "random"], ["none"], episodes=1, out=out, resume=resume,
                           progress=False, overrides=TINY)

    run(False)
    files = json.loads((out / "run.json").read_text())["files"]
    assert sorted(files) == sorted([str(policy), str(policy.with_suffix(".json")), str(toml)])
    assert all(v.startswith("sha256:") and len(v) == 71 for v in files.values())
    run(True)  # the same files: resumed (nothing left to play)

    original = policy.read_bytes(), policy.with_suffix(".json").read_bytes()
    _save_policy(policy, seed=2)  # retrained at the same path
    with pytest.raises(ValueError, match=rf"--resume: files of the run in {out} differ from those it started with: "
                                         rf"{policy} \(changed\)\. Its finished pairs were played"):
        run(True)
    policy.write_bytes(original[0])
    policy.with_suffix(".json").write_bytes(original[1])
    run(True)  # the original contents back

    toml.write_text(toml.read_text() + "\n# edited\n")
    with pytest.raises(ValueError, match=r"digits.toml \(changed\)"):
        run(True)


def test_resume_of_a_log_without_file_hashes_refuses_its_policy_files(tmp_path):
    """A run.json written before files were recorded cannot vouch for them."""
    policy = tmp_path / "attacker.zip"
    _save_policy(policy, seed=1)
    out = tmp_path / "run"
    kwargs = {"episodes": 1, "out": out, "progress": False, "overrides": TINY}
    ev.evaluate("digits", [str(policy)], ["none"], **kwargs)
    saved = json.loads((out / "run.json").read_text())
    del saved["files"]
    (out / "run.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=rf"{policy} \(not recorded\)"):
        ev.evaluate("digits", [str(policy)], ["none"], resume=True, **kwargs)

"""One writer per run folder (issue 38, item 4): :func:`leakgym.files.run_folder_lock` and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from leakgym.cli import main, run_folder
from leakgym.files import LOCK_FILE, RunFolderBusy, run_folder_lock

HOLD = """
import sys, time
from leakgym.files import run_folder_lock
with run_folder_lock(sys.argv[1], "leakgym eval --out held"):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder_process(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    held = rf"in use by pid {os.getpid()} \(`leakgym eval --out run`, started 20"
    with (run_folder_lock(tmp_path / "run", "leakgym eval --out run"), pytest.raises(RunFolderBusy, match=held),
          run_folder_lock(tmp_path / "run", "leakgym train --out run")):
        pass
    with run_folder_lock(tmp_path / "run", "leakgym train --out run"):  # released when the block ended
        pass


def test_the_lock_is_released_when_its_holder_dies(tmp_path):
    """Another process holds the folder: refused while it runs, free once it is killed (SIGKILL: no
    cleanup code runs; the OS drops the lock)."""
    proc = _holder_process(tmp_path)
    try:
        with (pytest.raises(RunFolderBusy, match=rf"pid {proc.pid} \(`leakgym eval --out held`"),
              run_folder_lock(tmp_path, "leakgym eval --out x")):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with run_folder_lock(tmp_path, "leakgym eval --out x") as path:
        assert path == tmp_path / LOCK_FILE
    assert not path.exists()


def test_a_refused_or_empty_run_leaves_no_folder_and_a_written_one_keeps_its_files(tmp_path):
    """The lock file goes when the block ends; a folder the block created goes with it if nothing was
    written (commands refuse bad settings before they write: no empty folder is left behind)."""
    with run_folder_lock(tmp_path / "a" / "b", "x"):
        assert (tmp_path / "a" / "b" / LOCK_FILE).is_file()
    assert not (tmp_path / "a").exists()
    with run_folder_lock(tmp_path / "c", "x"):
        (tmp_path / "c" / "result.json").write_text("{}")
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["result.json"]
    with run_folder_lock(tmp_path, "x"):  # a folder that existed stays, even empty
        pass
    assert tmp_path.is_dir()


def test_the_lock_is_released_when_the_block_raises(tmp_path):
    with pytest.raises(KeyboardInterrupt), run_folder_lock(tmp_path, "a"):
        raise KeyboardInterrupt
    with run_folder_lock(tmp_path, "b"):
        pass


def test_cli_commands_hold_their_run_folder(tmp_path, capsys):
    """A second ``leakgym eval`` into a folder in use is refused before it plays or writes anything:
    one line, exit 2 (two runs on one --out used to interleave their episodes.csv rows)."""
    out = tmp_path / "run"
    proc = _holder_process(out)
    try:
        code = main(["eval", "--env", "LeakGym-Digits-v0", "--attackers", "random", "--defenders", "none",
                     "--episodes", "1", "--overrides", "rounds=1", "--no-progress", "--out", str(out)])
        err = capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert code == 2
    started = err.split("started ")[1].split(")")[0]
    assert err.strip().splitlines() == [(f"leakgym: error: {out} is in use by pid {proc.pid} (`leakgym eval --out held`, "
                                         f"started {started}); wait for it to finish, or choose another output folder")]
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written (the holder's lock file)


@pytest.mark.parametrize(("argv", "folder"), [
    (["eval", "--out", "x/e"], "x/e"),
    (["train", "--out", "x/t"], "x/t"),
    (["selfplay", "--out", "x/s"], "x/s"),
    (["reproduce", "dcs2", "--out", "x/r"], "x/r"),
    (["bench", "env", "--json", "x/b/env.json"], "x/b"),
    (["bench", "attacks", "--json", "x/b/a.json"], "x/b"),
    (["bench", "eval", "--json", "x/b/e.json"], "x/b"),
    (["bench", "defenses", "--json", "x/b/d.json"], "x/b"),
    (["demo", "--out", "x/d"], "x/d"),
    (["list"], None),
    (["describe", "LeakGym-Digits-v0"], None),
])
def test_every_writing_command_names_its_run_folder(argv, folder):
    from pathlib import Path

    from leakgym.cli import build_parser

    got = run_folder(build_parser().parse_args(argv))
    assert got == (None if folder is None else Path(folder))


def test_a_lock_file_removed_while_it_is_being_locked_is_locked_anew(tmp_path, monkeypatch):
    """A holder removes its lock file when it lets go; a writer that opened that file just before locks a
    file no longer in the folder, sees it and locks the folder's new one (else two writers would hold)."""
    from leakgym import files

    real, removed = files.fcntl.flock, []

    def flock(fd, operation):
        if operation & files.fcntl.LOCK_EX and not removed:
            removed.append(True)
            (tmp_path / LOCK_FILE).unlink()  # the previous holder letting go, just before this lock
        return real(fd, operation)

    monkeypatch.setattr(files.fcntl, "flock", flock)
    with run_folder_lock(tmp_path, "leakgym eval --out x") as path:
        assert removed and path.is_file() and "leakgym eval --out x" in path.read_text()
        monkeypatch.setattr(files.fcntl, "flock", real)
        with pytest.raises(RunFolderBusy), run_folder_lock(tmp_path, "second"):
            pass

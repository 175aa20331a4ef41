"""Output files replaced atomically: written beside their final name, then renamed over it, so an
interruption (Ctrl-C, a failing figure) never leaves a half-written file or a stale one beside a new one;
one writer per run folder (:func:`run_folder_lock`, whose ``--out`` :func:`folder_argument` checks); content hashes of input files (:func:`file_digest`);
values made JSON-safe for results files (:func:`json_safe`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock
    fcntl = None  # type: ignore[assignment]

#: the lock file :func:`run_folder_lock` keeps inside a run folder
LOCK_FILE = ".leakgym.lock"


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A hidden partial path beside ``path`` to write to (same suffix, so matplotlib picks the format);
    renamed over ``path`` when the block ends normally, removed when it raises. Several nested blocks
    (``contextlib.ExitStack``) rename their files only once every block's file is written."""
    path = Path(path)
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` to ``path`` through :func:`replacing`, flushed to disk before the rename."""
    with replacing(path) as partial, open(partial, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())


class RunFolderBusy(ValueError):
    """Another process writes into the run folder (:func:`run_folder_lock`); the message names it."""


def _holder(fh) -> str:
    """What the lock file says about the process holding it (written by :func:`run_folder_lock`)."""
    try:
        fh.seek(0)
        info = json.loads(fh.read(4096) or "{}")
    except (OSError, ValueError, UnicodeDecodeError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not written its name yet)"
    return f"pid {info.get('pid')} (`{info.get('command')}`, started {info.get('started')})"


def _made_folders(folder: Path) -> list[Path]:
    """``folder`` created with its missing parents; returns the ones created, deepest first."""
    missing = []
    at = folder
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def remove_made(made: list[Path]) -> None:
    """Remove the folders ``made`` (deepest first, as :func:`_made_folders` lists them); stops at the first one
    that holds anything."""
    for created in made:
        try:
            created.rmdir()
        except OSError:
            break


def writable_folder(folder: Path) -> list[Path]:
    """Make ``folder`` (with its missing parents) and a file in it, then remove the file; returns the folders
    made, deepest first (:func:`remove_made` undoes them), or raises ``OSError`` where it cannot, having removed
    what it made. Where another process removes the new folder between the two (its own check of the same new
    folder), once more."""
    import tempfile

    made: list[Path] = []
    for attempt in range(3):
        try:
            made += _made_folders(folder)
            tempfile.NamedTemporaryFile(dir=folder, prefix=".leakgym-write-check-").close()
            return made
        except FileNotFoundError:
            if attempt < 2:
                continue
            remove_made(made)
            raise
        except OSError:
            remove_made(made)
            raise
    return made  # (not reached: the last attempt returns or raises)


def _acquire(path: Path, folder: Path, made: list[Path]):
    """An open lock file at ``path`` holding the exclusive lock, or :class:`RunFolderBusy`. A holder removes
    the file when it lets go, so a lock taken on a file that is no longer the one at ``path`` is retried."""
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # a holder that had made the folder removed it as we came in
            made.extend(_made_folders(folder))
            continue
        fh = os.fdopen(fd, "r+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fh)
            fh.close()
            raise RunFolderBusy(f"{folder} is in use by {holder}; wait for it to finish, or choose another "
                                "output folder") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fh
        fh.close()  # the previous holder removed this file before we locked it: lock the new one
    raise RunFolderBusy(f"{folder}: could not take its lock file {path} (it keeps being replaced)")


@contextmanager
def run_folder_lock(folder: str | os.PathLike[str], command: str) -> Iterator[Path]:
    """Hold the run folder ``folder`` for one writer while the block runs.

    An OS file lock (``fcntl.flock``, exclusive, non-blocking) on ``folder/.leakgym.lock``, which then holds
    the holder's pid, ``command`` (what a refused writer is told, e.g. ``"leakgym eval --out runs/x"``) and
    start time. A second writer, from any process, is refused at once with :class:`RunFolderBusy` (a
    ``ValueError``: the CLI's ``leakgym: error: ...``, exit 2) naming the holder. The OS releases the lock
    when the process dies however it dies (``kill -9`` included), so a crashed run never blocks the folder
    (its lock file stays, unlocked, and is reused). When the block ends the lock file is removed, and the
    folder too if the block created it and left it empty (a command refused before it wrote anything
    leaves no folder behind).

    Locks are per open file, so the same process cannot hold one folder twice: take the lock once, in
    the command's ``main``, around everything that writes (``leakgym.cli`` does it for every command with
    a run folder, :func:`leakgym.cli.run_folder`). On platforms without ``fcntl`` (Windows) no lock is
    taken. Yields the lock file's path.
    """
    folder = Path(folder)
    path = folder / LOCK_FILE
    made = _made_folders(folder)
    if fcntl is None:  # pragma: no cover
        yield path
        return
    fh = _acquire(path, folder, made)
    try:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "command": command, "started": started}))
        fh.flush()
        yield path
    finally:
        path.unlink(missing_ok=True)  # still locked: a writer that opened it meanwhile retries on a new file
        fh.close()  # releases the lock
        remove_made(made)


def folder_argument(text: str) -> Path:
    """``argparse`` type of ``--out``: a folder path, not empty, with no file in its way (the path itself or a
    parent). ``Path("")`` is the current directory, so an
    empty ``--out`` (an unset shell variable) wrote a run's files, and removed an earlier run's stale ones,
    in whatever directory the command ran from."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no folder; allowed: a folder path (e.g. runs/eval, or . for "
                                         "the current directory)")
    folder = Path(text)
    # a file in the way was an OSError later ("[Errno 17] File exists"), after the command's other checks;
    # so was a broken or looping link (it exists as a link, not as a folder)
    try:
        blocker = next((p for p in (folder, *folder.parents) if os.path.lexists(p) and not p.is_dir()), None)
    except OSError as exc:  # e.g. a name longer than the file system takes
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.strerror or exc}; allowed: a folder path") from None
    if blocker is not None:
        where = f"{text!r} is" if blocker == folder else f"{text!r}: {str(blocker)!r} is"
        what = "a broken link" if blocker.is_symlink() and not blocker.exists() else "a file"
        raise argparse.ArgumentTypeError(f"{where} {what}, not a folder; allowed: a folder path (made if missing)")
    return folder


def command_line(argv: list[str] | None = None) -> str:
    """``leakgym <arguments>`` of this process (what :func:`run_folder_lock` records as its holder)."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["leakgym", *args])[:500]


def file_digest(path: str | os.PathLike[str]) -> str:
    """``"sha256:<hex>"`` of the file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(2**20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def json_safe(v: Any) -> Any:
    """JSON-safe copy: NumPy scalars -> Python, non-finite floats -> None."""
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    return v


def npz_arrays(archive, keys) -> dict[str, np.ndarray]:
    """Entries ``keys`` of an open ``np.load(..., allow_pickle=False)`` archive, each a numpy array; a
    ``ValueError`` names those that are not: numpy hands back the raw bytes of an entry that is not a ``.npy``
    file (a hand-made or damaged archive)."""
    arrays = {k: archive[k] for k in keys}
    raw = sorted(k for k, v in arrays.items() if not isinstance(v, np.ndarray))
    if raw:
        raise ValueError(f"entry/entries {raw} are not .npy arrays (np.savez writes them)")
    return arrays


__all__ = ["LOCK_FILE", "RunFolderBusy", "command_line", "file_digest", "folder_argument", "json_safe",
           "npz_arrays", "replacing", "run_folder_lock", "write_atomically"]

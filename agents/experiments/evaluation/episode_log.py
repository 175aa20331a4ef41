"""The on-disk log of a ``leakgym eval`` run, written pair by pair so that an interrupted run resumes.

Files under the run's output folder ``OUT``:

``run.json``
    the run's settings (environment, scenario, attacker and defender labels, episodes, seed,
    scenario overrides), written when the run starts, and ``files``: the content hash
    (:func:`leakgym.files.file_digest`) of every file the run reads its agents and scenario from (each
    policy's ``.zip`` and ``.json``, the scenario's TOML file).
``episodes.csv``
    one row per episode: ``attacker, defender, episode, seed, rounds`` and the value of every metric
    in :data:`~leakgym.agents.experiments.evaluation.payoff.METRICS` (empty when undefined, e.g.
    ``leakage_lpips`` without the LPIPS weights). A pair's rows are appended, flushed and synced as soon as the last episode of
    its lockstep group (the pairs played together, :mod:`leakgym.agents.experiments.evaluation.play`) ends.
``last_round/a<i>_d<j>.npz``
    the last round of pair (attacker ``i``, defender ``j``): private images, matched
    reconstructions, their SSIM and PSNR, the images' labels when known and their LPIPS when the game
    scored it (``lpips``, only with the user's LPIPS weights; a file without it reads back as LPIPS not
    available), what ``gallery.png`` shows; written just before its rows.

Resuming (:meth:`EpisodeLog.open` with ``resume=True``) refuses a folder whose ``run.json`` holds
other settings, or whose recorded files changed since (a policy retrained at the same path would mix two
policies' episodes in one table), naming them. It keeps every pair whose episodes are all in
``episodes.csv`` and replays the others from their first episode (agents that adapt learn across a
pair's episodes, so a pair is never resumed mid-way), each with its whole lockstep group so that its
numbers are the uninterrupted run's.
A line cut off by a crash is dropped; any other malformed row (a value outside its metric's range, or a
non-finite one spelled out, included: the log writes an undefined value as an empty field) is an error
naming the file and line. An SSIM up to 1e-6 outside [-1, 1] (:data:`METRIC_ROUNDING`: the float32 rounding
of a near-perfect match, e.g. 1.0000000596046448, in files written before the metric was clamped) is read
clamped into the range. A last round that cannot be read or is not one the gallery can show (float
images of 1 or 3 channels, at least one, of the scenario's size:
:func:`~leakgym.agents.experiments.evaluation.reporting.last_round_problem`) is ignored (the gallery
leaves its pair out). Files are read as text and ``numpy.load(allow_pickle=False)``;
nothing is un-pickled.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.devices import device_name
from leakgym.files import json_safe, npz_arrays, write_atomically

from .payoff import (
    METRIC_ROUNDING,
    METRICS,
    EpisodeStats,
    LastRound,
    PairResult,
    clamped_metric_value,
    metric_value_error,
)
from .reporting import OUTPUT_FILES, last_round_problem

RUN_FILE = "run.json"
EPISODES_FILE = "episodes.csv"
LAST_ROUND_DIR = "last_round"
EPISODE_COLUMNS = ["attacker", "defender", "episode", "seed", "rounds", *METRICS]
#: bump when the meaning of the files changes; a run of another version is not resumed
LOG_VERSION = 2


def _normalise(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as they read back from JSON (tuples -> lists, NumPy scalars -> Python)."""
    return json.loads(json.dumps(json_safe(settings), default=str))


def _format(value: float) -> str:
    return "" if math.isnan(value) else repr(float(value))


def _parse_float(text: str) -> float:
    return float("nan") if text == "" else float(text)


def _check_value(metric: str, text: str, value: float) -> str | None:
    """Why ``value`` (read from ``text``) is not a value of ``metric`` that :meth:`EpisodeLog.append`
    writes, or ``None``: undefined values are written as an empty field, others pass
    :func:`metric_value_error`."""
    if text == "":
        return None
    why = metric_value_error(metric, value)
    if why is not None and not math.isfinite(value):
        why += " (an undefined value is written as an empty field)"
    return why


class EpisodeLog:
    """Appends finished pairs to ``OUT/episodes.csv`` and reads them back for ``--resume``.

    Use :meth:`open`; :attr:`finished` maps ``(attacker, defender)`` labels to the pairs already on
    disk (empty for a new run).
    """

    def __init__(self, out: Path, settings: dict[str, Any], finished: dict[tuple[str, str], PairResult]) -> None:
        self.out = out
        self.settings = settings
        self.finished = finished

    @property
    def episodes_path(self) -> Path:
        return self.out / EPISODES_FILE

    @classmethod
    def open(cls, out: str | os.PathLike[str], settings: dict[str, Any], *, resume: bool,
             files: dict[str, str] | None = None) -> EpisodeLog:
        """Start a new log in ``out`` (replacing an earlier one), or with ``resume`` continue the one there.

        ``settings`` must hold ``attackers``, ``defenders`` (labels), ``episodes`` and ``seed``; with
        ``resume`` they must equal the saved ones (``ValueError`` naming every difference). ``files``: path
        -> :func:`~leakgym.files.file_digest` of the files the run reads (policies, scenario); with
        ``resume`` they must equal the recorded ones (``ValueError`` naming every file that changed,
        appeared or went). Resuming a folder without ``run.json`` starts a new run.
        """
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        settings = _normalise(settings)
        files = dict(files or {})
        run_path = out / RUN_FILE
        if resume and run_path.is_file():
            cls._check_settings(run_path, settings)
            cls._check_files(run_path, files)
            (out / LAST_ROUND_DIR).mkdir(exist_ok=True)  # a removed folder was fatal only after the replayed group
            log = cls(out, settings, {})
            log.finished = log._read_finished()
            # Keep only complete pairs, so the rows of replayed pairs are not there twice.
            log._write_rows(list(log.finished.values()), mode="replace")
            return log
        (out / LAST_ROUND_DIR).mkdir(exist_ok=True)
        for stale in (out / LAST_ROUND_DIR).glob("a*_d*.npz"):
            stale.unlink()
        for name in OUTPUT_FILES:  # an earlier run's tables would pass for this run's until it ends
            (out / name).unlink(missing_ok=True)
        write_atomically(run_path, json.dumps({"version": LOG_VERSION, "settings": settings, "files": files},
                                              indent=2).encode())
        log = cls(out, settings, {})
        log._write_rows([], mode="replace")
        return log

    @staticmethod
    def _check_settings(run_path: Path, settings: dict[str, Any]) -> None:
        try:
            saved = json.loads(run_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"--resume: cannot read {run_path} ({exc}); run without --resume to start over") from None
        if not isinstance(saved, dict) or saved.get("version") != LOG_VERSION or not isinstance(
            saved.get("settings"), dict
        ):
            raise ValueError(
                f"--resume: {run_path} is not a LeakGym eval log of version {LOG_VERSION}; run without --resume "
                f"to start over"
            )
        old = saved["settings"]
        # Logs written before the device was recorded ran on the CPU (CUDA games did not run then).
        if "device" in settings:
            old = {"device": "cpu", **old}
            old["device"] = device_name(old["device"])  # a log of an earlier version may say "cuda"
        # The torch threads decide the rounding of CPU reductions too; a log written before they were
        # recorded does not say, so it is not held to them.
        if "threads" in settings and "threads" not in old:
            old = {**old, "threads": settings["threads"]}
        diffs = [
            f"{key}: saved {old.get(key)!r}, now {settings.get(key)!r}"
            for key in sorted(set(old) | set(settings))
            if old.get(key) != settings.get(key)
        ]
        if diffs:
            raise ValueError(
                f"--resume: the run in {run_path.parent} was started with other settings ("
                + "; ".join(diffs)
                + "). Resume it with the same settings, or choose another --out (or drop --resume to start over)"
            )

    @staticmethod
    def _check_files(run_path: Path, files: dict[str, str]) -> None:
        """The files the run reads are the ones it started with (``run.json``'s ``files``); a log written
        before files were recorded has no record, so every file of the run counts as changed."""
        saved = json.loads(run_path.read_text()).get("files")  # readable: _check_settings read it
        saved = saved if isinstance(saved, dict) else {}
        changed = sorted(p for p in set(saved) | set(files) if saved.get(p) != files.get(p))
        if changed:
            what = "; ".join(f"{p} ({'not recorded' if p not in saved else 'gone' if p not in files else 'changed'})"
                             for p in changed)
            raise ValueError(f"--resume: files of the run in {run_path.parent} differ from those it started with: "
                             f"{what}. Its finished pairs were played with the recorded contents; restore the files, "
                             "or run without --resume to start over")

    # ------------------------------------------------------------------ writing
    def _last_round_path(self, attacker: str, defender: str) -> Path:
        i = self.settings["attackers"].index(attacker)
        j = self.settings["defenders"].index(defender)
        return self.out / LAST_ROUND_DIR / f"a{i:03d}_d{j:03d}.npz"

    def _write_rows(self, pairs: list[PairResult], *, mode: str) -> None:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if mode == "replace":
            writer.writerow(EPISODE_COLUMNS)
        seed = int(self.settings["seed"])
        for pair in pairs:
            for e, stats in enumerate(pair.episodes):
                writer.writerow(
                    [pair.attacker, pair.defender, e, seed + e, stats.rounds, *(_format(stats.metrics[m]) for m in METRICS)]
                )
        if mode == "replace":
            write_atomically(self.episodes_path, buffer.getvalue().encode())
            return
        with open(self.episodes_path, "a", newline="") as fh:
            fh.write(buffer.getvalue())
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, pair: PairResult) -> None:
        """Save a finished pair: its last round first, then its rows (flushed and synced)."""
        if pair.last_round is not None:
            buffer = io.BytesIO()
            last = pair.last_round
            optional = {k: v for k, v in (("labels", last.labels), ("lpips", last.lpips)) if v is not None}
            np.savez(buffer, originals=last.originals, matched=last.matched, ssim=last.ssim, psnr=last.psnr,
                     attacker=np.array(pair.attacker), defender=np.array(pair.defender), **optional)
            write_atomically(self._last_round_path(pair.attacker, pair.defender), buffer.getvalue())
        self._write_rows([pair], mode="append")

    # ------------------------------------------------------------------ reading
    def _read_finished(self) -> dict[tuple[str, str], PairResult]:
        path = self.episodes_path
        if not path.is_file():
            return {}
        try:
            text = path.read_text()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a text file ({exc}); run without --resume to start over") from None
        if text and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # a line cut off by a crash
        try:
            rows = list(csv.reader(io.StringIO(text)))
        except csv.Error as exc:
            raise ValueError(f"{path}: not a CSV file ({exc}); run without --resume to start over") from None
        if not rows:
            return {}
        header, body = rows[0], rows[1:]
        if header != EPISODE_COLUMNS:
            raise ValueError(f"{path}: header {header} is not {EPISODE_COLUMNS}; run without --resume to start over")
        episodes, attackers, defenders = int(self.settings["episodes"]), self.settings["attackers"], self.settings["defenders"]
        seed = int(self.settings["seed"])
        by_pair: dict[tuple[str, str], dict[int, EpisodeStats]] = {}
        for line, row in enumerate(body, start=2):
            where = f"{path}, line {line}"
            if len(row) != len(EPISODE_COLUMNS):
                raise ValueError(f"{where}: {len(row)} fields, expected {len(EPISODE_COLUMNS)}")
            attacker, defender = row[0], row[1]
            if attacker not in attackers or defender not in defenders:
                raise ValueError(f"{where}: pair ({attacker}, {defender}) is not in this run ({attackers} x {defenders})")
            try:
                e, row_seed, rounds = int(row[2]), int(row[3]), int(row[4])
                values = [_parse_float(v) for v in row[5:]]
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            for metric, text, value in zip(METRICS, row[5:], values):
                why = _check_value(metric, text, value)
                if why is not None:
                    raise ValueError(f"{where}: {metric} = {text} {why}; run without --resume to start over")
            if not 0 <= e < episodes or row_seed != seed + e or rounds < 0:
                raise ValueError(
                    f"{where}: episode {e} (allowed 0..{episodes - 1}), seed {row_seed} (expected {seed + e}), "
                    f"rounds {rounds} (must be >= 0)"
                )
            stats = by_pair.setdefault((attacker, defender), {})
            if e in stats:
                raise ValueError(f"{where}: episode {e} of ({attacker}, {defender}) appears twice")
            stats[e] = EpisodeStats(metrics={m: clamped_metric_value(m, v) for m, v in zip(METRICS, values)},
                                    rounds=rounds)
        return {
            key: PairResult(key[0], key[1], [stats[e] for e in range(episodes)], self._read_last_round(*key))
            for key, stats in by_pair.items()
            if len(stats) == episodes
        }

    def _read_last_round(self, attacker: str, defender: str) -> LastRound | None:
        """The saved last round of a pair, or ``None`` when it is missing, does not belong to it or is not
        a last round (other shapes or types, pickled objects: never un-pickled)."""
        path = self._last_round_path(attacker, defender)
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data["attacker"]) != attacker or str(data["defender"]) != defender:
                    return None
                arrays = npz_arrays(data, ("originals", "matched", "ssim", "psnr")
                                    + (("labels",) if "labels" in data.files else ()))
                lpips = data["lpips"] if "lpips" in data.files else None
                last = LastRound(**{"labels": None, **arrays}, lpips=lpips if isinstance(lpips, np.ndarray) else None)
        except (OSError, EOFError, KeyError, ValueError, MemoryError, zipfile.BadZipFile):  # (raw bytes: npz_arrays)
            return None
        # (found in an audit: 5-channel images failed in the gallery after the payoff files were rewritten,
        # 0 images failed there too, and 64 x 64 images were shown for a 16-pixel scenario)
        if last_round_problem(last, self._image_shape) is not None:
            return None
        if last.lpips is not None and not (last.lpips.dtype.kind == "f" and last.lpips.shape == last.ssim.shape
                                           and np.isfinite(last.lpips).all()):
            last.lpips = None  # a damaged LPIPS entry: the images are still shown, LPIPS as not available
        return last

    @functools.cached_property
    def _image_shape(self) -> tuple[int, int, int] | None:
        """``(C, H, W)`` of the run's scenario's images (``settings``' scenario and overrides), or ``None``
        when the settings name no scenario that loads (a log written by hand, as the tests write them)."""
        from leakgym.data import dataset_spec
        from leakgym.game.scenario import load_scenario

        try:
            sc = load_scenario(self.settings["scenario"], **dict(self.settings.get("overrides") or {}))
            spec = dataset_spec(sc.dataset, sc.image_size)
        except (KeyError, TypeError, ValueError, OSError):
            return None
        return spec.channels, spec.image_size, spec.image_size


__all__ = ["EPISODES_FILE", "EPISODE_COLUMNS", "LAST_ROUND_DIR", "METRIC_ROUNDING", "RUN_FILE", "EpisodeLog",
           "clamped_metric_value", "metric_value_error"]

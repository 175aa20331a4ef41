"""Run one paper's reproduction over several seeds and write ``reproduce_<paper>.{json,md,png}``.

A paper module (``leakgym.reproduce.dcs2`` ...) is *data*: it defines a :class:`Paper` -- the
table's rows and columns, the scaled-down sizes, the paper's own numbers (one ``PAPER`` table whose
sections carry their table/figure citation, :func:`quote`) -- plus the function that turns our
numbers into verdicts and the panels of its figure. :func:`run_paper` runs the grid
(:func:`leakgym.reproduce.harness.run_grid`) for every setting and every seed, measures utility
(:func:`leakgym.reproduce.harness.measure_utility`) for every seed, and writes the three files. The
JSON is written as the work goes (``"complete": false`` with every finished seed's grid and utility
run), so a Ctrl-C keeps them and ``resume=True`` (``--resume``) runs only what is missing.

Every number of ours is an :class:`~leakgym.reproduce.stats.Estimate` -- the mean over the images of
all seeds (privacy) or over the seeds (utility) with its standard error. Verdicts are computed, never
edited by hand: each is ``{"claim", "status", "ours", "paper", "why"}`` with ``status`` one of
:data:`~leakgym.reproduce.stats.STATUSES` ("holds" only beyond two standard errors, see
:mod:`leakgym.reproduce.stats`); ``why`` gives the likely reason when a claim does not hold.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leakgym.devices import in_library_modes
from leakgym.files import replacing, write_atomically
from leakgym.reproduce.harness import (
    AttackColumn,
    DefenseRow,
    Scale,
    markdown_table,
    measure_utility,
    run_grid,
)
from leakgym.reproduce.stats import (
    FAILS,
    HOLDS,
    STATUSES,
    TIE,
    UNCHECKED,
    UNDECIDED,
    Estimate,
    bound,
    combine,
    compare,
    difference,
    estimate,
    ranking,
)

SIZES = ("small", "full")
#: The undefended model has plateaued when its accuracy rose by less than this (points) over the last
#: quarter of the utility run, or by less than two standard errors.
PLATEAU_POINTS = 1.0


@dataclass
class Panel:
    """One panel of a paper's figure: ours (mean ± se) next to the paper's numbers."""

    title: str
    ylabel: str
    labels: list[str]
    ours: list[Estimate | None]
    paper: list[float | None]


@dataclass
class Paper:
    """One paper's reproduction: what to run and how to compare it with the paper."""

    key: str
    title: str
    source: str
    """Which table/figure of the paper is reproduced."""
    paper_setting: str
    """The paper's own setting (dataset, model, attack), for the results file."""
    scales: dict[str, dict[str, Scale]]
    """``size -> {setting label -> Scale}`` (e.g. OASIS runs batch 8 and batch 64)."""
    rows: Callable[[str], list[DefenseRow]]
    columns: Callable[[str], list[AttackColumn]]
    paper_numbers: dict
    """The paper's numbers and claims, ``{section: {"cite": "Table 1, MNIST", ...values}}``: the only place
    a number attributed to the paper may come from (``tests/test_reproduce_quotes.py`` checks it)."""
    verdicts: Callable[[dict], list[dict]]
    tables: Callable[[dict], str]
    """Markdown: ours next to the paper's numbers."""
    panels: Callable[[dict], list[Panel]] | None = None
    """The figure's panels (the runner adds the accuracy curves of every row)."""
    draw: Callable[[dict, list], None] | None = None
    """A custom figure part instead of ``panels``: draws into the given axes (see ``draw_axes``)."""
    draw_axes: int = 0
    extra: Callable[..., dict] | None = None
    """Further measurements ``(split, utility scale, seeds, size=, progress=, parts=, keep=) -> {"utility":
    {label: entry}, ...}``: the utility entries join the utility table and curves, the rest is kept as
    ``result["extras"]``. ``keep(name, value)`` saves a finished part (the JSON is written as the run goes) and
    returns it as saved; ``parts`` holds the parts a resumed run already has, by name (:func:`extra_part`)."""
    printed: tuple[str, ...] = ()
    """Sections of ``paper_numbers`` whose every number the markdown tables print."""
    deviations: list[str] = field(default_factory=list)
    """What differs from the paper and why (printed in the results)."""


# -- the paper's numbers --------------------------------------------------------------------------------
def quote(value: float | None) -> str:
    """A number of the paper as printed: at least two decimals, no float noise (``1.0`` -> ``1.00``)."""
    if value is None:
        return "n/a"
    text = repr(float(value))
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}" if "e" not in text else text


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def numbers_in(obj) -> set[float]:
    """Every number in a (nested) table of the paper: values, and numbers inside its quoted text."""
    out: set[float] = set()
    if isinstance(obj, dict):
        for v in obj.values():
            out |= numbers_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out |= numbers_in(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.add(float(obj))
    elif isinstance(obj, str):
        out |= {float(m) for m in NUMBER.findall(obj)}
    return out


def dataset_status(name: str) -> str:
    """``"present"`` if ``load_dataset(name)`` works offline, else why not (recorded in the results)."""
    from leakgym.data import load_dataset

    try:
        load_dataset(name, download=False)
    except Exception as err:  # noqa: BLE001 - any failure means "not usable here"; the reason is recorded
        return f"not present ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
    return "present"


# -- running --------------------------------------------------------------------------------------------
def _merge_cells(per_seed: list[dict]) -> dict:
    """One cell from the same cell of every seed: images pooled, per-seed means kept."""
    first = per_seed[0]
    per_image = {k: [x for c in per_seed for x in c["per_image"][k]] for k in first["per_image"]}
    return {"setting": first["setting"], "defense": first["defense"], "attack": first["attack"],
            "n_images": len(per_image["psnr"]), "attack_s": sum(c["attack_s"] for c in per_seed),
            "fidelity": float(np.mean([c["fidelity"] for c in per_seed])),
            "overhead_ms": float(np.mean([c["overhead_ms"] for c in per_seed])),
            "sent": [s for c in per_seed for s in c["sent"]],
            "per_seed": {k: [float(np.mean(c["per_image"][k])) for c in per_seed] for k in first["per_image"]},
            "per_image": per_image}


def merge_utility(runs: list[dict], seeds: Sequence[int]) -> dict:
    """One utility entry from the runs of several seeds (accuracy mean ± se over seeds, mean curve)."""
    if runs[0].get("accuracy") is None:
        return runs[0]
    out = {k: runs[0][k] for k in ("rounds", "clients", "batch", "defended", "test_images")}
    for key in ("accuracy", "accuracy_victim", "test_loss"):
        e = estimate(r[key] for r in runs)
        out[key], out[f"{key}_se"], out[f"{key}_per_seed"] = e.mean, e.se, [r[key] for r in runs]
    out["seeds"] = list(seeds[: len(runs)])
    out["wall_s"] = sum(r["wall_s"] for r in runs)
    rounds = [pt[0] for pt in runs[0]["curve"]]
    acc = np.array([[pt[1] for pt in r["curve"]] for r in runs])
    se = acc.std(axis=0, ddof=1) / math.sqrt(len(runs)) if len(runs) > 1 else np.zeros(len(rounds))
    out["curve"] = {"rounds": rounds, "accuracy": acc.mean(axis=0).tolist(), "se": se.tolist()}
    sent: dict[str, int] = {}
    for r in runs:
        for k, v in r["sent"].items():
            sent[k] = sent.get(k, 0) + v
    out["sent"] = sent
    return out


MAX_SEED = 2**40
"""Largest seed of a run: seeds are spread as ``seed * 100_003 + ...`` and must stay below ``2**63``."""

#: The utility note of every row when the utility runs were skipped (``utility=False``, ``--no-utility``).
NO_UTILITY = "not measured (--no-utility)"
#: The fields of a results file that must match for ``resume=True`` to continue it.
RUN_FIELDS = ("paper", "size", "seeds", "settings", "rows", "columns", "utility_measured", "scale_overrides", "lpips")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_paper`. ``path``: the results file holding the finished part (``None``:
    nothing was written); ``kept``: what it holds, in words ("" when nothing)."""

    def __init__(self, path: Path | None, kept: str) -> None:
        super().__init__(f"interrupted; kept: {kept or 'nothing'}")
        self.path, self.kept = path, kept


def _plain(obj):
    """``obj`` as the results file holds it (tuples become lists): a finished part and a resumed one merge alike."""
    return json.loads(json.dumps(obj, allow_nan=True))


def machine() -> dict:
    """The CPU the run had: ``os.cpu_count()``, the cores this process may run on, a cgroup CPU quota if
    one is set (``None`` otherwise or where unknown), and torch's intra-op threads."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    quota = None
    with contextlib.suppress(OSError, ValueError):  # cgroup v2: "max 100000" or "200000 100000"
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if limit != "max":
            quota = round(int(limit) / int(period), 2)
    return {"cpu_count": os.cpu_count(), "usable_cores": usable, "cpu_quota": quota,
            "torch_threads": torch.get_num_threads()}


def _done_line(progress: dict, settings: Sequence[str], seeds: Sequence[int], utility_total: int) -> str:
    """What a partial results file holds, in words (``""`` when nothing)."""
    by_setting = {label: [g["seed"] for g in progress["grids"] if g["setting"] == label] for label in settings}
    if not any(by_setting.values()) and not progress["utility_runs"] and progress.get("extras") is None:
        return ""
    of = ",".join(map(str, seeds))
    parts = [(f"attack grid of seed(s) {','.join(map(str, done)) or 'none'} of {of}" if len(settings) == 1 else
              f"{label} attack grid of seed(s) {','.join(map(str, done)) or 'none'} of {of}")
             for label, done in by_setting.items()]
    if utility_total:
        parts.append(f"{len(progress['utility_runs'])} of {utility_total} utility runs")
    if progress.get("extras") is not None:
        parts.append("the extra measurements")
    elif progress.get("extra_parts"):
        parts.append(f"the extra measurements' {', '.join(progress['extra_parts'])}")
    return "; ".join(parts)


def extra_part(parts: dict, keep: Callable[[str, Any], Any], name: str, compute: Callable[[], Any]) -> Any:
    """Part ``name`` of a paper's extra measurements (:attr:`Paper.extra`): from ``parts`` when a resumed run
    has it, else computed and handed to ``keep`` (which saves it and returns it as saved)."""
    return parts[name] if name in parts else keep(name, compute())


def _recorded(paper: Paper, path: Path, run: dict) -> dict | None:
    """The results file ``path`` if it records the run ``run`` (``None`` if there is none); raises if it
    records another run or is not a results file."""
    if not path.exists():
        return None
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"resume: {path} is not a results file ({type(err).__name__}: {err}); move it away or run "
                         "without --resume") from None
    if not isinstance(recorded, dict) or recorded.get("paper") != paper.key:
        got = recorded.get("paper") if isinstance(recorded, dict) else None
        raise ValueError(f"resume: {path} holds the results of {got!r}, not {paper.key!r}")
    if "utility_measured" not in recorded:  # written before the field existed
        recorded["utility_measured"] = utility_measured(recorded)
    differ = [k for k in RUN_FIELDS if _plain(recorded.get(k)) != _plain(run[k])]
    if differ:
        raise ValueError(f"resume: {path} records a run with other settings ({', '.join(differ)} differ); run with "
                         "the options it was started with, or without --resume to start afresh")
    if not recorded.get("complete", True) and not isinstance(recorded.get("progress"), dict):
        raise ValueError(f"resume: {path} is marked incomplete but holds no progress; run without --resume")
    return recorded


def _on_one_torch_thread(fn):
    """``fn`` run on one torch intra-op thread (the results files say so), the caller's count back after."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


@_on_one_torch_thread
@in_library_modes
def run_paper(
    paper: Paper,
    *,
    size: str = "small",
    seeds: Sequence[int] = (0, 1, 2),
    images: int | None = None,
    out: Path | str | None = Path("runs/reproduce"),
    scale_overrides: dict | None = None,
    utility: bool = True,
    progress: bool = True,
    resume: bool = False,
) -> dict:
    """Run ``paper`` at ``size`` for every seed and (if ``out``) write ``reproduce_<key>.{json,md,png}``.

    The JSON is written as the work goes: after each seed's attack grid, each utility run and each part of
    the extra measurements, ``reproduce_<key>.json`` is replaced (atomically) by one marked ``"complete": false``
    that holds every finished part under ``"progress"`` (the ``.md``/``.png`` of an earlier run beside it
    are removed then: they no longer describe it). A Ctrl-C raises :class:`Interrupted` (a
    ``KeyboardInterrupt``) saying what was kept; ``resume=True`` continues from that file. The complete
    run replaces it with the results (``"complete": true``, no ``"progress"``) and writes the table and
    figure.

    Args:
        paper: a :class:`Paper`.
        size: ``"small"`` (minutes on 2 CPU cores) or ``"full"``.
        seeds: one run per seed (victim images, models, defenses, attacks, utility run); the data split
            is the same for all (``federated_split(seed=0)``), so seeds vary everything but the shards.
        images: override the number of victim images per cell and seed (rounded up to a multiple of
            the batch size of each setting).
        out: output folder; ``None`` writes nothing.
        scale_overrides: further :class:`~leakgym.reproduce.harness.Scale` fields to change
            (e.g. ``{"iterations": 20}`` for a smoke run); recorded in the results.
        utility: measure the utility columns (``False``: recorded as not measured).
        progress: tqdm bars.
        resume: continue the run recorded in ``out``: the finished seeds' grids, utility runs and extras are
            read back (JSON) and not run again, so the results equal an uninterrupted run's. The file must
            record a run with the same settings (paper, size, seeds, the settings after ``images`` and
            ``scale_overrides``, rows, columns, utility), else ``ValueError``; a complete one is returned
            as it is, with nothing run or written; without a file the run starts afresh.

    It runs on one torch thread (the caller's thread count is back afterwards) in the library's torch modes
    (:func:`leakgym.devices.library_modes`).

    Returns:
        The results dict (also the JSON file's content).
    """
    from leakgym.data import federated_split, load_dataset

    if size not in SIZES:
        raise ValueError(f"size={size!r}; allowed: {SIZES}")
    if images is not None and (not isinstance(images, int) or images < 1):
        raise ValueError(f"images={images!r}; allowed: integers >= 1")
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds) or not all(0 <= s <= MAX_SEED for s in seeds):
        raise ValueError(f"seeds={seeds!r}; allowed: one or more distinct integers in [0, {MAX_SEED}]")
    if resume and out is None:
        raise ValueError("resume=True needs out (the folder whose results file it continues)")
    if out is not None:  # checked before the work, not after it
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise ValueError(f"out={str(out)!r} is not a writable folder")
    from leakgym.metrics import lpips_available, lpips_status

    # LPIPS beside SSIM/PSNR where the user's backbone weights are on disk; decided once per run (a resumed run
    # must decide alike, RUN_FIELDS). Without them: null, with the reason once (``lpips_note``).
    with_lpips = lpips_available()
    start, cpu_start = time.perf_counter(), time.process_time()
    settings = {}
    for label, scale in paper.scales[size].items():
        if scale_overrides:
            scale = scale.replace(**scale_overrides)
        if images is not None:
            b = scale.batch_size
            scale = scale.replace(images=b * math.ceil(images / b))
        settings[label] = scale
    rows, columns = paper.rows(size), paper.columns(size)
    first_label, first = next(iter(settings.items()))
    head = {
        "paper": paper.key,
        "title": paper.title,
        "source": paper.source,
        "paper_setting": paper.paper_setting,
        "size": size,
        "seeds": seeds,
        "dataset": "digits",
        "settings": {k: v.to_dict() for k, v in settings.items()},
        "utility_setting": first_label,
        "rows": [{"name": r.name, "config": r.config.to_dict(), "active": r.config.active(), "precode": r.precode,
                  "attacks": list(r.attacks) if r.attacks else None, "note": r.note} for r in rows],
        "columns": [{"name": c.name, "attack": c.attack, "config": c.config, "labels_known": c.labels_known,
                     "note": c.note} for c in columns],
        "paper_numbers": paper.paper_numbers,
        "deviations": paper.deviations,
        "scale_overrides": scale_overrides or {},
        "images_requested": images,
        "utility_measured": bool(utility),
        "lpips": "alex" if with_lpips else None,
        "lpips_note": lpips_status(),
    }
    path = out / f"reproduce_{paper.key}.json" if out is not None else None
    recorded = _recorded(paper, path, head) if resume else None
    if recorded is not None and recorded.get("complete", True):
        return recorded
    state = (recorded or {}).get("progress") or {"grids": [], "utility_runs": [], "extras": None, "wall_s": 0.0,
                                                  "cpu_s": 0.0, "invocations": 0}
    earlier_wall, earlier_cpu = float(state["wall_s"]), float(state["cpu_s"])
    state["invocations"] = int(state["invocations"]) + 1
    grids = {(g["setting"], g["seed"]): g["cells"] for g in state["grids"]}
    runs = {(u["row"], u["seed"]): u["run"] for u in state["utility_runs"]}
    use_seeds = {r.name: (seeds[: r.utility_seeds] if r.utility_seeds else seeds) for r in rows}
    utility_total = sum(len(use_seeds[r.name]) for r in rows) if utility else 0
    kept = _done_line(state, list(settings), seeds, utility_total) if recorded is not None else ""
    splits: dict = {}
    cleared: list[bool] = []

    def split_for(scale: Scale):
        if scale.image_size not in splits:
            dataset = load_dataset("digits", image_size=scale.image_size)
            splits[scale.image_size] = federated_split(dataset, num_clients=max(4, scale.utility_clients), seed=0)
        return splits[scale.image_size]

    def save() -> None:
        """Replace the JSON by the finished part (``"complete": false``)."""
        nonlocal kept
        if path is None:
            return
        state["wall_s"] = earlier_wall + time.perf_counter() - start
        state["cpu_s"] = earlier_cpu + time.process_time() - cpu_start
        partial = {**head, "complete": False,
                   "done": {"grids": {label: [s for s in seeds if (label, s) in grids] for label in settings},
                            "utility_runs": {r.name: [s for s in use_seeds[r.name] if (r.name, s) in runs]
                                             for r in rows if utility},
                            "extras": state["extras"] is not None},
                   "progress": state}
        write_atomically(path, json.dumps(partial, indent=1, allow_nan=True) + "\n")
        if not cleared:  # a table and figure beside it describe an earlier run
            for ext in ("md", "png"):
                path.with_suffix(f".{ext}").unlink(missing_ok=True)
            cleared.append(True)
        kept = _done_line(state, list(settings), seeds, utility_total)

    try:
        for label, scale in settings.items():
            for seed in seeds:
                if (label, seed) in grids:
                    continue
                grid = run_grid(rows, columns, scale, split=split_for(scale), seed=seed, progress=progress,
                                lpips=with_lpips)
                grids[(label, seed)] = _plain([{"setting": label, **c.summary()} for c in grid.values()])
                state["grids"].append({"setting": label, "seed": seed, "cells": grids[(label, seed)]})
                save()
        per_cell: dict[tuple, list[dict]] = {}
        for label in settings:
            for seed in seeds:
                for c in grids[(label, seed)]:
                    per_cell.setdefault((label, c["defense"], c["attack"]), []).append(c)
        cells = [_merge_cells(v) for v in per_cell.values()]
        utility_rows = {}
        for row in rows:
            if not utility:
                utility_rows[row.name] = {"accuracy": None, "note": NO_UTILITY}
                continue
            for s in use_seeds[row.name]:
                if (row.name, s) not in runs:
                    runs[(row.name, s)] = _plain(measure_utility(row, first, split=split_for(first), seed=s,
                                                                 progress=progress))
                    state["utility_runs"].append({"row": row.name, "seed": s, "run": runs[(row.name, s)]})
                    save()
            utility_rows[row.name] = merge_utility([runs[(row.name, s)] for s in use_seeds[row.name]],
                                                   use_seeds[row.name])
        extras: dict = {}
        if paper.extra is not None and utility:
            if state["extras"] is None:
                parts = state.setdefault("extra_parts", {})

                def keep(name: str, value: Any) -> Any:
                    parts[name] = _plain(value)
                    save()
                    return parts[name]

                state["extras"] = _plain(dict(paper.extra(split_for(first), first, seeds, size=size,
                                                          progress=progress, parts=parts, keep=keep)))
                del state["extra_parts"]  # (now inside state["extras"])
                save()
            extras = _plain(state["extras"])
            utility_rows.update(extras.pop("utility", {}))
        result = {k: head[k] for k in ("paper", "title", "source", "paper_setting", "size", "seeds", "dataset")}
        result["cifar10"] = dataset_status("cifar10")
        result |= {k: head[k] for k in ("settings", "utility_setting", "rows", "columns", "lpips", "lpips_note")}
        result |= {"cells": cells, "utility": utility_rows}
        result |= {k: head[k] for k in ("paper_numbers", "deviations", "scale_overrides")}
        result["extras"] = extras
        result["plateau"] = plateau(result)
        result["verdicts"] = paper.verdicts(result)
        result["wall_s"] = earlier_wall + time.perf_counter() - start
        # CPU time of this process (one torch thread): the run's cost apart from whatever else shares the cores.
        result["cpu_s"] = earlier_cpu + time.process_time() - cpu_start
        result["load_avg"] = [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
        result |= {"complete": True, "images_requested": images, "utility_measured": bool(utility),
                   "machine": machine(), "invocations": state["invocations"]}
        if out is not None:
            write_outputs(paper, result, out)
    except KeyboardInterrupt as err:
        raise Interrupted(path if kept else None, kept) from err
    return result


def rerender(paper: Paper, path: Path | str, out: Path | str | None = None) -> dict:
    """Recompute the verdicts and rewrite the markdown and figure of a saved results JSON (no run).

    For a presentation change after a long run; the measured numbers (cells, utility, extras, wall
    time) are kept as they are. Writes next to the JSON unless ``out`` is given. An unfinished run's
    file (``"complete": false``) is refused: ``run_paper(..., resume=True)`` finishes it.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no results file to re-render (`leakgym reproduce {paper.key} --out FOLDER` writes "
                         f"FOLDER/reproduce_{paper.key}.json)")
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable results file ({type(exc).__name__}: {exc})") from None
    if not isinstance(result, dict):
        raise ValueError(f"{path}: holds a JSON {type(result).__name__}, not the results object `leakgym reproduce` "  # noqa: TRY004
                         "writes")
    if "paper" not in result:
        raise ValueError(f"{path}: not a results file of `leakgym reproduce`: missing ['paper']")
    if result.get("paper") != paper.key:
        raise ValueError(f"{path} holds the results of {result.get('paper')!r}, not {paper.key!r}")
    if result.get("complete") is False:
        raise ValueError(f"{path} holds an unfinished run (\"complete\": false); `leakgym reproduce {paper.key} "
                         "--resume` with the options it was started with finishes it")
    _check_measured(path, result)
    try:
        result["plateau"] = plateau(result)
        result["verdicts"] = paper.verdicts(result)
    # (a file edited by hand or written by something else; ValueError: a value the statistics cannot take)
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"{path}: not a complete results file of `leakgym reproduce` ({type(exc).__name__}: "
                         f"{exc})") from None
    write_outputs(paper, result, Path(out) if out is not None else path.parent)
    return result


def _check_measured(path: Path, result: dict) -> None:
    """``ValueError`` naming ``path`` and the field unless the measured numbers of a results file are what
    :func:`run_paper` writes: every cell's ``per_image`` and ``per_seed`` lists hold numbers (NaN included), its
    scalars are numbers, each utility row's numbers are numbers or null. A string among them failed in the
    statistics as "could not convert string to float: 'a'", naming neither the file nor the field (found in an
    audit). Parts that are missing are left to the readers, whose error names the file."""
    def refuse(where: str, value: Any, allowed: str) -> None:
        raise ValueError(f"{path}: not a complete results file of `leakgym reproduce`: {where} is {value!r:.60}; "
                         f"allowed: {allowed}")

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def numbers(where: str, values: Any, *, null: bool = False) -> None:
        if not isinstance(values, list):
            refuse(where, values, "a list of numbers")
        for j, value in enumerate(values):
            if not (number(value) or (null and value is None)):
                refuse(f"{where}[{j}]", value, "numbers" + (" or null" if null else ""))

    cells = result.get("cells", [])
    if not isinstance(cells, list):
        refuse("'cells'", cells, "a list of cells")
    for i, c in enumerate(cells):
        if not isinstance(c, dict):
            refuse(f"cells[{i}]", c, "an object (one cell)")
        for group in ("per_image", "per_seed"):
            measured = c.get(group, {})
            if not isinstance(measured, dict):
                refuse(f"cells[{i}].{group}", measured, "an object of lists of numbers")
            for name, values in measured.items():
                numbers(f"cells[{i}].{group}.{name}", values)
        for key in ("n_images", "attack_s", "fidelity", "overhead_ms"):
            if key in c and not number(c[key]):
                refuse(f"cells[{i}].{key}", c[key], "a number")
    utility = result.get("utility", {})
    if not isinstance(utility, dict):
        refuse("'utility'", utility, "an object of rows")
    for row, u in utility.items():
        if not isinstance(u, dict):
            refuse(f"utility[{row!r}]", u, "an object")
        for key in ("accuracy", "accuracy_victim", "test_loss"):
            for name in (key, f"{key}_se"):
                if u.get(name) is not None and not number(u[name]):
                    refuse(f"utility[{row!r}].{name}", u[name], "a number or null")
            if f"{key}_per_seed" in u:
                numbers(f"utility[{row!r}].{key}_per_seed", u[f"{key}_per_seed"], null=True)
        curve = u.get("curve")
        if curve is not None:
            if not isinstance(curve, dict):
                refuse(f"utility[{row!r}].curve", curve, "an object of lists of numbers")
            for name, values in curve.items():
                numbers(f"utility[{row!r}].curve.{name}", values)


# -- reading results -------------------------------------------------------------------------------------
def cell(result: dict, defense: str, attack: str, setting: str | None = None) -> dict | None:
    """One merged cell of ``result`` (``None`` if that cell was not run)."""
    setting = setting if setting is not None else result["utility_setting"]
    for c in result["cells"]:
        if c["defense"] == defense and c["attack"] == attack and c["setting"] == setting:
            return c
    return None


def est(result: dict, defense: str, attack: str, name: str, setting: str | None = None, *,
        sent: Sequence[str] | None = None) -> Estimate | None:
    """``name`` (psnr/ssim/mse; lpips where the run had the weights, :func:`lpips_reported`) of one cell:
    mean ± standard error over the images of every seed.

    Images whose update was not sent (CENSOR's ``skip`` fallback) are left out: nothing reached the
    attacker. ``sent``: keep only the images whose update was one of these kinds (e.g. ``("original",)``).
    ``None`` if the cell was not run, no update of it was sent or the run did not score ``name``.
    """
    c = cell(result, defense, attack, setting)
    if c is None:
        return None
    if name not in c["per_image"]:  # lpips of a run without the backbone weights
        return None
    values = c["per_image"][name]
    kinds = c.get("sent") or []
    if len(kinds) == len(values):
        values = [v for v, k in zip(values, kinds) if k != "skip" and (sent is None or k in sent)]
    return estimate(values) if values else None


def sent_share(entry: dict | None, kinds: Sequence[str]) -> float | None:
    """Share of updates whose ``sent`` is one of ``kinds`` (a cell, or a utility entry's counts)."""
    if not entry:
        return None
    sent = entry.get("sent")
    if isinstance(sent, dict):
        total = sum(sent.values())
        return None if total == 0 else sum(sent.get(k, 0) for k in kinds) / total
    if not sent:
        return None
    return sum(s in kinds for s in sent) / len(sent)


def accuracy(result: dict, defense: str, key: str = "accuracy") -> Estimate | None:
    """Utility of a row in percent: mean ± standard error over the seeds (``key``: accuracy / accuracy_victim)."""
    u = result["utility"].get(defense) or {}
    if u.get(key) is None:
        return None
    return Estimate(100.0 * u[key], 100.0 * u.get(f"{key}_se", 0.0), len(u.get(f"{key}_per_seed", [0])))


def plateau(result: dict, name: str | None = None) -> dict | None:
    """Has row ``name`` (default: the first row, the undefended model) plateaued? Its accuracy gain over the
    last quarter of its run."""
    name = result["rows"][0]["name"] if name is None else name
    u = result["utility"].get(name) or {}
    curve = u.get("curve")
    if not curve or len(curve["rounds"]) < 3:
        return None
    rounds, acc, se = curve["rounds"], curve["accuracy"], curve["se"]
    last = len(rounds) - 1
    target = rounds[last] * 3 / 4
    ref = min(range(last), key=lambda i: abs(rounds[i] - target))
    gain = 100.0 * (acc[last] - acc[ref])
    noise = 200.0 * math.hypot(se[last], se[ref])
    return {"row": name, "from_round": rounds[ref], "to_round": rounds[last], "gain_points": gain,
            "two_se_points": noise, "plateaued": gain < max(PLATEAU_POINTS, noise)}


def still_rising(result: dict, name: str) -> str:
    """A sentence if row ``name``'s accuracy was still rising at the end of its run ("" otherwise)."""
    p = plateau(result, name)
    if p is None or p["plateaued"]:
        return ""
    return (f" Measured: {name}'s accuracy still rose by {p['gain_points']:+.1f} points from round {p['from_round']} "
            f"to {p['to_round']} (not converged at the end of the run).")


#: the reason an undecided verdict gives unless its caller knows a better one
UNDECIDED_WHY = ("the data do not decide it at two standard errors (a single value, one seed or one image, has "
                 "none): more seeds or images would.")


def verdict(claim: str, status: str, *, ours: str = "", paper: str = "", why: str = "",
            undecided_why: str = UNDECIDED_WHY) -> dict:
    """A computed verdict; ``why`` (the likely reason a claim does not hold or ties) is kept only then: an
    undecided verdict says ``undecided_why`` instead (a reason written for a failed claim would state what
    the data do not show, found in review)."""
    if status not in STATUSES:
        raise ValueError(f"verdict status {status!r}; allowed: {STATUSES}")
    reason = "" if status == HOLDS else undecided_why if status == UNDECIDED else why
    return {"claim": claim, "status": status, "ours": ours, "paper": paper, "why": reason}


def unmeasured(claim: str) -> dict:
    return verdict(claim, UNCHECKED, why="utility not measured")


def ranking_verdict(claim: str, ours: dict[str, Estimate | None], paper: dict[str, float], *, why: str = "",
                    digits: int = 2) -> dict:
    """Every pair the paper orders must be ordered the same way in ours, beyond two standard errors."""
    if any(v is None for v in ours.values()):
        return verdict(claim, UNCHECKED, why="a cell was not run")
    status, notes = ranking(ours, paper)  # type: ignore[arg-type]
    notes = sorted(notes, key=lambda n: not n.endswith(FAILS))  # reversals first
    if len(notes) > 4:
        notes = [*notes[:4], f"and {len(notes) - 4} more pair(s) not separated"]
    return verdict(claim, status,
                   ours=" < ".join(f"{k} {ours[k].fmt(digits)}" for k in sorted(ours, key=lambda k: ours[k].mean)),
                   paper=" < ".join(f"{k} {quote(paper[k])}" for k in sorted(paper, key=paper.get)),
                   why=("pairs not separated as in the paper: " + "; ".join(notes) + ". " + why).strip())


def extreme_verdict(claim: str, ours: dict[str, Estimate | None], best: str, *, lowest: bool = True, paper: str = "",
                    why: str = "") -> dict:
    """``best`` is the lowest (``lowest``) or highest of ``ours``, beyond two standard errors of each pair."""
    if any(v is None for v in ours.values()):
        return verdict(claim, UNCHECKED, why="a cell was not run")
    parts = {k: compare(ours[best], v, lower=lowest) for k, v in ours.items() if k != best}  # type: ignore[arg-type]
    loose = [f"{best} vs {k}: {st}" for k, st in parts.items() if st != HOLDS]
    return verdict(claim, combine(list(parts.values())), ours=listing(ours), paper=paper,
                   why=("; ".join(loose) + ". " + why).strip())


def drop_verdict(claim: str, base: Estimate | None, other: Estimate | None, max_drop: float, *, labels=("", ""),
                 paper: str = "", why: str = "") -> dict:
    """``base - other`` (an accuracy drop, points) stays below ``max_drop`` beyond two standard errors."""
    if base is None or other is None:
        return unmeasured(claim)
    drop = difference(base, other)
    status = bound(drop, max_drop, lower=True)  # neither met nor broken: undecided, not a tie (issue 36)
    undecided_why = (f"the drop ({drop} points) cannot be told from the {max_drop:g}-point bound at two standard "
                     "errors (more seeds would decide it).")
    return verdict(claim, status, ours=f"{labels[0]} {base}%, {labels[1]} {other}% (drop {drop})", paper=paper,
                   why=why, undecided_why=undecided_why)


def listing(values: dict[str, Estimate | None], digits: int = 2) -> str:
    """``"A 1.00 ± 0.01, B ..."``: our estimates of several rows."""
    return ", ".join(f"{k} {'n/a' if v is None else v.fmt(digits)}" for k, v in values.items())


def lpips_reported(result: dict) -> bool:
    """Did the run score LPIPS (the user's backbone weights were on disk)? Results written before LPIPS
    was reported did not."""
    return result.get("lpips") is not None


def lpips_line(result: dict) -> str:
    """The results' one statement about LPIPS: reported (which backbone, which file) or why not."""
    note = result.get("lpips_note")
    if note is None:
        return "LPIPS: not reported (these results were written before LeakGym reported LPIPS)."
    if lpips_reported(result):
        return (f"{note}; every LPIPS number of ours is on the digits images, upsampled to 32x32 where smaller "
                "(comparable among our rows, not with the paper's LPIPS).")
    return note


# -- writing ---------------------------------------------------------------------------------------------
_MARK = {HOLDS: "holds", TIE: "tie (within noise)", FAILS: "**does not hold**", UNCHECKED: "not checkable",
         UNDECIDED: "undecided (more seeds needed)"}


def markdown(paper: Paper, result: dict) -> str:
    def width(s: dict) -> str:
        return "" if s["model_width"] is None else f" (width {s['model_width']})"

    seeds = ",".join(map(str, result["seeds"]))
    settings = "; ".join(
        f"**{label}**: {s['model']}{width(s)}, "
        f"digits {s['image_size']}x{s['image_size']}, batch {s['batch_size']}, {s['images']} victim images per seed, "
        f"{s['iterations']} attack iterations x {s['restarts']} restart(s)"
        for label, s in result["settings"].items()
    )
    u = result["settings"][result["utility_setting"]]
    split_clients = {}  # the split of each image size is cut for its first setting (run_paper)
    for s in result["settings"].values():
        split_clients.setdefault(s["image_size"], max(4, s["utility_clients"]))
    if utility_measured(result):
        if u.get("utility_update_kind", "gradient") == "gradient":
            protocol = f"FedSGD, {u['utility_rounds']} rounds"
            server = f"server lr {u['utility_lr']}"
        else:
            protocol = (f"FedAvg ({u['utility_local_steps']} local {u['utility_optimizer']} steps of lr "
                        f"{u['utility_local_lr']:g} per round, fresh optimiser state each round), {u['utility_rounds']} rounds")
            server = "server step 1"
        utility_line = (
            f"* Utility: {protocol}, {u['utility_clients']} clients x batch "
            f"{u['utility_batch']}, {server}, "
            f"{'every client applies' if u['utility_defended'] == 'all' else 'only the victim (client 0) applies'} "
            f"the defense; accuracy on {u['eval_size'] or 'all'} test images (Acc_T), evaluated every "
            f"{u['utility_eval_every']} rounds (curves in the figure).")
    else:
        utility_line = ("* Utility: not run (`--no-utility`): no accuracy is measured, the accuracy columns and "
                        "verdicts say so, and the figure has no accuracy curves.")
    lines = [
        f"# Reproduction: {paper.title}",
        "",
        (f"Generated by {command_line(paper, result)} in {_wall(result)} ({_machine(result)}{_load(result)}). "
         f"Reproduces {paper.source}."),
        "",
        f"* Paper: {paper.paper_setting}",
        (f"* Ours: {settings}. Victim = client 0 of a {'/'.join(map(str, sorted(set(split_clients.values()))))}-"
         "client digits split; the attacker knows the labels (unless a column says otherwise) and the public "
         "split."),
        (f"* Statistics: seeds {seeds}; every privacy number is the mean ± standard error over the images of all "
         "seeds, every accuracy the mean ± standard error over the seeds. A verdict \"holds\" only when the "
         "difference exceeds two standard errors; \"tie (within noise)\" otherwise, and \"undecided\" for a bound "
         "(an accuracy drop below a paper's gap) that the estimate neither meets nor breaks at two standard errors, "
         "or for a comparison of a single value (one seed or one image: no standard error)."),
        utility_line,
        f"* {lpips_line(result)}",
        f"* {plateau_line(result)}",
        f"* CIFAR-10: {result['cifar10']}; all our numbers are on digits.",
        "",
        paper.tables(result),
        "",
        "## Does the ordering/trend hold?",
        "",
    ]
    for v in result["verdicts"]:
        line = f"* {v['claim']} — {_MARK[v['status']]}."
        if v["ours"]:
            line += f" Ours: {v['ours']}."
        if v["paper"]:
            line += f" Paper: {v['paper']}."
        if v["why"]:
            line += f" Likely reason: {v['why']}"
        lines.append(line)
    if paper.deviations:
        lines += ["", "## Deviations from the paper", ""] + [f"* {d}" for d in paper.deviations]
    return "\n".join(lines) + "\n"


def utility_measured(result: dict) -> bool:
    """Were the utility runs made (``False``: ``--no-utility``)? Results written before the run recorded it
    tell by their rows' notes."""
    if "utility_measured" in result:
        return bool(result["utility_measured"])
    entries = list((result.get("utility") or {}).values())
    return bool(entries) and not all((e or {}).get("note") == NO_UTILITY for e in entries)


_UNRECORDED = object()


def _images_option(paper: Paper, result: dict):
    """The ``--images`` of the run (``None``: the size's default); for results written before it was
    recorded, the value that gives the recorded settings, or ``_UNRECORDED`` if none does."""
    if "images_requested" in result:
        return result["images_requested"]
    recorded = {k: s["images"] for k, s in result["settings"].items()}
    try:
        scales = {k: s.replace(**(result.get("scale_overrides") or {})) for k, s in paper.scales[result["size"]].items()}
    except (KeyError, ValueError):
        return _UNRECORDED
    if set(scales) != set(recorded):
        return _UNRECORDED
    if all(scales[k].images == n for k, n in recorded.items()):
        return None
    n = min(recorded.values())
    if all(scales[k].batch_size * math.ceil(n / scales[k].batch_size) == recorded[k] for k in recorded):
        return n
    return _UNRECORDED


def command_line(paper: Paper, result: dict) -> str:
    """How to make this run again (markdown): every option that changes the numbers. ``scale_overrides``
    have no command-line flag, so a run with them is given as the Python call."""
    seeds = ",".join(map(str, result["seeds"]))
    images = _images_option(paper, result)
    utility = utility_measured(result)
    overrides = result.get("scale_overrides") or {}
    if overrides:
        args = [f"paper_spec({paper.key!r})", f"size={result['size']!r}", f"seeds={tuple(result['seeds'])!r}"]
        if images is not None and images is not _UNRECORDED:
            args.append(f"images={images}")
        if not utility:
            args.append("utility=False")
        args.append(f"scale_overrides={overrides!r}")
        text = (f"the Python call `leakgym.reproduce.runner.run_paper({', '.join(args)})` (its scale overrides "
                "have no command-line flag)")
    else:
        flags = f"--size {result['size']} --seeds {seeds}"
        if images is not None and images is not _UNRECORDED:
            flags += f" --images {images}"
        if not utility:
            flags += " --no-utility"
        text = f"`leakgym reproduce {paper.key} {flags}`"
    if images is _UNRECORDED:
        text += " with the victim images per seed of the Ours line (the option that set them was not recorded)"
    return text


def _wall(result: dict) -> str:
    """``"731 s"``; a resumed run: the time of all its invocations."""
    n = result.get("invocations", 1)
    return f"{result['wall_s']:.0f} s" + (f" over {n} invocations" if n > 1 else "")


def _machine(result: dict) -> str:
    """The CPU the run had, as recorded (``machine()``); results written before it was recorded say so."""
    m = result.get("machine")
    if not m:
        return "CPU cores not recorded, one torch thread"
    cores = m.get("usable_cores") or m.get("cpu_count")
    text = f"{cores} CPU core{'s' if cores != 1 else ''} available to the process" if cores else "CPU cores unknown"
    if m.get("usable_cores") and m.get("cpu_count") and m["cpu_count"] != m["usable_cores"]:
        text += f" (of {m['cpu_count']})"
    if m.get("cpu_quota"):
        text += f", CPU quota {m['cpu_quota']:g} cores"
    threads = m.get("torch_threads")
    text += f", {'one torch thread' if threads == 1 else f'{threads} torch threads'}"
    if result.get("invocations", 1) > 1:
        text = f"resumed with --resume; last invocation: {text}"
    return text


def _load(result: dict) -> str:
    """``"; 812 s of CPU time, 15-minute load average 3.1 at the end"`` when the run recorded them, else ``""``."""
    if result.get("cpu_s") is None:
        return ""
    load = result.get("load_avg")
    return (f"; {result['cpu_s']:.0f} s of CPU time"
            + (f", 15-minute load average {load[2]:.1f} at the end" if load else ""))


def plateau_line(result: dict) -> str:
    p = result.get("plateau")
    if p is None:
        return "Plateau: not measured (no utility curve)."
    state = "has plateaued" if p["plateaued"] else "has **not** plateaued"
    return (f"Plateau: the undefended model ({p['row']}) {state} — accuracy gain {p['gain_points']:+.1f} points "
            f"from round {p['from_round']} to {p['to_round']} (two standard errors: {p['two_se_points']:.1f}).")


def utility_table(result: dict, names: Sequence[str]) -> str:
    """Accuracy of every row: mean ± se over its seeds, the seeds and the rounds of its run."""
    body = []
    for r in names:
        u = result["utility"].get(r) or {}
        if u.get("accuracy") is None:
            body.append([r, u.get("note", "not measured"), "", ""])
        else:
            body.append([r, accuracy(result, r), str(len(u["seeds"])), str(u["rounds"])])
    return "## Utility\n\n" + markdown_table(["defense", "Acc_T ours %", "seeds", "rounds"], body)


def write_outputs(paper: Paper, result: dict, out: Path) -> dict[str, Path]:
    """Write the JSON, markdown and PNG figure (the paper's panels + every row's accuracy curve)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"reproduce_{paper.key}.json", "md": out / f"reproduce_{paper.key}.md",
             "png": out / f"reproduce_{paper.key}.png"}
    # All three are written beside their final names first and renamed only once all are written, so an
    # interruption or a failing figure never leaves a new JSON beside an old table and picture.
    with contextlib.ExitStack() as stack:
        partial = {k: stack.enter_context(replacing(p)) for k, p in paths.items()}
        partial["json"].write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
        from leakgym.reproduce.plots import figure

        figure(paper, result, partial["png"])
        partial["md"].write_text(markdown(paper, result) + f"\n![figure](reproduce_{paper.key}.png)\n")
    return paths

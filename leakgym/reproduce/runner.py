"""Run one paper's reproduction and write ``reproduce_<paper>.{json,md,png}``.

A paper module (``leakgym.reproduce.dcs2`` ...) is *data*: it defines a :class:`Paper` -- the
table's rows and columns, the scaled-down sizes, the paper's own numbers -- plus the function that
turns our numbers into verdicts ("does the ordering/trend hold?") and, where a picture helps, a
figure. :func:`run_paper` runs the grid (:func:`leakgym.reproduce.harness.run_grid`) for every
setting of the chosen size, measures utility where the paper's table has it
(:func:`leakgym.reproduce.harness.measure_utility`), and writes the three files.

Verdicts are computed from the numbers, never edited by hand: each is a dict
``{"claim", "holds": bool | None, "ours", "paper", "why"}``; ``why`` gives the likely reason when a
claim does not reproduce (``holds=None``: cannot be checked at this scale).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, measure_utility, run_grid

SIZES = ("small", "full")


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
    verdicts: Callable[[dict], list[dict]]
    tables: Callable[[dict], str]
    """Markdown: ours next to the paper's numbers."""
    figure: Callable[[dict, Path], None] | None = None
    deviations: list[str] = field(default_factory=list)
    """What differs from the paper and why (printed in the results)."""


def dataset_status(name: str) -> str:
    """``"present"`` if ``load_dataset(name)`` works offline, else why not (recorded in the results)."""
    from leakgym.data import load_dataset

    try:
        load_dataset(name, download=False)
    except Exception as err:  # noqa: BLE001 - any failure means "not usable here"; the reason is recorded
        return f"not present ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
    return "present"


def run_paper(
    paper: Paper,
    *,
    size: str = "small",
    seed: int = 0,
    images: int | None = None,
    out: Path | str | None = Path("docs/results"),
    scale_overrides: dict | None = None,
    utility: bool = True,
    progress: bool = True,
) -> dict:
    """Run ``paper`` at ``size`` and (if ``out``) write ``reproduce_<key>.{json,md,png}`` there.

    Args:
        paper: a :class:`Paper`.
        size: ``"small"`` (minutes on 2 CPU cores) or ``"full"``.
        seed: seeds everything (split, images, models, defenses, attacks).
        images: override the number of victim images per cell (rounded up to a multiple of the
            batch size of each setting).
        out: output folder; ``None`` writes nothing.
        scale_overrides: further :class:`~leakgym.reproduce.harness.Scale` fields to change
            (e.g. ``{"iterations": 20}`` for a smoke run); recorded in the results.
        utility: measure the utility columns (``False``: recorded as not measured).
        progress: tqdm bars.

    Returns:
        The results dict (also the JSON file's content).
    """
    from leakgym.data import federated_split, load_dataset

    if size not in SIZES:
        raise ValueError(f"size={size!r}; allowed: {SIZES}")
    if images is not None and (not isinstance(images, int) or images < 1):
        raise ValueError(f"images={images!r}; allowed: integers >= 1")
    torch.set_num_threads(1)
    start = time.perf_counter()
    settings = {}
    for label, scale in paper.scales[size].items():
        if scale_overrides:
            scale = scale.replace(**scale_overrides)
        if images is not None:
            b = scale.batch_size
            scale = scale.replace(images=b * math.ceil(images / b))
        settings[label] = scale
    rows, columns = paper.rows(size), paper.columns(size)
    cells, splits = [], {}
    for label, scale in settings.items():
        if scale.image_size not in splits:
            dataset = load_dataset("digits", image_size=scale.image_size)
            splits[scale.image_size] = federated_split(dataset, num_clients=max(4, scale.utility_clients), seed=seed)
        grid = run_grid(rows, columns, scale, split=splits[scale.image_size], seed=seed, progress=progress)
        for cell in grid.values():
            cells.append({"setting": label, **cell.summary()})
    first_label, first = next(iter(settings.items()))
    utility_rows = {}
    if utility:
        for row in rows:
            utility_rows[row.name] = measure_utility(row, first, split=splits[first.image_size], seed=seed,
                                                     progress=progress)
    else:
        utility_rows = {row.name: {"accuracy": None, "note": "not measured (--no-utility)"} for row in rows}
    result = {
        "paper": paper.key,
        "title": paper.title,
        "source": paper.source,
        "paper_setting": paper.paper_setting,
        "size": size,
        "seed": seed,
        "dataset": "digits",
        "cifar10": dataset_status("cifar10"),
        "settings": {k: v.to_dict() for k, v in settings.items()},
        "utility_setting": first_label,
        "rows": [{"name": r.name, "config": r.config.to_dict(), "active": r.config.active(), "precode": r.precode,
                  "attacks": list(r.attacks) if r.attacks else None, "note": r.note} for r in rows],
        "columns": [{"name": c.name, "attack": c.attack, "config": c.config, "labels_known": c.labels_known,
                     "note": c.note} for c in columns],
        "cells": cells,
        "utility": utility_rows,
        "paper_numbers": paper.paper_numbers,
        "deviations": paper.deviations,
        "scale_overrides": scale_overrides or {},
    }
    result["verdicts"] = paper.verdicts(result)
    result["wall_s"] = time.perf_counter() - start
    if out is not None:
        write_outputs(paper, result, Path(out))
    return result


def cell(result: dict, defense: str, attack: str, setting: str | None = None) -> dict | None:
    """The summary of one cell of ``result`` (``None`` if that cell was not run)."""
    setting = setting if setting is not None else result["utility_setting"]
    for c in result["cells"]:
        if c["defense"] == defense and c["attack"] == attack and c["setting"] == setting:
            return c
    return None


def metric(result: dict, defense: str, attack: str, name: str, setting: str | None = None) -> float | None:
    c = cell(result, defense, attack, setting)
    return None if c is None else c[name]


def accuracy(result: dict, defense: str) -> float | None:
    u = result["utility"].get(defense) or {}
    return None if u.get("accuracy") is None else 100.0 * u["accuracy"]


def verdict(claim: str, holds: bool | None, *, ours: str = "", paper: str = "", why: str = "") -> dict:
    return {"claim": claim, "holds": holds, "ours": ours, "paper": paper, "why": "" if holds else why}


def markdown(paper: Paper, result: dict) -> str:
    def width(s: dict) -> str:
        return "" if s["model_width"] is None else f" (width {s['model_width']})"

    settings = "; ".join(
        f"**{label}**: {s['model']}{width(s)}, "
        f"digits {s['image_size']}x{s['image_size']}, batch {s['batch_size']}, {s['images']} victim images, "
        f"{s['iterations']} attack iterations x {s['restarts']} restart(s)"
        for label, s in result["settings"].items()
    )
    u = result["settings"][result["utility_setting"]]
    lines = [
        f"# Reproduction: {paper.title}",
        "",
        (f"Generated by `leakgym reproduce {paper.key} --size {result['size']} --seed {result['seed']}` "
        f"in {result['wall_s']:.0f} s (2 CPU cores, one torch thread). Reproduces {paper.source}."),
        "",
        f"* Paper: {paper.paper_setting}",
        (f"* Ours: {settings}. Victim = client 0 of a 4-client digits split; the attacker knows the labels "
        "(unless a column says otherwise) and the public split."),
        (f"* Utility: FedSGD, {u['utility_rounds']} rounds, {u['utility_clients']} clients x batch "
        f"{u['utility_batch']}, server lr {u['utility_lr']}, "
        f"{'every client applies' if u['utility_defended'] == 'all' else 'only the victim (client 0) applies'} "
        "the defense; accuracy on "
        f"{u['eval_size'] or 'all'} test images (Acc_T) and on the victim's shard (Acc_S)."),
        f"* CIFAR-10: {result['cifar10']}; all our numbers are on digits.",
        "",
        paper.tables(result),
        "",
        "## Does the ordering/trend hold?",
        "",
    ]
    for v in result["verdicts"]:
        mark = {True: "yes", False: "**no**", None: "not checkable"}[v["holds"]]
        line = f"* {v['claim']} — {mark}."
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


def write_outputs(paper: Paper, result: dict, out: Path) -> dict[str, Path]:
    """Write the JSON, markdown and (if the paper has one) PNG figure; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"reproduce_{paper.key}.json", "md": out / f"reproduce_{paper.key}.md"}
    paths["json"].write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
    text = markdown(paper, result)
    if paper.figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        paths["png"] = out / f"reproduce_{paper.key}.png"
        paper.figure(result, paths["png"])
        text += f"\n![figure](reproduce_{paper.key}.png)\n"
    paths["md"].write_text(text)
    return paths

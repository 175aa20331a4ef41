"""The payoff files of ``leakgym eval``: ``payoff.csv``, ``payoff.json``, ``payoff.png``, ``gallery.png``.

See :mod:`leakgym.agents.evaluation` for what each file holds. Figures are plain
``matplotlib.figure.Figure`` objects rendered with the Agg backend (no pyplot state).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .analysis import best_responses
from .payoff import METRICS, PayoffTable

CSV_COLUMNS = ["attacker", "defender", "episodes", "rounds"] + [
    f"{m}_{s}" for m in METRICS for s in ("mean", "ci95_low", "ci95_high")
]
OUTPUT_FILES = ("payoff.csv", "payoff.json", "payoff.png", "gallery.png")


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


def write_csv(table: PayoffTable, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in table.rows():
            writer.writerow({k: ("" if v is None else v) for k, v in json_safe(row).items()})


def write_json(table: PayoffTable, path: Path) -> None:
    payload = {
        "env_id": table.env_id,
        "scenario": table.scenario,
        "seed": table.seed,
        "overrides": table.overrides,
        "attackers": table.attackers,
        "defenders": table.defenders,
        "metrics": list(METRICS),
        "confidence": 0.95,
        "pairs": table.rows(),
        "best_responses": best_responses(table),
    }
    path.write_text(json.dumps(json_safe(payload), indent=2))


def _figure(**kwargs):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def write_heatmap(table: PayoffTable, path: Path) -> None:
    """Mean leakage SSIM per pair, annotated with mean ± 95% CI half-width."""
    mean = table.matrix("leakage_ssim_mean")
    half = table.matrix("leakage_ssim_ci95_high") - mean
    na, nd = mean.shape
    fig = _figure(figsize=(1.6 * nd + 3.0, 0.7 * na + 2.0), dpi=100)
    ax = fig.subplots()
    im = ax.imshow(mean, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(na):
        for j in range(nd):
            text = f"{mean[i, j]:.3f}" + (f"\n±{half[i, j]:.3f}" if np.isfinite(half[i, j]) else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=8,
                    color="black" if np.isfinite(mean[i, j]) and mean[i, j] > 0.6 else "white")
    ax.set_xticks(range(nd), table.defenders, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(na), table.attackers, fontsize=8)
    ax.set_xlabel("defender")
    ax.set_ylabel("attacker")
    ax.set_title(f"{table.env_id}: mean leakage SSIM ({len(table.pairs[0].episodes)} episodes)", fontsize=9)
    fig.colorbar(im, ax=ax, label="SSIM (higher = more leakage)")
    fig.tight_layout()
    fig.savefig(path)


def write_gallery(table: PayoffTable, path: Path, max_images: int = 4) -> None:
    """A grid like the payoff table: one block per (attacker row, defender column) holding the
    last round's private images (top) over their matched reconstructions (bottom, with SSIM)."""
    by_pair = {(p.attacker, p.defender): p.last_round for p in table.pairs if p.last_round is not None}
    if not by_pair:
        raise ValueError("no pair has a finished round to show")
    n = min(max_images, min(len(last.originals) for last in by_pair.values()))
    na, nd = len(table.attackers), len(table.defenders)
    fig = _figure(figsize=(1.0 * n * nd + 1.6, 2.1 * na + 0.8), dpi=100)
    axes = fig.subplots(2 * na, n * nd, squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
    for i, a in enumerate(table.attackers):
        axes[2 * i][0].set_ylabel(f"{a}\noriginal", fontsize=6)
        axes[2 * i + 1][0].set_ylabel(f"{a}\nreconstruction", fontsize=6)
        for j, d in enumerate(table.defenders):
            if i == 0:
                axes[0][j * n].set_title(d, fontsize=7, loc="left")
            last = by_pair.get((a, d))
            if last is None:
                continue
            for k in range(n):
                for r, arr in enumerate((last.originals[k], last.matched[k])):
                    ax = axes[2 * i + r][j * n + k]
                    ax.imshow(arr[0] if arr.shape[0] == 1 else np.transpose(arr, (1, 2, 0)), cmap="gray",
                              vmin=0, vmax=1)
                ax.set_xlabel(f"SSIM {last.ssim[k]:.2f}", fontsize=6)
    fig.suptitle(f"{table.env_id}: last round of each pair (rows: attackers, columns: defenders)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def write_outputs(table: PayoffTable, out: Path) -> dict[str, Path]:
    """Write payoff.csv, payoff.json, payoff.png and gallery.png to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in OUTPUT_FILES}
    write_csv(table, paths["payoff.csv"])
    write_json(table, paths["payoff.json"])
    write_heatmap(table, paths["payoff.png"])
    write_gallery(table, paths["gallery.png"])
    return paths


__all__ = [
    "CSV_COLUMNS",
    "OUTPUT_FILES",
    "json_safe",
    "write_csv",
    "write_gallery",
    "write_heatmap",
    "write_json",
    "write_outputs",
]

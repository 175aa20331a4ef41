"""The payoff files of ``leakgym eval``: ``payoff.csv``, ``payoff.json``, ``payoff.png``, ``gallery.png``.

See :mod:`leakgym.agents.evaluation` for what each file holds. Figures are plain
``matplotlib.figure.Figure`` objects rendered with the Agg backend (no pyplot state);
:func:`heatmap_figure` and :func:`gallery_figure` return them, the ``write_*`` functions save them.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.files import replacing

from .analysis import best_responses, mixed_equilibria
from .payoff import METRICS, MIN_EPISODES, PayoffTable

CSV_COLUMNS = ["attacker", "defender", "episodes", "total_rounds"] + [
    f"{m}_{s}" for m in METRICS for s in ("mean", "ci95_low", "ci95_high")
]
OUTPUT_FILES = ("payoff.csv", "payoff.json", "payoff.png", "gallery.png")
#: characters of a title line per inch of figure width at font size 8 (so titles wrap, never clip)
_CHARS_PER_INCH = 12


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
        "episodes": table.episodes,
        "lockstep": table.lockstep,
        "device": table.device,
        "attackers": table.attackers,
        "defenders": table.defenders,
        "metrics": list(METRICS),
        "confidence": 0.95,
        "interval": "Student-t over episodes, clipped to the metric's range",
        "pairs": table.rows(),
        "best_responses": best_responses(table),
        "mixed_equilibria": mixed_equilibria(table),
    }
    path.write_text(json.dumps(json_safe(payload), indent=2))


def _figure(**kwargs):
    """A ``Figure`` with constrained layout on its own Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


def _wrap(text: str, width_in: float, fontsize: float = 8) -> str:
    """``text`` wrapped to fit a figure ``width_in`` inches wide (each line of it separately)."""
    chars = max(int(width_in * _CHARS_PER_INCH * 8 / fontsize), 12)
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def short_label(label: str) -> str:
    """A figure label for an agent: a policy path shows its last two parts (``attacker/policy.zip``)."""
    parts = Path(label).parts
    return str(Path(*parts[-2:])) if label.endswith(".zip") and len(parts) > 2 else label


def episodes_label(table: PayoffTable) -> str:
    """``"3 episodes"`` (or ``"2-3 episodes"`` when pairs differ)."""
    counts = sorted({len(p.episodes) for p in table.pairs})
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{n} episode{'s' if counts[-1] > 1 else ''}"


def few_episodes(table: PayoffTable) -> str | None:
    """A warning when some pair has fewer than :data:`MIN_EPISODES` episodes, else ``None``."""
    fewest = min(len(p.episodes) for p in table.pairs)
    if fewest >= MIN_EPISODES:
        return None
    if fewest == 1:
        return "1 episode per pair: no confidence interval (run --episodes 5 or more)"
    return (f"only {fewest} episodes per pair (fewer than {MIN_EPISODES}): the 95% t-intervals are wide and "
            f"unreliable (run --episodes {MIN_EPISODES} or more)")


def _interval_text(low: float, high: float) -> str:
    return f"[{low:.2f}, {high:.2f}]" if np.isfinite(low) and np.isfinite(high) else ""


def payoff_text(table: PayoffTable, metric: str = "leakage_ssim") -> str:
    """The attackers x defenders table of ``metric``: mean and 95% t-interval (printed by ``leakgym eval``)."""
    mean = table.matrix(f"{metric}_mean")
    low, high = table.matrix(f"{metric}_ci95_low"), table.matrix(f"{metric}_ci95_high")
    cells = [[f"{mean[i, j]:.3f} {_interval_text(low[i, j], high[i, j])}".rstrip() for j in range(len(table.defenders))]
             for i in range(len(table.attackers))]
    wa = max(len("attacker"), *(len(a) for a in table.attackers))
    widths = [max(len(d), *(len(row[j]) for row in cells)) for j, d in enumerate(table.defenders)]
    lines = [f"mean {metric} [95% t-interval over {episodes_label(table)}] (rows: attackers, columns: defenders):",
             ("  " + f"{'attacker':<{wa}}  " + "  ".join(f"{d:<{w}}" for d, w in zip(table.defenders, widths))).rstrip()]
    for a, row in zip(table.attackers, cells):
        lines.append(("  " + f"{a:<{wa}}  " + "  ".join(f"{c:<{w}}" for c, w in zip(row, widths))).rstrip())
    return "\n".join(lines)


def heatmap_figure(table: PayoffTable):
    """Mean leakage SSIM per pair, annotated with its 95% t-interval, best responses and equilibria.

    A triangle marks, in each defender's column, the attacker with the highest mean attacker return
    (the attacker's best response); a square marks, in each attacker's row, the defender with the
    highest mean defender return; a red frame marks the pure-strategy equilibria (mutual best
    responses). Warns (``UserWarning``, and in the title) with fewer than :data:`MIN_EPISODES`
    episodes per pair.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    mean = table.matrix("leakage_ssim_mean")
    low, high = table.matrix("leakage_ssim_ci95_low"), table.matrix("leakage_ssim_ci95_high")
    na, nd = mean.shape
    width = max(1.7 * nd + 3.2, 5.5)
    fig = _figure(figsize=(width, 0.75 * na + 3.0), dpi=100)
    ax = fig.subplots()
    im = ax.imshow(mean, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(na):
        for j in range(nd):
            text = f"{mean[i, j]:.3f}\n{_interval_text(low[i, j], high[i, j])}".rstrip()
            ax.text(j, i + 0.08, text, ha="center", va="center", fontsize=8,
                    color="black" if np.isfinite(mean[i, j]) and mean[i, j] > 0.6 else "white")
    br = best_responses(table)
    a_index = {a: i for i, a in enumerate(table.attackers)}
    d_index = {d: j for j, d in enumerate(table.defenders)}
    for d, r in br["against_defender"].items():
        for a in r["tied"]:  # every attacker tied at the best mean
            ax.plot(d_index[d] - 0.36, a_index[a] - 0.3, marker="^", color="tab:orange",
                    markeredgecolor="black", markersize=7)
    for a, r in br["against_attacker"].items():
        for d in r["tied"]:
            ax.plot(d_index[d] + 0.36, a_index[a] - 0.3, marker="s", color="tab:cyan",
                    markeredgecolor="black", markersize=6)
    for e in br["pure_equilibria"]:
        ax.add_patch(Rectangle((d_index[e["defender"]] - 0.5, a_index[e["attacker"]] - 0.5), 1, 1, fill=False,
                               edgecolor="tab:red", linewidth=3))
    ax.set_xlim(-0.5, nd - 0.5)
    ax.set_ylim(na - 0.5, -0.5)
    ax.set_xticks(range(nd), [short_label(d) for d in table.defenders], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(na), [short_label(a) for a in table.attackers], fontsize=8)
    ax.set_xlabel("defender")
    ax.set_ylabel("attacker")
    title = (f"{table.env_id}: mean leakage SSIM per pair\n"
             f"[brackets]: 95% t-interval over {episodes_label(table)}, clipped to [-1, 1]")
    warning = few_episodes(table)
    if warning is not None:
        warnings.warn(f"payoff heatmap: {warning}", UserWarning, stacklevel=3)
        title += f"\n{warning}"
    fig.suptitle(_wrap(title, width), fontsize=8)
    fig.colorbar(im, ax=ax, label="SSIM (higher = more leakage)")
    handles = [
        Line2D([], [], marker="^", color="tab:orange", markeredgecolor="black", linestyle="",
               label="attacker's best response to the column's defender (highest attacker return)"),
        Line2D([], [], marker="s", color="tab:cyan", markeredgecolor="black", linestyle="",
               label="defender's best response to the row's attacker (highest defender return)"),
        Rectangle((0, 0), 1, 1, fill=False, edgecolor="tab:red", linewidth=2, label="pure-strategy equilibrium"),
    ]
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, frameon=False)
    return fig


def write_heatmap(table: PayoffTable, path: Path) -> None:
    """Save :func:`heatmap_figure` to ``path``."""
    heatmap_figure(table).savefig(path, bbox_inches="tight")


def _image(ax, arr: np.ndarray) -> None:
    ax.imshow(arr[0] if arr.shape[0] == 1 else np.transpose(arr, (1, 2, 0)), cmap="gray", vmin=0, vmax=1)


def gallery_figure(table: PayoffTable, max_images: int = 4):
    """Each private image once, beside every attacker's reconstruction of it, defender by defender.

    Rows are the last round's private images (at most ``max_images``); columns are the originals
    (with their labels when known) followed by each (attacker, defender) pair's matched
    reconstruction, grouped by defender, with SSIM and PSNR under each. Pairs played with common
    random numbers see the same private images, so the originals column appears once; it is
    repeated only before pairs whose last round saw other images.
    """
    by_pair = {(p.attacker, p.defender): p.last_round for p in table.pairs if p.last_round is not None}
    if not by_pair:
        raise ValueError("no pair has a finished round to show")
    n = min(max_images, min(len(last.originals) for last in by_pair.values()))
    columns: list[tuple[str | None, Any]] = []  # (title or None for an originals column, last round)
    shown = None
    for d in table.defenders:
        for a in table.attackers:
            last = by_pair.get((a, d))
            if last is None:
                continue
            if shown is None or not np.array_equal(shown.originals[:n], last.originals[:n]):
                columns.append((None, last))
                shown = last
            columns.append((f"{short_label(a)}\nvs {short_label(d)}", last))
    width = max(1.15 * len(columns) + 0.4, 4.0)
    fig = _figure(figsize=(width, 1.35 * n + 1.3), dpi=100)
    axes = fig.subplots(n, len(columns), squeeze=False)
    for c, (title, last) in enumerate(columns):
        for k in range(n):
            ax = axes[k][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if title is None:
                _image(ax, last.originals[k])
                label = "" if last.labels is None else f"label {int(last.labels[k])}"
                ax.set_xlabel(label, fontsize=6)
                for spine in ax.spines.values():
                    spine.set_edgecolor("tab:blue")
                    spine.set_linewidth(1.5)
            else:
                _image(ax, last.matched[k])
                ax.set_xlabel(f"SSIM {last.ssim[k]:.2f}\nPSNR {last.psnr[k]:.1f} dB", fontsize=6)
                for spine in ax.spines.values():
                    spine.set_visible(False)
        head = "original" if title is None else "\n".join(
            textwrap.fill(part, 16) for part in title.split("\n")
        )
        axes[0][c].set_title(head, fontsize=6)
    fig.suptitle(
        _wrap(f"{table.env_id}: the last round of each pair: the private images (blue frames) and each "
              "attacker's matched reconstruction against each defender", width),
        fontsize=8,
    )
    return fig


def write_gallery(table: PayoffTable, path: Path, max_images: int = 4) -> None:
    """Save :func:`gallery_figure` to ``path``."""
    gallery_figure(table, max_images).savefig(path, bbox_inches="tight")


def write_outputs(table: PayoffTable, out: Path) -> dict[str, Path]:
    """Write payoff.csv, payoff.json, payoff.png and gallery.png to ``out``, each atomically (written
    beside its name, then renamed), so an interrupted write leaves no half-written file.

    Without any pair's last round (a resumed run whose ``last_round/`` files are gone or damaged) there
    is no gallery: ``gallery.png`` is not written (an earlier one there is removed) and a ``UserWarning``
    says why; the returned paths hold only the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in OUTPUT_FILES}
    if all(p.last_round is None for p in table.pairs):
        del paths["gallery.png"]
        (out / "gallery.png").unlink(missing_ok=True)  # an earlier write's would pass for this table's
        warnings.warn("no pair has a readable last round (last_round/ files missing or damaged): gallery.png "
                      "not written", UserWarning, stacklevel=2)
    writers = {"payoff.csv": write_csv, "payoff.json": write_json, "payoff.png": write_heatmap,
               "gallery.png": write_gallery}
    for name, path in paths.items():
        with replacing(path) as partial:
            writers[name](table, partial)
    return paths


__all__ = [
    "CSV_COLUMNS",
    "OUTPUT_FILES",
    "episodes_label",
    "few_episodes",
    "gallery_figure",
    "heatmap_figure",
    "json_safe",
    "payoff_text",
    "short_label",
    "write_csv",
    "write_gallery",
    "write_heatmap",
    "write_json",
    "write_outputs",
]

"""The payoff files of ``leakgym eval``: ``payoff.csv``, ``payoff.json``, ``payoff.png``, ``gallery.png``.

See :mod:`leakgym.agents.experiments.evaluation.cli` for what each file holds. Figures are plain
``matplotlib.figure.Figure`` objects rendered with the Agg backend (no pyplot state);
:func:`heatmap_figure` and :func:`gallery_figure` return them, the ``write_*`` functions save them.
"""

from __future__ import annotations

import csv
import json
import textwrap
import warnings
from pathlib import Path

import numpy as np

from leakgym.files import json_safe, replacing

from .analysis import best_responses, mixed_equilibria
from .payoff import METRICS, MIN_EPISODES, LastRound, PayoffTable, gallery_episode, t_interval

CSV_COLUMNS = ["attacker", "defender", "episodes", "total_rounds"] + [
    f"{m}_{s}" for m in METRICS for s in ("mean", "ci95_low", "ci95_high")
]
OUTPUT_FILES = ("payoff.csv", "payoff.json", "payoff.png", "gallery.png")
#: characters of a title line per inch of figure width at font size 8 (so titles wrap, never clip)
_CHARS_PER_INCH = 12


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


def _half_widths(table: PayoffTable, metric: str) -> np.ndarray:
    """Half-width of each pair's 95% t-interval of ``metric``, in the metric's own units and not clipped
    (NaN for one episode): the ``± h`` the heatmap prints, where the clipped interval of payoff.csv would
    read "[-1.00, 1.00]" for a wide one."""
    half = np.full((len(table.attackers), len(table.defenders)), np.nan)
    a_index = {a: i for i, a in enumerate(table.attackers)}
    d_index = {d: j for j, d in enumerate(table.defenders)}
    for p in table.pairs:
        _, low, high = t_interval([e.metrics[metric] for e in p.episodes])
        half[a_index[p.attacker], d_index[p.defender]] = (high - low) / 2
    return half


def support_cells(table: PayoffTable, mixed) -> set[tuple[int, int]]:
    """``(attacker row, defender column)`` of every cell whose row and column are both in the support of
    one of the mixed equilibria ``mixed`` (pairs of probability vectors over the attackers and defenders)."""
    cells: set[tuple[int, int]] = set()
    na, nd = len(table.attackers), len(table.defenders)
    for attacker_mix, defender_mix in mixed or ():
        x, y = np.asarray(attacker_mix, dtype=np.float64), np.asarray(defender_mix, dtype=np.float64)
        if x.shape != (na,) or y.shape != (nd,):
            raise ValueError(f"mixed equilibrium of shapes {x.shape}, {y.shape}; allowed: ({na},) attacker and "
                             f"({nd},) defender probabilities")
        cells |= {(i, j) for i in np.flatnonzero(x > 1e-9) for j in np.flatnonzero(y > 1e-9)}
    return {(int(i), int(j)) for i, j in cells}


def heatmap_figure(table: PayoffTable, mixed=None):
    """Mean leakage SSIM per pair, annotated with its 95% t-interval, best responses and equilibria.

    Each cell prints the mean SSIM and ``± h``, the half-width of its 95% Student-t interval over the
    episodes in SSIM units (not clipped to SSIM's range, so a wide interval reads as wide: payoff.csv holds
    the clipped bounds). A large orange triangle marks, in each defender's column, the attacker with the
    highest mean attacker return (the attacker's best response, ties included); a large cyan square marks,
    in each attacker's row, the defender with the highest mean defender return; a thick red frame marks
    the pure-strategy equilibria (mutual best responses). ``mixed`` (optional): a list of
    ``(attacker_mix, defender_mix)`` probability arrays, the mixed equilibria; a dashed magenta frame
    outlines each cell whose row and column are both in some equilibrium's support
    (:func:`support_cells`). The colour scale runs from 0 (or the lowest mean, when negative) to 1.
    Warns (``UserWarning``, and in the title) with fewer than :data:`MIN_EPISODES` episodes per pair.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    mean = table.matrix("leakage_ssim_mean")
    half = _half_widths(table, "leakage_ssim")
    na, nd = mean.shape
    width = max(1.8 * nd + 3.4, 6.0)
    fig = _figure(figsize=(width, 0.95 * na + 3.0), dpi=100)
    ax = fig.subplots()
    finite = mean[np.isfinite(mean)]
    vmin = min(0.0, float(finite.min())) if finite.size else 0.0
    im = ax.imshow(mean, cmap="viridis", vmin=vmin, vmax=1.0, aspect="auto")
    for i in range(na):
        for j in range(nd):
            text = f"{mean[i, j]:.3f}" + (f"\n± {half[i, j]:.2f}" if np.isfinite(half[i, j]) else "")
            light = np.isfinite(mean[i, j]) and (mean[i, j] - vmin) / (1.0 - vmin) > 0.6
            ax.text(j, i + 0.05, text, ha="center", va="center", fontsize=10, color="black" if light else "white")
    br = best_responses(table)
    a_index = {a: i for i, a in enumerate(table.attackers)}
    d_index = {d: j for j, d in enumerate(table.defenders)}
    for d, r in br["against_defender"].items():
        for a in r["tied"]:  # every attacker tied at the best mean
            ax.plot(d_index[d] - 0.34, a_index[a] - 0.27, marker="^", color="tab:orange",
                    markeredgecolor="black", markeredgewidth=1.2, markersize=13)
    for a, r in br["against_attacker"].items():
        for d in r["tied"]:
            ax.plot(d_index[d] + 0.34, a_index[a] - 0.27, marker="s", color="tab:cyan",
                    markeredgecolor="black", markeredgewidth=1.2, markersize=11)
    for i, j in sorted(support_cells(table, mixed)):
        ax.add_patch(Rectangle((j - 0.42, i - 0.42), 0.84, 0.84, fill=False, edgecolor="magenta",
                               linestyle="--", linewidth=2.5))
    for e in br["pure_equilibria"]:
        ax.add_patch(Rectangle((d_index[e["defender"]] - 0.48, a_index[e["attacker"]] - 0.48), 0.96, 0.96,
                               fill=False, edgecolor="red", linewidth=4))
    ax.set_xlim(-0.5, nd - 0.5)
    ax.set_ylim(na - 0.5, -0.5)
    ax.set_xticks(range(nd), [short_label(d) for d in table.defenders], rotation=20, ha="right", fontsize=9)
    ax.set_yticks(range(na), [short_label(a) for a in table.attackers], fontsize=9)
    ax.set_xlabel("defender", fontsize=9)
    ax.set_ylabel("attacker", fontsize=9)
    title = (f"{table.env_id}: mean leakage SSIM per pair (SSIM lies in [-1, 1]; higher = more leakage)\n"
             f"± h: half-width of the 95% t-interval over {episodes_label(table)}, in SSIM units")
    warning = few_episodes(table)
    if warning is not None:
        warnings.warn(f"payoff heatmap: {warning}", UserWarning, stacklevel=3)
        title += f"\n{warning}"
    fig.suptitle(_wrap(title, width, fontsize=9), fontsize=9)
    fig.colorbar(im, ax=ax).set_label("mean SSIM (colour scale from 0, or the lowest mean, to 1)", fontsize=8)
    handles = [
        Line2D([], [], marker="^", color="tab:orange", markeredgecolor="black", markersize=10, linestyle="",
               label="attacker's best response to the column's defender (highest attacker return)"),
        Line2D([], [], marker="s", color="tab:cyan", markeredgecolor="black", markersize=9, linestyle="",
               label="defender's best response to the row's attacker (highest defender return)"),
        Rectangle((0, 0), 1, 1, fill=False, edgecolor="red", linewidth=3,
                  label="pure-strategy equilibrium (mutual best responses)"),
    ]
    if mixed:
        handles.append(Rectangle((0, 0), 1, 1, fill=False, edgecolor="magenta", linestyle="--", linewidth=2,
                                 label="in a mixed equilibrium's support (row and column)"))
    fig.legend(handles=handles, loc="outside lower center", fontsize=8, frameon=False)
    return fig


def mixed_arrays(table: PayoffTable) -> list[tuple[np.ndarray, np.ndarray]]:
    """The table's mixed equilibria (:func:`~leakgym.agents.experiments.evaluation.analysis.mixed_equilibria`)
    as probability arrays over its attackers and defenders (what :func:`heatmap_figure` marks)."""
    out = []
    for e in mixed_equilibria(table)["equilibria"]:
        x = np.array([e["attacker_mix"].get(a, 0.0) for a in table.attackers])
        y = np.array([e["defender_mix"].get(d, 0.0) for d in table.defenders])
        out.append((x, y))
    return out


def write_heatmap(table: PayoffTable, path: Path) -> None:
    """Save :func:`heatmap_figure` to ``path``, the mixed equilibria's supports marked."""
    heatmap_figure(table, mixed=mixed_arrays(table)).savefig(path, bbox_inches="tight")


#: the channels of an image the gallery shows (grey or RGB)
GALLERY_CHANNELS = (1, 3)


def last_round_problem(last: LastRound, image_shape: tuple[int, int, int] | None = None) -> str | None:
    """Why the gallery cannot show ``last``, or ``None``: float images of shape ``(N, C, H, W)`` with
    ``N >= 1``, ``C`` in :data:`GALLERY_CHANNELS` and ``H, W >= 1`` (``(C, H, W)`` equal to ``image_shape``
    when given: the scenario's images), ``matched`` of the same shape, float ``ssim``/``psnr`` and integer
    ``labels`` (when there are labels) with one value per image. ``--resume`` ignores a saved last round
    with a problem (:mod:`.episode_log`), and the gallery leaves its pair out."""
    arrays = (last.originals, last.matched, last.ssim, last.psnr, last.labels)
    if not all(a is None or isinstance(a, np.ndarray) for a in arrays) or last.originals is None:
        return "its entries are not arrays"
    if not all(a.dtype.kind == "f" for a in (last.originals, last.matched, last.ssim, last.psnr)):
        return "its images or scores are not floats"
    shape = last.originals.shape
    if len(shape) != 4 or shape[0] < 1 or shape[1] not in GALLERY_CHANNELS or min(shape[2:]) < 1:
        return (f"its images have shape {shape}; allowed: (N, C, H, W) with N >= 1 images, C in "
                f"{GALLERY_CHANNELS} channels, H, W >= 1")
    if image_shape is not None and tuple(shape[1:]) != tuple(image_shape):
        return f"its images are {tuple(shape[1:])} (C, H, W), the scenario's are {tuple(image_shape)}"
    if last.matched.shape != shape:
        return f"its reconstructions have shape {last.matched.shape}, its images {shape}"
    per_image = (shape[0],)
    if last.ssim.shape != per_image or last.psnr.shape != per_image:
        return f"its SSIM and PSNR have shapes {last.ssim.shape}, {last.psnr.shape}; allowed: {per_image}"
    if last.labels is not None and (last.labels.shape != per_image or last.labels.dtype.kind not in "iu"):
        return f"its labels have shape {last.labels.shape} and type {last.labels.dtype}; allowed: integers, {per_image}"
    return None


def _image(ax, arr: np.ndarray) -> None:
    ax.imshow(arr[0] if arr.shape[0] == 1 else np.transpose(arr, (1, 2, 0)), cmap="gray", vmin=0, vmax=1)


def _shown_last_rounds(table: PayoffTable) -> dict[tuple[str, str], LastRound]:
    """The last round of every pair that has one the gallery can show (:func:`last_round_problem`)."""
    return {(p.attacker, p.defender): p.last_round for p in table.pairs
            if p.last_round is not None and last_round_problem(p.last_round) is None}


def gallery_figure(table: PayoffTable, max_images: int = 4):
    """One panel per (attacker, defender) pair: its kept round's private images beside their reconstructions.

    Panels are laid out as the payoff table (rows: attackers, columns: defenders). In each, every row is
    one private image (at most ``max_images``; blue frame, with its class when known) beside the
    attacker's reconstruction matched to it, with SSIM and PSNR under it, and LPIPS where the game scored
    it (the user's LPIPS backbone weights; the title says when no pair has it). The pair in row ``i`` and column
    ``j`` keeps the last round of its episode ``(i + j) mod episodes``
    (:func:`~leakgym.agents.experiments.evaluation.payoff.gallery_episode`), so neighbouring panels show
    different originals when the run has several episodes. A pair without a last round, or with one that
    cannot be shown (:func:`last_round_problem`), is left out.
    """
    by_pair = _shown_last_rounds(table)
    if not by_pair:
        raise ValueError("no pair has a finished round to show")
    n = min(max_images, min(len(last.originals) for last in by_pair.values()))
    attackers = [a for a in table.attackers if any((a, d) in by_pair for d in table.defenders)]
    defenders = [d for d in table.defenders if any((a, d) in by_pair for a in table.attackers)]
    longest = max(len(short_label(x)) + 3 for x in [*attackers, *defenders])  # "vs " before a defender
    with_lpips = any(last.lpips is not None for last in by_pair.values())
    panel_w, panel_h = max(2.6, 0.075 * longest + 0.3), (1.4 if with_lpips else 1.25) * n + 0.95  # labels fit
    width = max(panel_w * len(defenders), 5.2)  # a one-column gallery still has room for its title
    fig = _figure(figsize=(width, panel_h * len(attackers) + 0.7), dpi=100)
    panels = fig.subfigures(len(attackers), len(defenders), squeeze=False)
    for r, a in enumerate(attackers):
        for c, d in enumerate(defenders):
            panel, last = panels[r][c], by_pair.get((a, d))
            panel.suptitle(f"{short_label(a)}\nvs {short_label(d)}", fontsize=9)
            if last is None:
                continue
            axes = panel.subplots(n, 2, squeeze=False)
            for k in range(n):
                left, right = axes[k]
                for ax in (left, right):
                    ax.set_xticks([])
                    ax.set_yticks([])
                _image(left, last.originals[k])
                for spine in left.spines.values():
                    spine.set_edgecolor("tab:blue")
                    spine.set_linewidth(2)
                left.set_xlabel("original" + ("" if last.labels is None else f", class {int(last.labels[k])}"),
                                fontsize=8)
                _image(right, last.matched[k])
                for spine in right.spines.values():
                    spine.set_visible(False)
                label = f"SSIM {last.ssim[k]:.2f}, {last.psnr[k]:.1f} dB"
                if last.lpips is not None:
                    label += f"\nLPIPS {last.lpips[k]:.2f}"
                elif with_lpips:  # a pair kept from a run without the weights (--resume)
                    label += "\nLPIPS n/a"
                right.set_xlabel(label, fontsize=8)
    metrics = "SSIM, PSNR and LPIPS" if with_lpips else "SSIM, PSNR (LPIPS not available)"
    fig.suptitle(
        _wrap(f"{table.env_id}: private images (blue) beside each pair's matched reconstructions; {metrics}",
              width, fontsize=10),
        fontsize=10,
    )
    return fig


def write_gallery(table: PayoffTable, path: Path, max_images: int = 4) -> None:
    """Save :func:`gallery_figure` to ``path``."""
    gallery_figure(table, max_images).savefig(path, bbox_inches="tight")


def write_outputs(table: PayoffTable, out: Path) -> dict[str, Path]:
    """Write payoff.csv, payoff.json, payoff.png and gallery.png to ``out``, each atomically (written
    beside its name, then renamed), so an interrupted write leaves no half-written file.

    Without any pair's last round that can be shown (a resumed run whose ``last_round/`` files are gone or
    damaged; :func:`last_round_problem`) there is no gallery: ``gallery.png`` is not written (an earlier one
    there is removed) and a ``UserWarning`` says why; the returned paths hold only the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in OUTPUT_FILES}
    if not _shown_last_rounds(table):
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
    "GALLERY_CHANNELS",
    "OUTPUT_FILES",
    "episodes_label",
    "few_episodes",
    "gallery_episode",
    "gallery_figure",
    "heatmap_figure",
    "json_safe",
    "last_round_problem",
    "payoff_text",
    "short_label",
    "support_cells",
    "write_csv",
    "write_gallery",
    "write_heatmap",
    "write_json",
    "write_outputs",
]

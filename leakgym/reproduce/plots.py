"""The one figure of every reproduction: the paper's panels (ours ± se next to the paper) and the
accuracy curves of every row (mean over seeds, shaded ± se)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def paired_bars(ax, panel) -> None:
    """Grouped bars of a :class:`~leakgym.reproduce.runner.Panel`: ours (solid, ± se) and the paper's (hatched)."""
    x = np.arange(len(panel.labels))
    w = 0.38
    ours = [np.nan if e is None else e.mean for e in panel.ours]
    err = [0.0 if e is None else e.se for e in panel.ours]
    paper = [np.nan if v is None else v for v in panel.paper]
    ax.bar(x - w / 2, ours, w, yerr=err, capsize=2, label="ours (digits, scaled down; ± se)", color="tab:blue")
    ax.bar(x + w / 2, paper, w, label="paper", color="tab:gray", hatch="//", alpha=0.7)
    ax.set_xticks(x, panel.labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title, fontsize=9)


def accuracy_curves(ax, result: dict) -> None:
    """Test accuracy against FedSGD rounds, one line per row (mean over seeds, ± se shaded)."""
    drawn = 0
    for name, u in result["utility"].items():
        curve = (u or {}).get("curve")
        if not curve:
            continue
        r = np.asarray(curve["rounds"])
        acc, se = 100 * np.asarray(curve["accuracy"]), 100 * np.asarray(curve["se"])
        line, = ax.plot(r, acc, lw=1, label=f"{name} ({len(u['seeds'])} seed{'s' if len(u['seeds']) > 1 else ''})")
        ax.fill_between(r, acc - se, acc + se, color=line.get_color(), alpha=0.15, lw=0)
        drawn += 1
    ax.set_xlabel("FedSGD round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("utility: accuracy curves", fontsize=9)
    if drawn:
        ax.legend(fontsize=6, ncol=2)


def figure(paper, result: dict, path: Path) -> None:
    """Write ``path``: the paper's panels (or its custom ``draw``) and the accuracy curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = paper.panels(result) if paper.panels is not None else []
    n = len(panels) + paper.draw_axes + 1
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.8), squeeze=False)
    axes = list(axes[0])
    for ax, panel in zip(axes, panels):
        paired_bars(ax, panel)
    if panels:
        axes[0].legend(fontsize=6)
    if paper.draw is not None:
        paper.draw(result, axes[len(panels):len(panels) + paper.draw_axes])
    accuracy_curves(axes[-1], result)
    fig.suptitle(f"{paper.title}: ours (digits 16x16, seeds {','.join(map(str, result['seeds']))}) vs paper",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

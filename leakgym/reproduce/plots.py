"""Matplotlib (Agg) figures shared by the paper modules: ours next to the paper's numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def paired_bars(ax, labels: list[str], ours: list[float | None], paper: list[float | None], *,
                ylabel: str, title: str = "") -> None:
    """Grouped bars: ours (solid) and the paper's (hatched; missing values left out)."""
    x = np.arange(len(labels))
    w = 0.38
    o = [np.nan if v is None else v for v in ours]
    p = [np.nan if v is None else v for v in paper]
    ax.bar(x - w / 2, o, w, label="ours (digits, scaled down)", color="tab:blue")
    ax.bar(x + w / 2, p, w, label="paper", color="tab:gray", hatch="//", alpha=0.7)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)

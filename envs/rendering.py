"""Pictures of a round: originals beside reconstructions, labelled with their metrics."""

from __future__ import annotations

import numpy as np
from torch import Tensor


def _to_hwc(img: Tensor) -> np.ndarray:
    arr = img.detach().cpu().clamp(0, 1).numpy()
    if arr.shape[0] == 1:
        return arr[0]
    return np.transpose(arr, (1, 2, 0))


def round_figure(originals: Tensor, reconstructions: Tensor, scores, title: str = "", max_images: int = 8):
    """A matplotlib Figure: row 1 the private images, row 2 their matched reconstructions."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    n = min(len(originals), max_images)
    fig = Figure(figsize=(max(1.6 * n + 0.4, 4.8), 3.8), dpi=80)
    axes = fig.subplots(2, n, squeeze=False)
    assignment = scores.assignment
    for i in range(n):
        ax_o, ax_r = axes[0][i], axes[1][i]
        cmap = "gray" if originals.shape[1] == 1 else None
        ax_o.imshow(_to_hwc(originals[i]), cmap=cmap, vmin=0, vmax=1)
        ax_r.imshow(_to_hwc(reconstructions[int(assignment[i])]), cmap=cmap, vmin=0, vmax=1)
        ax_o.set_title("original" if i == 0 else "", fontsize=8)
        ax_r.set_title(
            f"SSIM {scores.per_image['ssim'][i]:.2f}\nPSNR {scores.per_image['psnr'][i]:.1f}", fontsize=7
        )
        for ax in (ax_o, ax_r):
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        import textwrap

        fig.suptitle("\n".join(textwrap.wrap(title, width=60)), fontsize=8)
    fig.tight_layout()
    return fig


def placeholder_figure(text: str):
    """A figure with only ``text``: what ``render()`` shows before the first round."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2, 1.2), dpi=80)
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=8)
    return fig


def figure_to_rgb(fig) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()

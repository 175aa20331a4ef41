"""Pictures of a round: originals beside reconstructions, labelled with their metrics."""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor


def _to_hwc(img: Tensor) -> np.ndarray:
    arr = img.detach().cpu().clamp(0, 1).numpy()
    if arr.shape[0] == 1:
        return arr[0]
    return np.transpose(arr, (1, 2, 0))


#: every frame ``render()`` returns has this size (inches at ``FRAME_DPI``): video recorders need a fixed size
FRAME_INCHES = (6.4, 3.8)
FRAME_DPI = 80
#: the matplotlib figure of render_mode="human" (closed by the env's close())
WINDOW_TITLE = "LeakGym"


def round_figure(originals: Tensor, reconstructions: Tensor, scores, title: str = "", max_images: int = 8):
    """A matplotlib Figure of fixed size: row 1 the private images, row 2 their matched reconstructions."""
    from matplotlib.figure import Figure

    n = min(len(originals), max_images)
    fig = Figure(figsize=FRAME_INCHES, dpi=FRAME_DPI)
    axes = fig.subplots(2, n, squeeze=False)
    assignment = scores.assignment
    for i in range(n):
        ax_o, ax_r = axes[0][i], axes[1][i]
        cmap = "gray" if originals.shape[1] == 1 else None
        ax_o.imshow(_to_hwc(originals[i]), cmap=cmap, vmin=0, vmax=1)
        ax_r.imshow(_to_hwc(reconstructions[int(assignment[i])]), cmap=cmap, vmin=0, vmax=1)
        ax_o.set_title("original" if i == 0 else "", fontsize=8)
        label = f"SSIM {scores.per_image['ssim'][i]:.2f}\nPSNR {scores.per_image['psnr'][i]:.1f}"
        lpips = scores.per_image.get("lpips")
        if lpips is not None and math.isfinite(lpips[i]):  # scored where the LPIPS weights are present
            label += f"\nLPIPS {lpips[i]:.2f}"
        ax_r.set_title(label, fontsize=7)
        for ax in (ax_o, ax_r):
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        import textwrap

        fig.suptitle("\n".join(textwrap.wrap(title, width=80)), fontsize=8)
    fig.tight_layout()
    return fig


def placeholder_figure(text: str):
    """A figure with only ``text``: what ``render()`` shows before the first round."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FRAME_INCHES, dpi=FRAME_DPI)
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=10)
    return fig


def show_figure(fig) -> None:
    """``render_mode="human"``: draw in a matplotlib window when an interactive backend is available.

    Without a display (the ``Agg`` backend, CI machines) this is a documented no-op, as PettingZoo's
    own environments do.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    if matplotlib.get_backend().lower() in ("agg", "pdf", "svg", "ps", "cairo", "template"):
        return
    window = plt.figure(WINDOW_TITLE, figsize=FRAME_INCHES, dpi=FRAME_DPI)
    window.clf()
    window.figimage(figure_to_rgb(fig), xo=0, yo=0)
    plt.pause(0.001)


def figure_to_rgb(fig) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()

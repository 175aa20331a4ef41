"""ConvNet of Inverting Gradients (Geiping et al., NeurIPS 2020), also the Soteria testbed.

``inversefed.nn.models.ConvNet`` (github.com/JonasGeiping/invertinggradients): eight 3x3 conv-BN-ReLU
blocks with channel widths (w, 2w, 2w, 4w, 4w, 4w | 4w, 4w) and a 3x3 max-pool after the sixth and the
eighth block, then a linear classifier. (The reference lists a ninth block, but it reuses the
``conv6``/``bn6``/``relu6`` keys of an ``OrderedDict``, so the instantiated network has the eight
blocks reproduced here.)

Deviations: the flatten size is computed from the spec (``4w * 3 * 3`` for 32x32 as in the reference,
``4w * 1 * 1`` for 16x16) and the default width is ``16`` instead of the reference's 64 (the paper's
"ConvNet64"), which is 16x cheaper and runs attacks on CPU; pass ``width=64`` for the original.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from leakgym.data.spec import DatasetSpec
from leakgym.models.base import LeakGymModel
from leakgym.models.precode import DEFAULT_PRECODE_BETA

DEFAULT_CONVNET_WIDTH = 16
"""Base width ``w`` (Inverting Gradients used 64; 16 keeps CPU attacks fast)."""

# (output-channel multiplier of w, max-pool(3) after this block)
_BLOCKS = ((1, False), (2, False), (2, False), (4, False), (4, False), (4, True), (4, False), (4, True))


class ConvNet(LeakGymModel):
    """Inverting Gradients' ConvNet: 8 conv3x3-BN-ReLU blocks, two MaxPool(3), linear head."""

    min_image_size = 9  # two 3x3 max-pools with stride 3: 9 -> 3 -> 1

    def __init__(self, spec: DatasetSpec, *, width: int = DEFAULT_CONVNET_WIDTH, precode: bool = False,
                 precode_dim: int | None = None, precode_beta: float = DEFAULT_PRECODE_BETA) -> None:
        if width < 1:
            raise ValueError(f"ConvNet width={width} must be >= 1")
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        in_ch, size, pool = spec.channels, spec.image_size, 0
        for i, (mult, pool_after) in enumerate(_BLOCKS):
            out_ch = mult * width
            layers[f"conv{i}"] = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
            layers[f"bn{i}"] = nn.BatchNorm2d(out_ch)
            layers[f"relu{i}"] = nn.ReLU()
            if pool_after:
                layers[f"pool{pool}"] = nn.MaxPool2d(3)
                size, pool = size // 3, pool + 1
            in_ch = out_ch
        layers["flatten"] = nn.Flatten()
        super().__init__(spec, nn.Sequential(layers), in_ch * size * size, precode=precode,
                         precode_dim=precode_dim, precode_beta=precode_beta)

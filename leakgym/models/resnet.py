"""ResNet-18 with the CIFAR stem (He et al., CVPR 2016; CIFAR variant as in Inverting Gradients).

Stem: 3x3 convolution with stride 1 and no max-pool (the ImageNet stem's 7x7/2 convolution and
max-pool would shrink 32x32 images to 8x8 before the first block). Four stages of two
``torchvision.models.resnet.BasicBlock`` each, widths (w, 2w, 4w, 8w), strides (1, 2, 2, 2), a 1x1
projection shortcut (conv + BN) when shape changes, global average pooling, linear head. ``w = 64``
is the standard ResNet-18; pass a smaller ``width`` for cheap CPU experiments. Initialisation follows
torchvision (Kaiming-normal, fan-out convolutions; BN weight 1, bias 0).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn
from torchvision.models.resnet import BasicBlock

from leakgym.data.spec import DatasetSpec
from leakgym.models.base import LeakGymModel
from leakgym.models.precode import DEFAULT_PRECODE_BETA

DEFAULT_RESNET_WIDTH = 64
"""Width of the first stage of the standard ResNet-18."""

_LAYERS = (2, 2, 2, 2)
_STRIDES = (1, 2, 2, 2)


def _stage(in_ch: int, out_ch: int, blocks: int, stride: int) -> nn.Sequential:
    downsample = None
    if stride != 1 or in_ch != out_ch:
        downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False),
                                   nn.BatchNorm2d(out_ch))
    layers = [BasicBlock(in_ch, out_ch, stride=stride, downsample=downsample)]
    layers += [BasicBlock(out_ch, out_ch) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class ResNet18(LeakGymModel):
    """ResNet-18, CIFAR stem, BasicBlocks [2, 2, 2, 2]."""

    min_image_size = 8  # three stride-2 stages: 8 -> 4 -> 2 -> 1

    def __init__(self, spec: DatasetSpec, *, width: int = DEFAULT_RESNET_WIDTH, precode: bool = False,
                 precode_dim: int | None = None, precode_beta: float = DEFAULT_PRECODE_BETA) -> None:
        if width < 1:
            raise ValueError(f"ResNet18 width={width} must be >= 1")
        layers: OrderedDict[str, nn.Module] = OrderedDict(
            conv1=nn.Conv2d(spec.channels, width, kernel_size=3, stride=1, padding=1, bias=False),
            bn1=nn.BatchNorm2d(width),
            relu=nn.ReLU(),
        )
        in_ch = width
        for i, (blocks, stride) in enumerate(zip(_LAYERS, _STRIDES), start=1):
            out_ch = width * 2 ** (i - 1)
            layers[f"layer{i}"] = _stage(in_ch, out_ch, blocks, stride)
            in_ch = out_ch
        layers["avgpool"] = nn.AdaptiveAvgPool2d((1, 1))
        layers["flatten"] = nn.Flatten()
        body = nn.Sequential(layers)
        for m in body.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        super().__init__(spec, body, in_ch, precode=precode, precode_dim=precode_dim,
                         precode_beta=precode_beta)

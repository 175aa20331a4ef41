"""``build_model``: one entry point from a model name and a :class:`DatasetSpec` to a model."""

from __future__ import annotations

import torch

from leakgym.data.spec import DatasetSpec
from leakgym.models.base import LeakGymModel
from leakgym.models.convnet import ConvNet
from leakgym.models.lenet import LeNet
from leakgym.models.mlp import MLP
from leakgym.models.precode import DEFAULT_PRECODE_BETA
from leakgym.models.resnet import ResNet18

MODEL_CLASSES: dict[str, type[LeakGymModel]] = {
    "lenet": LeNet,
    "convnet": ConvNet,
    "mlp": MLP,
    "resnet18": ResNet18,
}
MODEL_NAMES: tuple[str, ...] = tuple(MODEL_CLASSES)


def build_model(name: str, spec: DatasetSpec, *, precode: bool = False,
                precode_beta: float = DEFAULT_PRECODE_BETA, precode_dim: int | None = None,
                width: int | None = None, seed: int | None = None,
                device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> LeakGymModel:
    """Build model ``name`` for images described by ``spec``.

    Args:
        name: one of :data:`MODEL_NAMES` (``"lenet"``, ``"convnet"``, ``"mlp"``, ``"resnet18"``).
        spec: dataset description; input channels, image size and class count are read from it.
        precode: insert a PRECODE variational bottleneck before the head.
        precode_beta: KL weight ``beta`` of PPP Eq. 3 (ignored without ``precode``).
        precode_dim: bottleneck size ``K`` (default 256, the official PRECODE value).
        width: architecture width (LeNet channels, ConvNet base width, MLP hidden width, ResNet first
            stage width); ``None`` takes the class default (12, 16, 1024, 64).
        seed: if given, parameters are initialised from ``torch.manual_seed(seed)`` inside
            ``torch.random.fork_rng`` (the global RNG state is left untouched); ``None`` draws from
            the global RNG.
        device, dtype: where and in which floating dtype to place the parameters.
    """
    if name not in MODEL_CLASSES:
        raise ValueError(f"unknown model name {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    if width is not None and (not isinstance(width, int) or width < 1):
        raise ValueError(f"width={width!r} must be a positive int or None")
    if precode_dim is not None and (not isinstance(precode_dim, int) or precode_dim < 1):
        raise ValueError(f"precode_dim={precode_dim!r} must be a positive int or None")
    cls = MODEL_CLASSES[name]
    kwargs = {"precode": precode, "precode_dim": precode_dim, "precode_beta": precode_beta}
    if width is not None:
        kwargs["width"] = width
    if seed is None:
        model = cls(spec, **kwargs)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls(spec, **kwargs)
    return model.to(device=device, dtype=dtype)

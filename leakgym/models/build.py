"""``build_model``: one entry point from a model name and a :class:`DatasetSpec` to a model."""

from __future__ import annotations

import torch

from leakgym.checks import is_integer
from leakgym.data.spec import DatasetSpec
from leakgym.devices import library_dtype, seed_generators
from leakgym.models.base import LeakGymModel
from leakgym.models.convnet import ConvNet
from leakgym.models.lenet import LeNet
from leakgym.models.mlp import MLP
from leakgym.models.precode import DEFAULT_PRECODE_BETA
from leakgym.models.resnet import ResNet18
from leakgym.suggest import did_you_mean

MODEL_CLASSES: dict[str, type[LeakGymModel]] = {
    "lenet": LeNet,
    "convnet": ConvNet,
    "mlp": MLP,
    "resnet18": ResNet18,
}
MODEL_NAMES: tuple[str, ...] = tuple(MODEL_CLASSES)


def _positive_integer(value, name: str) -> int | None:
    """``value`` as an int when it is an integer >= 1 (numpy integers too), None for None; a bool
    (``width=True`` built a one-channel model) or anything else is a ``ValueError`` naming it."""
    if value is None:
        return None
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name}={value!r}; allowed: an integer >= 1, or None (the class default)")
    return int(value)


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
        seed: if given, parameters are initialised on the CPU generator seeded as ``torch.manual_seed(seed)``
            seeds it, inside ``torch.random.fork_rng`` (every global RNG state is left untouched,
            :func:`~leakgym.devices.seed_generators`); ``None`` draws from the global RNG.
        device, dtype: where and in which floating dtype to place the parameters; ``None``: on torch's default
            device (``with torch.device("meta")`` builds the shapes only) in float32, whatever torch's default
            dtype (:func:`~leakgym.devices.library_dtype`), outside inference mode (parameters made in it get no
            gradients after it).
    """
    if name not in MODEL_CLASSES:
        raise ValueError(
            f"unknown model name {name!r}{did_you_mean(name, MODEL_NAMES)}; allowed: {', '.join(MODEL_NAMES)}"
        )
    width = _positive_integer(width, "width")
    precode_dim = _positive_integer(precode_dim, "precode_dim")
    cls = MODEL_CLASSES[name]
    kwargs = {"precode": precode, "precode_dim": precode_dim, "precode_beta": precode_beta}
    if width is not None:
        kwargs["width"] = width
    with torch.inference_mode(False), library_dtype():
        if seed is None:
            model = cls(spec, **kwargs)
        else:
            with torch.random.fork_rng(devices=[]):  # built on the default device (the CPU's generator), moved below
                seed_generators(seed)
                model = cls(spec, **kwargs)
    return model.to(device=device, dtype=dtype)

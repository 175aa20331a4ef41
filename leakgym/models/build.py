"""``build_model``: one entry point from a model name and a :class:`DatasetSpec` to a model."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from leakgym.checks import is_integer
from leakgym.data.spec import DatasetSpec
from leakgym.devices import check_device, default_device, library_dtype, seed_generators
from leakgym.models.base import LeakGymModel
from leakgym.models.convnet import ConvNet
from leakgym.models.lenet import LeNet
from leakgym.models.mlp import MLP
from leakgym.models.precode import DEFAULT_PRECODE_BETA, check_precode_beta
from leakgym.models.resnet import ResNet18
from leakgym.suggest import did_you_mean

MODEL_CLASSES: dict[str, type[LeakGymModel]] = {
    "lenet": LeNet,
    "convnet": ConvNet,
    "mlp": MLP,
    "resnet18": ResNet18,
}
MODEL_NAMES: tuple[str, ...] = tuple(MODEL_CLASSES)

#: the seeds torch's generators take (``torch.Generator.manual_seed``; a negative one is taken modulo 2**64)
SEED_RANGE = (-(2**63), 2**64 - 1)


def _positive_integer(value, name: str) -> int | None:
    """``value`` as an int when it is an integer >= 1 (numpy integers too), None for None; a bool
    (``width=True`` built a one-channel model) or anything else is a ``ValueError`` naming it."""
    if value is None:
        return None
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name}={value!r}; allowed: an integer >= 1, or None (the class default)")
    return int(value)


def _device(device: object) -> torch.device | None:
    """``device`` as a ``torch.device``, checked by :func:`~leakgym.devices.check_device` (a device this machine
    lacks, such as ``"cuda"`` without a GPU, is a ``ValueError`` naming it and the available ones, not torch's
    driver error at the first tensor); ``"meta"`` (shapes only, no memory: the scenario checks) is allowed too;
    None stays None (torch's default device, ``with torch.device(...)`` included)."""
    if device is None:
        return None
    if isinstance(device, (str, torch.device)):
        try:
            if torch.device(device).type == "meta":
                return torch.device(device)
        except (RuntimeError, ValueError):
            pass  # check_device names it
    return check_device(device)


def build_model(name: str, spec: DatasetSpec, *, precode: bool = False,
                precode_beta: float = DEFAULT_PRECODE_BETA, precode_dim: int | None = None,
                width: int | None = None, seed: int | None = None,
                device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> LeakGymModel:
    """Build model ``name`` for images described by ``spec``.

    Args:
        name: one of :data:`MODEL_NAMES` (``"lenet"``, ``"convnet"``, ``"mlp"``, ``"resnet18"``).
        spec: dataset description; input channels, image size and class count are read from it.
        precode: insert a PRECODE variational bottleneck before the head (a bool).
        precode_beta: KL weight ``beta`` of PPP Eq. 3, a finite number >= 0 (checked, but ignored without
            ``precode``).
        precode_dim: bottleneck size ``K`` (default 256, the official PRECODE value).
        width: architecture width (LeNet channels, ConvNet base width, MLP hidden width, ResNet first
            stage width); ``None`` takes the class default (12, 16, 1024, 64).
        seed: if given, parameters are initialised on the CPU generator seeded as ``torch.manual_seed(seed)``
            seeds it, inside ``torch.random.fork_rng`` (every global RNG state is left untouched,
            :func:`~leakgym.devices.seed_generators`); an integer in :data:`SEED_RANGE`. ``None`` draws from the
            global RNG.
        device, dtype: where and in which floating dtype to place the parameters; ``None``: on torch's default
            device (``with torch.device("meta")`` builds the shapes only) in float32, whatever torch's default
            dtype (:func:`~leakgym.devices.library_dtype`), outside inference mode (parameters made in it get no
            gradients after it). A device is one this machine has (:func:`~leakgym.devices.check_device`), or
            ``"meta"``. The parameters are initialised on the CPU and moved there (on the meta device where it
            is the target), so a seed gives the same model on every device.

    Every argument is checked before anything is built (a ``ValueError`` naming the value and what is allowed).
    """
    if name not in MODEL_CLASSES:
        raise ValueError(
            f"unknown model name {name!r}{did_you_mean(name, MODEL_NAMES)}; allowed: {', '.join(MODEL_NAMES)}"
        )
    if not isinstance(spec, DatasetSpec):
        raise ValueError(  # noqa: TRY004 - the library reports all bad input as ValueError
            f"spec={spec!r}; allowed: a leakgym.data.spec.DatasetSpec (e.g. leakgym.data.dataset_spec(name))")
    if not isinstance(precode, (bool, np.bool_)):
        raise ValueError(f"precode={precode!r}; allowed: True or False")  # noqa: TRY004
    precode_beta = check_precode_beta(precode_beta)
    width = _positive_integer(width, "width")
    precode_dim = _positive_integer(precode_dim, "precode_dim")
    if seed is not None and (not is_integer(seed) or not SEED_RANGE[0] <= int(seed) <= SEED_RANGE[1]):
        raise ValueError(f"seed={seed!r}; allowed: an integer in [-2**63, 2**64 - 1] (torch's seeds), or None (the "
                         "global RNG)")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ValueError(f"dtype={dtype!r}; allowed: a floating torch dtype (torch.float32, torch.float64, ...), "
                         "or None (float32)")
    device = _device(device)
    cls = MODEL_CLASSES[name]
    kwargs = {"precode": bool(precode), "precode_dim": precode_dim, "precode_beta": precode_beta}
    if width is not None:
        kwargs["width"] = width
    # Built on the CPU from its seeded generator and moved, so a seed gives one model on every device; on the
    # meta device (shapes only, nothing allocated) where that is where it goes.
    current = default_device()
    target = device if device is not None else current
    build_on = torch.device("meta") if target.type == "meta" else torch.device("cpu")
    on_build_device = contextlib.nullcontext() if current == build_on else torch.device(build_on)
    with torch.inference_mode(False), library_dtype(), on_build_device:
        if seed is None:
            model = cls(spec, **kwargs)
        else:
            with torch.random.fork_rng(devices=[]):
                seed_generators(int(seed))
                model = cls(spec, **kwargs)
    return model.to(device=target, dtype=dtype)

"""Torch devices named by users: checked when a game, a command or a benchmark is configured.

``torch.device("cuda")`` is accepted on a machine without CUDA and fails only at the first tensor
placed there -- mid-reset, mid-run, after output files were opened. :func:`check_device` fails at
once, naming the device and what this machine offers. :func:`to_host` brings many games' tensors to
the CPU in one transfer.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

#: device types LeakGym runs on
DEVICE_TYPES = ("cpu", "cuda", "mps")


def available_devices() -> list[str]:
    """The devices this machine offers: ``cpu``, ``cuda:0`` ... and ``mps`` where present."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` when this machine has it; ``ValueError`` naming it and the
    available devices otherwise (``cuda`` means the current CUDA device, ``cuda:N`` needs N GPUs)."""
    if isinstance(device, bool) or not isinstance(device, (str, torch.device)):
        raise ValueError(f"device={device!r}; allowed: a device name such as {available_devices()}")  # noqa: TRY004
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device={device!r} is not a torch device name; available here: {available_devices()}") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"device={device!r}: LeakGym runs on {list(DEVICE_TYPES)}; available here: {available_devices()}")
    if dev.type == "cuda" and (not torch.cuda.is_available()
                               or (dev.index is not None and dev.index >= torch.cuda.device_count())):
        raise ValueError(f"device={device!r} is not available on this machine; available here: {available_devices()}")
    if dev.type == "mps" and "mps" not in available_devices():
        raise ValueError(f"device={device!r} is not available on this machine; available here: {available_devices()}")
    return dev


def canonical_device(device: str | torch.device) -> torch.device:
    """``device`` in one spelling per device, for comparisons and records: ``"cuda"`` (the current CUDA
    device) becomes ``cuda:<index>``, ``"cpu:0"`` becomes ``cpu``."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    elif d.type == "cpu":
        d = torch.device("cpu")
    return d


def device_name(device: object) -> object:
    """A recorded or configured device in :func:`canonical_device`'s spelling (``"cuda"`` and ``"cuda:0"``
    are one device) where this machine can read it, else as given (``"cuda"`` needs CUDA to know its
    index; a name from a file may be anything)."""
    try:
        return str(canonical_device(device))  # type: ignore[arg-type]
    except (RuntimeError, AssertionError, TypeError, ValueError):
        return device


def seed_generators(seed: int, device: str | torch.device = "cpu") -> None:
    """Seed what a computation on ``device`` draws from when it is given no generator: the CPU generator,
    and for a CUDA device that device's generator.

    Unlike ``torch.manual_seed`` it leaves every other device's generator alone, so a
    ``torch.random.fork_rng(devices=...)`` block that forks the devices it computes on restores all it
    changed (``torch.manual_seed`` inside ``fork_rng(devices=[])`` re-seeded every GPU for good), and it
    queues no lazy CUDA re-seed (``torch.manual_seed`` formats a stack trace for one on every call where
    CUDA is not initialised: 0.12 ms, more than a LeNet forward pass). The CPU generator's state is the
    one ``torch.manual_seed(seed)`` gives. Other accelerators (MPS) take ``torch.manual_seed``."""
    torch.default_generator.manual_seed(int(seed))
    dev = torch.device(device)
    if dev.type == "cuda":
        with torch.cuda.device(dev):  # this device's generator ("cuda": the current one)
            torch.cuda.manual_seed(int(seed))
    elif dev.type != "cpu":
        torch.manual_seed(int(seed))


def device_argument(text: str) -> str:
    """``argparse`` type of ``--device``: the name, checked by :func:`check_device`."""
    try:
        check_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def to_host(items: Sequence) -> list:
    """``items`` with every tensor that is not on the CPU brought there, the tensors of one device, shape
    and dtype in one transfer (on a GPU one synchronisation for all the games of a vector step, not one
    per game); CPU tensors and other entries (None, lists, ...) as they are."""
    out = list(items)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(out):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            groups.setdefault((t.device, tuple(t.shape), t.dtype), []).append(i)
    for members in groups.values():
        for i, t in zip(members, torch.stack([out[i].detach() for i in members]).cpu().unbind(0)):
            out[i] = t
    return out


def synchronize(device: str | torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing elsewhere. For timing: a host clock read after it
    sees the device's work done."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


__all__ = ["DEVICE_TYPES", "available_devices", "canonical_device", "check_device", "device_argument", "device_name",
           "seed_generators", "synchronize", "to_host"]

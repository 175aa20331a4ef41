"""The torch state a caller owns: the devices it names, and the modes it computes in.

Devices named by users are checked when a game, a command or a benchmark is configured.

``torch.device("cuda")`` is accepted on a machine without CUDA and fails only at the first tensor
placed there -- mid-reset, mid-run, after output files were opened. :func:`check_device` fails at
once, naming the device and what this machine offers. :func:`to_host` brings many games' tensors to
the CPU in one transfer.

**Modes.** A round differentiates through the model (the clients' updates, DCS²'s and CENSOR's searches, an
attack's gradient of a gradient), and every tensor of the library is float32 (``docs/architecture.md``,
Conventions). Both rest on torch state that belongs to the caller and that callers change: an RL evaluation
loop steps an environment under ``torch.no_grad()`` or ``torch.inference_mode()``; scientific code sets
``torch.set_default_dtype(torch.float64)`` or a default device. Under no_grad or inference mode a round
failed (``element 0 of tensors does not require grad``); under a float64 default a game could not be built
(``Input type (float) and bias type (double) should be the same``) and the joint attack engine drew float64
starting images; under a default device the dataset was shuffled there.

The library's entry points -- loading a dataset, building, resetting and playing games
(:class:`leakgym.game.batch.GameBatch`, :func:`leakgym.game.round.play_round`), computing clients' updates
(one game's or N games' in :mod:`leakgym.fl`), applying a defense, preparing a malicious server's model and
running an attack (``reconstruct_all`` too), the reproduction harness, loading a saved policy and training
one -- run under :func:`library_modes` (through :func:`in_library_modes`): autograd on, inference mode off
and float32 as torch's default dtype for the call, the caller's modes back on every way out. A tensor
argument made under ``torch.inference_mode()``, or one in a dict, list, tuple or dataclass argument (N games'
stacked parameters, a client's job), is passed on as a normal copy (torch refuses to save an inference
tensor for backward). A default device the caller set (``torch.set_default_device``, ``with
torch.device(...)``) is the CPU for the call: the library places its tensors on the device a game or a call
names, and builds on the CPU what it moves there (the dataset, index sets).
:func:`leakgym.models.build_model` builds float32 parameters (:func:`library_dtype`) outside inference mode,
and, given no ``device``, on the caller's default device, as torch's modules do (``with
torch.device("meta")`` builds a model's shapes without allocating them). Whatever the caller's modes, a game
plays the trajectory it plays under torch's defaults (``tests/test_torch_modes.py``).

A game copied under inference mode (``copy.deepcopy``) is a normal copy; one unpickled under it is refused
(its tensors are made by the unpickler before LeakGym sees them, and no round could train them).

Not covered: torch's default dtype is process-wide, so another thread that creates tensors without a
dtype while a LeakGym call runs gets float32 for that time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

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


# --------------------------------------------------------------------------------------------------
# The modes a computation runs in
# --------------------------------------------------------------------------------------------------
F = TypeVar("F", bound=Callable)

#: the default dtype LeakGym's tensors have
LIBRARY_DTYPE = torch.float32


@contextlib.contextmanager
def library_modes() -> Iterator[None]:
    """Autograd on, inference mode off, :data:`LIBRARY_DTYPE` as torch's default dtype and no default device
    other than the CPU inside; the caller's modes back after, on every way out (an exception, Ctrl-C)."""
    caller_device = default_device()
    with (torch.inference_mode(False), torch.enable_grad(),
          torch.device("cpu") if caller_device.type != "cpu" else contextlib.nullcontext(), library_dtype()):
        yield


@contextlib.contextmanager
def library_dtype() -> Iterator[None]:
    """:data:`LIBRARY_DTYPE` as torch's default dtype inside; the caller's back after, on every way out."""
    caller_dtype = torch.get_default_dtype()
    if caller_dtype is LIBRARY_DTYPE:
        yield
        return
    torch.set_default_dtype(LIBRARY_DTYPE)
    try:
        yield
    finally:
        torch.set_default_dtype(caller_dtype)


@contextlib.contextmanager
def python_random_kept() -> Iterator[None]:
    """Python's global ``random`` stream as the caller left it, after the block, on every way out. For blocks
    that import third-party modules lazily: ``rich.style`` draws ``random.getrandbits(24)`` when it is first
    imported, and scikit-learn's datasets (the digits) and Stable-Baselines3 import it, so the first digits
    load or policy load of a process moved the caller's stream (found in an audit). LeakGym itself never
    draws from it."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


def default_device() -> torch.device:
    """Where torch's factory functions put a tensor given no device (``torch.get_default_device``, torch >=
    2.3; before it, the CPU)."""
    get = getattr(torch, "get_default_device", None)
    return get() if get is not None else torch.device("cpu")


def _in_library_modes() -> bool:
    """Whether the modes are :func:`library_modes`' already (0.3 us; entering them costs 8 us)."""
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled() or torch.get_default_dtype() is not LIBRARY_DTYPE:
        return False
    # a default device is a torch function mode: with none on the stack, asking for it (4 us) is not needed
    modes = getattr(torch._C, "_len_torch_function_stack", None)
    return (modes is not None and modes() == 0) or default_device().type == "cpu"


#: how deep :func:`in_library_modes` looks for inference tensors in an argument: a tensor, or one in a dict, list,
#: tuple or dataclass argument (N games' stacked parameters, a LocalTraining job), or one level below that (the
#: tensors of a SharedUpdate, the jobs of a list)
INFERENCE_DEPTH = 2


def _inference(value, depth: int = INFERENCE_DEPTH) -> bool:
    """Whether ``value`` is or holds (to ``depth`` containers deep) a tensor made under inference mode."""
    if isinstance(value, torch.Tensor):
        return value.is_inference()
    if depth == 0 or isinstance(value, (str, bytes, int, float)):
        return False
    if isinstance(value, dict):
        return any(_inference(v, depth - 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_inference(v, depth - 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_inference(getattr(value, f.name), depth - 1) for f in dataclasses.fields(value))
    return False


def _normal(value, depth: int = INFERENCE_DEPTH):
    """``value`` with each inference tensor in it (:func:`_inference`) replaced by a copy made outside inference
    mode: one a computation tracked by autograd may use (torch refuses to save an inference tensor for backward,
    or to make it require grad). Containers holding one are copied (a dict, list, tuple or dataclass); the
    rest is passed as it is."""
    if isinstance(value, torch.Tensor):
        if not value.is_inference():
            return value
        with torch.inference_mode(False):
            return value.clone()
    if depth == 0 or not _inference(value, depth):
        return value
    if isinstance(value, dict):
        return {k: _normal(v, depth - 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v, depth - 1) for v in value]
    if isinstance(value, tuple):
        items = [_normal(v, depth - 1) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return dataclasses.replace(value, **{f.name: _normal(getattr(value, f.name), depth - 1)
                                         for f in dataclasses.fields(value) if f.init})


def in_library_modes(fn: F) -> F:
    """``fn`` run under :func:`library_modes` (a decorator for the library's entry points); a tensor made under
    ``torch.inference_mode()`` in an argument (to :data:`INFERENCE_DEPTH` containers deep) is passed as a
    normal copy."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if any(_inference(a) for a in (*args, *kwargs.values())):  # (rare: nothing is copied otherwise)
            args, kwargs = tuple(_normal(a) for a in args), {k: _normal(v) for k, v in kwargs.items()}
        if _in_library_modes():
            return fn(*args, **kwargs)
        with library_modes():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


__all__ = ["DEVICE_TYPES", "LIBRARY_DTYPE", "available_devices", "canonical_device", "check_device", "default_device",
           "device_argument", "device_name", "in_library_modes", "library_dtype", "library_modes",
           "python_random_kept", "seed_generators", "synchronize", "to_host"]

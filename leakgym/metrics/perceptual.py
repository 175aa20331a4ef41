"""LPIPS (Zhang et al., CVPR 2018) through the ``lpips`` package, strictly offline.

LPIPS compares deep features of a pretrained backbone (AlexNet or VGG-16 from torchvision) with
linear calibration layers learned on human judgements. The calibration layers ship inside the
``lpips`` package; the backbone weights are torchvision's ImageNet checkpoints, which this library
never downloads: the user points at a copy they have. Before building the metric we look, in order:

1. ``$LEAKGYM_LPIPS_WEIGHTS`` (:data:`LPIPS_WEIGHTS_ENV`), if set: a checkpoint file (used for the
   backbone asked for, ``alex`` by default, and refused if it is not that backbone's checkpoint) or a
   folder holding the file under torchvision's name (below). A value naming nothing raises
   ``ValueError``.
2. the file torchvision itself would use, in torch's hub cache:

   * ``net="alex"``: ``$TORCH_HOME/hub/checkpoints/alexnet-owt-7be5be79.pth``
   * ``net="vgg"``: ``$TORCH_HOME/hub/checkpoints/vgg16-397923af.pth``

   (``torch.hub.get_dir()/checkpoints``; ``TORCH_HOME`` defaults to ``~/.cache/torch``).

If a file is found, its SHA-256 must start with the digits in its name (torch.hub's naming convention, which
torchvision's downloads check too; :data:`LPIPS_SHA256_PREFIXES`): any other file under that name --
an untrained AlexNet saved there, a truncated download -- is refused with a ``ValueError`` naming both
digests, as soon as anything asks whether LPIPS is available (:func:`lpips_available`: an environment
being made), once per process and file version. The LPIPS module is then built with a *randomly initialised* backbone (so nothing is fetched)
and the checkpoint's ``features.*`` tensors are loaded into it with a strict key check, so LPIPS is
never computed on a random backbone. If it is absent, :func:`lpips` returns NaN for every image and
emits one :class:`LPIPSWeightsMissingWarning` per backbone and process naming the file and where to
put it. Where the weights are present, the environments report LPIPS beside SSIM and PSNR
(``leakage_lpips`` in the step infos and the payoff files, ``leakgym/game/round.py``); where they are not, no
LPIPS number is reported at all.

Input preparation: unit images are clamped to ``[0, data_range]`` and mapped to ``[-1, 1]`` (what
``lpips.LPIPS`` expects with ``normalize=False``); grayscale images are repeated to 3 channels; images
whose shorter side is below ``min_size`` (default 32) are bilinearly upsampled so that it equals
``min_size``: AlexNet's stride-4 stem and pooling reduce 16x16 inputs to an empty map. LPIPS values of
upsampled tiny images are comparable among themselves, not with LPIPS values reported at 32x32 or
larger.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leakgym.metrics.functional import check_image_pair

LPIPS_BACKBONE_FILES: dict[str, str] = {
    "alex": "alexnet-owt-7be5be79.pth",  # torchvision AlexNet_Weights.IMAGENET1K_V1
    "vgg": "vgg16-397923af.pth",  # torchvision VGG16_Weights.IMAGENET1K_V1
}
"""LPIPS backbone -> file name of torchvision's pretrained checkpoint."""

LPIPS_SHA256_PREFIXES: dict[str, str] = {"alex": "7be5be79", "vgg": "397923af"}
"""LPIPS backbone -> the start of its checkpoint's SHA-256 (the digits in the file name)."""

DEFAULT_LPIPS_MIN_SIZE = 32

LPIPS_WEIGHTS_ENV = "LEAKGYM_LPIPS_WEIGHTS"
"""Environment variable naming the user's backbone checkpoint (a file) or a folder holding it."""


class LPIPSWeightsMissingWarning(UserWarning):
    """The pretrained LPIPS backbone checkpoint is not on disk; LPIPS values are NaN."""


_WARNED: set[str] = set()
_MODELS: dict[tuple[str, str, str], nn.Module] = {}


def _hub_path(net: str) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_BACKBONE_FILES[net]


def lpips_weights_path(net: str = "alex") -> Path:
    """The checkpoint LPIPS backbone ``net`` is built from: ``$LEAKGYM_LPIPS_WEIGHTS`` (a file, or the
    torchvision file name inside a folder) if it holds one, else torch's hub cache (may not exist).

    ``ValueError`` if ``$LEAKGYM_LPIPS_WEIGHTS`` is set to a path that does not exist.
    """
    if net not in LPIPS_BACKBONE_FILES:
        raise ValueError(f"lpips net={net!r} is not supported; allowed: {', '.join(LPIPS_BACKBONE_FILES)}")
    given = os.environ.get(LPIPS_WEIGHTS_ENV)
    if given:
        path = Path(given).expanduser()
        if path.is_file():
            return path
        if path.is_dir():
            if (path / LPIPS_BACKBONE_FILES[net]).is_file():
                return path / LPIPS_BACKBONE_FILES[net]
        else:
            raise ValueError(f"{LPIPS_WEIGHTS_ENV}={given!r}: no such file or folder; point it at torchvision's "
                             f"{LPIPS_BACKBONE_FILES[net]} or a folder holding it (or unset it)")
    return _hub_path(net)


def lpips_available(net: str = "alex") -> bool:
    """True if torchvision's backbone checkpoint for ``net`` is on disk where LPIPS looks; a file there that is
    not that checkpoint (its SHA-256, :func:`_check_digest`, once per process and file version) is a
    ``ValueError`` naming it, here (found in an audit: an environment accepted such a file when it was made
    and failed on its first step)."""
    path = lpips_weights_path(net)
    if not path.is_file():
        return False
    _check_digest(net, path)
    return True


def lpips_status(net: str = "alex") -> str:
    """One line saying whether LPIPS is reported and from which file, or why not (no weights: where to put
    them; a file that is not torchvision's checkpoint: why it is refused)."""
    path = lpips_weights_path(net)
    if path.is_file():
        try:
            _check_digest(net, path)
        except ValueError as exc:
            return f"LPIPS ({net}) is not reported: {exc}"
        return f"LPIPS ({net}) is reported, from {path}"
    return (f"LPIPS ({net}) is not reported: no backbone weights. Set {LPIPS_WEIGHTS_ENV} to torchvision's "
            f"{LPIPS_BACKBONE_FILES[net]} (or a folder holding it), or copy the file to {path.parent}/")


#: files whose digest :func:`_check_digest` accepted: ``(net, path, size, mtime_ns, expected prefix)``
_VERIFIED: set[tuple[str, str, int, int, str]] = set()


def _check_digest(net: str, path: Path) -> None:
    """``ValueError`` unless the file's SHA-256 starts with :data:`LPIPS_SHA256_PREFIXES` ``[net]``; a file
    accepted once is not hashed again while its size and modification time stay."""
    stat = path.stat()
    key = (net, str(path), stat.st_size, stat.st_mtime_ns, LPIPS_SHA256_PREFIXES[net])
    if key in _VERIFIED:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    want, got = LPIPS_SHA256_PREFIXES[net], digest.hexdigest()
    if not got.startswith(want):
        others = [n for n, prefix in LPIPS_SHA256_PREFIXES.items() if n != net and got.startswith(prefix)]
        hint = (f" (it is the {others[0]} checkpoint; {LPIPS_WEIGHTS_ENV} naming a file gives the backbone asked "
                "for, alex by default: name a folder holding both files instead)") if others else ""
        raise ValueError(
            f"{path} is not torchvision's pretrained {net} checkpoint: its SHA-256 is {got[:16]}..., expected "
            f"{want}... (the digits in its name). LPIPS is never computed with other weights; replace the file "
            f"with torchvision's download{hint}"
        )
    _VERIFIED.add(key)


def _build_lpips(net: str, path: Path) -> nn.Module:
    import lpips as lpips_pkg  # the third-party package, imported lazily (heavy)

    _check_digest(net, path)

    with warnings.catch_warnings():
        # torchvision's deprecation notice for the ``pretrained=`` argument the lpips package uses.
        warnings.simplefilter("ignore", UserWarning)
        model = lpips_pkg.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False)
    try:  # weights_only: tensors and containers only, no object is un-pickled
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"{path} is not a readable torch checkpoint ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict):
        kind = type(state).__name__  # a user's file: one ValueError naming it (not a TypeError)
        raise ValueError(f"{path} is not a torchvision {net} checkpoint: it holds a {kind}, not a state dict")  # noqa: TRY004
    mapped = {}
    for key in model.net.state_dict():  # e.g. "slice2.3.weight" <- torchvision "features.3.weight"
        source = "features." + key.split(".", 1)[1]
        if source not in state:
            raise ValueError(f"{path} is not a torchvision {net} checkpoint: key {source!r} is missing")
        mapped[key] = state[source]
    try:
        model.net.load_state_dict(mapped, strict=True)
    except RuntimeError as exc:  # a tensor of the wrong shape
        first = str(exc).strip().splitlines()[-1].strip()
        raise ValueError(f"{path} is not a torchvision {net} checkpoint: {first}") from None
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _get_lpips(net: str, device: torch.device) -> nn.Module | None:
    path = lpips_weights_path(net)
    if not path.is_file():
        if net not in _WARNED:
            _WARNED.add(net)
            warnings.warn(
                f"LPIPS ({net}) is unavailable: the pretrained torchvision backbone weights are missing. "
                f"Set {LPIPS_WEIGHTS_ENV} to the file {LPIPS_BACKBONE_FILES[net]} (torchvision's ImageNet "
                f"checkpoint) or a folder holding it, or copy it to {path.parent}/ (torch.hub checkpoints dir; "
                "set TORCH_HOME to change it). LPIPS values are NaN and not reported until then.",
                LPIPSWeightsMissingWarning,
                stacklevel=3,
            )
        return None
    key = (net, str(path), str(device))
    if key not in _MODELS:
        _MODELS[key] = _build_lpips(net, path).to(device)
    return _MODELS[key]


def lpips(a: Tensor, b: Tensor, *, net: str = "alex", data_range: float = 1.0,
          min_size: int = DEFAULT_LPIPS_MIN_SIZE) -> Tensor:
    """Per-image LPIPS distance ``(N,)`` (lower is better); NaN if the backbone weights are missing."""
    a, b = check_image_pair(a, b, data_range)
    if net not in LPIPS_BACKBONE_FILES:
        raise ValueError(f"lpips net={net!r} is not supported; allowed: {', '.join(LPIPS_BACKBONE_FILES)}")
    if not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"min_size={min_size!r} must be a positive int")
    channels = a.shape[1]
    if channels not in (1, 3):
        raise ValueError(f"LPIPS needs 1- or 3-channel images, got {channels} channels")
    model = _get_lpips(net, a.device)
    if model is None:
        return torch.full((a.shape[0],), float("nan"), dtype=a.dtype, device=a.device)

    def prepare(x: Tensor) -> Tensor:
        x = x.float() * (2.0 / data_range) - 1.0
        if channels == 1:
            x = x.repeat(1, 3, 1, 1)
        h, w = x.shape[-2:]
        if min(h, w) < min_size:
            scale = min_size / min(h, w)
            size = (max(min_size, round(h * scale)), max(min_size, round(w * scale)))
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return x

    with torch.no_grad():
        dist = model(prepare(a), prepare(b))
    return dist.flatten().to(a.dtype)

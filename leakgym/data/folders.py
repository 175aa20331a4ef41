"""Image files on disk: finding them, reading their headers, decoding them to unit images.

Shared by the user's own image folders (:mod:`leakgym.data.custom`) and the papers' image datasets
(:mod:`leakgym.data.imagesets`). Images are decoded with Pillow (a dependency of torchvision).

* :func:`image_files` lists a folder's images (by suffix, recursively, hidden files skipped) in
  sorted order, so a folder always gives the same list. Other files are ignored (broken links among
  them); a broken link named as an image is refused, naming it.
* :func:`image_header` reads only an image's header: its channel count (from the pixel mode) and size.
* :func:`decode_images` decodes a list of images into one float32 tensor ``(N, C, S, S)`` in ``[0, 1]``:
  each image is centre-cropped to a square on its shorter side, then resized to ``S x S`` with the
  antialiased bilinear filter of :func:`leakgym.data.images.resize_images` (torchvision's
  ``Resize(S)`` + ``CenterCrop(S)`` up to the order of crop and resize), and rounded to 8 bits. The
  memory the result needs is checked against :data:`MAX_DATASET_BYTES` before anything is decoded.

A file that cannot be decoded raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from leakgym.data.images import resize_images

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_DATASET_BYTES",
    "check_dataset_bytes",
    "class_folders",
    "decode_image",
    "decode_images",
    "image_files",
    "image_header",
    "tree_fingerprint",
]

#: file suffixes (lower case) taken as images
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm")

#: Pillow pixel mode -> channels LeakGym gives the image (alpha dropped; palettes and CMYK/YCbCr as RGB)
_MODE_CHANNELS = {"1": 1, "L": 1, "LA": 1, "RGB": 3, "RGBA": 3, "P": 3, "CMYK": 3, "YCbCr": 3}

#: Upper bound on a dataset held in memory as float32 unit images (train + test). A game normalises a
#: second copy (envs/shared_data.py), so the process needs about twice this.
MAX_DATASET_BYTES = 16 * 2**30


def image_files(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively; hidden files and folders skipped), sorted by path.

    Other files are ignored, broken links among them; a link named as an image whose target is missing
    is refused with a ``ValueError`` naming it (it would fail to decode, after the other images' headers
    were read; found in an audit)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [Path(dirpath) / f for f in filenames
                  if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES]
    for path in found:
        if not path.exists():  # (os.walk lists a broken link as a file; exists() follows it)
            if not path.is_symlink():
                raise ValueError(f"{path}: removed while {folder} was read")
            raise ValueError(f"{path}: a broken link (to {os.readlink(path)!r}, which does not exist or loops); "
                             "restore its target or remove the link")
    return sorted(found)


def tree_fingerprint(path: Path) -> str:
    """SHA-256 over every file's relative path, size and modification time under ``path`` (or of the file
    ``path``): what caches of data read from ``path`` are keyed by, so that a changed copy is read again.

    Linked folders are followed, as the readers follow them (``root/train`` or a class folder may be a link),
    and each folder's resolved path counts too, so a link pointed at another copy is another tree (found in an
    audit: the walk did not enter linked folders, and a relinked or edited copy behind one kept its cache); a
    folder reached again through a link loop is counted once."""
    path = Path(path)
    digest = hashlib.sha256(str(path.resolve()).encode())
    if path.is_file():
        stat = path.stat()
        digest.update(f"{stat.st_size}\0{stat.st_mtime_ns}".encode())
        return digest.hexdigest()
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        relative = os.path.relpath(dirpath, path)
        digest.update(f"{relative}\0{real}\n".encode())
        for name in sorted(filenames):
            digest.update(f"{relative}/{name}\0{_file_key(os.path.join(dirpath, name))}\n".encode())
    return digest.hexdigest()


def _file_key(path: str) -> str:
    """Size and modification time of ``path``, followed through links; of the link itself where it is broken
    (one broken link anywhere, a ``notes.txt`` among the images too, made every read of the folder fail with
    ``FileNotFoundError``: found in an audit; the readers ignore it or name it, :func:`image_files`)."""
    try:
        stat = os.stat(path)
    except OSError:
        try:
            stat = os.lstat(path)
        except OSError:  # removed since the folder was listed
            return "gone"
        return f"link\0{stat.st_size}\0{stat.st_mtime_ns}"
    return f"{stat.st_size}\0{stat.st_mtime_ns}"


def class_folders(folder: Path) -> list[Path]:
    """The sub-folders of ``folder`` (hidden ones skipped), sorted by name: ImageFolder's classes."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _open(path: Path):
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(path)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from None


def _channels(path: Path, mode: str) -> int:
    if mode not in _MODE_CHANNELS:
        raise ValueError(f"{path}: pixel mode {mode!r} is not supported; allowed: {', '.join(_MODE_CHANNELS)}")
    return _MODE_CHANNELS[mode]


def image_header(path: Path) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image, from its header (the pixels are not decoded)."""
    with _open(path) as image:
        width, height = image.size
        return _channels(path, image.mode), height, width


def decode_image(path: Path, channels: int) -> np.ndarray:
    """The pixels of one image as uint8 ``(H, W, channels)`` (grey for 1 channel, RGB for 3)."""
    from PIL import Image

    with _open(path) as image:
        _channels(path, image.mode)
        try:
            pixels = np.array(image.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)  # writable copy
        except (OSError, ValueError, Image.DecompressionBombError) as exc:  # truncated or damaged data
            raise ValueError(f"{path}: truncated or damaged image ({type(exc).__name__}: {exc})") from None
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels)


def check_dataset_bytes(where: str, count: int, channels: int, size: int) -> None:
    """``ValueError`` naming ``where`` if ``count`` float32 images of ``channels x size x size`` exceed
    :data:`MAX_DATASET_BYTES`."""
    need = count * channels * size * size * 4
    if need > MAX_DATASET_BYTES:
        raise ValueError(
            f"{where}: {count} images of {channels}x{size}x{size} take {need / 2**30:.1f} GiB as float32, more "
            f"than the {MAX_DATASET_BYTES / 2**30:.0f} GiB LeakGym holds in memory; use a subset of the images "
            "or a smaller image_size"
        )


def center_square(pixels: np.ndarray) -> np.ndarray:
    """The centred square crop ``(s, s, C)`` of ``(H, W, C)`` pixels, ``s = min(H, W)``."""
    height, width = pixels.shape[:2]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    return pixels[top:top + side, left:left + side]


def to_unit(pixels: np.ndarray, size: int) -> Tensor:
    """uint8 ``(H, W, C)`` -> float32 ``(C, size, size)`` in ``[0, 1]``: centre square, resize, then rounded
    to 8 bits (``k / 255``, as a resized image saved to disk would be), so that a copy cached as uint8
    (:func:`leakgym.data.imagesets.read_cached`) gives back exactly these values."""
    square = torch.from_numpy(np.ascontiguousarray(center_square(pixels))).permute(2, 0, 1)
    unit = square.to(torch.float32).div_(255.0).unsqueeze(0)
    return resize_images(unit, size)[0].mul_(255.0).round_().to(torch.uint8).to(torch.float32).div_(255.0)


def decode_images(paths: Sequence[Path], channels: int, size: int, *, where: str) -> Tensor:
    """Decode ``paths`` into float32 ``(N, channels, size, size)`` unit images (see module docstring).

    ``where`` names the dataset in the memory error raised before decoding starts.
    """
    check_dataset_bytes(where, len(paths), channels, size)
    out = torch.empty((len(paths), channels, size, size), dtype=torch.float32)
    for i, path in enumerate(paths):
        out[i] = to_unit(decode_image(path, channels), size)
    return out

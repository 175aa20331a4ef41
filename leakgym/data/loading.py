"""``load_dataset``: one entry point for every dataset, returning unit-image tensors.

A path (an image folder or an ``.npz`` file) in place of a name loads the user's own data
(:mod:`leakgym.data.custom`).

``digits`` comes from scikit-learn and always works. Every other dataset is read from its official
on-disk format (see :mod:`leakgym.data.sources` for the directories searched); if no complete copy is
found and ``download=True`` the official files are downloaded into the data root and verified
against their MD5 digests before use. When that is impossible a single
:class:`DatasetUnavailableError` says what was looked for, where, and how to provide it. LeakGym never
substitutes another dataset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from leakgym.data.catalog import check_image_size, dataset_info, dataset_spec
from leakgym.data.digits import load_digits_split
from leakgym.data.download import DownloadError
from leakgym.data.images import resize_images, uint8_to_unit
from leakgym.data.imagesets import IMAGE_SOURCES, SizedSource, read_cached
from leakgym.data.sources import SOURCES, DiskSource
from leakgym.data.spec import DatasetSpec
from leakgym.devices import in_library_modes, python_random_kept

__all__ = ["DEFAULT_DATA_ROOT", "Dataset", "DatasetUnavailableError", "data_root", "disk_source", "load_dataset"]

#: Data root used when neither ``root=`` nor ``$LEAKGYM_DATA`` is given.
DEFAULT_DATA_ROOT = Path("~/.cache/leakgym")


class DatasetUnavailableError(RuntimeError):
    """A dataset is not on disk and could not be downloaded.

    Attributes:
        name: the dataset requested.
        searched: every directory that was looked in.
        reason: why no download happened or why it failed.
        message: the full explanation (also ``str(error)``).
    """

    def __init__(self, name: str, searched: list[tuple[Path, list[str]]], reason: str, hint: str,
                 downloadable: bool = True) -> None:
        super().__init__(name, searched, reason, hint, downloadable)  # args kept whole so the error pickles
        lines = [f"dataset {name!r} is not available.", "Looked in:"]
        for directory, missing in searched:
            state = "directory does not exist" if not directory.is_dir() else "missing " + ", ".join(missing)
            lines.append(f"  - {directory} ({state})")
        lines.append(reason)
        # (a dataset provided by hand only is not offered download=True, which cannot fetch it: found in an audit)
        fetch = (f"; or call load_dataset({name!r}, download=True) on a machine with internet access"
                 if downloadable else " (LeakGym does not download it)")
        lines.append(f"To provide it: {hint}{fetch}; or set $LEAKGYM_DATA / pass root= to point at a directory "
                     "that holds it.")
        lines.append("The bundled 'digits' dataset works offline: load_dataset('digits').")
        self.message = "\n".join(lines)
        self.name = name
        self.searched = [directory for directory, _ in searched]
        self.reason = reason

    def __str__(self) -> str:
        return self.message


@dataclass
class Dataset:
    """A dataset in memory: unit float32 images ``(N, C, H, W)`` in ``[0, 1]`` and int64 labels ``(N,)``."""

    spec: DatasetSpec
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor

    def __post_init__(self) -> None:
        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if x.dtype != torch.float32 or tuple(x.shape[1:]) != self.spec.shape:
                raise ValueError(
                    f"Dataset {self.spec.name!r}: {split}_x must be float32 (N, *{self.spec.shape}), "
                    f"got {x.dtype} {tuple(x.shape)}"
                )
            if y.dtype != torch.int64 or tuple(y.shape) != (x.shape[0],):
                raise ValueError(
                    f"Dataset {self.spec.name!r}: {split}_y must be int64 ({x.shape[0]},), "
                    f"got {y.dtype} {tuple(y.shape)}"
                )
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.spec.num_classes):
                raise ValueError(
                    f"Dataset {self.spec.name!r}: {split} labels span [{int(y.min())}, {int(y.max())}], "
                    f"allowed [0, {self.spec.num_classes - 1}]"
                )


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root: ``root`` if given, else ``$LEAKGYM_DATA`` if set, else ``~/.cache/leakgym``."""
    if root is None:
        root = os.environ.get("LEAKGYM_DATA") or DEFAULT_DATA_ROOT
    return Path(root).expanduser()



def disk_source(name: str) -> DiskSource | None:
    """The on-disk source of a named dataset that is looked for under the data root and downloaded when
    it can be (:data:`~leakgym.data.sources.SOURCES`, :data:`~leakgym.data.imagesets.IMAGE_SOURCES`);
    None for the bundled digits and for a user's dataset path."""
    return SOURCES.get(name) or IMAGE_SOURCES.get(name)

@in_library_modes
@python_random_kept()  # (scikit-learn's digits import rich.style, which draws from it)
def load_dataset(
    name: str,
    *,
    image_size: int | None = None,
    root: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> Dataset:
    """Load ``name`` (one of ``DATASET_NAMES``, or a path) as unit images, resized to ``image_size`` if given.

    Args:
        name: one of ``DATASET_NAMES`` (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``,
            ``svhn``, ``celeba``, ``tiny-imagenet``, ``imagenet``, ``imagenette``), or a path to an image
            folder or an ``.npz`` file (:mod:`leakgym.data.custom`).
        image_size: side length of the returned images (antialiased bilinear resize); ``None`` keeps
            the dataset's default (16 for digits, 32 for CelebA, 224 for Imagenette, native otherwise).
        root: data root; defaults to ``$LEAKGYM_DATA`` or ``~/.cache/leakgym``. Ignored for digits and paths.
        download: fetch the official files into the root if no complete copy is found.

    Raises:
        ValueError: unknown ``name`` or bad ``image_size``.
        DatasetUnavailableError: not found on disk and not downloadable.
    """
    check_image_size(image_size)
    info = dataset_info(name)
    spec = dataset_spec(name, image_size)
    if name == "digits":
        return Dataset(spec, *load_digits_split(spec.image_size))
    source = disk_source(name)
    if source is None:  # a path (dataset_info resolved and read it)
        return _user_dataset(spec, info.name)

    base = data_root(root)
    searched = [(d, source.missing_files(d)) for d in source.candidates(base)]
    directory = next((d for d, missing in searched if not missing), None)
    if directory is None:
        hint, fetchable = source.layout_hint(base), source.downloadable
        if not download:
            raise DatasetUnavailableError(name, searched, "Download disabled (download=False).", hint, fetchable)
        try:
            directory = source.download(base)
        except DownloadError as error:
            raise DatasetUnavailableError(name, searched, f"Download failed: {error}", hint, fetchable) from error
        except OSError as error:  # e.g. the root is not writable, extraction failed
            raise DatasetUnavailableError(
                name, searched, f"Download failed: {type(error).__name__}: {error}", hint, fetchable
            ) from error

    if isinstance(source, SizedSource):  # decoded straight to the requested size (JPEG folders)
        return Dataset(spec, *read_cached(source, directory, spec.image_size, base))
    train_x, train_y, test_x, test_y = source.read(directory)
    train_x, test_x = uint8_to_unit(train_x), uint8_to_unit(test_x)
    if train_x.shape[1] != info.channels:
        raise ValueError(f"{directory}: images have {train_x.shape[1]} channels, {name} has {info.channels}")
    return Dataset(
        spec,
        resize_images(train_x, spec.image_size),
        torch.from_numpy(train_y),
        resize_images(test_x, spec.image_size),
        torch.from_numpy(test_y),
    )


def _user_dataset(spec: DatasetSpec, path: str) -> Dataset:
    """The user's folder or ``.npz`` at ``path`` as unit images of ``spec``'s size (centre square, resize)."""
    from leakgym.data.custom import user_data
    from leakgym.data.folders import center_square, check_dataset_bytes

    data = user_data(path)
    check_dataset_bytes(path, len(data.train_y) + len(data.test_y), data.channels, spec.image_size)

    def unit(x):  # (N, C, H, W) uint8 -> centred square -> resized unit images
        square = center_square(x.transpose(2, 3, 0, 1)).transpose(2, 3, 0, 1)
        return resize_images(uint8_to_unit(square), spec.image_size)

    return Dataset(spec, unit(data.train_x), torch.from_numpy(data.train_y), unit(data.test_x),
                   torch.from_numpy(data.test_y))

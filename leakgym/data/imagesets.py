"""The papers' datasets in their published formats: SVHN, CelebA, TinyImageNet, ImageNet, Imagenette.

Each is looked for under ``<root>/<name>/`` (``<root>`` is ``root=``, else ``$LEAKGYM_DATA``, else
``~/.cache/leakgym``; :mod:`leakgym.data.sources` describes the mechanism):

============== ============================================================================================
dataset        files (in ``<root>/<name>/``)                             how they get there
============== ============================================================================================
svhn           ``train_32x32.mat``, ``test_32x32.mat`` (MATLAB v5; ``X``   downloaded from ufldl.stanford.edu,
               ``(32, 32, 3, N)`` uint8, ``y`` ``(N, 1)`` in 1..10,        MD5-checked (torchvision's digests)
               10 = digit 0; read with ``scipy.io.loadmat``)
celeba         ``img_align_celeba/*.jpg``, ``list_attr_celeba.txt``,       by hand (Google Drive, the
               ``list_eval_partition.txt``                                 publisher's terms)
tiny-imagenet  ``wnids.txt``, ``train/<wnid>/images/*.JPEG``,              by hand; also found in
               ``val/val_annotations.txt``, ``val/images/*.JPEG``          ``<root>/tiny-imagenet/tiny-imagenet-200``
imagenet       ``train/<wnid>/*.JPEG``, ``val/<wnid>/*.JPEG`` (ILSVRC2012   by hand (ImageNet's terms)
               class folders, all 1000 or a subset)
imagenette     ``imagenette2-320/{train,val}/<wnid>/*.JPEG`` (or           ``imagenette2-320.tgz`` downloaded
               ``imagenette2``/``imagenette2-160``, or train/val directly)  from fast.ai's S3, MD5-checked
============== ============================================================================================

Labels and splits:

* SVHN: the published train and test files (``extra_32x32.mat`` is not used).
* CelebA: label 1 if the ``Male`` attribute is 1, else 0 (the gender label DCS² uses, "we ... use the
  attribute gender as the target label in CelebA to perform binary classification", DCS² §Experiments);
  training images are partition 0 of ``list_eval_partition.txt``, test images partition 2 (1 is
  CelebA's validation split, unused).
* TinyImageNet: classes in the order of ``wnids.txt``; test images are the labelled validation set
  (``val/val_annotations.txt``; TinyImageNet's test set has no labels).
* ImageNet: classes are the ``train/`` folder names in sorted order (torchvision's ``ImageFolder``
  numbering; for all 1000 classes the standard one). A subset of class folders is accepted; its
  labels are then the positions among the folders present, the model keeps ImageNet's 1000 outputs.
  ``val/`` must hold class folders too (e.g. made by the widely used ``valprep.sh``).
* Imagenette: the ``train/`` and ``val/`` class folders, classes in sorted order.

The JPEG datasets have images of many shapes: each image is centre-cropped to a square and resized to
``image_size`` as it is decoded (:func:`leakgym.data.folders.decode_images`), and the memory the result
needs is checked first (ImageNet's full training set at 224 px is refused: give a subset).

Decoding is slow (measured: 1.3 ms per 178x218 JPEG to 32x32 on one CPU core, 4 minutes for CelebA), so
:func:`read_cached` keeps the decoded images, as uint8 in an ``.npz`` read with ``allow_pickle=False``,
under ``<root>/.decoded/<name>-<size>px-<fingerprint>.npz``; the fingerprint covers every file's path,
size and modification time, so a changed copy is decoded again. A cache that cannot be written (a
read-only root) is skipped; one that cannot be read, or whose arrays are not what is written there (uint8
images of the dataset's channels and the requested size, int64 labels in the dataset's range, one per
image), is decoded again and replaced.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from leakgym.data.catalog import dataset_info
from leakgym.data.download import RemoteFile, download_and_extract, download_file
from leakgym.data.folders import (
    check_dataset_bytes,
    class_folders,
    decode_images,
    image_files,
    tree_fingerprint,
)
from leakgym.data.sources import DiskSource, RawSplits
from leakgym.files import npz_arrays

__all__ = ["DECODED_FOLDER", "IMAGE_SOURCES", "SizedSource", "SizedSplits", "read_cached"]

#: folder of the data root that holds decoded copies of the JPEG datasets (:func:`read_cached`)
DECODED_FOLDER = ".decoded"
_SPLIT_KEYS = ("train_x", "train_y", "test_x", "test_y")

#: ``(train_x float32 (N, C, S, S) in [0, 1], train_y int64, test_x, test_y)``
SizedSplits = tuple[Tensor, Tensor, Tensor, Tensor]


class SizedSource(DiskSource):
    """A dataset whose images are decoded straight to the requested size (JPEG folders of mixed shapes)."""

    native_size: int

    @abstractmethod
    def read_sized(self, directory: Path, image_size: int) -> SizedSplits:
        """Decode a complete copy in ``directory`` to unit images of ``image_size x image_size``."""

    def read(self, directory: Path) -> RawSplits:
        train_x, train_y, test_x, test_y = self.read_sized(directory, self.native_size)
        return (_to_uint8(train_x), train_y.numpy(), _to_uint8(test_x), test_y.numpy())


def read_cached(source: SizedSource, directory: Path, image_size: int, root: Path) -> SizedSplits:
    """``source.read_sized(directory, image_size)``, through the decoded copy under ``root`` (module docstring).

    The values are the same either way: decoding rounds to 8 bits, the copy stores those 8 bits.
    """
    cache = root / DECODED_FOLDER / f"{source.name}-{image_size}px-{tree_fingerprint(directory)[:20]}.npz"
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as stored:
                train_x, train_y, test_x, test_y = _checked_copy(source, image_size, stored)
            return (torch.from_numpy(train_x).to(torch.float32).div_(255.0), torch.from_numpy(train_y),
                    torch.from_numpy(test_x).to(torch.float32).div_(255.0), torch.from_numpy(test_y))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            cache.unlink(missing_ok=True)  # damaged or not what is written below: decoded again
    splits = source.read_sized(directory, image_size)
    # A read-only root or a full disk: no copy, the images were decoded all the same.
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f"{cache.stem}.{os.getpid()}.part.npz")
        arrays = dict(zip(_SPLIT_KEYS, splits))
        for key in ("train_x", "test_x"):
            arrays[key] = _to_uint8(arrays[key])
        try:
            np.savez(partial, **{k: v if isinstance(v, np.ndarray) else v.numpy() for k, v in arrays.items()})
            os.replace(partial, cache)
        finally:
            partial.unlink(missing_ok=True)
    return splits


def _checked_copy(source: SizedSource, image_size: int, stored) -> tuple[np.ndarray, ...]:
    """The four arrays of an open decoded copy; ``ValueError`` unless they are what :func:`read_cached` writes:
    uint8 images ``(N, C, S, S)`` (``N >= 1``, the dataset's channels, ``S = image_size``) and int64 labels
    ``(N,)`` in ``[0, num_classes)``. A float32 ``train_x`` in ``[0, 1]`` was read as nearly black images, one of
    another size went on at that size (found in an audit)."""
    info = dataset_info(source.name)
    arrays = npz_arrays(stored, _SPLIT_KEYS)
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if x.dtype != np.uint8 or x.shape[1:] != (info.channels, image_size, image_size) or not len(x):
            raise ValueError(f"{split}_x is {x.dtype} {x.shape}; written: uint8 (N >= 1, {info.channels}, "
                             f"{image_size}, {image_size})")
        if y.dtype != np.int64 or y.shape != (len(x),):
            raise ValueError(f"{split}_y is {y.dtype} {y.shape}; written: int64 ({len(x)},)")
        if not 0 <= int(y.min()) <= int(y.max()) < info.num_classes:
            raise ValueError(f"{split}_y holds labels in [{int(y.min())}, {int(y.max())}]; written: "
                             f"[0, {info.num_classes - 1}]")
    return tuple(arrays[k] for k in _SPLIT_KEYS)


def _to_uint8(x: Tensor) -> np.ndarray:
    return (x * 255.0).round_().to(torch.uint8).numpy()


def _labels(values: list[int]) -> Tensor:
    return torch.tensor(values, dtype=torch.int64)


# -- SVHN ------------------------------------------------------------------------------------------
def read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One SVHN ``*_32x32.mat``: ``(images uint8 (N, 3, 32, 32), labels int64 (N,) in 0..9)``.

    ``X`` is ``(32, 32, 3, N)`` and ``y`` ``(N, 1)`` with labels 1..10 where 10 stands for the digit 0
    (the format torchvision's ``SVHN`` reads; it maps 10 to 0 too). ``scipy.io.loadmat`` reads MATLAB
    v5 data and runs no code. ``ValueError`` naming the file for anything else.
    """
    import scipy.io
    from scipy.io.matlab import MatReadError

    try:
        mat = scipy.io.loadmat(path, variable_names=["X", "y"])
    # (scipy raises NotImplementedError for MATLAB v7.3 files, which are HDF5: not this format)
    except (MatReadError, ValueError, TypeError, OSError, NotImplementedError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable MATLAB v5 file ({type(exc).__name__}: {exc})") from None
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: an SVHN .mat file holds 'X' and 'y'; found {sorted(k for k in mat if k[0] != '_')}")
    x, y = mat["X"], np.asarray(mat["y"])
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise ValueError(f"{path}: 'X' must be uint8 (32, 32, 3, N), got {x.dtype} {x.shape}")
    if x.shape[3] == 0:  # (as an empty CIFAR batch: it loaded, and failed later naming no file)
        raise ValueError(f"{path}: 'X' holds 0 images (shape {x.shape}); a split needs at least 1 image of 32x32x3")
    y = y.reshape(-1)
    if y.shape != (x.shape[3],):
        raise ValueError(f"{path}: 'y' has {y.size} labels for {x.shape[3]} images")
    if y.dtype == bool or not np.issubdtype(y.dtype, np.number) or not np.all(np.isin(y, np.arange(1, 11))):
        bad = y[~np.isin(y, np.arange(1, 11))][:1] if np.issubdtype(y.dtype, np.number) else y[:1]
        raise ValueError(f"{path}: labels out of range: 'y' holds {bad.tolist()}; allowed 1..10 (10 = digit 0)")
    labels = y.astype(np.int64) % 10  # 10 -> 0
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), labels


@dataclass(frozen=True)
class SvhnSource(DiskSource):
    """SVHN's two MATLAB files in ``<root>/svhn``, downloadable and MD5-checked."""

    name: str
    folder: str
    remote: tuple[RemoteFile, ...]

    def candidates(self, root: Path) -> list[Path]:
        return [root / self.folder]

    def missing_files(self, directory: Path) -> list[str]:
        return [r.filename for r in self.remote if not (directory / r.filename).is_file()]

    def read(self, directory: Path) -> RawSplits:
        return (*read_svhn_mat(directory / self.remote[0].filename), *read_svhn_mat(directory / self.remote[1].filename))

    def download(self, root: Path) -> Path:
        for remote in self.remote:
            download_file(remote, root / self.folder)
        return root / self.folder

    def layout_hint(self, root: Path) -> str:
        return f"put the official {', '.join(r.filename for r in self.remote)} into {root / self.folder}"


# -- CelebA ----------------------------------------------------------------------------------------
def _text_rows(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable text file ({type(exc).__name__}: {exc})") from None


def read_celeba_lists(directory: Path, attribute: str = "Male") -> tuple[dict[str, int], dict[str, int]]:
    """``(partition, label)`` per image file name from CelebA's two lists.

    ``list_eval_partition.txt``: ``<file> <0|1|2>`` per line. ``list_attr_celeba.txt``: the image count,
    the 40 attribute names, then ``<file> <+-1 x 40>`` per line; the label is 1 where ``attribute`` is 1.
    """
    part_path, attr_path = directory / "list_eval_partition.txt", directory / "list_attr_celeba.txt"
    partition = {}
    for number, row in enumerate(_text_rows(part_path), 1):
        if not row:
            continue
        if len(row) != 2 or row[1] not in ("0", "1", "2"):
            raise ValueError(f"{part_path}: line {number} {' '.join(row)!r} must be '<image> <0|1|2>'")
        partition[row[0]] = int(row[1])
    rows = _text_rows(attr_path)
    if len(rows) < 2 or attribute not in rows[1]:
        raise ValueError(f"{attr_path}: line 2 must name the attributes, among them {attribute!r}")
    names = rows[1]
    column = names.index(attribute) + 1
    labels = {}
    for number, row in enumerate(rows[2:], 3):
        if not row:
            continue
        if len(row) != len(names) + 1 or row[column] not in ("1", "-1"):
            raise ValueError(f"{attr_path}: line {number} must be '<image>' and {len(names)} values of 1 or -1")
        labels[row[0]] = int(row[column] == "1")
    return partition, labels


@dataclass(frozen=True)
class CelebaSource(SizedSource):
    """CelebA's aligned images with the gender label; provided by hand."""

    name: str = "celeba"
    folder: str = "celeba"
    native_size: int = 178

    def candidates(self, root: Path) -> list[Path]:
        return [root / self.folder]

    def missing_files(self, directory: Path) -> list[str]:
        missing = [] if (directory / "img_align_celeba").is_dir() else ["img_align_celeba/"]
        return missing + [f for f in ("list_attr_celeba.txt", "list_eval_partition.txt") if not (directory / f).is_file()]

    def read_sized(self, directory: Path, image_size: int) -> SizedSplits:
        partition, labels = read_celeba_lists(directory)
        images = directory / "img_align_celeba"
        splits = {0: ([], []), 2: ([], [])}
        for name, part in sorted(partition.items()):
            if part not in splits:
                continue
            if name not in labels:
                raise ValueError(f"{directory / 'list_attr_celeba.txt'}: no attributes for {name} "
                                 "(listed in list_eval_partition.txt)")
            path = images / name
            if not path.is_file():
                raise ValueError(f"{path}: listed in list_eval_partition.txt but missing")
            splits[part][0].append(path)
            splits[part][1].append(labels[name])
        if not splits[0][0] or not splits[2][0]:
            raise ValueError(f"{directory / 'list_eval_partition.txt'}: needs images of partition 0 (train) and "
                             "2 (test)")
        where = f"{directory} (celeba)"
        # train + test together, as the other image sets check them (each split alone passed the bound)
        check_dataset_bytes(where, len(splits[0][0]) + len(splits[2][0]), 3, image_size)
        return (decode_images(splits[0][0], 3, image_size, where=where), _labels(splits[0][1]),
                decode_images(splits[2][0], 3, image_size, where=where), _labels(splits[2][1]))

    def download(self, root: Path) -> Path:
        raise OSError("CelebA is distributed by its authors through Google Drive under their terms; LeakGym does "
                      "not download it")

    @property
    def downloadable(self) -> bool:
        return False

    def layout_hint(self, root: Path) -> str:
        return (f"put img_align_celeba/ (the aligned-and-cropped JPEGs), list_attr_celeba.txt and "
                f"list_eval_partition.txt from the CelebA site into {root / self.folder}")


# -- class folders (TinyImageNet, ImageNet, Imagenette) --------------------------------------------
def _read_class_folders(train: Path, val: Path, classes: list[str], image_size: int, where: str) -> SizedSplits:
    """Decode ``train/<class>/**`` and ``val/<class>/**`` with labels = positions in ``classes``."""
    index = {c: i for i, c in enumerate(classes)}
    out = []
    for split in (train, val):
        paths, labels = [], []
        for folder in class_folders(split):
            if folder.name not in index:
                raise ValueError(f"{folder}: {folder.name!r} is not one of the {len(classes)} classes of {train}")
            found = image_files(folder)
            paths += found
            labels += [index[folder.name]] * len(found)
        if not paths:
            raise ValueError(f"{split}: holds no images in class folders ({split}/<class>/<image>)")
        out.append((paths, labels))
    check_total = sum(len(p) for p, _ in out)
    check_dataset_bytes(where, check_total, 3, image_size)
    (train_paths, train_labels), (val_paths, val_labels) = out
    return (decode_images(train_paths, 3, image_size, where=where), _labels(train_labels),
            decode_images(val_paths, 3, image_size, where=where), _labels(val_labels))


@dataclass(frozen=True)
class ClassFolderSource(SizedSource):
    """``train/<class>/`` and ``val/<class>/`` folders (ImageNet, Imagenette), optionally downloadable."""

    name: str
    folder: str
    subfolders: tuple[str, ...]
    native_size: int
    remote: RemoteFile | None = None

    def candidates(self, root: Path) -> list[Path]:
        return [root / self.folder / sub for sub in self.subfolders] + [root / self.folder]

    def missing_files(self, directory: Path) -> list[str]:
        return [f"{split}/<class>/ folders" for split in ("train", "val")
                if not ((directory / split).is_dir() and class_folders(directory / split))]

    def read_sized(self, directory: Path, image_size: int) -> SizedSplits:
        classes = [p.name for p in class_folders(directory / "train")]
        return _read_class_folders(directory / "train", directory / "val", classes, image_size,
                                   f"{directory} ({self.name})")

    @property
    def downloadable(self) -> bool:
        return self.remote is not None

    def download(self, root: Path) -> Path:
        if self.remote is None:
            raise OSError(f"{self.name} is distributed under its publisher's terms; LeakGym does not download it")
        download_and_extract(self.remote, root / self.folder)
        return root / self.folder / self.subfolders[0]

    def layout_hint(self, root: Path) -> str:
        where = root / self.folder
        hint = (f"put the train/<wnid>/ and val/<wnid>/ class folders (all classes or a subset) into {where}"
                + (f" or {where / self.subfolders[0]}" if self.subfolders else ""))
        if self.remote is not None:
            hint += f", or extract the official {self.remote.filename} into {where}"
        return hint


@dataclass(frozen=True)
class TinyImageNetSource(SizedSource):
    """TinyImageNet-200 as published (``tiny-imagenet-200.zip`` extracted); provided by hand."""

    name: str = "tiny-imagenet"
    folder: str = "tiny-imagenet"
    native_size: int = 64

    def candidates(self, root: Path) -> list[Path]:
        return [root / self.folder, root / self.folder / "tiny-imagenet-200"]

    def missing_files(self, directory: Path) -> list[str]:
        need = {"wnids.txt": (directory / "wnids.txt").is_file(), "train/": (directory / "train").is_dir(),
                "val/val_annotations.txt": (directory / "val" / "val_annotations.txt").is_file(),
                "val/images/": (directory / "val" / "images").is_dir()}
        return [name for name, ok in need.items() if not ok]

    def read_sized(self, directory: Path, image_size: int) -> SizedSplits:
        wnids = [row[0] for row in _text_rows(directory / "wnids.txt") if row]
        if len(set(wnids)) != len(wnids) or len(wnids) < 2:
            raise ValueError(f"{directory / 'wnids.txt'}: needs at least 2 distinct class ids, one per line")
        index = {w: i for i, w in enumerate(wnids)}
        train_paths, train_labels = [], []
        for folder in class_folders(directory / "train"):
            if folder.name not in index:
                raise ValueError(f"{folder}: {folder.name!r} is not listed in {directory / 'wnids.txt'}")
            found = image_files(folder / "images")
            train_paths += found
            train_labels += [index[folder.name]] * len(found)
        annotations = directory / "val" / "val_annotations.txt"
        val_paths, val_labels = [], []
        for number, row in enumerate(_text_rows(annotations), 1):
            if not row:
                continue
            if len(row) < 2 or row[1] not in index:
                raise ValueError(f"{annotations}: line {number} must be '<image> <wnid> ...' with a wnid of wnids.txt")
            path = directory / "val" / "images" / row[0]
            if not path.is_file():
                raise ValueError(f"{path}: listed in {annotations} but missing")
            val_paths.append(path)
            val_labels.append(index[row[1]])
        if not train_paths or not val_paths:
            raise ValueError(f"{directory}: needs training images in train/<wnid>/images/ and validation images")
        where = f"{directory} (tiny-imagenet)"
        check_dataset_bytes(where, len(train_paths) + len(val_paths), 3, image_size)
        return (decode_images(train_paths, 3, image_size, where=where), _labels(train_labels),
                decode_images(val_paths, 3, image_size, where=where), _labels(val_labels))

    def download(self, root: Path) -> Path:
        raise OSError("TinyImageNet is derived from ImageNet and distributed under its terms; LeakGym does not "
                      "download it")

    @property
    def downloadable(self) -> bool:
        return False

    def layout_hint(self, root: Path) -> str:
        return (f"extract tiny-imagenet-200.zip so that {root / self.folder} holds wnids.txt, train/<wnid>/images/ "
                "and val/val_annotations.txt with val/images/")


# URLs and MD5 digests are those torchvision pins in torchvision.datasets.SVHN and .Imagenette
# (tests/test_data_papers.py checks they still agree).
_SVHN = ("http://ufldl.stanford.edu/housenumbers/",)
_FASTAI = ("https://s3.amazonaws.com/fast-ai-imageclas/",)

IMAGE_SOURCES: dict[str, DiskSource] = {
    "svhn": SvhnSource(
        name="svhn",
        folder="svhn",
        remote=(
            RemoteFile("train_32x32.mat", "e26dedcc434d2e4c54c9b2d4a06d8373", _SVHN),
            RemoteFile("test_32x32.mat", "eb5a983be6a315427106f1b164d9cef3", _SVHN),
        ),
    ),
    "celeba": CelebaSource(),
    "tiny-imagenet": TinyImageNetSource(),
    "imagenet": ClassFolderSource(name="imagenet", folder="imagenet", subfolders=(), native_size=224),
    "imagenette": ClassFolderSource(
        name="imagenette",
        folder="imagenette",
        subfolders=("imagenette2-320", "imagenette2", "imagenette2-160"),
        native_size=320,
        remote=RemoteFile("imagenette2-320.tgz", "3df6f0d01a2c9592104656642f5e78a3", _FASTAI),
    ),
}

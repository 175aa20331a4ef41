"""Where each file-based dataset lives on disk, how to read it, and how to fetch it.

A :class:`DiskSource` knows, for one dataset, the directories to look in under a data root, which
files make a complete copy, how to read them (through :mod:`leakgym.data.formats`) and how to
download them (through :mod:`leakgym.data.download`, checksum-verified). Layouts:

============== =====================================================================================
dataset        looked for in (``<root>`` is ``root=``, else ``$LEAKGYM_DATA``, else ``~/.cache/leakgym``)
============== =====================================================================================
mnist          ``<root>/mnist``, ``<root>/MNIST/raw`` (torchvision's layout)
fashion-mnist  ``<root>/fashion-mnist``, ``<root>/FashionMNIST/raw`` (torchvision's layout),
               ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``)
cifar10        ``<root>/cifar-10-batches-py`` (the official archive's folder; torchvision's too)
cifar100       ``<root>/cifar-100-python``
============== =====================================================================================

MNIST-style folders hold ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each raw or with a ``.gz`` suffix (Debian
ships the gzip files). Downloads go to the first directory listed for each dataset.

A copy is refused at load, with a ``ValueError`` naming the file, what it holds and what is allowed, when a
split holds no image or its images are not the dataset's size (28x28 for the IDX datasets, 3x32x32 for a
CIFAR batch), or a label is out of the dataset's range.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from leakgym.data.catalog import dataset_info
from leakgym.data.download import RemoteFile, download_and_extract, download_file
from leakgym.data.formats import check_label_range, read_cifar_batch, read_idx

__all__ = ["DEBIAN_DATASETS_DIR", "SOURCES", "CifarSource", "DiskSource", "IdxSource", "RawSplits"]

#: Where Debian's ``dataset-*`` packages install their files (``dataset-fashion-mnist`` ships
#: ``/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``).
DEBIAN_DATASETS_DIR = Path("/usr/share/datasets")

#: ``(train_images uint8 (N, C, H, W) or (N, H, W), train_labels int64, test_images, test_labels)``
RawSplits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class DiskSource(ABC):
    """One dataset's on-disk layout, reader and downloader."""

    name: str

    @abstractmethod
    def candidates(self, root: Path) -> list[Path]:
        """Directories that may hold the dataset, in the order they are tried."""

    @abstractmethod
    def missing_files(self, directory: Path) -> list[str]:
        """Names of the files a complete copy needs that ``directory`` lacks (empty: complete)."""

    @abstractmethod
    def read(self, directory: Path) -> RawSplits:
        """Read a complete copy from ``directory``."""

    @abstractmethod
    def download(self, root: Path) -> Path:
        """Fetch and verify the official files under ``root``; return the directory now holding them."""

    @property
    def downloadable(self) -> bool:
        """Whether :meth:`download` fetches the files (False: provided by hand only)."""
        return True

    @abstractmethod
    def layout_hint(self, root: Path) -> str:
        """How a user can provide the files by hand."""


_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class IdxSource(DiskSource):
    """MNIST-style data: four IDX files (raw or gzip) in one directory.

    Attributes:
        name: dataset name.
        folders: candidate sub-directories of the data root; downloads go to the first.
        debian_folder: sub-directory of :data:`DEBIAN_DATASETS_DIR` a Debian package installs, if any.
        remote: the four official ``.gz`` files with their MD5 digests.
    """

    name: str
    folders: tuple[str, ...]
    debian_folder: str | None
    remote: tuple[RemoteFile, ...]

    def candidates(self, root: Path) -> list[Path]:
        dirs = [root / folder for folder in self.folders]
        if self.debian_folder is not None:
            dirs.append(DEBIAN_DATASETS_DIR / self.debian_folder)
        return dirs

    @staticmethod
    def _find(directory: Path, stem: str) -> Path | None:
        for candidate in (directory / stem, directory / (stem + ".gz")):
            if candidate.is_file():
                return candidate
        return None

    def missing_files(self, directory: Path) -> list[str]:
        return [f"{stem}[.gz]" for stem in _IDX_STEMS if self._find(directory, stem) is None]

    def read(self, directory: Path) -> RawSplits:
        arrays, paths = [], []
        for stem in _IDX_STEMS:
            path = self._find(directory, stem)
            if path is None:
                raise FileNotFoundError(f"{directory / stem}[.gz] not found")
            arrays.append(read_idx(path))
            paths.append(path)
        train_x, train_y, test_x, test_y = arrays
        info = dataset_info(self.name)
        size = f"{info.native_size}x{info.native_size}"
        # The training images first: their size is what the test images are compared with below.
        self._check_images(paths[0], "train", train_x, info.native_size)
        if train_x.ndim == test_x.ndim == 3 and train_x.shape[1:] != test_x.shape[1:]:
            # 1x1 test images beside 28x28 training images were upsampled to 28x28 without a word
            raise ValueError(f"{paths[2]}: test images are {'x'.join(map(str, test_x.shape[1:]))} but the training "
                             f"images ({paths[0].name}) are {'x'.join(map(str, train_x.shape[1:]))}; both splits "
                             f"must have one image size ({size} for {self.name})")
        self._check_images(paths[2], "t10k", test_x, info.native_size)
        for split, x, y, y_path in (("train", train_x, train_y, paths[1]), ("t10k", test_x, test_y, paths[3])):
            if y.ndim != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(f"{y_path}: {split} labels {y.shape} do not match {x.shape[0]} images")
            if not np.issubdtype(y.dtype, np.integer):  # float labels would be truncated (0.9 -> class 0)
                raise ValueError(f"{y_path}: labels must be integers, got dtype {y.dtype}")
            check_label_range(y_path, y, info.num_classes)
        return train_x, train_y.astype(np.int64), test_x, test_y.astype(np.int64)

    def _check_images(self, path: Path, split: str, x: np.ndarray, side: int) -> None:
        """``ValueError`` naming ``path`` unless ``x`` is uint8 ``(N, side, side)`` with N >= 1: an empty split
        loaded and failed later naming no file, 1x1 images were upsampled to 28x28 without a word (audit)."""
        if x.dtype != np.uint8 or x.ndim != 3:
            raise ValueError(f"{path}: {split} images must be uint8 (N, H, W), got {x.dtype} {x.shape}")
        if x.shape[0] == 0:
            raise ValueError(f"{path}: holds 0 {split} images (shape {x.shape}); a split needs at least 1 image")
        if x.shape[1:] != (side, side):
            raise ValueError(f"{path}: {split} images are {x.shape[1]}x{x.shape[2]}; {self.name}'s IDX images are "
                             f"{side}x{side}")

    def download(self, root: Path) -> Path:
        target = root / self.folders[0]
        for remote in self.remote:
            download_file(remote, target)  # IDX .gz files are read compressed; nothing to extract
        return target

    def layout_hint(self, root: Path) -> str:
        files = ", ".join(f"{stem}[.gz]" for stem in _IDX_STEMS)
        hint = f"put the IDX files {files} into {root / self.folders[0]}"
        if self.debian_folder is not None:
            hint += f", or install the Debian package dataset-{self.debian_folder}"
        return hint


@dataclass(frozen=True)
class CifarSource(DiskSource):
    """CIFAR python batches: the folder the official ``*-python.tar.gz`` archive extracts to.

    Attributes:
        name: dataset name.
        folder: folder name inside the data root (``cifar-10-batches-py`` / ``cifar-100-python``).
        train_files, test_files: batch file names inside ``folder``.
        label_key: ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100).
        remote: the official archive and its MD5 digest.
    """

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: str
    remote: RemoteFile

    def candidates(self, root: Path) -> list[Path]:
        return [root / self.folder]

    def missing_files(self, directory: Path) -> list[str]:
        return [f for f in self.train_files + self.test_files if not (directory / f).is_file()]

    def _read_all(self, directory: Path, files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        classes = dataset_info(self.name).num_classes  # (CIFAR-100's: the fine labels')
        batches = [read_cifar_batch(directory / f, self.label_key, classes) for f in files]
        return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])

    def read(self, directory: Path) -> RawSplits:
        return (*self._read_all(directory, self.train_files), *self._read_all(directory, self.test_files))

    def download(self, root: Path) -> Path:
        download_and_extract(self.remote, root)
        return root / self.folder

    def layout_hint(self, root: Path) -> str:
        files = ", ".join(self.train_files + self.test_files)
        return (
            f"extract the official {self.remote.filename} into {root} so that {root / self.folder} "
            f"holds {files}"
        )


# URLs and MD5 digests are those torchvision pins in torchvision.datasets.MNIST / FashionMNIST /
# CIFAR10 / CIFAR100 (tests/test_data_download.py checks they still agree).
_MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
_FASHION_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
_KRIZ = ("https://www.cs.toronto.edu/~kriz/",)

SOURCES: dict[str, DiskSource] = {
    "mnist": IdxSource(
        name="mnist",
        folders=("mnist", "MNIST/raw"),
        debian_folder=None,
        remote=(
            RemoteFile("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873", _MNIST_MIRRORS),
            RemoteFile("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432", _MNIST_MIRRORS),
            RemoteFile("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3", _MNIST_MIRRORS),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c", _MNIST_MIRRORS),
        ),
    ),
    "fashion-mnist": IdxSource(
        name="fashion-mnist",
        folders=("fashion-mnist", "FashionMNIST/raw"),
        debian_folder="fashion-mnist",
        remote=(
            RemoteFile("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", _FASHION_MIRRORS),
            RemoteFile("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe", _FASHION_MIRRORS),
            RemoteFile("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79", _FASHION_MIRRORS),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310", _FASHION_MIRRORS),
        ),
    ),
    "cifar10": CifarSource(
        name="cifar10",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        label_key="labels",
        remote=RemoteFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a", _KRIZ),
    ),
    "cifar100": CifarSource(
        name="cifar100",
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        label_key="fine_labels",
        remote=RemoteFile("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85", _KRIZ),
    ),
}

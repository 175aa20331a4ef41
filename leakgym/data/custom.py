"""Bring your own data: an image folder or an ``.npz`` file wherever a dataset name is accepted.

``load_dataset(path)``, ``Scenario(dataset=path)``, ``dataset = "path"`` in a scenario TOML file and
``--overrides dataset=path`` on the command line all take one of:

* a **folder in ImageFolder layout**: one sub-folder per class, holding that class's images (any
  depth; ``.png .jpg .jpeg .bmp .gif .webp .tif .tiff .ppm .pgm .pbm``). Classes are the sub-folder
  names in sorted order (label 0 is the first), as torchvision's ``ImageFolder`` numbers them. A folder
  with ``train/`` and ``val/`` (or ``test/``) sub-folders, each in that layout, gives its own split.
* an **.npz file** with ``images`` uint8 ``(N, H, W)`` or ``(N, H, W, C)`` (C = 1 or 3) and integer
  ``labels`` ``(N,)`` in ``[0, num_classes)``; optionally ``test_images`` and ``test_labels`` (its
  own split) and ``classes`` (class names; fixes ``num_classes`` to their number, otherwise it is the
  largest label + 1). It is read with ``np.load(..., allow_pickle=False)``: nothing is un-pickled.

Channels, class count, image size and normalisation statistics come from the data. Without its own
split the data are split once, class by class, like the bundled digits (:mod:`leakgym.data.digits`):
``round(0.2 * n_c)`` images of each class ``c`` are held out as the test set, drawn with
``numpy.random.default_rng(0)``. The normalisation statistics are the per-channel mean and standard
deviation of the *training* images in ``[0, 1]`` at native resolution (the catalog's convention,
:mod:`leakgym.data.catalog`). Split and statistics are computed once per process and cached with the
decoded images (keyed by the path and every file's size and modification time, so an edited folder is
read again).

Images must all have one shape (height, width and channels): a folder of mixed shapes is refused
rather than silently resized. Non-square images are centre-cropped to a square before any resize
(:mod:`leakgym.data.folders`). Refusals -- a missing path, one class, mixed shapes, labels out of range,
too few images for the split, an undecodable file -- are one ``ValueError`` line naming the path (or
the file) and the problem. A path is told from a dataset name by containing a ``/`` (or ``os.sep``),
starting with ``~`` or ``.``, ending in ``.npz``, or existing; write ``./mnist`` for a folder named
like a packaged dataset (:func:`leakgym.data.catalog.is_dataset_path`).
"""

from __future__ import annotations

import functools
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from leakgym.data.folders import (
    IMAGE_SUFFIXES,
    MAX_DATASET_BYTES,
    class_folders,
    decode_image,
    image_files,
    image_header,
    tree_fingerprint,
)
from leakgym.files import npz_arrays

__all__ = ["USER_SPLIT_SEED", "USER_TEST_FRACTION", "UserData", "resolve_path", "user_data"]

#: Seed of the fixed class-stratified train/test split of data that bring no split of their own.
USER_SPLIT_SEED = 0
#: Fraction of each class held out as the test set (as for digits).
USER_TEST_FRACTION = 0.2
#: Fewest training images a split may leave: one public and one private image.
MIN_TRAIN_IMAGES = 2
#: Largest label an ``.npz`` dataset may hold (without ``classes``, the largest label + 1 is the number of
#: classes, a name and a model output each: one stray large label would have made a million of them).
MAX_LABEL = 99_999


def resolve_path(value: str | os.PathLike[str]) -> str:
    """The absolute path of a user dataset, checked to be a folder or an ``.npz`` file.

    ``ValueError`` naming the path if it does not exist or is neither.
    """
    path = Path(value).expanduser().absolute()
    if path.is_dir():
        return str(path)
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise ValueError(f"{path}: a file dataset must be an .npz archive (images, labels); "
                             "or give a folder with one sub-folder per class")
        return str(path)
    raise ValueError(f"{path}: no such folder or .npz file (a dataset path is an image folder with one "
                     "sub-folder per class, or an .npz file with images and labels)")


@dataclass(frozen=True)
class UserData:
    """A user's dataset, decoded once: uint8 ``(N, C, H, W)`` images, int64 labels, classes, statistics.

    Attributes:
        path: the absolute path (the dataset's name in its :class:`~leakgym.data.DatasetSpec`).
        kind: ``"folder"`` or ``"npz"``.
        classes: class names (folder names, the npz's ``classes``, or ``"0"``, ``"1"``, ...).
        own_split: whether the data came with their own test split.
        mean, std: per-channel statistics of the training images in ``[0, 1]``.
    """

    path: str
    kind: str
    classes: tuple[str, ...]
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    own_split: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def height(self) -> int:
        return int(self.train_x.shape[2])

    @property
    def width(self) -> int:
        return int(self.train_x.shape[3])

    @property
    def native_size(self) -> int:
        """Side of the centred square the images are cropped to (the default ``image_size``)."""
        return min(self.height, self.width)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def source(self) -> str:
        """Where the data come from and how they were split (the catalog's ``source``)."""
        what = "image folder (ImageFolder layout)" if self.kind == "folder" else ".npz file"
        split = "its own test split" if self.own_split else f"{USER_TEST_FRACTION:g} of each class held out as test"
        return f"{what} of {self.height}x{self.width} images, {len(self.test_y)} test images ({split})"


def user_data(value: str | os.PathLike[str]) -> UserData:
    """The :class:`UserData` at ``value`` (a folder or an ``.npz``), read once per process and content."""
    path = resolve_path(value)
    return _read(path, tree_fingerprint(Path(path)))


@functools.lru_cache(maxsize=4)
def _read(path: str, fingerprint: str) -> UserData:
    del fingerprint  # only part of the cache key
    reader = _read_folder if Path(path).is_dir() else _read_npz
    kind, classes, train_x, train_y, test_x, test_y = reader(Path(path))
    if min(train_x.shape[2:]) < 2:  # (the default image size is the shorter side; a model needs 2 pixels)
        raise ValueError(f"{path}: images of {train_x.shape[2]}x{train_x.shape[3]} pixels; allowed: at least 2x2")
    own_split = test_x is not None
    if not own_split:
        train_x, train_y, test_x, test_y = _split(path, train_x, train_y, len(classes))
    if len(train_y) < MIN_TRAIN_IMAGES or len(test_y) < 1:
        raise ValueError(
            f"{path}: too few images for the split: {len(train_y)} train and {len(test_y)} test images; need at "
            f"least {MIN_TRAIN_IMAGES} train (one public, one private) and 1 test image"
            + ("" if own_split else f" (the test set takes round({USER_TEST_FRACTION:g} x n) images of each class)")
        )
    mean, std = _statistics(path, train_x)
    return UserData(path=path, kind=kind, classes=tuple(classes), train_x=train_x, train_y=train_y, test_x=test_x,
                    test_y=test_y, own_split=own_split, mean=mean, std=std)


def _statistics(path: str, images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) standard deviation of uint8 ``(N, C, H, W)`` images in [0, 1]."""
    channels = images.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for chunk in np.array_split(images, max(1, images.nbytes // 2**26)):  # float64 in 64 MiB pieces
        values = chunk.astype(np.float64) / 255.0
        total += values.sum(axis=(0, 2, 3))
        squares += (values * values).sum(axis=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    if not (std > 0).all():
        flat = [c for c in range(channels) if not std[c] > 0]
        raise ValueError(f"{path}: every training pixel of channel(s) {flat} has the same value; the images "
                         "cannot be normalised (standard deviation 0)")
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _split(path: str, x: np.ndarray, y: np.ndarray, num_classes: int):
    """The fixed class-stratified split (module docstring)."""
    rng = np.random.default_rng(USER_SPLIT_SEED)
    train_parts, test_parts = [], []
    for c in range(num_classes):
        members = rng.permutation(np.flatnonzero(y == c))
        n_test = round(USER_TEST_FRACTION * members.size)
        test_parts.append(members[:n_test])
        train_parts.append(members[n_test:])
    train = rng.permutation(np.concatenate(train_parts))  # classes interleaved
    test = rng.permutation(np.concatenate(test_parts))
    return x[train], y[train], x[test], y[test]


# -- folders ---------------------------------------------------------------------------------------
def _class_images(classes: list[str], where: Path) -> tuple[list[Path], np.ndarray]:
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = image_files(where / name)
        if not found:
            raise ValueError(f"{where / name}: class folder holds no images; remove it or add images")
        paths += found
        labels += [label] * len(found)
    return paths, np.asarray(labels, dtype=np.int64)


def _decode_uniform(root: Path, paths: list[Path], shape: tuple[int, int, int] | None) -> np.ndarray:
    """uint8 ``(N, C, H, W)``; every image must have ``shape`` (the first image's when ``None``)."""
    first = None
    for p in paths:  # headers first: a mixed folder is refused before anything is decoded
        header = image_header(p)
        if shape is None:
            shape, first = header, p
        elif header != shape:
            c, h, w = header
            raise ValueError(f"{root}: mixed image shapes: {p} is {h}x{w} with {c} channel(s), "
                             f"{first or 'the training images'} {shape[1]}x{shape[2]} with {shape[0]}; "
                             "all images must have one shape (resize them first)")
        first = first or p
    channels, height, width = shape
    need = len(paths) * channels * height * width
    if need * 4 > MAX_DATASET_BYTES:
        raise ValueError(f"{root}: {len(paths)} images of {channels}x{height}x{width} take {need * 4 / 2**30:.1f} GiB "
                         f"as float32, more than the {MAX_DATASET_BYTES / 2**30:.0f} GiB LeakGym holds in memory; "
                         "use fewer or smaller images")
    out = np.empty((len(paths), channels, height, width), dtype=np.uint8)
    for i, p in enumerate(paths):
        out[i] = decode_image(p, channels).transpose(2, 0, 1)
    return out


def _loose_images(folder: Path) -> list[Path]:
    """The images lying directly in ``folder`` (not in a class sub-folder)."""
    return [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]


def _refuse_loose(folder: Path, loose: list[Path]) -> None:
    if loose:
        raise ValueError(f"{folder}: images {loose[0].name!r}, ... lie beside the class sub-folders; move every image "
                         f"into its class's sub-folder (ImageFolder layout: {folder}/<class>/<image>)")


def _read_folder(root: Path):
    loose = _loose_images(root)
    subfolders = class_folders(root)
    names = {p.name for p in subfolders}
    test_name = "val" if "val" in names else "test" if "test" in names else None
    if "train" in names and test_name is not None and class_folders(root / "train"):
        # (loose images here were ignored, where the flat layout refuses them)
        _refuse_loose(root, loose)
        for folder in (root / "train", root / test_name):
            _refuse_loose(folder, _loose_images(folder))
        classes = [p.name for p in class_folders(root / "train")]
        test_classes = [p.name for p in class_folders(root / test_name)]
        unknown = sorted(set(test_classes) - set(classes))
        if unknown:
            raise ValueError(f"{root / test_name}: class folder(s) {unknown} are not classes of {root / 'train'}")
        _check_classes(root / "train", classes)
        train_paths, train_y = _class_images(classes, root / "train")
        test_paths: list[Path] = []
        test_labels: list[int] = []
        for name in test_classes:
            found = image_files(root / test_name / name)
            test_paths += found
            test_labels += [classes.index(name)] * len(found)
        train_x = _decode_uniform(root, train_paths, None)
        shape = tuple(train_x.shape[1:])
        test_x = _decode_uniform(root, test_paths, shape) if test_paths else train_x[:0]
        return "folder", classes, train_x, train_y, test_x, np.asarray(test_labels, dtype=np.int64)
    if not subfolders:
        what = "holds images but no class sub-folders" if loose else "holds no class sub-folders"
        raise ValueError(f"{root}: {what} (ImageFolder layout: {root}/<class>/<image>, one sub-folder per class)")
    _refuse_loose(root, loose)
    classes = [p.name for p in subfolders]
    _check_classes(root, classes)
    paths, labels = _class_images(classes, root)
    return "folder", classes, _decode_uniform(root, paths, None), labels, None, None


def _check_classes(root: Path, classes: list[str]) -> None:
    if len(classes) < 2:
        found = f"one class ({classes[0]!r})" if classes else "no class"
        raise ValueError(f"{root}: {found}; a classification dataset needs at least 2 class sub-folders")


# -- npz -------------------------------------------------------------------------------------------
def _read_npz(path: Path):
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz archive ({type(exc).__name__}: {exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds one array, not an .npz archive with 'images' and 'labels' (np.savez)")  # noqa: TRY004
    with archive:
        keys = set(archive.files)
        missing = sorted({"images", "labels"} - keys)
        if missing:
            raise ValueError(f"{path}: missing array(s) {missing}; an .npz dataset holds 'images' uint8 (N, H, W[, C]) "
                             f"and 'labels' (N,); found {sorted(keys)}")
        if ("test_images" in keys) != ("test_labels" in keys):
            raise ValueError(f"{path}: 'test_images' and 'test_labels' go together; found {sorted(keys)}")
        try:
            arrays = npz_arrays(archive, [k for k in ("images", "labels", "test_images", "test_labels", "classes")
                                          if k in keys])
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:  # object arrays need pickle: refused
            raise ValueError(f"{path}: an array cannot be read without un-pickling or is damaged "
                             f"({type(exc).__name__}: {exc}); store plain numeric arrays") from None
        except MemoryError:
            raise ValueError(f"{path}: an array's header declares more data than this machine's memory holds; "
                             "the file is damaged or not an .npz dataset") from None
    train_x = _npz_images(path, "images", arrays["images"])
    train_y = _npz_labels(path, "labels", arrays["labels"], len(train_x))
    test_x = test_y = None
    if "test_images" in arrays:
        test_x = _npz_images(path, "test_images", arrays["test_images"])
        test_y = _npz_labels(path, "test_labels", arrays["test_labels"], len(test_x))
        if test_x.shape[1:] != train_x.shape[1:]:
            raise ValueError(f"{path}: mixed image shapes: test_images are {test_x.shape[1:]} (C, H, W), images "
                             f"{train_x.shape[1:]}")
    top = int(max(train_y.max(initial=-1), -1 if test_y is None else test_y.max(initial=-1)))
    if "classes" in arrays:
        names = arrays["classes"]
        if names.ndim != 1 or names.dtype.kind not in "USi":
            raise ValueError(f"{path}: 'classes' must be a 1-d array of class names, got {names.dtype} {names.shape}")
        classes = [str(n) for n in names.tolist()]
        if top >= len(classes):
            raise ValueError(f"{path}: labels out of range: label {top} for {len(classes)} classes; allowed "
                             f"[0, {len(classes) - 1}]")
    else:
        classes = [str(c) for c in range(top + 1)]
    if len(np.unique(train_y)) < 2:
        raise ValueError(f"{path}: one class (every label is {int(train_y[0])}); a classification dataset needs at "
                         "least 2 classes")
    return "npz", classes, train_x, train_y, test_x, test_y


def _npz_images(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    if x.dtype != np.uint8 or x.ndim not in (3, 4) or (x.ndim == 4 and x.shape[3] not in (1, 3)):
        raise ValueError(f"{path}: {key!r} must be uint8 (N, H, W) or (N, H, W, C) with C = 1 or 3, got "
                         f"{x.dtype} {x.shape}")
    if x.shape[0] == 0 or min(x.shape[1:3]) < 1:
        raise ValueError(f"{path}: {key!r} holds no images (shape {x.shape})")
    if x.ndim == 3:
        x = x[..., None]
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _npz_labels(path: Path, key: str, y: np.ndarray, count: int) -> np.ndarray:
    if y.dtype.kind not in "iu":  # (bool and timedelta64 are kinds of their own)
        raise ValueError(f"{path}: {key!r} must be integers, got dtype {y.dtype}")
    if y.shape != (count,):
        raise ValueError(f"{path}: {key!r} has shape {y.shape}, expected ({count},) (one label per image)")
    # (compared as Python integers: a uint64 label past 2**63 became negative as int64, and its image was dropped)
    if count and not 0 <= int(y.min()) <= int(y.max()) <= MAX_LABEL:
        bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
        raise ValueError(f"{path}: labels out of range: {key!r} holds {bad}; allowed: integers in [0, {MAX_LABEL}] "
                         "(class indices)")
    return y.astype(np.int64)

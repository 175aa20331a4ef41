"""Bad data files found in an audit: each is refused at load with a ``ValueError`` naming the file, what it
holds and what is allowed (or, for the decoded-image cache, decoded again as its module promises), and a
results file with a string among its numbers is named with the field when it is re-rendered."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from leakgym.data import imagesets, load_dataset
from leakgym.data.folders import image_files, tree_fingerprint
from leakgym.data.formats import read_cifar_batch

REPO = Path(__file__).resolve().parents[1]


def _png(path: Path, rng: np.random.Generator, size: int = 4) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(path)


# -- bug 3: broken links in a user's image folder ----------------------------------------------------------
def test_a_broken_link_that_is_no_image_is_ignored_and_one_named_as_an_image_is_refused(tmp_path):
    """One broken link anywhere in the folder (a ``notes.txt`` too) made every read fail with a
    FileNotFoundError from the cache key (folders.tree_fingerprint); docs/data.md says other files are ignored."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "faces"
    for label in ("a", "b"):
        for i in range(6):
            _png(folder / label / f"{i}.png", rng)
    (folder / "a" / "notes.txt").symlink_to(tmp_path / "nonexistent")
    before = tree_fingerprint(folder)
    dataset = load_dataset(str(folder))
    assert tuple(dataset.train_x.shape[1:]) == (1, 4, 4) and len(dataset.train_y) + len(dataset.test_y) == 12
    (tmp_path / "nonexistent").write_text("notes")  # the link's target comes back: another tree
    assert tree_fingerprint(folder) != before
    link = folder / "b" / "7.png"
    link.symlink_to(tmp_path / "missing.png")
    with pytest.raises(ValueError, match=rf"^{link}: a broken link \(to '{tmp_path / 'missing.png'}', which does "
                                         r"not exist or loops\); restore its target or remove the link$"):
        load_dataset(str(folder))
    with pytest.raises(ValueError, match=f"^{link}: a broken link"):
        image_files(folder)


# -- bug 5: empty splits and wrong-size images of the IDX and CIFAR readers --------------------------------
def _idx(array: np.ndarray) -> bytes:
    """IDX encoding written from LeCun's description (uint8 values)."""
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def _idx_copy(folder: Path, n_train: int = 20, n_test: int = 10, side: int = 28, test_side: int | None = None):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    test_side = side if test_side is None else test_side
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, side, side), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, test_side, test_side), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for stem, array in arrays.items():
        (folder / stem).write_bytes(_idx(array))


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
@pytest.mark.parametrize(("case", "file", "message"), [
    ("no test images", "t10k-images-idx3-ubyte",
     r"holds 0 t10k images \(shape \(0, 28, 28\)\); a split needs at least 1 image"),
    ("no training images", "train-images-idx3-ubyte",
     r"holds 0 train images \(shape \(0, 28, 28\)\); a split needs at least 1 image"),
    ("1x1 images", "train-images-idx3-ubyte", r"train images are 1x1; {name}'s IDX images are 28x28"),
])
def test_an_idx_split_without_images_or_of_another_size_is_refused_naming_the_file(tmp_path, name, case, file,
                                                                                    message):
    """An empty split loaded (and failed only at a game's reset); 1x1 images beside 1x1 test images were
    upsampled to 28x28 without a word, where a user's own data refuses images under 2x2."""
    folder = tmp_path / name
    kwargs = {"no test images": {"n_test": 0}, "no training images": {"n_train": 0},
              "1x1 images": {"side": 1}}[case]
    _idx_copy(folder, **kwargs)
    with pytest.raises(ValueError, match=f"^{folder / file}: {message.format(name=name)}$"):
        load_dataset(name, root=tmp_path, download=False)


def test_idx_test_images_of_another_size_name_the_size_the_dataset_has(tmp_path):
    _idx_copy(tmp_path / "mnist", test_side=27)
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: test images are 27x27 but the training images "
                                         r"\(train-images-idx3-ubyte\) are 28x28; both splits must have one image "
                                         r"size \(28x28 for mnist\)$"):
        load_dataset("mnist", root=tmp_path, download=False)


def _batch(path: Path, data: np.ndarray, labels) -> None:
    # (this Python's default protocol: protocol 2 pickles an empty array's buffer as __builtin__.bytes, refused)
    path.write_bytes(pickle.dumps({"data": data, "labels": labels}))


def test_a_cifar_batch_without_images_is_refused_naming_it(tmp_path):
    """A CIFAR-10 test_batch of 0 images loaded, and the game failed at reset naming no file."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        _batch(folder / f"data_batch_{i}", rng.integers(0, 256, (4, 3072), dtype=np.uint8), [0, 1, 2, 3])
    _batch(folder / "test_batch", np.zeros((0, 3072), np.uint8), np.zeros(0, np.int64))
    message = (rf"^{folder / 'test_batch'}: 'data' holds 0 images \(shape \(0, 3072\)\); a CIFAR batch holds at "
               r"least 1 image of 3x32x32$")
    with pytest.raises(ValueError, match=message):
        load_dataset("cifar10", root=tmp_path, download=False)
    with pytest.raises(ValueError, match=message):
        read_cifar_batch(folder / "test_batch", "labels")
    _batch(folder / "test_batch", np.zeros((2, 3000), np.uint8), [0, 1])
    with pytest.raises(ValueError, match=r"test_batch: 'data' must be uint8 of shape \(N, 3072\) \(N images of "
                                         r"3x32x32\), got uint8 \(2, 3000\)$"):
        load_dataset("cifar10", root=tmp_path, download=False)


def test_an_svhn_file_without_images_is_refused_naming_it(tmp_path):
    import scipy.io

    from leakgym.data.imagesets import read_svhn_mat

    path = tmp_path / "test_32x32.mat"
    scipy.io.savemat(path, {"X": np.zeros((32, 32, 3, 0), np.uint8), "y": np.zeros((0, 1), np.uint8)})
    with pytest.raises(ValueError, match=rf"^{path}: 'X' holds 0 images \(shape \(32, 32, 3, 0\)\); a split needs at "
                                         r"least 1 image of 32x32x3$"):
        read_svhn_mat(path)


# -- bug 8: a uint64 CIFAR label past 2**63 -----------------------------------------------------------------
def test_a_uint64_cifar_label_past_2_63_is_reported_as_stored(tmp_path):
    """It was converted to int64 (a negative number) before the range check, which reported that number."""
    path = tmp_path / "data_batch_1"
    _batch(path, np.zeros((2, 3072), np.uint8), np.array([2**63 + 1, 0], np.uint64))
    with pytest.raises(ValueError, match=rf"^{path}: label {2**63 + 1} out of range; allowed \[0, 9\]$"):
        read_cifar_batch(path, "labels", 10)
    with pytest.raises(ValueError, match=rf"^{path}: label {2**63 + 1} out of range; allowed integers up to "
                                         rf"{2**63 - 1}$"):
        read_cifar_batch(path, "labels")
    _batch(path, np.zeros((2, 3072), np.uint8), np.array([9, 0], np.uint64))
    _, labels = read_cifar_batch(path, "labels", 10)
    assert labels.dtype == np.int64 and labels.tolist() == [9, 0]


# -- bug 6: the decoded-image cache -------------------------------------------------------------------------
def _imagenette(root: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for wnid in ("n01440764", "n02102040"):
            folder = root / "imagenette" / "imagenette2-320" / split / wnid
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / f"{i}.JPEG")


@pytest.mark.parametrize("tamper", ["float32 train_x", "another size", "int32 labels", "label out of range",
                                    "labels of another count", "no test images"])
def test_a_decoded_copy_that_is_not_what_is_written_there_is_decoded_again(tmp_path, tamper):
    """A float32 train_x in [0, 1] in $LEAKGYM_DATA/.decoded was read as nearly black images (x / 255)."""
    _imagenette(tmp_path)
    first = load_dataset("imagenette", root=tmp_path, image_size=16, download=False)
    (cache,) = (tmp_path / imagesets.DECODED_FOLDER).glob("imagenette-16px-*.npz")
    stat = cache.stat()
    with np.load(cache) as stored:
        arrays = dict(stored)
    if tamper == "float32 train_x":
        arrays["train_x"] = arrays["train_x"].astype(np.float32) / 255
    elif tamper == "another size":
        arrays["train_x"] = arrays["train_x"][:, :, :8, :8].copy()
    elif tamper == "int32 labels":
        arrays["train_y"] = arrays["train_y"].astype(np.int32)
    elif tamper == "label out of range":
        arrays["test_y"][0] = 1000
    elif tamper == "labels of another count":
        arrays["test_y"] = arrays["test_y"][:-1]
    else:
        arrays["test_x"], arrays["test_y"] = arrays["test_x"][:0], arrays["test_y"][:0]
    with open(cache, "wb") as fh:
        np.savez(fh, **arrays)
    os.utime(cache, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = load_dataset("imagenette", root=tmp_path, image_size=16, download=False)
    for a, b in zip((first.train_x, first.train_y, first.test_x, first.test_y),
                    (again.train_x, again.train_y, again.test_x, again.test_y)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    with np.load(cache) as stored:  # replaced by what the writer writes
        assert stored["train_x"].dtype == np.uint8 and stored["train_x"].shape[1:] == (3, 16, 16)
        assert stored["test_y"].tolist() == first.test_y.tolist()


# -- bug 9: leakgym reproduce --rerender of a file with a string among its numbers --------------------------
def test_rerender_names_the_file_and_the_field_of_a_value_that_is_not_a_number(tmp_path, capsys):
    from leakgym import cli

    result = json.loads((REPO / "docs" / "results" / "reproduce_dcs2.json").read_text())
    result["cells"][1]["per_image"]["psnr"][2] = "a"
    path = tmp_path / "reproduce_dcs2.json"
    path.write_text(json.dumps(result))
    assert cli.main(["reproduce", "dcs2", "--rerender", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"leakgym: error: {path}: not a complete results file of `leakgym reproduce`: "
                   "cells[1].per_image.psnr[2] is 'a'; allowed: numbers\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reproduce_dcs2.json"]  # nothing written
    result["cells"][1]["per_image"]["psnr"][2] = 1.0
    result["utility"]["None"]["accuracy_per_seed"][0] = "x"
    path.write_text(json.dumps(result))
    assert cli.main(["reproduce", "dcs2", "--rerender", "--out", str(tmp_path)]) == 2
    assert "utility['None'].accuracy_per_seed[0] is 'x'; allowed: numbers or null" in capsys.readouterr().err

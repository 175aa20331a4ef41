"""Tests for the on-disk dataset formats: tiny files written in the real IDX and CIFAR-pickle formats
(by hand, independently of the readers) are loaded through ``load_dataset``'s real code path."""

from __future__ import annotations

import gzip
import os
import pickle
import shlex
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from leakgym.data import load_dataset, sources
from leakgym.data.formats import read_cifar_batch, read_idx

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _idx_bytes(array: np.ndarray, type_code: int, dtype: str) -> bytes:
    """IDX encoding written from LeCun's description: 0x0000, type byte, ndim, big-endian dims, data."""
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(dtype).tobytes()


def _write(path: Path, data: bytes, gz: bool) -> None:
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _mnist_like(directory: Path, gz: bool, n_train: int = 5, n_test: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for stem, array in arrays.items():
        _write(directory / stem, _idx_bytes(array, 0x08, "u1"), gz)
    return arrays


def _check_mnist_like(dataset, arrays: dict[str, np.ndarray]) -> None:
    expected_train = torch.from_numpy(arrays["train-images-idx3-ubyte"]).float().unsqueeze(1) / 255
    assert dataset.train_x.shape == (5, 1, 28, 28) and dataset.test_x.shape == (3, 1, 28, 28)
    torch.testing.assert_close(dataset.train_x, expected_train, rtol=0, atol=0)
    assert dataset.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert dataset.test_y.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    assert dataset.train_y.dtype == torch.int64


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_mnist_idx_loads_raw_and_gzip(tmp_path: Path, gz: bool) -> None:
    arrays = _mnist_like(tmp_path / "mnist", gz)
    dataset = load_dataset("mnist", root=tmp_path, download=False)
    _check_mnist_like(dataset, arrays)
    assert dataset.spec.shape == (1, 28, 28)


def test_mnist_labels_of_a_float_type_are_refused(tmp_path: Path) -> None:
    """IDX labels stored as float32 (type byte 0x0D) loaded as [0.9, 1.7, 9.99] -> classes [0, 1, 9]."""
    _mnist_like(tmp_path / "mnist", gz=False)
    labels = tmp_path / "mnist" / "train-labels-idx1-ubyte"
    labels.write_bytes(_idx_bytes(np.array([0.9, 1.7, 2.2, 9.99, 3.5]), 0x0D, ">f4"))
    with pytest.raises(ValueError, match=rf"{labels}: labels must be integers, got dtype (>)?float32"):
        load_dataset("mnist", root=tmp_path, download=False)


def test_fashion_mnist_debian_layout(tmp_path: Path, monkeypatch) -> None:
    # Debian's dataset-fashion-mnist installs /usr/share/datasets/fashion-mnist/<stem>.gz (checked with
    # `apt-get download dataset-fashion-mnist && dpkg -c`).
    debian = tmp_path / "usr-share-datasets"
    monkeypatch.setattr(sources, "DEBIAN_DATASETS_DIR", debian)
    arrays = _mnist_like(debian / "fashion-mnist", gz=True)
    dataset = load_dataset("fashion-mnist", root=tmp_path / "empty-root", download=False, image_size=14)
    assert dataset.spec.name == "fashion-mnist" and dataset.train_x.shape == (5, 1, 14, 14)
    assert dataset.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    # A 2x shrink is close to averaging 2x2 blocks (mean abs difference 0.03 measured; bar 0.1).
    full = load_dataset("fashion-mnist", root=tmp_path / "empty-root", download=False)
    _check_mnist_like(full, arrays)
    pooled = torch.nn.functional.avg_pool2d(full.train_x, 2)
    assert float((dataset.train_x - pooled).abs().mean()) < 0.1


def test_torchvision_raw_layout_is_found(tmp_path: Path) -> None:
    arrays = _mnist_like(tmp_path / "MNIST" / "raw", gz=False)
    _check_mnist_like(load_dataset("mnist", root=tmp_path, download=False), arrays)


def test_read_idx_big_endian_types_and_rejects_bad_files(tmp_path: Path) -> None:
    values = np.array([[1.5, -2.0], [3.25, 1e-3]], dtype=np.float32)
    path = tmp_path / "floats.idx"
    path.write_bytes(_idx_bytes(values, 0x0D, ">f4"))
    np.testing.assert_array_equal(read_idx(path), values)
    ints = np.array([1, -70000, 2**30], dtype=np.int32)
    path.write_bytes(_idx_bytes(ints, 0x0C, ">i4"))
    np.testing.assert_array_equal(read_idx(path), ints)

    path.write_bytes(b"\x08\x03\x00\x00" + bytes(8))
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)
    path.write_bytes(bytes([0, 0, 0x07, 1]) + struct.pack(">I", 1) + b"\x00")
    with pytest.raises(ValueError, match="type byte 0x07"):
        read_idx(path)
    good = _idx_bytes(np.zeros((2, 3), np.uint8), 0x08, "u1")
    path.write_bytes(good[:-1])
    with pytest.raises(ValueError, match="payload has 5 bytes"):
        read_idx(path)


def _cifar_batch(
    path: Path, n: int, label_key: str, num_classes: int, seed: int, protocol: int = 2
) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, num_classes, n).tolist()
    entry = {
        "batch_label": "testing batch",
        label_key: labels,
        "data": data,
        "filenames": [f"{i}.png" for i in range(n)],
    }
    if label_key == "fine_labels":
        entry["coarse_labels"] = [c // 5 for c in labels]
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=protocol)
    return data, labels


def test_cifar10_python_batches(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train = [_cifar_batch(folder / f"data_batch_{i}", 2, "labels", 10, seed=i) for i in range(1, 6)]
    test_data, test_labels = _cifar_batch(folder / "test_batch", 3, "labels", 10, seed=9)
    dataset = load_dataset("cifar10", root=tmp_path, download=False)
    assert dataset.train_x.shape == (10, 3, 32, 32) and dataset.test_x.shape == (3, 3, 32, 32)
    assert dataset.train_y.tolist() == [label for _, labels in train for label in labels]
    assert dataset.test_y.tolist() == test_labels
    # Row layout: 1024 red values, then green, then blue, each a 32x32 image in row-major order.
    value = test_data[1, 1024 * 2 + 32 * 5 + 7]
    assert float(dataset.test_x[1, 2, 5, 7]) == pytest.approx(value / 255.0)
    value = train[2][0][0, 32 * 31 + 0]
    assert float(dataset.train_x[4, 0, 31, 0]) == pytest.approx(value / 255.0)


def test_cifar100_python_files_use_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    # Protocol 5 (Python 3's default) as well as the original files' protocol 2.
    _, train_labels = _cifar_batch(folder / "train", 4, "fine_labels", 100, seed=1, protocol=5)
    _, test_labels = _cifar_batch(folder / "test", 2, "fine_labels", 100, seed=2)
    dataset = load_dataset("cifar100", root=tmp_path, download=False, image_size=16)
    assert dataset.spec.num_classes == 100 and dataset.train_x.shape == (4, 3, 16, 16)
    assert dataset.train_y.tolist() == train_labels and dataset.test_y.tolist() == test_labels


class _RunsCommand:
    """Un-pickling this runs ``command`` with os.system."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_cifar_reader_refuses_a_pickle_that_would_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"data": _RunsCommand(f"touch {shlex.quote(str(marker))}"), "labels": [0]}, protocol=2)
    pickle.loads(payload)  # armed: plain un-pickling runs the command
    assert marker.exists()
    marker.unlink()
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _cifar_batch(folder / name, 1, "labels", 10, seed=0)
    (folder / "data_batch_3").write_bytes(payload)
    with pytest.raises(ValueError, match=r"data_batch_3: refused: the pickle names \w+\.system"):
        load_dataset("cifar10", root=tmp_path, download=False)
    assert not marker.exists()
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({"data": np.zeros((1, 3072), np.uint8)}, f, protocol=2)
    with pytest.raises(ValueError, match="'labels'"):
        read_cifar_batch(folder / "data_batch_3", "labels")


def test_cifar_reader_names_the_file_for_broken_batches(tmp_path: Path) -> None:
    path = tmp_path / "data_batch_1"
    _cifar_batch(path, 3, "labels", 10, seed=0)
    whole = path.read_bytes()
    for cut in (1, 40, len(whole) // 2, len(whole) - 1):
        path.write_bytes(whole[:cut])
        with pytest.raises(ValueError, match=f"{path}: truncated or not a CIFAR python batch"):
            read_cifar_batch(path, "labels")
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"{path}: empty file"):
        read_cifar_batch(path, "labels")
    path.write_bytes(gzip.compress(whole))
    with pytest.raises(ValueError, match=f"{path}: gzip-compressed"):
        read_cifar_batch(path, "labels")
    path.write_bytes(b"PK\x03\x04" + whole)
    with pytest.raises(ValueError, match=f"{path}: truncated or not a CIFAR python batch"):
        read_cifar_batch(path, "labels")


class _HugeArray:
    """Pickles as numpy's ``_reconstruct`` of an array of 10**14 entries (a damaged batch)."""

    def __reduce__(self):
        core = getattr(np, "_core", None) or np.core
        return core.multiarray._reconstruct, (np.ndarray, (10**14,), b"b")


def test_cifar_reader_refuses_an_array_larger_than_the_file(tmp_path: Path) -> None:
    """A ~100-byte batch asking numpy for 10**14 entries ended in a 91 TiB MemoryError traceback."""
    path = tmp_path / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({"data": _HugeArray(), "labels": [0]}, f, protocol=2)
    with pytest.raises(ValueError, match=rf"{path}: truncated or not a CIFAR python batch .*shape \(100000000000000,\) "
                                         r"cannot come from a file of \d+ bytes"):
        read_cifar_batch(path, "labels")


def test_cifar_reader_refuses_non_integer_labels(tmp_path: Path) -> None:
    """Float labels used to be truncated silently (0.9 -> class 0)."""
    path = tmp_path / "data_batch_1"
    data = np.zeros((2, 3072), dtype=np.uint8)
    with open(path, "wb") as f:
        pickle.dump({"data": data, "labels": [0.9, 1.5]}, f, protocol=2)
    with pytest.raises(ValueError, match=f"{path}: 'labels' must be a list of integers, got dtype float64"):
        read_cifar_batch(path, "labels")


@pytest.mark.parametrize("num_classes", [10, 3])
def test_a_label_out_of_range_is_named_with_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     num_classes: int) -> None:
    """Found in an audit: an MNIST label byte of 200, or a CIFAR-10 label of 10 or -1, failed only in the
    dataset's own check, whose message names no file. The readers bound the labels by the dataset's catalog
    entry (they had restated 10 and 100 themselves): with the catalog's count lowered to 3, a label of 3 is
    refused by the reader."""
    import dataclasses

    from leakgym.data import catalog

    for name in ("mnist", "cifar10"):
        monkeypatch.setitem(catalog._INFOS, name, dataclasses.replace(catalog._INFOS[name], num_classes=num_classes))
    top = num_classes - 1
    _mnist_like(tmp_path / "mnist", gz=False)
    labels = tmp_path / "mnist" / "train-labels-idx1-ubyte"
    bad = 200 if num_classes == 10 else num_classes
    labels.write_bytes(_idx_bytes(np.array([0, 1, bad, 2, 1]), 0x08, "u1"))
    with pytest.raises(ValueError, match=rf"{labels}: label {bad} out of range; allowed \[0, {top}\]"):
        load_dataset("mnist", root=tmp_path, download=False)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        _cifar_batch(folder / f"data_batch_{i}", 2, "labels", num_classes, seed=i)
    _cifar_batch(folder / "test_batch", 3, "labels", num_classes, seed=9)
    for bad in (num_classes, -1):
        data = np.zeros((2, 3072), dtype=np.uint8)
        with open(folder / "data_batch_3", "wb") as f:
            pickle.dump({"data": data, "labels": [0, bad]}, f, protocol=2)
        with pytest.raises(ValueError, match=rf"data_batch_3: label {bad} out of range; allowed \[0, {top}\]"):
            load_dataset("cifar10", root=tmp_path, download=False)


def test_idx_reader_names_the_file_for_empty_truncated_and_damaged_files(tmp_path: Path) -> None:
    good = _idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5), 0x08, "u1")
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"{path}: empty file"):
        read_idx(path)
    compressed = gzip.compress(good)
    path.write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(ValueError, match=f"{path}: truncated or damaged gzip data"):
        read_idx(path)
    damaged = bytearray(compressed)
    damaged[-8] ^= 0xFF  # the CRC in the gzip trailer
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match=f"{path}: truncated or damaged gzip data .*CRC"):
        read_idx(path)
    path.write_bytes(gzip.compress(good[:-7]))  # a complete gzip stream of a truncated IDX file
    with pytest.raises(ValueError, match=r"IDX payload has 53 bytes but dimensions \(3, 4, 5\) of uint8 need 60"):
        read_idx(path)
    path.write_bytes(gzip.compress(good + b"extra"))
    with pytest.raises(ValueError, match="IDX payload has more than 60 bytes"):
        read_idx(path)
    path.write_bytes(gzip.compress(b"\x08\x03\x00\x00" + good[4:]))
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)
    # Through load_dataset, the error still names the file.
    folder = tmp_path / "mnist"
    _mnist_like(folder, gz=True)
    labels = folder / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:-3])
    with pytest.raises(ValueError, match=f"{labels}: truncated or damaged gzip data"):
        load_dataset("mnist", root=tmp_path, download=False)


def test_idx_header_with_huge_dimensions_is_rejected_before_allocating(tmp_path: Path) -> None:
    huge = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 2**32 - 1, 2**32 - 1, 2**32 - 1)  # ~8e28 bytes
    path = tmp_path / "huge.idx"
    path.write_bytes(huge + bytes(16))
    with pytest.raises(ValueError, match=r"IDX payload has 16 bytes but dimensions \(4294967295, 4294967295, "):
        read_idx(path)
    # (2**16)**2 doubles overflow a 64-bit product to 0, which the old check compared with an empty payload.
    path.write_bytes(bytes([0, 0, 0x0E, 4]) + struct.pack(">4I", 2**16, 2**16, 2**16, 2**16))
    with pytest.raises(ValueError, match="need 147573952589676412928"):
        read_idx(path)
    gz = tmp_path / "huge.idx.gz"
    gz.write_bytes(gzip.compress(huge + bytes(1000)))
    with pytest.raises(ValueError, match=r"more than a \d+-byte gzip file can hold"):
        read_idx(gz)


def test_idx_test_images_of_another_size_than_the_training_images_are_refused(tmp_path: Path) -> None:
    """1x1 test images beside 28x28 training images were silently upsampled to 28x28 (issue 38)."""
    _mnist_like(tmp_path / "mnist", gz=False)
    test_images = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
    test_images.write_bytes(_idx_bytes(np.zeros((3, 1, 1), np.uint8), 0x08, "u1"))
    with pytest.raises(ValueError, match=rf"{test_images}: test images are 1x1 but the training images "
                                         r"\(train-images-idx3-ubyte\) are 28x28; both splits must have one image size"):
        load_dataset("mnist", root=tmp_path, download=False)

"""Readers for the on-disk formats the official datasets ship in.

* **IDX** (MNIST, Fashion-MNIST): LeCun's format, http://yann.lecun.com/exdb/mnist/ ("FILE FORMATS FOR
  THE MNIST DATABASE"). A 4-byte magic number ``0x00 0x00 <type> <ndim>``, ``ndim`` big-endian uint32
  dimension sizes, then the values in C order, big-endian. Files may be gzip-compressed (the
  official downloads and Debian's ``dataset-fashion-mnist`` package ship ``*.gz``); compression is
  detected from the gzip magic bytes, not from the file name.
* **CIFAR python batches** (CIFAR-10/100): https://www.cs.toronto.edu/~kriz/cifar.html. Each batch is
  a pickled dict with ``data``, a ``(N, 3072)`` uint8 array (1024 red, then green, then blue values of
  a 32x32 image in row-major order), and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100).

The readers return numpy arrays exactly as stored (uint8 pixels, integer labels); conversion to unit
float tensors happens in :mod:`leakgym.data.loading`.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from typing import Any

import numpy as np

__all__ = ["read_cifar_batch", "read_idx"]

# IDX type byte -> big-endian numpy dtype (the table in LeCun's format description).
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_maybe_gzip(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == _GZIP_MAGIC else open
    with opener(path, "rb") as f:
        return f.read()


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) into a native-endian numpy array of its stored shape.

    Raises ``ValueError`` naming the file when the magic number, type byte or payload size is wrong.
    """
    data = _read_maybe_gzip(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(
            f"{path}: not an IDX file (first bytes {data[:4].hex()!r}; an IDX file starts with "
            f"0x0000 followed by a type byte and a dimension count)"
        )
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{code:02X}" for code in _IDX_DTYPES)
        raise ValueError(f"{path}: IDX type byte 0x{type_code:02X} is not one of {allowed}")
    if ndim < 1:
        raise ValueError(f"{path}: IDX dimension count {ndim} must be >= 1")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes, need {header_size})")
    dims = struct.unpack(f">{ndim}I", data[4:header_size])
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    payload = len(data) - header_size
    if payload != expected:
        raise ValueError(
            f"{path}: IDX payload has {payload} bytes but dimensions {dims} of {dtype} need {expected}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global except those numpy needs to rebuild an ndarray.

    CIFAR batches are pickles; unpickling an arbitrary file can run arbitrary code. The official
    (Python 2) batches reference only numpy's array-rebuilding globals; batches re-pickled by
    Python 3 may also use ``_codecs.encode`` (protocol <= 2 bytes) or ``_frombuffer`` (protocol 5).
    Anything else is rejected rather than imported.
    """

    _ALLOWED = {
        (module, name)
        for module in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    } | {
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def read_cifar_batch(path: str | os.PathLike[str], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR python batch: ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``.

    Args:
        path: a batch file such as ``cifar-10-batches-py/data_batch_1`` or ``cifar-100-python/train``.
        label_key: ``"labels"`` for CIFAR-10, ``"fine_labels"`` for CIFAR-100.

    The official files are Python 2 pickles; they are decoded with ``encoding="latin1"`` (byte
    strings become ``str`` keys, numpy buffers survive unchanged), as torchvision does.
    """
    with open(path, "rb") as f:
        entry = _NumpyOnlyUnpickler(f, encoding="latin1").load()
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(f"{path}: a CIFAR batch is a dict with 'data' and {label_key!r}; found {keys}")
    data = np.asarray(entry["data"])
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: 'data' must be uint8 of shape (N, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: {label_key!r} has shape {labels.shape}, expected ({data.shape[0]},)")
    return data.reshape(-1, 3, 32, 32), labels

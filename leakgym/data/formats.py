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
float tensors happens in :mod:`leakgym.data.loading`. A file that is empty, truncated (raw or inside
its gzip stream), of the wrong format, or whose IDX header declares more data than the file can hold
raises ``ValueError`` naming the file and what is wrong; the size declared by an IDX header is
checked against the file's size before anything is allocated for it. A CIFAR batch must hold at least one
image; an IDX file's counts and image size are checked by its dataset (:class:`leakgym.data.sources.IdxSource`:
at least one image per split, of the dataset's 28x28). CIFAR batches are read with an
unpickler that resolves only the numpy globals an array needs (see :class:`_NumpyOnlyUnpickler`);
any other global is refused before it is imported, so a hostile batch runs no code.
"""

from __future__ import annotations

import codecs
import gzip
import math
import os
import pickle
import struct
import zlib
from typing import Any, BinaryIO

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
#: DEFLATE expands at most ~1032:1, so a gzip file of n bytes holds at most this many times n bytes
_MAX_DEFLATE_RATIO = 1032
#: what reading a damaged gzip stream raises (BadGzipFile is an OSError)
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes (fewer only at the end of the stream), read in bounded chunks."""
    chunks, left = [], size
    while left > 0:
        chunk = stream.read(min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_idx_stream(path: str | os.PathLike[str], stream: BinaryIO, file_size: int, compressed: bool) -> np.ndarray:
    """Parse an IDX stream; the header's dimensions are checked against ``file_size`` before the payload is read."""
    head = _read_exactly(stream, 4)
    if len(head) < 4 or head[0] != 0 or head[1] != 0:
        raise ValueError(
            f"{path}: not an IDX file (first bytes {head.hex()!r}; an IDX file starts with "
            f"0x0000 followed by a type byte and a dimension count)"
        )
    type_code, ndim = head[2], head[3]
    if type_code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{code:02X}" for code in _IDX_DTYPES)
        raise ValueError(f"{path}: IDX type byte 0x{type_code:02X} is not one of {allowed}")
    if ndim < 1:
        raise ValueError(f"{path}: IDX dimension count {ndim} must be >= 1")
    raw_dims = _read_exactly(stream, 4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header ({4 + len(raw_dims)} bytes, need {4 + 4 * ndim})")
    dims = struct.unpack(f">{ndim}I", raw_dims)
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = math.prod(dims) * dtype.itemsize  # a Python int: no overflow
    need = f"dimensions {dims} of {dtype} need {expected}"
    if not compressed and expected != file_size - 4 - 4 * ndim:
        raise ValueError(f"{path}: IDX payload has {file_size - 4 - 4 * ndim} bytes but {need}")
    if compressed and expected > file_size * _MAX_DEFLATE_RATIO:
        raise ValueError(
            f"{path}: IDX {need} bytes, more than a {file_size}-byte gzip file can hold "
            f"(at most {file_size * _MAX_DEFLATE_RATIO})"
        )
    payload = _read_exactly(stream, expected)
    if len(payload) != expected or stream.read(1):
        got = len(payload) if len(payload) != expected else f"more than {expected}"
        raise ValueError(f"{path}: IDX payload has {got} bytes but {need}")
    array = np.frombuffer(payload, dtype=dtype).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) into a native-endian numpy array of its stored shape.

    Raises ``ValueError`` naming the file when it is empty, truncated, a damaged gzip stream, or
    when the magic number, type byte or payload size is wrong. The dimensions in the header are
    checked against the file's size (for gzip: the most it can decompress to) before the payload
    is read.
    """
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"{path}: empty file (an IDX file starts with 0x0000, a type byte and a dimension count)")
    with open(path, "rb") as f:
        compressed = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        if not compressed:
            return _read_idx_stream(path, f, size, compressed=False)
        try:
            with gzip.GzipFile(fileobj=f) as stream:
                return _read_idx_stream(path, stream, size, compressed=True)
        except _GZIP_ERRORS as exc:
            raise ValueError(f"{path}: truncated or damaged gzip data ({type(exc).__name__}: {exc})") from None


class _ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle names a global that a CIFAR batch does not contain."""


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The globals numpy pickles reference, mapped to the objects themselves (never imported by name)."""
    core = getattr(np, "_core", None) or np.core
    objects = {
        ("multiarray", "_reconstruct"): core.multiarray._reconstruct,
        ("multiarray", "scalar"): core.multiarray.scalar,
        ("numeric", "_frombuffer"): core.numeric._frombuffer,
    }
    table: dict[tuple[str, str], Any] = {
        (f"{package}.{module}", name): obj
        for package in ("numpy.core", "numpy._core")
        for (module, name), obj in objects.items()
    }
    table.update({("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode})
    return table


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global except those numpy needs to rebuild an ndarray.

    CIFAR batches are pickles; unpickling an arbitrary file can run arbitrary code. The official
    (Python 2) batches reference only numpy's array-rebuilding globals (``_reconstruct``,
    ``ndarray``, ``dtype``, ``scalar``); batches re-pickled by Python 3 may also use
    ``_codecs.encode`` (protocol <= 2 bytes) or ``_frombuffer`` (protocol 5). Dicts, lists, strings
    and numbers need no globals. Anything else is rejected rather than imported.
    """

    _ALLOWED = _numpy_globals()

    def __init__(self, file: BinaryIO, *, size: int, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.size = size  # bytes in the file: no array it holds can have more entries

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = self._ALLOWED[(module, name)]
        except KeyError:
            raise _ForbiddenGlobal(f"{module}.{name}") from None
        return self._bounded(found) if name == "_reconstruct" else found

    def _bounded(self, reconstruct: Any) -> Any:
        """numpy's ``_reconstruct``, refusing a shape with more entries than the file has bytes: a damaged
        100-byte batch asked for 10**14 entries and ended in a 91 TiB ``MemoryError``."""
        def bounded(cls: Any, shape: Any, dtype: Any) -> Any:
            dims = shape if isinstance(shape, tuple) else (shape,)
            if not all(isinstance(d, int) and d >= 0 for d in dims) or math.prod(dims) > self.size:
                raise ValueError(f"an array of shape {shape!r} cannot come from a file of {self.size} bytes")
            return reconstruct(cls, shape, dtype)
        return bounded


#: what un-pickling a truncated or malformed (but not hostile) file raises
_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
                  struct.error, UnicodeDecodeError, OverflowError, MemoryError)


def read_cifar_batch(path: str | os.PathLike[str], label_key: str, num_classes: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR python batch: ``(images uint8 (N, 3, 32, 32), labels int64 (N,))``.

    Args:
        path: a batch file such as ``cifar-10-batches-py/data_batch_1`` or ``cifar-100-python/train``.
        label_key: ``"labels"`` for CIFAR-10, ``"fine_labels"`` for CIFAR-100.
        num_classes: when given, every label must be in ``[0, num_classes)`` (named with the file).

    The official files are Python 2 pickles; they are decoded with ``encoding="latin1"`` (byte
    strings become ``str`` keys, numpy buffers survive unchanged), as torchvision does, by
    :class:`_NumpyOnlyUnpickler`. Raises ``ValueError`` naming the file when it is empty, truncated,
    compressed, names any other global (refused before it is imported), lacks the arrays, or holds no image.
    """
    with open(path, "rb") as f:
        head = f.read(2)
        if not head:
            raise ValueError(f"{path}: empty file (a CIFAR python batch is a pickled dict)")
        if head == _GZIP_MAGIC:
            raise ValueError(
                f"{path}: gzip-compressed; CIFAR python batches are plain pickles (extract the official "
                f"*-python.tar.gz archive instead of renaming it)"
            )
        f.seek(0)
        try:
            entry = _NumpyOnlyUnpickler(f, size=os.fstat(f.fileno()).st_size, encoding="latin1").load()
        except _ForbiddenGlobal as exc:
            raise ValueError(
                f"{path}: refused: the pickle names {exc}, which a CIFAR batch does not contain (only numpy "
                f"arrays, dtypes and built-in containers are allowed); nothing from it was run"
            ) from None
        except _PICKLE_ERRORS as exc:
            raise ValueError(f"{path}: truncated or not a CIFAR python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(f"{path}: a CIFAR batch is a dict with 'data' and {label_key!r}; found {keys}")
    data = np.asarray(entry["data"])
    try:
        labels = np.asarray(entry[label_key])
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{path}: {label_key!r} must be a list of integers ({exc})") from None
    if labels.dtype == bool or not np.issubdtype(labels.dtype, np.integer):  # 0.9 would become class 0
        raise ValueError(f"{path}: {label_key!r} must be a list of integers, got dtype {labels.dtype}")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: 'data' must be uint8 of shape (N, 3072) (N images of 3x32x32), got {data.dtype} "
                         f"{data.shape}")
    if data.shape[0] == 0:  # (an empty test_batch loaded and failed only when a game was reset, naming no file)
        raise ValueError(f"{path}: 'data' holds 0 images (shape {data.shape}); a CIFAR batch holds at least 1 image "
                         "of 3x32x32")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: {label_key!r} has shape {labels.shape}, expected ({data.shape[0]},)")
    # The range is checked on the stored values, before the int64 conversion: a uint64 label past 2**63 wrapped
    # round to a negative number and was reported as one (found in an audit).
    if num_classes is not None:
        check_label_range(path, labels, num_classes)
    elif int(labels.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{path}: label {int(labels.max())} out of range; allowed integers up to "
                         f"{np.iinfo(np.int64).max}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def check_label_range(path: str | os.PathLike[str], labels: np.ndarray, num_classes: int) -> None:
    """``ValueError`` naming the file unless every label is in ``[0, num_classes)`` (a damaged file's label
    failed later, in the dataset's own check, which names no file: found in an audit). The labels are compared
    as Python integers, so call it on the stored values: an unsigned label past 2**63 is reported as stored."""
    if labels.size and not (0 <= int(labels.min()) and int(labels.max()) < num_classes):
        bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        raise ValueError(f"{path}: label {bad} out of range; allowed [0, {num_classes - 1}]")

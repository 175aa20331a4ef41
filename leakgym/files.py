"""Output files replaced atomically: written beside their final name, then renamed over it, so an
interruption (Ctrl-C, a failing figure) never leaves a half-written file or a stale one beside a new one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A hidden partial path beside ``path`` to write to (same suffix, so matplotlib picks the format);
    renamed over ``path`` when the block ends normally, removed when it raises. Several nested blocks
    (``contextlib.ExitStack``) rename their files only once every block's file is written."""
    path = Path(path)
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` to ``path`` through :func:`replacing`, flushed to disk before the rename."""
    with replacing(path) as partial, open(partial, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())


__all__ = ["replacing", "write_atomically"]

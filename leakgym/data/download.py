"""Downloading dataset files and verifying them against known checksums before use.

Every remote file LeakGym fetches is described by a :class:`RemoteFile` (its URLs and the MD5 digest of
the official file, the same digests torchvision's dataset classes pin). :func:`download_file` fetches a
file under a temporary ``.part`` name with torchvision's HTTP helper, checks its MD5 with
:func:`verify_md5`, and only then moves it to its final name; archives are extracted by
:func:`download_and_extract` only after that check passed. A corrupted or tampered download is deleted
and never read. Extraction (:func:`extract_tar`) checks every member first and extracts nothing from an
archive holding a member that would land outside the target folder (an absolute path, ``..``, or a
link, device or other special file) or holding more than :data:`MAX_EXTRACTED_BYTES` in all (a
decompression bomb: a checksum vouches for the archive's origin, not for what it expands to; the sizes
are read from the members' headers as the archive is listed, so a bomb is refused before its data is
decompressed past the cap); the members are then extracted with ``tarfile``'s ``"data"`` filter where the
Python version has it.

MD5 is what the upstream publishers and torchvision record for these files; it guards against
truncated or corrupted transfers, not against a deliberate collision attack.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from torchvision.datasets.utils import download_url

__all__ = [
    "MAX_EXTRACTED_BYTES",
    "ChecksumMismatchError",
    "DownloadError",
    "RemoteFile",
    "download_and_extract",
    "download_file",
    "extract_tar",
    "file_md5",
    "verify_md5",
]


#: most bytes an archive may extract to (its members' sizes together): 4 GiB, above any dataset LeakGym
#: downloads (the CIFAR python archives extract to about 180 MB each)
MAX_EXTRACTED_BYTES = 4 * 2**30


class ChecksumMismatchError(RuntimeError):
    """A file's MD5 digest differs from the digest of the official file."""

    def __init__(self, path: Path, expected: str, actual: str) -> None:
        super().__init__(path, expected, actual)  # args kept whole so the error pickles across processes
        self.path = path
        self.expected = expected
        self.actual = actual

    def __str__(self) -> str:
        return f"checksum mismatch for {self.path}: expected md5 {self.expected}, got {self.actual}"


class DownloadError(RuntimeError):
    """Every URL of a :class:`RemoteFile` failed (network error or checksum mismatch)."""

    def __init__(self, filename: str, attempts: list[tuple[str, str]]) -> None:
        super().__init__(filename, attempts)  # args kept whole so the error pickles across processes
        self.filename = filename
        self.attempts = attempts

    def __str__(self) -> str:
        lines = [f"could not download {self.filename}:"]
        lines += [f"  {url}: {error}" for url, error in self.attempts]
        return "\n".join(lines)


@dataclass(frozen=True)
class RemoteFile:
    """One official file: where it can be fetched and the MD5 digest it must have.

    Attributes:
        filename: name the file is stored under (also the last URL component).
        md5: hex MD5 digest of the official file.
        mirrors: base URLs tried in order; the file's URL is ``mirror + filename``.
    """

    filename: str
    md5: str
    mirrors: tuple[str, ...]

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(mirror + self.filename for mirror in self.mirrors)


def file_md5(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex MD5 digest of a file, read in chunks (flagged not-for-security so it works under FIPS)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def verify_md5(path: str | os.PathLike[str], expected: str) -> None:
    """Raise :class:`ChecksumMismatchError` unless ``path`` has MD5 digest ``expected``."""
    actual = file_md5(path)
    if actual != expected.lower():
        raise ChecksumMismatchError(Path(path), expected, actual)


def download_file(remote: RemoteFile, directory: str | os.PathLike[str]) -> Path:
    """Fetch ``remote`` into ``directory`` and return its path once its MD5 digest has been verified.

    Each mirror is tried in turn. The bytes land in ``<filename>.part``; a file whose digest is wrong
    is deleted and the next mirror is tried. If the verified file is already present nothing is
    fetched. Raises :class:`DownloadError` listing every URL tried and why it failed.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / remote.filename
    if final.is_file():
        try:
            verify_md5(final, remote.md5)
            return final
        except ChecksumMismatchError:
            final.unlink()
    partial = directory / (remote.filename + ".part")
    attempts: list[tuple[str, str]] = []
    for url in remote.urls:
        partial.unlink(missing_ok=True)
        try:
            # torchvision's helper follows redirects and falls back from https to http; it is given no
            # digest so that the check below is the one place a download is accepted or rejected.
            download_url(url, str(directory), partial.name, md5=None)
            if not partial.is_file():
                raise OSError(f"nothing was written to {partial}")
            verify_md5(partial, remote.md5)
        except (OSError, RuntimeError, ValueError) as error:  # URLError is an OSError
            partial.unlink(missing_ok=True)
            attempts.append((url, f"{type(error).__name__}: {error}"))
            continue
        partial.replace(final)
        return final
    raise DownloadError(remote.filename, attempts)


def _member_problem(member: tarfile.TarInfo, target: Path) -> str | None:
    """Why ``member`` must not be extracted into ``target`` (a resolved folder), or ``None``."""
    if not (member.isfile() or member.isdir()):
        return "is a link, device or other special file (only regular files and folders are extracted)"
    if os.path.isabs(member.name) or member.name.startswith(("/", "\\")):
        return "has an absolute path"
    if not (target / member.name).resolve().is_relative_to(target):
        return f"would be written outside {target}"
    return None


def extract_tar(archive: str | os.PathLike[str], directory: str | os.PathLike[str], *,
                max_bytes: int | None = None) -> None:
    """Extract the tar archive ``archive`` (optionally gzip/bz2/xz-compressed) into ``directory``.

    Every member is checked before anything is written: an absolute path, a ``..`` that leaves
    ``directory``, a link, a device or any other special file raises ``ValueError`` naming the
    archive and the member, and nothing is extracted; so do members whose sizes add up to more than
    ``max_bytes`` (default :data:`MAX_EXTRACTED_BYTES`), checked header by header as the archive is
    listed (a member's data is read past only after its declared size was counted). The members are then extracted with the
    ``"data"`` filter (Python >= 3.10.12 / 3.11.4), which re-checks them as they are written. A
    truncated or damaged archive raises ``ValueError`` naming it.
    """
    cap = MAX_EXTRACTED_BYTES if max_bytes is None else max_bytes
    target = Path(directory).resolve()
    target.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members, total = [], 0
            for member in tar:  # one header at a time (getmembers() would decompress everything first)
                problem = _member_problem(member, target)
                if problem is not None:
                    raise ValueError(f"{archive}: member {member.name!r} {problem}; nothing was extracted")
                total += member.size
                if total > cap:
                    raise ValueError(f"{archive}: its members hold more than {cap} bytes (reached at member "
                                     f"{member.name!r}, {total} bytes so far); allowed: at most {cap} "
                                     "(MAX_EXTRACTED_BYTES); nothing was extracted")
                members.append(member)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, members=members, filter="data")
            else:  # the explicit check above is then the only one
                tar.extractall(target, members=members)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ValueError(f"{archive}: not a readable tar archive, or truncated ({type(exc).__name__}: {exc})") from None


def download_and_extract(remote: RemoteFile, directory: str | os.PathLike[str]) -> None:
    """Download an archive, verify its checksum, then extract it into ``directory`` and delete it.

    Extraction uses :func:`extract_tar` (members that would land outside ``directory`` are refused
    and nothing is extracted). Nothing is extracted from an archive that failed verification.
    """
    archive = download_file(remote, directory)
    extract_tar(archive, directory)
    archive.unlink()

"""Tests for downloads: checksums are verified before anything is extracted or read, failures turn
into one DatasetUnavailableError, and the pinned URLs/digests agree with torchvision's. No network:
torchvision's HTTP helper is replaced by a function that copies a small local file."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torchvision

from leakgym.data import ChecksumMismatchError, DatasetUnavailableError, DownloadError, load_dataset, sources
from leakgym.data import download as download_module
from leakgym.data.download import RemoteFile, download_and_extract, extract_tar, file_md5, verify_md5


def _tiny_cifar10_archive(directory: Path) -> Path:
    """A cifar-10-python.tar.gz in the official layout holding 1 image per batch."""
    staging = directory / "staging" / "cifar-10-batches-py"
    staging.mkdir(parents=True)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        entry = {"data": np.full((1, 3072), 10 * i, np.uint8), "labels": [i], "batch_label": name}
        with open(staging / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)
    archive = directory / "upload" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staging, arcname="cifar-10-batches-py")
    return archive


def _use_remote(monkeypatch, md5: str) -> RemoteFile:
    remote = RemoteFile("cifar-10-python.tar.gz", md5, ("https://mirror-a.test/", "https://mirror-b.test/"))
    monkeypatch.setitem(
        sources.SOURCES, "cifar10", dataclasses.replace(sources.SOURCES["cifar10"], remote=remote)
    )
    return remote


def test_verify_md5_rejects_a_corrupted_file(tmp_path: Path) -> None:
    path = tmp_path / "archive.bin"
    path.write_bytes(b"official bytes")
    good = file_md5(path)
    assert good == hashlib.md5(b"official bytes").hexdigest()
    verify_md5(path, good)
    path.write_bytes(b"official bytez")  # one byte flipped
    with pytest.raises(ChecksumMismatchError) as info:
        verify_md5(path, good)
    assert info.value.expected == good and info.value.actual == file_md5(path) != good


def test_corrupted_archive_is_rejected_before_extraction(tmp_path: Path, fake_server) -> None:
    served, requested = fake_server
    archive = _tiny_cifar10_archive(tmp_path)
    remote = RemoteFile(
        "cifar-10-python.tar.gz", "0" * 32, ("https://mirror-a.test/", "https://mirror-b.test/")
    )
    served[remote.urls[0]] = archive
    served[remote.urls[1]] = archive
    target = tmp_path / "data"
    with pytest.raises(DownloadError, match="checksum mismatch") as info:
        download_and_extract(remote, target)
    assert requested == list(remote.urls)  # every mirror was tried
    assert len(info.value.attempts) == 2
    # Nothing was extracted and no (partial) download was left behind.
    assert sorted(p.name for p in target.iterdir()) == []

    # With the archive's real digest the same call verifies, extracts and removes the archive.
    download_and_extract(dataclasses.replace(remote, md5=file_md5(archive)), target)
    assert sorted(p.name for p in target.iterdir()) == ["cifar-10-batches-py"]


def test_load_dataset_downloads_verifies_and_loads(tmp_path: Path, fake_server, monkeypatch) -> None:
    served, requested = fake_server
    archive = _tiny_cifar10_archive(tmp_path)
    remote = _use_remote(monkeypatch, file_md5(archive))
    served[remote.urls[1]] = archive  # first mirror is down, second works
    dataset = load_dataset("cifar10", root=tmp_path / "data", download=True)
    assert requested == list(remote.urls)
    assert dataset.train_y.tolist() == [0, 1, 2, 3, 4] and dataset.test_y.tolist() == [5]
    assert float(dataset.train_x[3].mean()) == pytest.approx(30 / 255)
    # Second call finds the extracted copy and does not download again.
    load_dataset("cifar10", root=tmp_path / "data", download=True)
    assert len(requested) == 2


def test_load_dataset_with_bad_checksum_raises_unavailable(tmp_path: Path, fake_server, monkeypatch) -> None:
    served, _ = fake_server
    archive = _tiny_cifar10_archive(tmp_path)
    remote = _use_remote(monkeypatch, "f" * 32)
    served[remote.urls[0]] = archive
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("cifar10", root=tmp_path / "data", download=True)
    message = str(info.value)
    assert "checksum mismatch" in message and "expected md5 " + "f" * 32 in message
    assert isinstance(info.value.__cause__, DownloadError)
    # The errors survive pickling (vectorised environments re-raise worker errors in the parent).
    for error in (info.value, info.value.__cause__):
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error) and str(clone) == str(error)
    mismatch = ChecksumMismatchError(Path("a.tar.gz"), "0" * 32, "1" * 32)
    assert str(pickle.loads(pickle.dumps(mismatch))) == str(mismatch)
    assert not (tmp_path / "data" / "cifar-10-batches-py").exists()


def test_network_failure_raises_one_unavailable_error(tmp_path: Path, fake_server, monkeypatch) -> None:
    monkeypatch.setattr(sources, "DEBIAN_DATASETS_DIR", tmp_path / "no-debian")
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("fashion-mnist", root=tmp_path / "data", download=True)
    message = str(info.value)
    assert "Download failed" in message and "name resolution" in message
    assert "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/train-images-idx3-ubyte.gz" in message
    assert str(tmp_path / "data" / "fashion-mnist") in message and "load_dataset('digits')" in message


@pytest.mark.parametrize("name", ["celeba", "tiny-imagenet", "imagenet"])
@pytest.mark.parametrize("download", [False, True])
def test_a_dataset_provided_by_hand_is_not_offered_a_download(tmp_path: Path, name: str, download: bool) -> None:
    """Found in an audit: the message of a dataset LeakGym never downloads ended with "call load_dataset(name,
    download=True) on a machine with internet access", which cannot fetch it."""
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset(name, root=tmp_path / "data", download=download)
    message = str(info.value)
    assert "download=True" not in message and "(LeakGym does not download it)" in message
    assert str(pickle.loads(pickle.dumps(info.value))) == message
    with pytest.raises(DatasetUnavailableError, match=r"download=True\) on a machine with internet access"):
        load_dataset("cifar10", root=tmp_path / "data", download=False)


def test_pinned_urls_and_digests_match_torchvision() -> None:
    datasets = torchvision.datasets
    for name, cls in (("mnist", datasets.MNIST), ("fashion-mnist", datasets.FashionMNIST)):
        remote = sources.SOURCES[name].remote
        assert [(r.filename, r.md5) for r in remote] == list(cls.resources)
        assert all(r.mirrors == tuple(cls.mirrors) for r in remote)
    for name, cls in (("cifar10", datasets.CIFAR10), ("cifar100", datasets.CIFAR100)):
        remote = sources.SOURCES[name].remote
        assert remote.urls == (cls.url,) and remote.md5 == cls.tgz_md5
        assert sources.SOURCES[name].folder == cls.base_folder
        assert sources.SOURCES[name].train_files + sources.SOURCES[name].test_files == tuple(
            f for f, _ in cls.train_list + cls.test_list
        )


def _tar_with(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    "hostile",
    [
        (_file("../evil.txt"), b"written outside"),
        (_file("cifar-10-batches-py/../../evil.txt"), b"written outside"),
        (_file("/tmp/leakgym-test-absolute-evil.txt"), b"absolute"),
        (_link("cifar-10-batches-py/escape", "../../evil.txt", tarfile.SYMTYPE), None),
        (_link("cifar-10-batches-py/hard", "/etc/passwd", tarfile.LNKTYPE), None),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink", "hardlink"],
)
def test_archive_members_outside_the_target_are_refused(tmp_path: Path, fake_server, hostile) -> None:
    served, _ = fake_server
    good = (_file("cifar-10-batches-py/data_batch_1"), b"extracted first if anything were")
    archive = _tar_with(tmp_path / "cifar-10-python.tar.gz", [good, hostile])
    remote = RemoteFile("cifar-10-python.tar.gz", file_md5(archive), ("https://mirror-a.test/",))
    served[remote.urls[0]] = archive
    target = tmp_path / "data" / "root"
    with pytest.raises(ValueError, match=f"member {re.escape(repr(hostile[0].name))} .*nothing was extracted"):
        download_and_extract(remote, target)  # the checksum is right: only the member check stops it
    assert not (tmp_path / "data" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    assert not Path("/tmp/leakgym-test-absolute-evil.txt").exists()
    assert sorted(p.name for p in target.iterdir()) == ["cifar-10-python.tar.gz"]  # nothing extracted


def test_dotdot_archive_is_really_hostile_without_the_check(tmp_path: Path) -> None:
    """The archive of the test above writes outside its target when extracted without any filter."""
    archive = _tar_with(tmp_path / "a.tar.gz", [(_file("../evil.txt"), b"written outside")])
    (tmp_path / "target").mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "target", **({"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}))
    assert (tmp_path / "evil.txt").read_bytes() == b"written outside"


def test_extract_tar_names_a_truncated_archive(tmp_path: Path) -> None:
    archive = _tiny_cifar10_archive(tmp_path)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"{archive}: not a readable tar archive, or truncated"):
        extract_tar(archive, tmp_path / "out")
    archive.write_bytes(b"")
    with pytest.raises(ValueError, match=f"{archive}: not a readable tar archive"):
        extract_tar(archive, tmp_path / "out")


def test_a_decompression_bomb_in_a_checksummed_archive_is_refused_before_it_expands(tmp_path: Path, fake_server,
                                                                                   monkeypatch) -> None:
    """A gzip bomb with the right checksum was extracted without a size cap (issue 38). The cap is met
    at the header of the member that crosses it, before its data is read."""
    served, _ = fake_server
    archive = tmp_path / "cifar-10-python.tar.gz"
    zeros = b"\0" * (4 * 2**20)  # 4 MiB of zeros: a few KB compressed
    _tar_with(archive, [(_file("cifar-10-batches-py/data_batch_1"), b"small"),
                        (_file("cifar-10-batches-py/data_batch_2"), zeros)])
    assert archive.stat().st_size < 64 * 1024
    remote = RemoteFile("cifar-10-python.tar.gz", file_md5(archive), ("https://mirror-a.test/",))
    served[remote.urls[0]] = archive
    monkeypatch.setattr(download_module, "MAX_EXTRACTED_BYTES", 2**20)
    target = tmp_path / "data"
    with pytest.raises(ValueError, match=r"cifar-10-python.tar.gz: its members hold more than 1048576 bytes \(reached "
                                         r"at member 'cifar-10-batches-py/data_batch_2', 4194309 bytes so far\); "
                                         r"allowed: at most 1048576 \(MAX_EXTRACTED_BYTES\); nothing was extracted"):
        download_and_extract(remote, target)
    assert sorted(p.name for p in target.iterdir()) == ["cifar-10-python.tar.gz"]  # nothing extracted
    extract_tar(archive, tmp_path / "roomy", max_bytes=8 * 2**20)  # under a larger cap it extracts
    assert (tmp_path / "roomy" / "cifar-10-batches-py" / "data_batch_2").stat().st_size == len(zeros)

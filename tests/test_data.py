"""Tests for leakgym.data: the bundled digits dataset, specs, resizing, normalisation, errors and
federated splits. On-disk formats and downloads are tested in test_data_formats.py and
test_data_download.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leakgym.data import (
    DATASET_NAMES,
    Dataset,
    DatasetUnavailableError,
    data_root,
    dataset_spec,
    federated_split,
    label_skew,
    load_dataset,
    resize_images,
    to_unit_images,
)
from leakgym.data.digits import digits_statistics


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


# --- digits -------------------------------------------------------------------------------------


def test_digits_loads_offline_with_expected_shapes_and_ranges(digits: Dataset) -> None:
    assert digits.spec == dataset_spec("digits")
    assert digits.spec.shape == (1, 16, 16)
    assert digits.train_x.shape == (1438, 1, 16, 16) and digits.test_x.shape == (359, 1, 16, 16)
    assert digits.train_x.dtype == torch.float32 and digits.train_y.dtype == torch.int64
    for x in (digits.train_x, digits.test_x):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(digits.train_y.tolist()) == set(range(10)) == set(digits.test_y.tolist())
    # Stratified 20% test split: every class contributes round(0.2 * n_c), i.e. 35 or 36 images.
    assert set(torch.bincount(digits.test_y).tolist()) <= {35, 36, 37}


def test_digits_split_is_fixed_and_native_size_matches_sklearn(digits: Dataset) -> None:
    from sklearn.datasets import load_digits

    again = load_dataset("digits")
    assert torch.equal(again.train_x, digits.train_x) and torch.equal(again.test_y, digits.test_y)

    native = load_dataset("digits", image_size=8)
    bunch = load_digits()
    pool = torch.from_numpy(bunch.images.reshape(len(bunch.images), -1).astype(np.float32) / 16.0)
    # Each native training image is an exact row of sklearn's data, scaled by 1/16, with its label.
    flat = native.train_x.flatten(1)
    match = (flat[:, None, :] == pool[None, :, :]).all(dim=2)
    assert match.any(dim=1).all()
    first = torch.nonzero(match[0]).flatten()
    assert int(native.train_y[0]) in set(bunch.target[first.numpy()].tolist())
    # Train and test are a partition of the 1797 images.
    assert native.train_x.shape[0] + native.test_x.shape[0] == len(bunch.images)


def test_digits_resize_to_other_sizes() -> None:
    big = load_dataset("digits", image_size=32)
    assert big.spec.shape == (1, 32, 32) and big.train_x.shape[1:] == (1, 32, 32)
    assert 0.0 <= float(big.train_x.min()) and float(big.train_x.max()) <= 1.0
    # Bilinear interpolation keeps the mean intensity: 0.30594 at 8x8 and at 32x32 (measured).
    native = load_dataset("digits", image_size=8)
    assert abs(float(big.train_x.mean()) - float(native.train_x.mean())) < 1e-3


def test_digits_normalisation_constants_match_recomputation(digits: Dataset) -> None:
    mean, std = digits_statistics(16)  # measured 0.30594, 0.31944
    assert abs(mean - digits.spec.mean[0]) < 1e-4 and abs(std - digits.spec.std[0]) < 1e-4
    x_n = digits.spec.normalize(digits.train_x)
    assert abs(float(x_n.mean())) < 1e-3 and abs(float(x_n.std()) - 1.0) < 1e-3


# --- specs, names, normalisation ----------------------------------------------------------------


def test_dataset_spec_for_every_name_without_loading() -> None:
    expected = {
        "digits": (1, 16, 10),
        "mnist": (1, 28, 10),
        "fashion-mnist": (1, 28, 10),
        "cifar10": (3, 32, 10),
        "cifar100": (3, 32, 100),
        "svhn": (3, 32, 10),
        "celeba": (3, 32, 2),
        "tiny-imagenet": (3, 64, 200),
        "imagenet": (3, 224, 1000),
        "imagenette": (3, 224, 10),
    }
    assert set(DATASET_NAMES) == set(expected)
    for name, (channels, size, classes) in expected.items():
        spec = dataset_spec(name)
        assert (spec.channels, spec.image_size, spec.num_classes) == (channels, size, classes)
        assert dataset_spec(name, image_size=12).shape == (channels, 12, 12)
    assert dataset_spec("mnist").mean == (0.1307,) and dataset_spec("mnist").std == (0.3081,)
    assert dataset_spec("fashion-mnist").mean == (0.2860,) and dataset_spec("fashion-mnist").std == (0.3530,)


def test_unknown_name_and_bad_image_size_raise_value_error() -> None:
    with pytest.raises(ValueError, match="allowed: digits, mnist, fashion-mnist, cifar10, cifar100, svhn, celeba, "
                                         "tiny-imagenet, imagenet, imagenette, or a path to an image folder"):
        load_dataset("imagenet-21k")
    with pytest.raises(ValueError, match="did you mean 'svhn'"):
        dataset_spec("svnh")
    for bad in (0, 1, -3, 2.5, True):
        with pytest.raises(ValueError, match="image_size"):
            load_dataset("digits", image_size=bad)


def test_normalise_denormalise_round_trip_and_to_unit_images() -> None:
    generator = torch.Generator().manual_seed(0)
    for name in ("digits", "cifar10", "cifar100"):
        spec = dataset_spec(name)
        x = torch.rand((4, *spec.shape), generator=generator)
        x_n = spec.normalize(x)
        assert not torch.allclose(x_n, x)
        torch.testing.assert_close(spec.denormalize(x_n), x, rtol=0, atol=1e-6)
        torch.testing.assert_close(to_unit_images(x_n, spec), x, rtol=0, atol=1e-6)
        # Out-of-range model inputs are clamped into [0, 1].
        wild = spec.normalize(x) * 5.0
        unit = to_unit_images(wild, spec)
        assert float(unit.min()) == 0.0 and float(unit.max()) == 1.0


def test_resize_is_antialiased() -> None:
    # A one-pixel checkerboard shrunk 3x. Without antialiasing, bilinear sampling lands exactly on
    # pixel centres and aliases it to a pattern of 0s and 1s (max deviation from grey 0.5); the
    # antialiased filter averages it to grey (max deviation 0.0062 measured).
    board = ((torch.arange(24)[:, None] + torch.arange(24)[None, :]) % 2).float().view(1, 1, 24, 24)
    small = resize_images(board, 8)
    assert small.shape == (1, 1, 8, 8)
    assert float((small - 0.5).abs().max()) < 0.05
    with pytest.raises(ValueError, match="size"):
        resize_images(board, 1)


# --- unavailable datasets ------------------------------------------------------------------------


def test_unavailable_dataset_error_names_dataset_places_and_digits(tmp_path, monkeypatch) -> None:
    from leakgym.data import sources

    monkeypatch.setattr(sources, "DEBIAN_DATASETS_DIR", tmp_path / "debian")
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("fashion-mnist", root=tmp_path, download=False)
    error = info.value
    message = str(error)
    assert isinstance(error, RuntimeError) and error.name == "fashion-mnist"
    assert "'fashion-mnist'" in message
    looked = [
        tmp_path / "fashion-mnist",
        tmp_path / "FashionMNIST" / "raw",
        tmp_path / "debian" / "fashion-mnist",
    ]
    assert error.searched == looked
    for place in looked:
        assert str(place) in message
    assert "download=False" in message
    assert "train-images-idx3-ubyte" in message  # how to provide it
    assert "load_dataset('digits')" in message

    # A partial copy is reported with exactly the files it lacks; no other dataset is substituted.
    partial = tmp_path / "cifar-10-batches-py"
    partial.mkdir()
    (partial / "data_batch_1").write_bytes(b"")
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("cifar10", root=tmp_path, download=False)
    expected = "missing data_batch_2, data_batch_3, data_batch_4, data_batch_5, test_batch)"
    assert f"  - {partial} ({expected}" in str(info.value) and "digits" in str(info.value)


def test_data_root_follows_argument_then_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LEAKGYM_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("LEAKGYM_DATA")
    assert data_root().name == "leakgym"


# --- federated split -----------------------------------------------------------------------------


def _assert_partition(split, n_train: int) -> None:
    pieces = [split.public_indices, *split.client_indices]
    everything = torch.cat(pieces)
    assert everything.numel() == n_train  # no index used twice ...
    assert torch.equal(everything.sort().values, torch.arange(n_train))  # ... and all covered


def test_federated_split_iid_partitions_and_is_deterministic(digits: Dataset) -> None:
    split = federated_split(digits, num_clients=7, public_fraction=0.1, seed=3)
    assert split.spec == digits.spec and split.num_clients == 7
    assert split.public_x.shape[0] == int(0.1 * 1438) == 143
    _assert_partition(split, 1438)
    sizes = split.client_sizes()
    assert max(sizes) - min(sizes) <= 1
    for (x, y), idx in zip(split.clients, split.client_indices):
        assert torch.equal(x, digits.train_x[idx]) and torch.equal(y, digits.train_y[idx])
    assert torch.equal(split.public_x, digits.train_x[split.public_indices])
    assert torch.equal(split.test_x, digits.test_x)

    same = federated_split(digits, num_clients=7, public_fraction=0.1, seed=3)
    other = federated_split(digits, num_clients=7, public_fraction=0.1, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(same.client_indices, split.client_indices))
    assert not torch.equal(other.client_indices[0], split.client_indices[0])


def test_federated_split_dirichlet_partitions_nonempty_and_deterministic(digits: Dataset) -> None:
    split = federated_split(digits, num_clients=50, public_fraction=0.2, alpha=0.01, seed=0)
    _assert_partition(split, 1438)
    assert min(split.client_sizes()) >= 1
    again = federated_split(digits, num_clients=50, public_fraction=0.2, alpha=0.01, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(again.client_indices, split.client_indices))


def test_dirichlet_split_is_measurably_more_skewed_than_iid(digits: Dataset) -> None:
    """Skew = mean over clients of the total-variation distance between the client's label
    distribution and the pooled one (``label_skew``). Measured on digits with 10 clients, seed 0:
    IID 0.113 (sampling noise of ~130 images per client), alpha=100 0.036, alpha=0.1 0.694."""
    iid = label_skew(federated_split(digits, num_clients=10, seed=0))
    skewed = label_skew(federated_split(digits, num_clients=10, alpha=0.1, seed=0))
    mild = label_skew(federated_split(digits, num_clients=10, alpha=100.0, seed=0))
    assert iid < 0.2 and mild < 0.2
    assert skewed > 0.5 and skewed > 3 * iid


def test_federated_split_test_subset_leaves_train_partition_unchanged(digits: Dataset) -> None:
    full = federated_split(digits, num_clients=4, alpha=0.5, seed=1)
    sub = federated_split(digits, num_clients=4, alpha=0.5, seed=1, test_size=50)
    assert sub.test_x.shape[0] == 50 and sub.test_y.shape == (50,)
    assert all(torch.equal(a, b) for a, b in zip(full.client_indices, sub.client_indices))
    # Every subset image is a test image with its own label.
    rows, pool = sub.test_x.flatten(1), digits.test_x.flatten(1)
    match = (rows[:, None, :] == pool[None, :, :]).all(dim=2)
    assert match.any(dim=1).all()
    assert all(int(sub.test_y[i]) in digits.test_y[match[i]].tolist() for i in range(50))


def test_federated_split_validates_arguments(digits: Dataset) -> None:
    with pytest.raises(ValueError, match="num_clients"):
        federated_split(digits, num_clients=0)
    with pytest.raises(ValueError, match="num_clients"):
        federated_split(digits, num_clients=2000)
    for fraction in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="public_fraction"):
            federated_split(digits, num_clients=2, public_fraction=fraction)
    for alpha in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            federated_split(digits, num_clients=2, alpha=alpha)
    for test_size in (0, 360, 2.0):
        with pytest.raises(ValueError, match="test_size"):
            federated_split(digits, num_clients=2, test_size=test_size)
    for seed in (-1, 1.5, True):  # numpy's messages named no argument (and True was seed 1)
        with pytest.raises(ValueError, match=rf"seed={seed!r} must be an integer >= 0"):
            federated_split(digits, num_clients=2, seed=seed)
    with pytest.raises(ValueError, match="alpha=True"):
        federated_split(digits, num_clients=2, alpha=True)
    single = federated_split(digits, num_clients=1, public_fraction=0.0)
    assert single.public_x.shape[0] == 0 and single.client_sizes() == [1438]
    # numpy integers and floats are numbers like any other
    same = federated_split(digits, num_clients=np.int64(2), public_fraction=np.float32(0.25), seed=np.int64(3))
    ref = federated_split(digits, num_clients=2, public_fraction=0.25, seed=3)
    assert same.client_sizes() == ref.client_sizes()


def test_dataset_spec_refuses_impossible_values_and_integer_images():
    """A NaN std passed `std <= 0`; image_size=0 was accepted; normalising uint8 images made uint8
    statistics (std 0) and returned inf everywhere."""
    import torch

    from leakgym.data.spec import DatasetSpec

    with pytest.raises(ValueError, match=r"std=\(nan,\) must be finite and > 0"):
        DatasetSpec("t", 1, 4, 2, (0.5,), (float("nan"),))
    with pytest.raises(ValueError, match="image_size=0 must be an integer >= 1"):
        DatasetSpec("t", 1, 0, 2, (0.5,), (0.5,))
    with pytest.raises(ValueError, match="must be floating point .* got dtype torch.uint8"):
        DatasetSpec("t", 1, 4, 2, (0.5,), (0.3,)).normalize(torch.zeros(1, 1, 4, 4, dtype=torch.uint8))


def test_normalisation_statistics_are_made_once_and_never_as_inference_tensors():
    """The (1, C, 1, 1) mean/std tensors are cached per dtype and device (one per vector step, not per
    game); one made under torch.inference_mode is not cached, so autograd can still use the stats later."""
    import torch

    from leakgym.data.spec import DatasetSpec, _channel_stats

    spec = DatasetSpec(name="t", channels=3, image_size=4, num_classes=2, mean=(0.1, 0.2, 0.3), std=(0.5, 0.6, 0.7))
    x = torch.rand(2, 3, 4, 4)
    _channel_stats.cache_clear()
    with torch.inference_mode():
        spec.normalize(x)
    assert _channel_stats.cache_info().currsize == 0
    leaf = torch.rand(2, 3, 4, 4, requires_grad=True)
    spec.normalize(leaf).sum().backward()  # would fail with a cached inference tensor
    torch.testing.assert_close(leaf.grad, (1 / torch.tensor([0.5, 0.6, 0.7])).view(1, 3, 1, 1).expand(2, 3, 4, 4))
    assert spec._stats(x)[0] is spec._stats(x.clone())[0]  # cached
    torch.testing.assert_close(spec.denormalize(spec.normalize(x)), x)

"""Datasets, normalisation and federated splits.

``load_dataset(name)`` returns unit images for ``digits`` (bundled, offline), ``mnist``,
``fashion-mnist``, ``cifar10``, ``cifar100`` and the papers' ``svhn``, ``celeba``, ``tiny-imagenet``,
``imagenet`` and ``imagenette`` (:mod:`leakgym.data.imagesets`), or for a path to the user's own image
folder or ``.npz`` file (:mod:`leakgym.data.custom`); ``federated_split`` turns a dataset into a public
pool, K client shards and a test set. See ``docs/data.md``.
"""

from leakgym.data.catalog import DATASET_NAMES, DatasetInfo, dataset_info, dataset_spec
from leakgym.data.download import ChecksumMismatchError, DownloadError
from leakgym.data.federated import FederatedSplit, SplitIndices, federated_split, label_skew, split_indices
from leakgym.data.images import resize_images, to_unit_images
from leakgym.data.loading import Dataset, DatasetUnavailableError, data_root, load_dataset
from leakgym.data.spec import DatasetSpec

__all__ = [
    "DATASET_NAMES",
    "ChecksumMismatchError",
    "Dataset",
    "DatasetInfo",
    "DatasetSpec",
    "DatasetUnavailableError",
    "DownloadError",
    "FederatedSplit",
    "SplitIndices",
    "data_root",
    "dataset_info",
    "dataset_spec",
    "federated_split",
    "label_skew",
    "load_dataset",
    "resize_images",
    "split_indices",
    "to_unit_images",
]

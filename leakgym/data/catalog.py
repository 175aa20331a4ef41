"""The datasets LeakGym knows: image geometry, class counts and normalisation statistics.

Normalisation statistics are per-channel mean and standard deviation of the *training* images in
``[0, 1]`` at native resolution, as used throughout the gradient-inversion literature:

* MNIST ``0.1307 / 0.3081`` and Fashion-MNIST ``0.2860 / 0.3530``: the standard published values.
* CIFAR-10 / CIFAR-100: the per-pixel values of the training sets as pinned in ``inversefed``'s and
  ``breaching``'s ``consts.py`` (Geiping et al., "Inverting Gradients - How easy is it to break
  privacy in federated learning?", NeurIPS 2020), so reconstructions are comparable with that work.
* digits: computed once by :func:`leakgym.data.digits.digits_statistics` on LeakGym's fixed digits
  training split at the default 16x16 size (mean 0.3059, std 0.3194) and stored here as constants
  (``tests/test_data.py`` recomputes them).

* SVHN: mean ``(0.4377, 0.4438, 0.4728)``, std ``(0.1980, 0.2010, 0.1970)``, the values in common use
  for SVHN's training set (quoted, not recomputed here: no copy of SVHN is available offline).
* CelebA: mean ``(0.5063, 0.4258, 0.3832)``, std ``(0.3107, 0.2904, 0.2897)``, the values in common use
  for the aligned-and-cropped training images (quoted likewise).
* ImageNet, Imagenette and TinyImageNet (both ImageNet subsets): torchvision's ImageNet statistics
  ``(0.485, 0.456, 0.406) / (0.229, 0.224, 0.225)``, as the papers' ResNet-18 pipelines use.
* A path (an image folder or an ``.npz``, :mod:`leakgym.data.custom`): computed from the data's
  training split when it is first read.

The same constants are used whatever ``image_size`` is, so normalisation never depends on a resize.
Resizing does change the true statistics a little: interpolation keeps the mean but smooths the
image, e.g. the digits training std is 0.376 at native 8x8, 0.319 at 16x16 and 0.324 at 32x32.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from leakgym.data.spec import DatasetSpec
from leakgym.suggest import did_you_mean

__all__ = ["DATASET_NAMES", "DatasetInfo", "dataset_info", "dataset_spec", "is_dataset_path"]


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about one dataset.

    Attributes:
        name: the identifier accepted by ``load_dataset``.
        channels: 1 (grey) or 3 (RGB).
        native_size: side length of the images as published.
        default_size: side length ``load_dataset`` returns when ``image_size`` is not given.
        num_classes: number of labels.
        mean, std: per-channel normalisation statistics of unit images (see module docstring).
        source: where the data comes from, in words (shown in error messages and docs).
        train_size: images of the published training split (scenarios check their federated split
            against it when they are built).
    """

    name: str
    channels: int
    native_size: int
    default_size: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str
    train_size: int


#: torchvision's ImageNet statistics (``torchvision.transforms.Normalize`` in its reference recipes)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)

_INFOS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            name="digits",
            channels=1,
            native_size=8,
            default_size=16,
            num_classes=10,
            mean=(0.3059,),
            std=(0.3194,),
            source="scikit-learn's bundled UCI optical handwritten digits (sklearn.datasets.load_digits)",
            train_size=1438,
        ),
        DatasetInfo(
            name="mnist",
            channels=1,
            native_size=28,
            default_size=28,
            num_classes=10,
            mean=(0.1307,),
            std=(0.3081,),
            source="MNIST (LeCun et al.), IDX files; downloaded from torchvision's mirrors",
            train_size=60000,
        ),
        DatasetInfo(
            name="fashion-mnist",
            channels=1,
            native_size=28,
            default_size=28,
            num_classes=10,
            mean=(0.2860,),
            std=(0.3530,),
            source="Fashion-MNIST (Zalando Research), IDX files; Debian package dataset-fashion-mnist "
            "or downloaded from Zalando's mirror",
            train_size=60000,
        ),
        DatasetInfo(
            name="cifar10",
            channels=3,
            native_size=32,
            default_size=32,
            num_classes=10,
            mean=(0.4914672374725342, 0.4822617471218109, 0.4467701315879822),
            std=(0.24703224003314972, 0.24348513782024384, 0.26158785820007324),
            source="CIFAR-10 (Krizhevsky, 2009), python pickled batches from www.cs.toronto.edu/~kriz",
            train_size=50000,
        ),
        DatasetInfo(
            name="cifar100",
            channels=3,
            native_size=32,
            default_size=32,
            num_classes=100,
            mean=(0.5071598291397095, 0.4866936206817627, 0.44120192527770996),
            std=(0.2673342823982239, 0.2564384639263153, 0.2761504650115967),
            source="CIFAR-100 (Krizhevsky, 2009), python pickled batches from www.cs.toronto.edu/~kriz",
            train_size=50000,
        ),
        DatasetInfo(
            name="svhn",
            channels=3,
            native_size=32,
            default_size=32,
            num_classes=10,
            mean=(0.4377, 0.4438, 0.4728),
            std=(0.1980, 0.2010, 0.1970),
            source="SVHN cropped digits (Netzer et al., 2011), train_32x32.mat / test_32x32.mat from "
            "ufldl.stanford.edu/housenumbers (label 10 is digit 0)",
            train_size=73257,
        ),
        DatasetInfo(
            name="celeba",
            channels=3,
            native_size=178,
            default_size=32,
            num_classes=2,
            mean=(0.5063, 0.4258, 0.3832),
            std=(0.3107, 0.2904, 0.2897),
            source="CelebA (Liu et al., 2015), img_align_celeba/ with list_attr_celeba.txt and "
            "list_eval_partition.txt; label: the 'Male' attribute (gender, as in DCS²); provided by hand",
            train_size=162770,
        ),
        DatasetInfo(
            name="tiny-imagenet",
            channels=3,
            native_size=64,
            default_size=64,
            num_classes=200,
            mean=_IMAGENET_MEAN,
            std=_IMAGENET_STD,
            source="TinyImageNet-200 (Le & Yang, 2015): wnids.txt, train/<wnid>/images/, val/val_annotations.txt; "
            "provided by hand",
            train_size=100000,
        ),
        DatasetInfo(
            name="imagenet",
            channels=3,
            native_size=224,
            default_size=224,
            num_classes=1000,
            mean=_IMAGENET_MEAN,
            std=_IMAGENET_STD,
            source="ILSVRC2012 (Deng et al., 2009; Russakovsky et al., 2015), train/<wnid>/ and val/<wnid>/ class "
            "folders, or a subset of them; provided by hand",
            train_size=1281167,
        ),
        DatasetInfo(
            name="imagenette",
            channels=3,
            native_size=320,
            default_size=224,
            num_classes=10,
            mean=_IMAGENET_MEAN,
            std=_IMAGENET_STD,
            source="Imagenette v2 (fast.ai; 10 ImageNet classes, the OASIS paper's ImageNet subset), "
            "imagenette2-320.tgz from s3.amazonaws.com/fast-ai-imageclas",
            train_size=9469,
        ),
    )
}

#: Every name ``load_dataset`` accepts. ``digits`` is bundled with scikit-learn and works offline.
#: Any path to an image folder or an ``.npz`` file is accepted too (:mod:`leakgym.data.custom`).
DATASET_NAMES: tuple[str, ...] = tuple(_INFOS)

#: what the "allowed" part of an unknown-dataset error says about paths
PATH_HINT = "or a path to an image folder (one sub-folder per class) or an .npz file (images, labels)"


def is_dataset_path(value: str) -> bool:
    """True if ``value`` names a path (see :mod:`leakgym.data.custom`), not a packaged dataset."""
    if value in DATASET_NAMES:
        return False
    return ("/" in value or os.sep in value or value.startswith(("~", ".")) or value.lower().endswith(".npz")
            or Path(value).exists())


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` for ``name`` (a dataset name or a path, see :mod:`leakgym.data.custom`);
    ``ValueError`` listing the allowed names otherwise. A path's data are read (once per process)."""
    if not isinstance(name, str):
        raise ValueError(f"dataset {name!r} must be a string: {', '.join(DATASET_NAMES)}, {PATH_HINT}")  # noqa: TRY004 - a user error (CLI exit 2)
    if name in _INFOS:
        return _INFOS[name]
    from leakgym.data.custom import user_data

    if is_dataset_path(name):
        data = user_data(name)
        return DatasetInfo(
            name=data.path,
            channels=data.channels,
            native_size=data.native_size,
            default_size=data.native_size,
            num_classes=data.num_classes,
            mean=data.mean,
            std=data.std,
            source=data.source,
            train_size=len(data.train_y),
        )

    raise ValueError(f"unknown dataset {name!r}{did_you_mean(name, DATASET_NAMES)}; allowed: "
                     f"{', '.join(DATASET_NAMES)}, {PATH_HINT}")


def check_image_size(image_size: int | None) -> None:
    """``ValueError`` unless ``image_size`` is ``None`` or an integer >= 2."""
    if image_size is None:
        return
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 2:
        raise ValueError(f"image_size={image_size!r} must be None or an integer >= 2")


def dataset_spec(name: str, image_size: int | None = None) -> DatasetSpec:
    """The :class:`DatasetSpec` ``load_dataset(name, image_size=image_size)`` returns, without loading.

    ``image_size=None`` means the dataset's default size (16 for digits, 32 for CelebA, 224 for Imagenette,
    native for the others; for a path, the shorter side of its images).
    """
    check_image_size(image_size)
    info = dataset_info(name)
    return DatasetSpec(
        name=info.name,
        channels=info.channels,
        image_size=info.default_size if image_size is None else image_size,
        num_classes=info.num_classes,
        mean=info.mean,
        std=info.std,
    )

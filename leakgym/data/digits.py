"""The offline default dataset: scikit-learn's bundled 8x8 handwritten digits.

``sklearn.datasets.load_digits`` ships the test part of the UCI "Optical Recognition of Handwritten
Digits" data set (Alpaydin & Kaynak, 1998): 1797 grey images of 8x8 pixels with integer intensities
0..16, ten classes. It needs no download, so it is LeakGym's default on any machine.

Images are scaled to ``[0, 1]`` by dividing by 16 and resized (antialiased bilinear) to the requested
size, 16x16 by default. The train/test split is fixed: a class-stratified split drawn with
``torch.Generator().manual_seed(DIGITS_SPLIT_SEED)`` (seed 0) that puts ``round(0.2 * n_c)`` images of
each class ``c`` in the test split -- 1438 training and 359 test images.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from leakgym.data.images import resize_images

__all__ = ["DIGITS_SPLIT_SEED", "DIGITS_TEST_FRACTION", "digits_statistics", "load_digits_split"]

#: Seed of the fixed digits train/test split.
DIGITS_SPLIT_SEED = 0
#: Fraction of each class held out as the digits test split.
DIGITS_TEST_FRACTION = 0.2


def load_digits_split(image_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(train_x, train_y, test_x, test_y)``: unit float32 ``(N, 1, S, S)`` images, int64 labels."""
    from sklearn.datasets import load_digits  # imported lazily: only this dataset needs scikit-learn

    bunch = load_digits()
    images = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32) / 16.0).unsqueeze(1)
    labels = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))

    generator = torch.Generator().manual_seed(DIGITS_SPLIT_SEED)
    train_parts, test_parts = [], []
    for c in range(10):
        members = torch.nonzero(labels == c).flatten()
        members = members[torch.randperm(members.numel(), generator=generator)]
        n_test = round(DIGITS_TEST_FRACTION * members.numel())
        test_parts.append(members[:n_test])
        train_parts.append(members[n_test:])
    train_idx = torch.cat(train_parts)
    test_idx = torch.cat(test_parts)
    # Interleave classes so that the first images of a split are not all zeros.
    train_idx = train_idx[torch.randperm(train_idx.numel(), generator=generator)]
    test_idx = test_idx[torch.randperm(test_idx.numel(), generator=generator)]

    images = resize_images(images, image_size)
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def digits_statistics(image_size: int = 16) -> tuple[float, float]:
    """Mean and standard deviation of the digits training images at ``image_size``.

    This is how the constants in :mod:`leakgym.data.catalog` were computed (at the default 16x16).
    """
    train_x, _, _, _ = load_digits_split(image_size)
    return float(train_x.mean()), float(train_x.std(unbiased=False))

"""One copy of a dataset's normalised images per device, read by every game of the process.

A game used to keep its own normalised copy of its clients' shards, which together are the whole
training set: 614 MB per LeakGym-CIFAR-v0 game (measured: about 630 MB of resident memory per game
of a vector env on CIFAR-sized data, and five seconds per reset spent copying and normalising it), so
that N = 256 games on one GPU would have needed 160 GB for N copies of the same images. Games now keep
index sets (:func:`leakgym.data.split_indices`) and read their batches from one :class:`SharedImages`
per (dataset, device): ``x[rows]`` of the normalised set is bit for bit ``normalize(x_unit[rows])``
(normalisation is elementwise), so every trajectory is what it was.

A :class:`SharedImages` lives while a game holds it (a weak-valued cache), so closing every
environment frees its device memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import Tensor

from leakgym.data import Dataset

_SHARED: weakref.WeakValueDictionary[tuple[int, str], SharedImages] = weakref.WeakValueDictionary()


class SharedImages:
    """``dataset``'s training images normalised on ``device`` (``train_x``, with ``train_y``), and its
    held-out evaluation images on demand (:meth:`evaluation`). Read-only by contract: games index it,
    never write to it."""

    def __init__(self, dataset: Dataset, device: torch.device) -> None:
        self.dataset = dataset
        self.device = device
        self.train_x = dataset.spec.normalize(dataset.train_x).to(device)
        self.train_y = dataset.train_y.to(device)
        self._evaluation: dict[int, tuple[Tensor, Tensor]] = {}

    def read(self, rows: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
        """``(train_x[r], train_y[r])`` for every row index set ``r`` of ``rows`` (CPU int64 tensors, as the
        games keep them; or arrays), as one read of the images
        (one index transfer and one gather for all of them, not two small ones per array: on a GPU each was
        a host-to-device copy and a kernel launch, per client and game of a vector step); the batches are
        views of that read, bit for bit the separate reads."""
        sizes = [len(r) for r in rows]
        parts = [torch.as_tensor(r, dtype=torch.int64) for r in rows]
        index = (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(self.train_x.device)
        xs, ys = self.train_x[index].split(sizes), self.train_y[index].split(sizes)
        return list(zip(xs, ys))

    def evaluation(self, n: int) -> tuple[Tensor, Tensor]:
        """The first ``n`` test images, normalised, and their labels on the device (one pair per ``n``,
        so the games of a vector env evaluate on the same tensors)."""
        if n not in self._evaluation:
            data = self.dataset
            self._evaluation[n] = (data.spec.normalize(data.test_x[:n]).to(self.device), data.test_y[:n].to(self.device))
        return self._evaluation[n]


def shared_images(dataset: Dataset, device: torch.device | str) -> SharedImages:
    """The :class:`SharedImages` of ``dataset`` on ``device``, made on first use."""
    device = torch.empty(0, device=device).device  # "cuda" and "cuda:0" name one device: one copy
    key = (id(dataset), str(device))
    images = _SHARED.get(key)
    if images is None or images.dataset is not dataset:  # (an id is reused only after its entry died)
        images = SharedImages(dataset, device)
        _SHARED[key] = images
    return images


__all__ = ["SharedImages", "shared_images"]

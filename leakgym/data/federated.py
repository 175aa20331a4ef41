"""Splitting a dataset between a public pool, K federated clients and a test set.

The *public* split stands in for data both sides can obtain outside the federation: attackers use it
for image priors and label statistics, defenders for auxiliary data. The remaining training images
are the clients' private data, split either IID (a random equal partition) or non-IID with the
Dirichlet label-skew scheme of Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification" (arXiv:1909.06335, Sec. 3): for every class ``c``
client proportions ``q_c ~ Dir(alpha * 1_K)`` are drawn and class ``c``'s images are divided in
those proportions. Small ``alpha`` gives each client few classes; ``alpha -> inf`` approaches IID.

Deviation: Hsu et al. do not say what happens to a client that receives no image. Here every
client is guaranteed at least one: an empty client takes one image from the currently largest
client (repeated until none is empty). This moves at most ``num_clients - 1`` images and keeps the
split a function of the seed alone, unlike the common "resample until every client is large enough"
loop, which can run for a long time at small ``alpha``.

All randomness comes from ``numpy.random.default_rng(seed)`` (numpy, because torch has no seeded
Dirichlet sampler); the test subset uses the independent stream ``default_rng([seed, 1])`` so that
``test_size`` does not change the train partition.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from leakgym.checks import is_integer
from leakgym.data.loading import Dataset
from leakgym.data.spec import DatasetSpec

__all__ = ["FederatedSplit", "SplitIndices", "federated_split", "label_skew", "split_indices"]


@dataclass
class FederatedSplit:
    """A public pool, per-client private shards and a test set (unit images, int64 labels).

    ``public_indices`` and ``client_indices`` record which training examples of the source dataset
    went where (``federated_split`` fills them).
    """

    spec: DatasetSpec
    public_x: Tensor
    public_y: Tensor
    clients: list[tuple[Tensor, Tensor]]
    test_x: Tensor
    test_y: Tensor
    public_indices: Tensor | None = field(default=None, repr=False)
    client_indices: list[Tensor] | None = field(default=None, repr=False)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def client_sizes(self) -> list[int]:
        return [int(y.shape[0]) for _, y in self.clients]


def label_skew(split: FederatedSplit) -> float:
    """Mean total-variation distance between each client's label distribution and the pooled one.

    ``mean_k 0.5 * sum_c |p_k(c) - p(c)|`` with ``p`` the label distribution of all clients' data
    together: 0 when every client has the pooled class mix, close to 1 when each client holds one
    class of many. Used to measure how non-IID a split is.
    """
    num_classes = split.spec.num_classes
    counts = torch.stack([torch.bincount(y, minlength=num_classes) for _, y in split.clients]).double()
    per_client = counts / counts.sum(dim=1, keepdim=True)
    pooled = counts.sum(dim=0) / counts.sum()
    return float(0.5 * (per_client - pooled).abs().sum(dim=1).mean())


def _dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Positions into ``labels`` per client, class by class in Dirichlet proportions (Hsu et al. 2019)."""
    shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        cuts = np.round(np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
        for k, part in enumerate(np.split(members, cuts)):
            shards[k].append(part)
    result = [np.concatenate(parts) for parts in shards]
    # Guarantee non-empty clients (see module docstring): move one example from the largest client.
    for k in range(num_clients):
        if result[k].size == 0:
            donor = int(np.argmax([r.size for r in result]))
            result[k], result[donor] = result[donor][-1:], result[donor][:-1]
    return [rng.permutation(r) for r in result]


@dataclass(frozen=True)
class SplitIndices:
    """Where :func:`federated_split` puts every example, as positions (int64, on the CPU): into the
    dataset's training set for the ``public`` pool and each of the ``clients``, into its test set for
    ``test``."""

    public: Tensor
    clients: list[Tensor]
    test: Tensor


def split_indices(
    dataset: Dataset,
    *,
    num_clients: int,
    public_fraction: float = 0.1,
    alpha: float | None = None,
    seed: int = 0,
    test_size: int | None = None,
) -> SplitIndices:
    """The split of :func:`federated_split` (same arguments, same draws) as index sets, without
    copying an image: what many games that read one shared copy of a dataset need (each copy of
    CIFAR-10's training set is 614 MB)."""
    if not is_integer(num_clients) or num_clients < 1:
        raise ValueError(f"num_clients={num_clients!r} must be an integer >= 1")
    if isinstance(public_fraction, bool) or not isinstance(public_fraction, numbers.Real) \
            or not 0.0 <= public_fraction < 1.0:
        raise ValueError(f"public_fraction={public_fraction!r} must lie in [0, 1)")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real)
                              or not (alpha > 0 and math.isfinite(alpha))):
        raise ValueError(f"alpha={alpha!r} must be None (IID) or a finite number > 0")
    if not is_integer(seed) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an integer >= 0")
    num_clients = int(num_clients)
    n_train, n_test = dataset.train_y.shape[0], dataset.test_y.shape[0]
    if test_size is not None and (
        not is_integer(test_size) or not 1 <= test_size <= n_test
    ):
        raise ValueError(f"test_size={test_size!r} must be None or an integer in [1, {n_test}]")
    n_public = math.floor(public_fraction * n_train)
    if n_train - n_public < num_clients:
        raise ValueError(
            f"num_clients={num_clients} exceeds the {n_train - n_public} private training images "
            f"left after public_fraction={public_fraction}; allowed num_clients in [1, {n_train - n_public}]"
        )

    rng = np.random.default_rng(seed)
    order = rng.permutation(n_train)
    public, private = order[:n_public], order[n_public:]
    if alpha is None:
        shards = np.array_split(private, num_clients)
    else:
        labels = dataset.train_y.numpy()[private]
        shards = [private[pos] for pos in _dirichlet_partition(labels, num_clients, alpha, rng)]

    if test_size is None:
        test_idx = torch.arange(n_test)
    else:
        test_idx = torch.from_numpy(np.random.default_rng([seed, 1]).permutation(n_test)[:test_size])
    return SplitIndices(public=torch.from_numpy(public),
                        clients=[torch.from_numpy(np.ascontiguousarray(s)) for s in shards], test=test_idx)


def federated_split(
    dataset: Dataset,
    *,
    num_clients: int,
    public_fraction: float = 0.1,
    alpha: float | None = None,
    seed: int = 0,
    test_size: int | None = None,
) -> FederatedSplit:
    """Split ``dataset`` into a public pool, ``num_clients`` private shards and a test set.

    Args:
        dataset: the unit-image dataset to split (its training part is partitioned).
        num_clients: number of clients K >= 1.
        public_fraction: share of the training images held out as the public split, in [0, 1)
            (``floor(public_fraction * N)`` images).
        alpha: ``None`` for an IID split into near-equal shards; otherwise the Dirichlet
            concentration (> 0) of the label-skew split. Every client gets at least one image.
        seed: determines the whole split.
        test_size: ``None`` keeps the full test set; an integer in [1, N_test] keeps a random subset.

    Returns:
        :class:`FederatedSplit`; public and client images are disjoint and together cover the
        training set. :func:`split_indices` gives the same split as index sets.
    """
    where = split_indices(dataset, num_clients=num_clients, public_fraction=public_fraction, alpha=alpha, seed=seed,
                          test_size=test_size)
    public_idx, client_idx, test_idx = where.public, where.clients, where.test
    x, y = dataset.train_x, dataset.train_y
    return FederatedSplit(
        spec=dataset.spec,
        public_x=x[public_idx],
        public_y=y[public_idx],
        clients=[(x[idx], y[idx]) for idx in client_idx],
        test_x=dataset.test_x[test_idx],
        test_y=dataset.test_y[test_idx],
        public_indices=public_idx,
        client_indices=client_idx,
    )

"""Games read their clients' images from one shared normalised copy of the dataset (leakgym/game/batch.py: SharedImages).

A game used to keep normalised copies of all its clients' shards (the whole training set: 614 MB per
CIFAR-10 game). These tests pin what replaced it: one copy per (dataset, device) shared by every game,
per-game index sets, and batches equal bit for bit to what the materialised split gives.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import leakgym  # noqa: F401  (registers the ids)
from leakgym.data import federated_split, split_indices
from leakgym.game import batch as game_module
from leakgym.game import round as game_round
from leakgym.game.batch import shared_images


def _games(num_envs: int, **overrides):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=num_envs, opponent="none", **overrides)
    vec.reset(seed=0)
    return vec, vec.games


def test_split_indices_is_federated_splits_split():
    data = game_module._dataset("digits", None)
    for alpha in (None, 0.3):
        where = split_indices(data, num_clients=5, public_fraction=0.1, alpha=alpha, seed=7, test_size=50)
        split = federated_split(data, num_clients=5, public_fraction=0.1, alpha=alpha, seed=7, test_size=50)
        assert torch.equal(where.public, split.public_indices)
        assert all(torch.equal(a, b) for a, b in zip(where.clients, split.client_indices))
        assert torch.equal(data.train_x[where.clients[2]], split.clients[2][0])
        assert torch.equal(data.test_x[where.test], split.test_x)
    with pytest.raises(ValueError, match="num_clients=0"):
        split_indices(data, num_clients=0)


def test_games_share_one_normalised_copy_and_evaluation_set():
    vec, games = _games(3)
    try:
        assert games.images is shared_images(games.dataset, "cpu")  # one copy for every row
        assert games.servers[0].eval_x is games.servers[2].eval_x  # the batched round's shared-evaluation path
        # What a game keeps of its own: index sets (its public split's and its clients'). Copies of the
        # clients' shards would be the whole training set, and the public images 10% of it.
        train_bytes = games.dataset.train_x.nbytes
        for r in range(3):
            own = [games.public_rows[r], games.victim_rows[r], *games.benign_rows[r]]
            assert sum(t.nbytes for t in own) < 0.01 * train_bytes
    finally:
        vec.close()


def test_a_games_batches_are_the_normalised_rows_of_its_split():
    """Bit for bit what the materialised split gives (normalisation is elementwise), so trajectories
    do not depend on where the images are kept."""
    vec, games = _games(2, batch_clients=True)
    try:
        g = games
        g.reset(1, seed=1234)
        sc = g.scenario
        split = federated_split(g.dataset, num_clients=sc.num_clients + 1, public_fraction=sc.public_fraction,
                                alpha=sc.dirichlet_alpha, seed=1234)
        norm = g.spec.normalize
        public_x, public_y = g.public_split(1)
        assert torch.equal(public_x, split.public_x) and torch.equal(public_y, split.public_y)
        rng = copy.deepcopy(g.rngs[1])
        nvec = [len(d) for d in (g.menus["defender"].dims, g.menus["attacker"].dims)]
        plans = game_round.plan(g, [1], [(np.zeros(nvec[0], np.int64), np.zeros(nvec[1], np.int64))])
        (drawn,) = game_round.defend(g, [1], plans, batch_clients=False)
        rng.integers(2**31 - 1)  # the round seed, drawn first
        victim_x, victim_y = split.clients[0]
        idx = rng.choice(len(victim_x), size=sc.batch_size, replace=len(victim_x) < sc.batch_size)
        assert torch.equal(drawn.x, norm(victim_x)[idx]) and torch.equal(drawn.y, victim_y[idx])
        benign = []
        real = game_round._aggregate_alone
        game_round._aggregate_alone = lambda games_, row, d, batches: benign.extend(batches)
        try:
            game_round.aggregate(g, [1], [drawn], batch_clients=False)
        finally:
            game_round._aggregate_alone = real
        assert len(benign) == len(split.clients) - 1
        for (bx, by), (ux, uy) in zip(benign, split.clients[1:]):
            take = rng.choice(len(ux), size=min(len(ux), max(sc.batch_size, 8)), replace=False)
            assert torch.equal(bx, norm(ux)[take]) and torch.equal(by, uy[take])
        ex, ey = g.servers[1].eval_x, g.servers[1].eval_y
        n = min(sc.eval_size, len(split.test_x))
        assert torch.equal(ex, norm(split.test_x[:n])) and torch.equal(ey, split.test_y[:n])
    finally:
        vec.close()


def test_a_vector_step_reads_the_shared_images_once_per_phase():
    """The victims' private batches and the benign clients' batches of every game of a vector step are
    two reads of the shared training images (one gather each), not two small reads per client and game
    (on a GPU, each a host-to-device copy of the rows and a kernel launch): here 8 games x (1 victim + 3
    benign clients) made 32 reads of the images and 32 of the labels. What the games train on is
    unchanged: tests/test_round.py (a game alone and in a vector, bit for bit)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    vec, games = _games(8, batch_clients=True, num_clients=4, iterations=[1], eval_size=16)
    try:
        images = games.images
        reads = []

        class CountReads(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.index.Tensor and args[0] is not None:
                    src = args[0]
                    if src.data_ptr() in (images.train_x.data_ptr(), images.train_y.data_ptr()):
                        reads.append(tuple(src.shape))
                return func(*args, **(kwargs or {}))

        with CountReads():
            vec.step(np.zeros((8, len(vec.single_action_space.nvec)), dtype=np.int64))
        assert sorted(reads) == sorted([tuple(images.train_x.shape)] * 2 + [tuple(images.train_y.shape)] * 2)
        x, y = images.train_x, images.train_y
        rows = [np.array([3, 1, 4]), np.array([], dtype=np.int64), np.array([1, 5])]
        for (bx, by), r in zip(images.read(rows), rows):
            assert torch.equal(bx, x[r]) and torch.equal(by, y[r])
    finally:
        vec.close()


def test_shared_copy_is_freed_with_its_games():
    import gc
    import weakref

    vec, games = _games(2)
    ref = weakref.ref(games.images)
    vec.close()
    del vec, games
    gc.collect()
    assert ref() is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_games_on_cuda_share_a_device_copy():
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, opponent="none", device="cuda", rounds=1, iterations=[2])
    try:
        vec.reset(seed=0)
        games = vec.games
        assert games.images.train_x.device.type == "cuda"
        assert shared_images(games.dataset, "cuda") is shared_images(games.dataset, f"cuda:{torch.cuda.current_device()}")
        vec.step(np.zeros((2, len(vec.single_action_space.nvec)), dtype=np.int64))
    finally:
        vec.close()

"""The state of N LeakGym games of one scenario: :class:`GameBatch`.

One object holds every game of a view: a PettingZoo env is a batch of one (or a row of a batch that
several envs share, :func:`leakgym.envs.step_together`), a vector env is a batch of N. Per-game
quantities are columns with a leading N dimension: the global models' parameters are the rows of one
:class:`~leakgym.fl.bank.ModelBank` (one stacked tensor per parameter name), round counters, accuracies
and test losses are ``(N,)`` arrays, and the per-game objects that cannot be stacked (each game's
generator, its client split and public split as index sets, the record of its last round) are length-N
lists; a game's public images are gathered only for the rounds whose attack or defense reads them
(:meth:`GameBatch.public_splits`). The
scenario, the action menus, the dataset (one normalised copy per device for the whole process,
:class:`SharedImages`) and the values the scenario fixes for a whole episode (the local optimiser, the
learning-rate schedule) are held once.

A round reads and writes this state through the phase functions of :mod:`leakgym.game.round`;
:meth:`GameBatch.snapshot` and :meth:`GameBatch.restore` copy and put back everything a round may change
(the rows' parameters as one copy per name), so a failed round leaves no trace.

Everything random is drawn from each game's own generator, seeded by :meth:`GameBatch.reset`, so the
same seed and the same actions give the same trajectory, whatever other games run beside it.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from leakgym.attacks.public_split import gathered_from
from leakgym.data import Dataset, load_dataset, split_indices
from leakgym.devices import check_device, in_library_modes
from leakgym.fl import batched as fl_batched
from leakgym.fl.bank import ModelBank
from leakgym.fl.server import Server
from leakgym.models import build_model

from .records import RoundPlan, RoundRecord

#: the two players of every game, in the order of the views' dicts
AGENTS = ("attacker", "defender")

#: bytes of gathered public splits (:meth:`GameBatch.public_splits`) a batch keeps between rounds at least, so
#: that a game reading its split every round does not gather it every round. 1 GiB holds 17 CIFAR-10 splits
#: (61 MB each) or 7,000 digits ones (148 KB).
PUBLIC_SPLIT_CACHE_BYTES = 2**30


@lru_cache(maxsize=8)
def _dataset(name: str, image_size: int | None) -> Dataset:
    return load_dataset(name, image_size=image_size)


# --------------------------------------------------------------------------------------------------
# The dataset, once per device
# --------------------------------------------------------------------------------------------------
_SHARED: weakref.WeakValueDictionary[tuple[int, str], SharedImages] = weakref.WeakValueDictionary()


class SharedImages:
    """``dataset``'s training images normalised on ``device`` (``train_x``, with ``train_y``), and its
    held-out evaluation images on demand (:meth:`evaluation`). Read-only by contract: games index it,
    never write to it.

    Why one copy: a game used to keep its own normalised copy of its clients' shards, which together are
    the whole training set: 614 MB per LeakGym-CIFAR-v0 game, so that N = 256 games on one GPU would have
    needed 160 GB for N copies of the same images. Games keep index sets
    (:func:`leakgym.data.split_indices`) and read their batches from one :class:`SharedImages` per
    (dataset, device): ``x[rows]`` of the normalised set is bit for bit ``normalize(x_unit[rows])``
    (normalisation is elementwise). It lives while a batch holds it (a weak-valued cache), so closing
    every environment frees its device memory.
    """

    def __init__(self, dataset: Dataset, device: torch.device) -> None:
        self.dataset = dataset
        self.device = device
        self.train_x = dataset.spec.normalize(dataset.train_x).to(device)
        self.train_y = dataset.train_y.to(device)
        self._evaluation: dict[int, tuple[Tensor, Tensor]] = {}

    def read(self, rows: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
        """``(train_x[r], train_y[r])`` for every row index set ``r`` of ``rows`` (CPU int64 tensors or
        arrays), as one read of the images: one index transfer and one gather for all of them (on a GPU
        each small read was a host-to-device copy and a kernel launch); the batches are views of that read,
        bit for bit the separate reads."""
        sizes = [len(r) for r in rows]
        parts = [torch.as_tensor(r, dtype=torch.int64) for r in rows]
        index = (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(self.train_x.device)
        xs, ys = self.train_x[index].split(sizes), self.train_y[index].split(sizes)
        return list(zip(xs, ys))

    def evaluation(self, n: int) -> tuple[Tensor, Tensor]:
        """The first ``n`` test images, normalised, and their labels on the device (one pair per ``n``, so
        the games of a batch evaluate on the same tensors)."""
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


# --------------------------------------------------------------------------------------------------
# Snapshot
# --------------------------------------------------------------------------------------------------
@dataclass
class BatchSnapshot:
    """Everything a round may change in ``rows``, copied (:meth:`GameBatch.snapshot`)."""

    rows: list[int]
    #: the bank rows' parameters, ``name -> (len(banked), ...)``, of the rows listed in ``banked``
    parameters: dict[str, Tensor]
    banked: list[int]
    #: per row: the model state the bank does not hold (buffers; everything for a model not in the bank)
    states: list[dict[str, Tensor]]
    rng_states: list[dict[str, Any]]
    round: np.ndarray
    accuracy: np.ndarray
    test_loss: np.ndarray
    diverged_at: list[int | None]
    last: list[RoundRecord | None]
    timings: list[dict[str, float]]


# --------------------------------------------------------------------------------------------------
# The batch
# --------------------------------------------------------------------------------------------------
class GameBatch:
    """N games of one scenario on one device: global models, client splits, generators, round counters,
    last rounds. Row ``i`` is game ``i``; a game exists once :meth:`reset` has seeded its row."""

    agents = AGENTS

    @in_library_modes
    def __init__(self, scenario, size: int = 1, *, device: str | torch.device = "cpu") -> None:
        from .scenario import local_optimizer, round_local_lr

        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r}; allowed: integers >= 1 (the number of games)")
        self.scenario = scenario
        self.size = size
        self.device = check_device(device)
        self.dataset = _dataset(scenario.dataset, scenario.image_size)
        self.spec = self.dataset.spec
        if scenario.leakage_metric == "lpips":
            from leakgym.metrics import lpips_available, lpips_status

            if not lpips_available():
                raise ValueError(
                    f"leakage_metric='lpips' needs the pretrained LPIPS backbone weights: {lpips_status()}; or "
                    "choose 'ssim', 'psnr' or 'ssim+psnr'"
                )
        from leakgym.metrics import lpips_available

        #: LPIPS is scored where the leakage metric needs it and, beside SSIM and PSNR, wherever the backbone
        #: weights are on disk when the batch is made (``$LEAKGYM_LPIPS_WEIGHTS`` or torch's hub cache,
        #: leakgym.metrics.perceptual): the step infos then carry ``leakage_lpips``; without them no LPIPS
        #: number is reported; a file there that is not torchvision's checkpoint is refused here
        self.reports_lpips = "lpips" in scenario.leakage_metric or lpips_available()
        #: the scenario's action menus, built once (the scenario is fixed for the batch's lifetime)
        self.menus = {role: scenario.menu(role) for role in AGENTS}
        #: the attacker's strategies, in menu order (the infos' ``strategy_index``)
        self.strategies = tuple(scenario.strategies)
        #: the defender's bit-mask fields (OASIS's augmentation set), listed in every decoded defense
        self.bit_fields = tuple(scenario.defender_bits)
        #: what the scenario fixes for every round: FedAvg's local optimiser (None: plain SGD) and the
        #: clients' local learning rate of each round (its ``local_lr_schedule``)
        self.local_optimizer = local_optimizer(scenario)
        self.local_lrs = tuple(round_local_lr(scenario, r) for r in range(scenario.rounds))
        self.images = shared_images(self.dataset, self.device)
        self.bank = ModelBank(size)
        # per-game columns
        self.round = np.zeros(size, dtype=np.int64)
        self.accuracy = np.zeros(size, dtype=np.float64)
        self.test_loss = np.zeros(size, dtype=np.float64)
        self.diverged_at: list[int | None] = [None] * size
        self.rngs: list[np.random.Generator | None] = [None] * size
        self.servers: list[Server | None] = [None] * size
        #: each game's public split (attacker priors, defender auxiliaries) as indices of the dataset's
        #: training images; :meth:`public_splits` gathers the images
        self.public_rows: list[Tensor | None] = [None] * size
        self._public: dict[int, tuple[Tensor, Tensor]] = {}  # kept gathers, row -> (x, y); dropped at reset
        self._public_peak = 0  # the most bytes of public splits one call of public_splits has read
        self.victim_rows: list[Tensor | None] = [None] * size
        self.benign_rows: list[list[Tensor]] = [[] for _ in range(size)]
        self.last: list[RoundRecord | None] = [None] * size
        self.timings: list[dict[str, float]] = [{} for _ in range(size)]
        #: decoded plans by (defender action, attacker action): a plan depends on the actions and the
        #: (fixed) scenario only, so a batch decodes each pair once (plan phase; at most PLAN_CACHE pairs)
        self.plans: dict[tuple[bytes, bytes], RoundPlan] = {}
        #: the defense registry's generation the plans were decoded under (a defense registered or
        #: unregistered since: they are decoded again, so a cached plan never plays a defense that is gone)
        self.plans_generation = -1
        self._signatures: list[tuple[nn.Module, tuple | None] | None] = [None] * size
        self._has_buffers = False

    def __repr__(self) -> str:
        return f"GameBatch(scenario={self.scenario.name!r}, size={self.size}, device={str(self.device)!r})"

    # ------------------------------------------------------------------ rows
    def check_row(self, row: int) -> int:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < self.size:
            raise ValueError(f"row={row!r}; allowed: integers in [0, {self.size - 1}]")
        return int(row)

    def model(self, row: int) -> nn.Module:
        """Game ``row``'s global model (its parameters are views of the bank's row)."""
        return self.servers[row].model

    def started(self, row: int) -> bool:
        """Whether game ``row`` has been reset (has a model and a generator)."""
        return self.servers[row] is not None

    def local_lr(self, row: int) -> float:
        """The clients' local learning rate in the round game ``row`` is playing."""
        return self.local_lrs[min(int(self.round[row]), len(self.local_lrs) - 1)]

    def evaluates_next(self, row: int) -> bool:
        """Whether the round game ``row`` is playing ends with an evaluation of its global model."""
        sc, nxt = self.scenario, int(self.round[row]) + 1
        return nxt % sc.eval_every == 0 or nxt == sc.rounds

    def advance(self, row: int, evaluation: tuple[float, float] | None) -> None:
        """Count game ``row``'s round; ``evaluation``: ``(accuracy, test_loss)`` when it evaluated."""
        self.round[row] += 1
        if evaluation is not None:
            self.accuracy[row], self.test_loss[row] = evaluation
            if not math.isfinite(evaluation[1]) and self.diverged_at[row] is None:
                self.diverged_at[row] = int(self.round[row])

    def signature(self, row: int, model: nn.Module) -> tuple | None:
        """:func:`leakgym.fl.batched.signature` of ``model`` when :func:`leakgym.fl.batched.supports` it,
        else None: what decides which games' clients are batched together. For game ``row``'s global model
        (rebuilt at reset; its architecture, device and dtype fixed until then) it is computed once per
        episode rather than every round."""
        server_model = self.model(row)
        known = self._signatures[row]
        if model is server_model and known is not None and known[0] is server_model:
            return known[1]
        key = fl_batched.signature(model) if fl_batched.supports(model) else None
        if model is server_model:
            self._signatures[row] = (server_model, key)
        return key

    def public_split(self, row: int) -> tuple[Tensor, Tensor]:
        """Game ``row``'s public split: :meth:`public_splits` of one game."""
        return self.public_splits([row])[0]

    def public_splits(self, rows: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
        """The public splits of the games ``rows`` read at once (one round's readers): each game's unit
        images and labels on the batch's device, gathered from the dataset's training images (bit for bit the
        split :func:`leakgym.data.federated_split` makes).

        Why on demand: a game used to keep its public split from reset on, 61 MB per CIFAR-10 game and 491
        MB per TinyImageNet one, so that N = 256 CIFAR-10 games held 15.7 GB of them whatever they played.
        Now only the rounds whose attack or defense reads the split gather it (:func:`leakgym.game.round.defend`).

        A gathered split is kept, the same tensor on every read, until its game resets, while the kept splits
        fit in the larger of :data:`PUBLIC_SPLIT_CACHE_BYTES` and the most one call has read at once (the
        round held those anyway, so keeping them raises no peak: games that all read every round are gathered
        once an episode). Past that, a split is gathered for each read (61 MB copied for CIFAR-10). The kept
        ones are not evicted least recently used: the games of a vector env read in turn, and with more of them
        than fit, that policy would drop every split before its next read. Either way, what an attack derives
        from a split is computed once per episode (:func:`leakgym.attacks.public_split.gathered_from`)."""
        gathered: dict[int, tuple[Tensor, Tensor]] = {}
        fresh = []
        for row in rows:
            row = self.check_row(row)
            if row in gathered:
                continue
            kept = self._public.get(row)
            if kept is not None:
                gathered[row] = kept
                continue
            source = self.public_rows[row]
            if source is None:
                raise RuntimeError(f"game {row} has not been reset; call reset() first")
            x, y = self.dataset.train_x[source].to(self.device), self.dataset.train_y[source].to(self.device)
            gathered_from(x, source, "x")
            gathered_from(y, source, "y")
            gathered[row] = (x, y)
            fresh.append(row)
        self._public_peak = max(self._public_peak, sum(x.nbytes + y.nbytes for x, y in gathered.values()))
        budget, kept_bytes = max(PUBLIC_SPLIT_CACHE_BYTES, self._public_peak), self._public_bytes
        for row in fresh:
            x, y = gathered[row]
            if kept_bytes + x.nbytes + y.nbytes <= budget:
                self._public[row] = (x, y)
                kept_bytes += x.nbytes + y.nbytes
        return [gathered[int(row)] for row in rows]

    @property
    def _public_bytes(self) -> int:
        """Bytes of the kept public splits."""
        return sum(x.nbytes + y.nbytes for x, y in self._public.values())

    # ------------------------------------------------------------------ reset
    @in_library_modes
    def reset(self, row: int, seed: int) -> None:
        """Start a new episode of game ``row`` from ``seed``: its generator, client split, global model
        (bound to the bank's row) and first evaluation."""
        row = self.check_row(row)
        sc, dev = self.scenario, self.device
        split = split_indices(self.dataset, num_clients=sc.num_clients + 1, public_fraction=sc.public_fraction,
                              alpha=sc.dirichlet_alpha, seed=seed)
        eval_x, eval_y = self.images.evaluation(min(sc.eval_size, len(split.test)))
        model = build_model(sc.model, self.spec, precode=sc.precode, width=sc.model_width, seed=seed, device=dev)
        server = Server(model, lr=sc.server_lr, eval_x=eval_x, eval_y=eval_y)
        self.bank.bind(row, model)  # the previous episode's model is released
        self._has_buffers = any(True for _ in model.buffers())
        self.rngs[row] = np.random.default_rng(seed)
        self.round[row] = 0
        self.diverged_at[row] = None
        self.public_rows[row] = split.public
        self._public.pop(row, None)
        self.victim_rows[row], self.benign_rows[row] = split.clients[0], list(split.clients[1:])
        self.servers[row] = server
        self._signatures[row] = None
        self.accuracy[row], self.test_loss[row] = server.evaluate()
        self.last[row] = None
        self.timings[row] = {}

    # ------------------------------------------------------------------ snapshot / restore
    def snapshot(self, rows: Sequence[int]) -> BatchSnapshot:
        """Everything a round may change in ``rows``, copied: the parameters of the rows whose models the
        bank holds as one copy per name (:meth:`ModelBank.gather`), the rest per game."""
        rows = list(rows)
        found = ModelBank.of([self.model(r) for r in rows])
        banked = rows if found is not None and found[0] is self.bank else [
            r for r in rows if (f := ModelBank.of([self.model(r)])) is not None and f[0] is self.bank]
        inside = set(banked)
        states = []
        for r in rows:
            model = self.model(r)
            if r not in inside:
                state = model.state_dict()  # detached
            elif self._has_buffers:
                state = {k: v for k, v in model.state_dict().items() if k not in self.bank.stacks}
            else:
                state = {}  # the bank holds all of it (no walk over the modules)
            states.append({k: v.clone() for k, v in state.items()})
        return BatchSnapshot(
            rows=rows,
            parameters=self.bank.gather(banked) if banked else {},
            banked=banked,
            states=states,
            rng_states=[self.rngs[r].bit_generator.state for r in rows],  # (a new dict on every read)
            round=self.round[rows].copy(),
            accuracy=self.accuracy[rows].copy(),
            test_loss=self.test_loss[rows].copy(),
            diverged_at=[self.diverged_at[r] for r in rows],
            last=[self.last[r] for r in rows],
            timings=[dict(self.timings[r]) for r in rows],
        )

    def restore(self, snap: BatchSnapshot) -> None:
        """Back to ``snap``: every row it copied is as it was."""
        inside = set(snap.banked)
        for r, state, rng_state in zip(snap.rows, snap.states, snap.rng_states):
            self.model(r).load_state_dict(state, strict=r not in inside)
            self.rngs[r].bit_generator.state = rng_state
        if snap.banked:
            self.bank.scatter(snap.banked, snap.parameters)
        self.round[snap.rows] = snap.round
        self.accuracy[snap.rows] = snap.accuracy
        self.test_loss[snap.rows] = snap.test_loss
        for i, r in enumerate(snap.rows):
            self.diverged_at[r], self.last[r], self.timings[r] = snap.diverged_at[i], snap.last[i], snap.timings[i]

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict:
        """A copy (``copy.deepcopy``, pickle) carries every game's state; its models are bound to the copy's
        own bank by :meth:`__setstate__` (the bank's stacks travel, its bindings do not); decoded plans and
        gathered public splits are made again on demand."""
        state = dict(self.__dict__)
        del state["bank"]
        state["plans"] = {}
        state["_public"] = {}  # (gathered again on demand)
        return state

    @in_library_modes
    def __deepcopy__(self, memo: dict) -> GameBatch:
        """A copy in this process shares the read-only dataset and its normalised images (what every batch
        of the process reads; a CIFAR copy would be 600 MB) and copies everything else."""
        memo[id(self.dataset)] = self.dataset
        memo[id(self.images)] = self.images
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))  # (in the library's modes: normal tensors)
        return copied

    def __setstate__(self, state: dict) -> None:
        if torch.is_inference_mode_enabled():  # (a deepcopy runs in the library's modes: not under it)
            raise ValueError("a LeakGym game unpickled under torch.inference_mode() would hold inference tensors, "
                             "which no later round can train: unpickle it outside the mode")
        self.__dict__.update(state)
        self.bank = ModelBank(self.size)
        for r in range(self.size):
            if self.servers[r] is not None:
                self.bank.bind(r, self.servers[r].model)
        self._signatures = [None] * self.size


__all__ = ["AGENTS", "BatchSnapshot", "GameBatch", "SharedImages", "shared_images"]

"""The generic reproduction harness: a grid of defenses (rows) x attacks (columns), scored.

A paper's main table is, for our purposes, a list of :class:`DefenseRow` (a table label, a
:class:`~leakgym.defenses.DefenseConfig`, whether the model carries a PRECODE bottleneck) and a list
of :class:`AttackColumn` (a table label, an attack registry name, its config). :func:`run_grid` runs
the game's round for every cell, exactly as ``docs/architecture.md`` draws it:

1. the server builds the model (``build_model(scale.model, spec, precode=row.precode, seed=seed)``);
   a malicious column modifies it with ``attack.prepare_model(model, spec, public_x=...)``;
2. the victim (client 0 of :func:`leakgym.data.federated_split`) shares its update through the
   round's defend phase (:func:`leakgym.game.round.share_update`) for each of its
   ``scale.images // scale.batch_size`` private batches (FedSGD, one gradient per batch);
3. the round's attack phase (:func:`leakgym.game.round.reconstruct_all`) reconstructs **all**
   batches of **all** rows that share one model in a single ``reconstruct_batch`` call, each
   problem with its own seed;
4. the round's scoring phase (:func:`leakgym.game.round.score_all`) scores each reconstruction
   against its batch (optimal matching), and the cell keeps the per-image PSNR / SSIM / MSE, and LPIPS
   where the user's backbone weights are on disk (:func:`leakgym.metrics.lpips_available`; never a
   number from an untrained backbone: without the weights the cells have no ``lpips`` entry).

Utility (:func:`measure_utility`) is a FedSGD run in which every client (or, with
``Scale.utility_defended="victim"``, only client 0) applies the row's defense, evaluated on the
held-out test split every ``Scale.utility_eval_every`` rounds (the accuracy curve) and at the end
on the victim's shard; rows with ``utility=False`` are reported as "not measured" together with the
reason. ``Scale.pretrain_rounds`` serves a model trained by that many undefended rounds instead of
a fresh one (a late round of training).

Threat model shared by every cell (stated in each results file): the attacker knows the labels of
the victim's batch (``AttackerKnowledge.labels``) unless a column says otherwise, the public split
(``public_x``/``public_y``), and the declared batch size; for Mixup/InstaHide rows it is also given
the encoding's mixing matrix in ``update.metadata["encoding"]`` (the upper-bound threat model of
:mod:`leakgym.attacks.mixup_decoding`). Only the mixup-decoding attack reads it.

Randomness: the victim's images, the model initialisation, every defense draw and every attack
restart derive from the one ``seed``; :func:`leakgym.reproduce.runner.run_paper` runs the grid once
per seed and pools the images.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from leakgym.defenses import DefenseConfig
from leakgym.devices import in_library_modes

#: The metrics each cell keeps per image (all from :func:`leakgym.metrics.score_reconstruction`); ``"lpips"``
#: joins them where the LPIPS backbone weights are present (:func:`run_grid`'s ``lpips``).
METRICS = ("psnr", "ssim", "mse")


@dataclass(frozen=True)
class DefenseRow:
    """One row of a paper's table."""

    name: str
    """The row's label as the paper prints it (e.g. ``"DP-Gaussian"``)."""
    config: DefenseConfig = field(default_factory=DefenseConfig)
    precode: bool = False
    """Train/attack a PRECODE model (``build_model(..., precode=True)``)."""
    attacks: tuple[str, ...] | None = None
    """Names of the columns that apply to this row; ``None``: every column."""
    utility: bool = True
    """Measure the FedSGD accuracy under this defense (``False``: too slow at this scale; say why in ``note``)."""
    utility_seeds: int | None = None
    """Run the utility measurement for the first this many seeds only (``None``: every seed); for rows
    whose defense is too slow to train with every seed at this scale (the results say so)."""
    note: str = ""


@dataclass(frozen=True)
class AttackColumn:
    """One attack column of a paper's table."""

    name: str
    """The column's label (e.g. ``"IG"``)."""
    attack: str
    """Registry name in :data:`leakgym.attacks.ATTACKS`."""
    config: dict = field(default_factory=dict)
    """Config overrides; ``iterations`` defaults to ``Scale.iterations`` for optimisation attacks."""
    labels_known: bool = True
    note: str = ""


@dataclass(frozen=True)
class Scale:
    """Sizes of one run (a paper module defines ``small`` and ``full``)."""

    image_size: int = 16
    model: str = "lenet"
    model_width: int | None = None
    batch_size: int = 1
    images: int = 8
    """Victim images attacked per cell (a multiple of ``batch_size``)."""
    iterations: int = 300
    """Iterations of the optimisation attacks (columns may override)."""
    restarts: int = 1
    utility_rounds: int = 100
    utility_clients: int = 4
    utility_defended: str = "all"
    """Who applies the defense in the utility run: ``"all"`` clients (the defense's full cost) or only the
    ``"victim"`` (client 0; DCS²'s setting, where one target client's data is sensitive)."""
    utility_batch: int = 8
    utility_lr: float = 0.5
    """FedSGD's server learning rate (FedAvg's server step is 1)."""
    utility_update_kind: str = "gradient"
    """The utility run's protocol: FedSGD (``"gradient"``) or FedAvg (``"model_delta"``, docs/fl_protocol.md)."""
    utility_local_steps: int = 1
    utility_local_lr: float = 0.1
    utility_optimizer: str = "sgd"
    """FedAvg's local optimiser, ``"sgd"`` or ``"adam"`` (:class:`leakgym.fl.optim.LocalOptimizer`)."""
    eval_size: int | None = 300
    utility_eval_every: int = 25
    """Evaluate the test accuracy every this many rounds (the accuracy curve; the last round always)."""
    pretrain_rounds: int = 0
    """Attack the model after this many undefended FedSGD rounds (the utility run's clients, batch and lr)
    instead of the untrained one: a late round of training, where e.g. CENSOR's trials fail more often."""

    def __post_init__(self) -> None:
        for name in ("image_size", "batch_size", "images", "iterations", "restarts", "utility_clients",
                     "utility_batch", "utility_eval_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Scale.{name}={value!r}; allowed: integers >= 1")
        for name in ("utility_rounds", "pretrain_rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Scale.{name}={value!r}; allowed: integers >= 0")
        if self.eval_size is not None and (not isinstance(self.eval_size, int) or isinstance(self.eval_size, bool)
                                           or self.eval_size < 1):
            raise ValueError(f"Scale.eval_size={self.eval_size!r}; allowed: None (all) or integers >= 1")
        if self.utility_defended not in ("all", "victim"):
            raise ValueError(f"Scale.utility_defended={self.utility_defended!r}; allowed: 'all', 'victim'")
        if self.images % self.batch_size:
            raise ValueError(f"Scale.images={self.images} must be a multiple of batch_size={self.batch_size}")
        if not (self.utility_lr > 0 and math.isfinite(self.utility_lr)):
            raise ValueError(f"Scale.utility_lr={self.utility_lr!r}; allowed range (0, inf)")
        if self.utility_update_kind not in ("gradient", "model_delta"):
            raise ValueError(f"Scale.utility_update_kind={self.utility_update_kind!r}; allowed: 'gradient', "
                             "'model_delta'")
        steps = self.utility_local_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"Scale.utility_local_steps={steps!r}; allowed: integers >= 1")
        if not (self.utility_local_lr > 0 and math.isfinite(self.utility_local_lr)):
            raise ValueError(f"Scale.utility_local_lr={self.utility_local_lr!r}; allowed range (0, inf)")
        from leakgym.fl.optim import LOCAL_OPTIMIZERS

        if self.utility_optimizer not in LOCAL_OPTIMIZERS:
            raise ValueError(f"Scale.utility_optimizer={self.utility_optimizer!r}; allowed: "
                             f"{', '.join(LOCAL_OPTIMIZERS)}")
        if self.utility_update_kind == "gradient" and (steps != 1 or self.utility_optimizer != "sgd"):
            raise ValueError(f"Scale.utility_local_steps={steps} / utility_optimizer={self.utility_optimizer!r} "
                             "need utility_update_kind='model_delta' (FedSGD shares one gradient)")

    def replace(self, **changes: Any) -> Scale:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown Scale field(s) {unknown}; allowed: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Cell:
    """Scores of one (defense, attack) cell."""

    defense: str
    attack: str
    per_image: dict[str, list[float]]
    attack_s: float
    fidelity: float
    overhead_ms: float
    sent: list[str] = field(default_factory=list)
    """Per image, what its update was (``"update"``; CENSOR: ``"candidate"`` or the fallback it sent)."""

    def summary(self) -> dict:
        return {"defense": self.defense, "attack": self.attack, "n_images": len(self.per_image["psnr"]),
                "attack_s": self.attack_s, "fidelity": self.fidelity, "overhead_ms": self.overhead_ms,
                "sent": list(self.sent), "per_image": {k: [float(x) for x in v] for k, v in self.per_image.items()}}


def sent_kinds(details: dict) -> list[str]:
    """What each local step of one shared update sent: CENSOR's ``sent`` entries, else ``["update"]``."""
    steps = details.get("censor")
    if not steps:
        return ["skip"] if details.get("skipped") else ["update"]
    return [str(step.get("sent", "update")) for step in steps]


def _build_attack(column: AttackColumn, scale: Scale):
    from leakgym.attacks import ATTACKS

    if column.attack not in ATTACKS:
        raise ValueError(f"column {column.name!r}: unknown attack {column.attack!r}; allowed: {sorted(ATTACKS)}")
    cls = ATTACKS[column.attack]
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    cfg = dict(column.config)
    if "iterations" in fields:
        cfg.setdefault("iterations", scale.iterations)
    if "restarts" in fields:
        cfg.setdefault("restarts", scale.restarts)
    return cls(**cfg)


def victim_batches(split, scale: Scale, seed: int) -> list[tuple[Tensor, Tensor]]:
    """``scale.images`` images of the victim (client 0), drawn with ``seed``, in batches (unit images)."""
    cx, cy = split.clients[0]
    if scale.images > len(cx):
        raise ValueError(f"Scale.images={scale.images}; the victim's shard holds only {len(cx)} images")
    idx = torch.randperm(len(cx), generator=torch.Generator().manual_seed(seed))[: scale.images]
    b = scale.batch_size
    return [(cx[idx[i:i + b]].clone(), cy[idx[i:i + b]].clone()) for i in range(0, scale.images, b)]


def build_models(scale: Scale, spec, seed: int, precode_flags: set[bool], split=None) -> dict[bool, torch.nn.Module]:
    """The served model per PRECODE flag: fresh, or after ``scale.pretrain_rounds`` undefended FedSGD rounds."""
    from leakgym.models import build_model

    models = {flag: build_model(scale.model, spec, precode=flag, width=scale.model_width, seed=seed)
              for flag in sorted(precode_flags)}
    if scale.pretrain_rounds:
        if split is None:
            raise ValueError("Scale.pretrain_rounds > 0 needs the split to train on")
        for model in models.values():
            _fedsgd(model, DefenseRow("pretrain"), scale.replace(utility_rounds=scale.pretrain_rounds,
                                                                  utility_eval_every=scale.pretrain_rounds),
                    split, seed, progress=False)
    return models


@in_library_modes
def run_grid(
    rows: list[DefenseRow],
    columns: list[AttackColumn],
    scale: Scale,
    *,
    split,
    seed: int = 0,
    progress: bool = True,
    lpips: bool | None = None,
) -> dict[tuple[str, str], Cell]:
    """Attack every defended update of every (row, column) pair; returns ``{(row, column): Cell}``.

    Args:
        rows, columns: the table (see :class:`DefenseRow`, :class:`AttackColumn`).
        scale: sizes.
        split: a :class:`~leakgym.data.FederatedSplit` (victim = client 0; public split for the
            defenses/attacks that use one).
        seed: seeds the victim's images, the models, the defenses and the attacks.
        progress: show tqdm bars.
        lpips: also keep per-image LPIPS (``None``: where the backbone weights are on disk,
            :func:`leakgym.metrics.lpips_available`); ``True`` without the weights raises ``ValueError``.
    """
    from tqdm import tqdm

    from leakgym.metrics import lpips_available, lpips_status

    if lpips is None:
        lpips = lpips_available()
    elif lpips and not lpips_available():
        raise ValueError(f"run_grid(lpips=True): {lpips_status()}")
    metrics = (*METRICS, "lpips") if lpips else METRICS

    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.game.records import AttackJob
    from leakgym.game.round import reconstruct_all, score_all, share_update

    names = [c.name for c in columns]
    for row in rows:
        bad = [a for a in (row.attacks or ()) if a not in names]
        if bad:
            raise ValueError(f"row {row.name!r} names unknown column(s) {bad}; allowed: {names}")
    spec = split.spec
    batches = victim_batches(split, scale, seed)
    base = build_models(scale, spec, seed, {r.precode for r in rows}, split)
    cells: dict[tuple[str, str], Cell] = {}
    for column in tqdm(columns, desc="attacks", disable=not progress):
        attack = _build_attack(column, scale)
        applicable = [r for r in rows if r.attacks is None or column.name in r.attacks]
        # One served model per PRECODE flag; a malicious server modifies it (with the public split).
        served = {flag: attack.prepare_model(copy.deepcopy(m), spec, public_x=split.public_x)
                  for flag, m in base.items()}
        for flag, model in served.items():
            group = [r for r in applicable if r.precode == flag]
            if not group:
                continue
            jobs, origs, owners, fids, overheads, sent = [], [], [], {}, {}, {}
            for row in tqdm(group, desc=f"{column.name}: defenses", leave=False, disable=not progress):
                for j, (xu, y) in enumerate(batches):
                    upd, rep = share_update(model, spec.normalize(xu), y, row.config, seed=seed * 1000 + j,
                                            public_x=split.public_x, public_y=split.public_y)
                    knowledge = AttackerKnowledge(
                        model=model, spec=spec, batch_size=upd.batch_size,
                        labels=y.clone() if column.labels_known else None,
                        public_x=split.public_x, public_y=split.public_y)
                    jobs.append(AttackJob(attack=attack, update=upd.detached(), knowledge=knowledge,
                                          seed=seed * 100_003 + len(jobs)))
                    origs.append(spec.normalize(xu))
                    owners.append(row.name)
                    fids.setdefault(row.name, []).append(rep.fidelity)
                    overheads.setdefault(row.name, []).append(rep.overhead_s)
                    sent.setdefault(row.name, []).extend(sent_kinds(rep.details)[-1:] * len(y))
            start = time.perf_counter()
            results, _ = reconstruct_all(jobs)
            elapsed = time.perf_counter() - start
            per_row: dict[str, dict[str, list[float]]] = {}
            for owner, s in zip(owners, score_all(spec, results, origs, lpips=lpips)):
                acc = per_row.setdefault(owner, {k: [] for k in metrics})
                for k in metrics:
                    acc[k].extend(float(v) for v in s.per_image[k])
            for row in group:
                cells[(row.name, column.name)] = Cell(
                    defense=row.name, attack=column.name, per_image=per_row[row.name],
                    attack_s=elapsed * len(fids[row.name]) / len(jobs),
                    fidelity=float(np.mean(fids[row.name])), overhead_ms=1000 * float(np.mean(overheads[row.name])),
                    sent=sent[row.name],
                )
    return cells


@in_library_modes
def measure_utility(row: DefenseRow, scale: Scale, *, split, seed: int = 0, progress: bool = True) -> dict:
    """Test accuracy over ``scale.utility_rounds`` FedSGD rounds under the defense of ``row``.

    Every round each of the first ``scale.utility_clients`` clients draws ``scale.utility_batch``
    examples of its shard and shares ``apply_defense(...)`` (with ``utility_defended="victim"`` only
    client 0 defends; the others share their clean gradient); the server (:class:`leakgym.fl.server.Server`)
    takes the example-weighted mean gradient step with learning rate ``scale.utility_lr`` (skipped
    updates left out). The test accuracy is evaluated every ``scale.utility_eval_every`` rounds
    (``curve``); ``sent`` counts what the defending clients' updates were (CENSOR: ``"candidate"`` or
    its fallback, see :func:`sent_kinds`).
    """
    if not row.utility:
        return {"accuracy": None, "note": row.note or "not measured"}
    if scale.utility_rounds == 0:
        return {"accuracy": None, "note": "not measured (utility_rounds=0)"}
    model = build_models(scale.replace(pretrain_rounds=0), split.spec, seed, {row.precode})[row.precode]
    return _fedsgd(model, row, scale, split, seed, progress=progress)


def _fedsgd(model, row: DefenseRow, scale: Scale, split, seed: int, *, progress: bool) -> dict:
    """Train ``model`` in place by ``scale.utility_rounds`` FedSGD rounds under ``row``'s defense."""
    from tqdm import tqdm

    from leakgym.fl.optim import LocalOptimizer
    from leakgym.fl.server import Server
    from leakgym.game.round import share_update

    spec = split.spec
    test_x, test_y = split.test_x, split.test_y
    if scale.eval_size is not None:
        test_x, test_y = test_x[: scale.eval_size], test_y[: scale.eval_size]
    server = Server(model, lr=scale.utility_lr, eval_x=spec.normalize(test_x), eval_y=test_y)
    clients = split.clients[: scale.utility_clients]
    gen = torch.Generator().manual_seed(seed + 17)
    start = time.perf_counter()
    curve: list[list[float]] = [[0, float(server.evaluate()[0])]]
    sent: dict[str, int] = {}
    optimizer = LocalOptimizer(scale.utility_optimizer)
    protocol = {"update_kind": scale.utility_update_kind, "local_steps": scale.utility_local_steps,
                "local_lr": scale.utility_local_lr, "optimizer": None if optimizer.plain else optimizer}
    for rnd in tqdm(range(scale.utility_rounds), desc=f"utility {row.name}", leave=False, disable=not progress):
        updates = []
        for k, (cx, cy) in enumerate(clients):
            idx = torch.randperm(len(cx), generator=gen)[: scale.utility_batch]
            defends = scale.utility_defended == "all" or k == 0
            upd, rep = share_update(server.model, spec.normalize(cx[idx]), cy[idx],
                                    row.config if defends else DefenseConfig(),
                                    seed=seed * 100_003 + rnd * 101 + k, public_x=split.public_x,
                                    public_y=split.public_y, **protocol)
            updates.append(upd)
            if defends:
                for kind in sent_kinds(rep.details):
                    sent[kind] = sent.get(kind, 0) + 1
        server.aggregate(updates)
        done = rnd + 1
        if done % scale.utility_eval_every == 0 or done == scale.utility_rounds:
            curve.append([done, float(server.evaluate()[0])])
    accuracy, loss = server.evaluate()
    # Acc_S (DCS² Table 1): accuracy on the victim's own (sensitive) training shard.
    vx, vy = split.clients[0]
    acc_s, _ = Server(server.model, lr=1.0, eval_x=spec.normalize(vx), eval_y=vy).evaluate()
    return {"accuracy": float(accuracy), "accuracy_victim": float(acc_s), "test_loss": float(loss),
            "wall_s": time.perf_counter() - start, "curve": curve, "sent": sent,
            "rounds": scale.utility_rounds, "clients": len(clients), "batch": scale.utility_batch,
            "defended": scale.utility_defended,
            "test_images": len(test_x)}


# -- comparing with the paper -------------------------------------------------------------------------
def fmt(value: Any, digits: int = 2) -> str:
    """A table entry: numbers with ``digits`` decimals, estimates as ``mean ± se``, ``None`` as 'n/a'."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if hasattr(value, "fmt"):  # an Estimate: mean ± standard error
        return value.fmt(digits)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) if not isinstance(v, str) else v for v in r) + " |" for r in rows]
    return "\n".join(lines)

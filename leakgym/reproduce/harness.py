"""The generic reproduction harness: a grid of defenses (rows) x attacks (columns), scored.

A paper's main table is, for our purposes, a list of :class:`DefenseRow` (a table label, a
:class:`~leakgym.defenses.DefenseConfig`, whether the model carries a PRECODE bottleneck) and a list
of :class:`AttackColumn` (a table label, an attack registry name, its config). :func:`run_grid` runs
the game's round for every cell, exactly as ``docs/architecture.md`` draws it:

1. the server builds the model (``build_model(scale.model, spec, precode=row.precode, seed=seed)``);
   a malicious column modifies it with ``attack.prepare_model(model, spec, public_x=...)``;
2. the victim (client 0 of :func:`leakgym.data.federated_split`) shares its update through the
   round's defend phase (:func:`leakgym.envs.round.share_update`) for each of its
   ``scale.images // scale.batch_size`` private batches (FedSGD, one gradient per batch);
3. the round's attack phase (:func:`leakgym.envs.round.reconstruct_all`) reconstructs **all**
   batches of **all** rows that share one model in a single ``reconstruct_batch`` call, each
   problem with its own seed;
4. the round's scoring phase (:func:`leakgym.envs.round.score_all`) scores each reconstruction
   against its batch (optimal matching), and the cell keeps the per-image PSNR / SSIM / MSE.

Utility (:func:`measure_utility`) is a short FedSGD run in which every client (or, with
``Scale.utility_defended="victim"``, only client 0) applies the row's defense, evaluated on the
held-out test split and on the victim's shard; rows with
``utility=False`` are reported as "not measured" together with the reason.

Threat model shared by every cell (stated in each results file): the attacker knows the labels of
the victim's batch (``AttackerKnowledge.labels``) unless a column says otherwise, the public split
(``public_x``/``public_y``), and the declared batch size; for Mixup/InstaHide rows it is also given
the encoding's mixing matrix in ``update.metadata["encoding"]`` (the upper-bound threat model of
:mod:`leakgym.attacks.mixup_decoding`). Only the mixup-decoding attack reads it.

Randomness: the victim's images, the model initialisation, every defense draw and every attack
restart derive from the one ``seed``.
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

#: The metrics each cell keeps per image (all from :func:`leakgym.metrics.score_reconstruction`).
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
    eval_size: int | None = 300

    def __post_init__(self) -> None:
        for name in ("image_size", "batch_size", "images", "iterations", "restarts", "utility_clients",
                     "utility_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Scale.{name}={value!r}; allowed: integers >= 1")
        if not isinstance(self.utility_rounds, int) or self.utility_rounds < 0:
            raise ValueError(f"Scale.utility_rounds={self.utility_rounds!r}; allowed: integers >= 0")
        if self.utility_defended not in ("all", "victim"):
            raise ValueError(f"Scale.utility_defended={self.utility_defended!r}; allowed: 'all', 'victim'")
        if self.images % self.batch_size:
            raise ValueError(f"Scale.images={self.images} must be a multiple of batch_size={self.batch_size}")
        if not (self.utility_lr > 0 and math.isfinite(self.utility_lr)):
            raise ValueError(f"Scale.utility_lr={self.utility_lr!r}; allowed range (0, inf)")

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

    def summary(self) -> dict:
        out: dict[str, Any] = {"defense": self.defense, "attack": self.attack, "n_images": len(self.per_image["psnr"])}
        for k, v in self.per_image.items():
            arr = np.asarray(v, dtype=float)
            out[k] = float(arr.mean())
            out[f"{k}_std"] = float(arr.std())
            out[f"{k}_min"] = float(arr.min())
            out[f"{k}_max"] = float(arr.max())
        out.update(attack_s=self.attack_s, fidelity=self.fidelity, overhead_ms=self.overhead_ms,
                   per_image={k: [float(x) for x in v] for k, v in self.per_image.items()})
        return out


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


def build_models(scale: Scale, spec, seed: int, precode_flags: set[bool]) -> dict[bool, torch.nn.Module]:
    from leakgym.models import build_model

    return {flag: build_model(scale.model, spec, precode=flag, width=scale.model_width, seed=seed)
            for flag in sorted(precode_flags)}


def run_grid(
    rows: list[DefenseRow],
    columns: list[AttackColumn],
    scale: Scale,
    *,
    split,
    seed: int = 0,
    progress: bool = True,
) -> dict[tuple[str, str], Cell]:
    """Attack every defended update of every (row, column) pair; returns ``{(row, column): Cell}``.

    Args:
        rows, columns: the table (see :class:`DefenseRow`, :class:`AttackColumn`).
        scale: sizes.
        split: a :class:`~leakgym.data.FederatedSplit` (victim = client 0; public split for the
            defenses/attacks that use one).
        seed: seeds the victim's images, the models, the defenses and the attacks.
        progress: show tqdm bars.
    """
    from tqdm import tqdm

    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.envs.round import AttackJob, reconstruct_all, score_all, share_update

    names = [c.name for c in columns]
    for row in rows:
        bad = [a for a in (row.attacks or ()) if a not in names]
        if bad:
            raise ValueError(f"row {row.name!r} names unknown column(s) {bad}; allowed: {names}")
    spec = split.spec
    batches = victim_batches(split, scale, seed)
    base = build_models(scale, spec, seed, {r.precode for r in rows})
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
            jobs, origs, owners, fids, overheads = [], [], [], {}, {}
            for row in tqdm(group, desc=f"{column.name}: defenses", leave=False, disable=not progress):
                for j, (xu, y) in enumerate(batches):
                    upd, rep = share_update(model, spec.normalize(xu), y, row.config, seed=seed * 1000 + j,
                                            public_x=split.public_x, public_y=split.public_y)
                    knowledge = AttackerKnowledge(
                        model=model, spec=spec, batch_size=upd.batch_size,
                        labels=y.clone() if column.labels_known else None,
                        public_x=split.public_x, public_y=split.public_y)
                    jobs.append(AttackJob(attack=attack, update=upd.detached(), knowledge=knowledge,
                                          seed=seed + len(jobs)))
                    origs.append(spec.normalize(xu))
                    owners.append(row.name)
                    fids.setdefault(row.name, []).append(rep.fidelity)
                    overheads.setdefault(row.name, []).append(rep.overhead_s)
            start = time.perf_counter()
            results, _ = reconstruct_all(jobs)
            elapsed = time.perf_counter() - start
            per_row: dict[str, dict[str, list[float]]] = {}
            for owner, s in zip(owners, score_all(spec, results, origs)):
                acc = per_row.setdefault(owner, {k: [] for k in METRICS})
                for k in METRICS:
                    acc[k].extend(float(v) for v in s.per_image[k])
            for row in group:
                cells[(row.name, column.name)] = Cell(
                    defense=row.name, attack=column.name, per_image=per_row[row.name],
                    attack_s=elapsed * len(fids[row.name]) / len(jobs),
                    fidelity=float(np.mean(fids[row.name])), overhead_ms=1000 * float(np.mean(overheads[row.name])),
                )
    return cells


def measure_utility(row: DefenseRow, scale: Scale, *, split, seed: int = 0, progress: bool = True) -> dict:
    """Test accuracy after ``scale.utility_rounds`` FedSGD rounds under the defense of ``row``.

    Every round each of the first ``scale.utility_clients`` clients draws ``scale.utility_batch``
    examples of its shard and shares ``apply_defense(...)`` (with ``utility_defended="victim"`` only
    client 0 defends; the others share their clean gradient); the server (:class:`leakgym.fl.server.Server`)
    takes the example-weighted mean gradient step with learning rate ``scale.utility_lr``.
    """
    from tqdm import tqdm

    from leakgym.envs.round import share_update
    from leakgym.fl.server import Server

    if not row.utility:
        return {"accuracy": None, "note": row.note or "not measured"}
    if scale.utility_rounds == 0:
        return {"accuracy": None, "note": "not measured (utility_rounds=0)"}
    spec = split.spec
    model = build_models(scale, spec, seed, {row.precode})[row.precode]
    test_x, test_y = split.test_x, split.test_y
    if scale.eval_size is not None:
        test_x, test_y = test_x[: scale.eval_size], test_y[: scale.eval_size]
    server = Server(model, lr=scale.utility_lr, eval_x=spec.normalize(test_x), eval_y=test_y)
    clients = split.clients[: scale.utility_clients]
    gen = torch.Generator().manual_seed(seed + 17)
    start = time.perf_counter()
    for rnd in tqdm(range(scale.utility_rounds), desc=f"utility {row.name}", leave=False, disable=not progress):
        updates = []
        for k, (cx, cy) in enumerate(clients):
            idx = torch.randperm(len(cx), generator=gen)[: scale.utility_batch]
            defends = scale.utility_defended == "all" or k == 0
            upd, _ = share_update(server.model, spec.normalize(cx[idx]), cy[idx],
                                  row.config if defends else DefenseConfig(),
                                  seed=seed * 100_003 + rnd * 101 + k, public_x=split.public_x,
                                  public_y=split.public_y)
            updates.append(upd)
        server.aggregate(updates)
    accuracy, loss = server.evaluate()
    # Acc_S (DCS² Table 1): accuracy on the victim's own (sensitive) training shard.
    vx, vy = split.clients[0]
    acc_s, _ = Server(server.model, lr=1.0, eval_x=spec.normalize(vx), eval_y=vy).evaluate()
    return {"accuracy": float(accuracy), "accuracy_victim": float(acc_s), "test_loss": float(loss),
            "wall_s": time.perf_counter() - start,
            "rounds": scale.utility_rounds, "clients": len(clients), "batch": scale.utility_batch,
            "defended": scale.utility_defended,
            "test_images": len(test_x)}


# -- comparing with the paper -------------------------------------------------------------------------
def order(values: dict[str, float], *, lower_is_better: bool = True) -> list[str]:
    """Names sorted from best to worst (for a leakage metric: best protection first)."""
    return sorted(values, key=lambda k: values[k], reverse=not lower_is_better)


def kendall_tau(ours: dict[str, float], paper: dict[str, float]) -> float:
    """Kendall's tau between our and the paper's numbers over their common keys (``scipy.stats``)."""
    from scipy.stats import kendalltau

    keys = [k for k in paper if k in ours and ours[k] is not None and paper[k] is not None]
    if len(keys) < 2:
        return math.nan
    tau = kendalltau([ours[k] for k in keys], [paper[k] for k in keys]).statistic
    return float(tau) if tau is not None else math.nan


def discordant_pairs(ours: dict[str, float], paper: dict[str, float], spread: dict[str, float] | None = None) -> str:
    """The pairs our numbers order differently from the paper's, with our gap (and the per-image std).

    Used as the computed "likely reason" of a failed ranking verdict: a swap within the per-image
    spread is a near-tie at this sample size, a swap beyond it a real difference.
    """
    keys = [k for k in paper if k in ours and ours[k] is not None and paper[k] is not None]
    parts = []
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if (ours[a] - ours[b]) * (paper[a] - paper[b]) < 0:
                gap = abs(ours[a] - ours[b])
                tie = ""
                if spread is not None:
                    s = max(spread.get(a, 0.0), spread.get(b, 0.0))
                    tie = f" (within the per-image std {s:.2f}: a near-tie)" if gap < s else f" (beyond the std {s:.2f})"
                parts.append(f"{a} {ours[a]:.2f} vs {b} {ours[b]:.2f}, gap {gap:.2f}{tie}")
    return "; ".join(parts) if parts else "no pair is swapped"


def fmt(value: Any, digits: int = 2) -> str:
    """A table entry: numbers with ``digits`` decimals, ``None`` as 'n/a'."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) if not isinstance(v, str) else v for v in r) + " |" for r in rows]
    return "\n".join(lines)

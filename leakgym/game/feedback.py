"""What each agent gets back after a round: its observation (only what it could see), its reward and its
infos (numbers only, the same keys from ``reset`` on).

**Observations**: only what each party could really see, normalised to [0, 1].

Defender (the victim client) sees
    [round fraction, test accuracy, test loss / (2 ln C) clipped, its last action (each entry
     index / (n - 1)), its self-audit leakage estimate, (fidelity + 1) / 2 of its last update]
The self-audit is the client attacking its own shared update with a fixed reference attack
(scenario ``audit_iterations``; 0 disables it and the entry stays 0).

Attacker (the server) sees
    [round fraction,
     per layer group (4 contiguous groups of the update's tensors): log10-norm mapped to [0, 1],
     per layer group: fraction of exact zeros,
     noise statistics of the whole update: (tanh(excess kurtosis / 10) + 1) / 2 and mean|u| / rms(u),
     its last gradient-matching loss as (tanh(log10(loss) / 4) + 1) / 2 (0 for attacks without one),
     its last action (index / (n - 1))]
Before the first round the update summary is all zeros. The "last action" entries come from the
scenario's :class:`~leakgym.game.menus.Menu` (``Menu.features``). Every entry is finite and in
[0, 1] by construction: non-finite statistics (a diverged model) map to 0. Neither party ever sees the private images
or ground-truth reconstruction metrics.

**Rewards.** Leakage ``L`` is the matched per-image reconstruction score, averaged over the private batch and
mapped to [0, 1]:

* ``ssim``: mean SSIM clipped to [0, 1];
* ``psnr``: mean PSNR / 40 dB clipped to [0, 1] (40 dB is visually exact);
* ``lpips``: 1 - mean LPIPS clipped to [0, 1] (needs the pretrained LPIPS weights);
* ``ssim+psnr``: the mean of the two above.

Attacker: ``r_A = L - w_cost * (iterations x restarts + once) / 1000`` (``AttackCost.units``), with
``iterations`` and ``restarts`` the menu's budget the attack ran (``AttackResult.cost``) and ``once`` the steps
of the second stage of two-stage attacks, which runs once on the best restart -- Mixup decoding's demixing
steps (``decode_steps``, default 1000) and LODA inversion's Eq. 6 steps (``inversion_steps``) -- real work,
charged as such.

Defender: ``r_D = -L + w_fid * fidelity + w_acc * accuracy - w_ovh * defense_units``, where
fidelity is the cosine of the shared update to the clean update, accuracy the global model's last
measured test accuracy and ``defense_units`` the defense's extra client compute in units of one
clean gradient computation (:func:`leakgym.defenses.defense_compute_units`: each registered defense
declares its own cost model; a deterministic count so that the same seed gives the same rewards,
unlike wall time).

**Infos.** The step infos every view returns: the same keys from ``reset`` on, finite numbers only.

RL clients stack infos: TorchRL's ``PettingZooWrapper`` builds its info spec from the ``reset`` infos and
turns every value into a tensor, Gymnasium's vector envs stack each key into an array, Tianshou into a
``Batch``; and the determinism checkers (Gymnasium's ``check_env``, PettingZoo's seed tests) compare them
with ``==``, which a NaN never passes. So each role's infos have one fixed set of keys
(:func:`info_template`), present from ``reset`` on, each an ``int``, ``float`` or ``bool`` of one type
throughout, all finite:

* ``reset`` (``round`` 0, no round played yet): ``accuracy`` and ``test_loss`` are the initial model's,
  every other quantity is 0 (``False`` for the flags) but ``strategy_index``, ``diverged_round`` and
  ``matching_loss``, which are -1; filter on ``round > 0`` for the rounds' values;
* ``strategy_index``: the attacker's strategy as an index into ``scenario.strategies``;
* ``diverged_round``: the round in which the global model diverged, -1 while it has not
  (``model_diverged`` says the same as a flag);
* ``matching_loss``: the attack's final gradient-matching loss, -1 for attacks without one (analytic,
  imprint);
* ``leakage_lpips`` is a key only where the env reports LPIPS (its backbone weights were on disk, or the
  leakage metric needs it, when the env was made): the key set is fixed per env. A round whose LPIPS is
  not finite reports 1 (a distance: the far end of its usual range).

The round's records that are not numbers -- ``strategy`` (the name), ``attack_settings`` and
``defense_settings`` (the decoded actions, dicts) and ``defenses`` (the names of the defenses applied)
-- are not in the infos; :meth:`leakgym.envs.LeakGymParallelEnv.round_details` returns an
agent's full record of the last round, these included (the single-agent and vector views have it too),
and ``history`` keeps every round's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from leakgym.fl.update import SharedUpdate
from leakgym.metrics import ReconstructionScores

from .menus import Menu
from .scenario import PSNR_FOR_FULL_LEAKAGE, RewardWeights

LAYER_GROUPS = 4


def _unit_interval(obs: np.ndarray) -> np.ndarray:
    return np.clip(np.nan_to_num(obs, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0).astype(np.float32)


def defender_obs_names(menu: Menu) -> list[str]:
    """Name of every defender observation entry, in order (each in [0, 1])."""
    return (["round_fraction", "test_accuracy", "test_loss_scaled"] + [f"last_{n}" for n in menu.names]
            + ["audit_leakage", "fidelity_scaled"])


def attacker_obs_names(menu: Menu) -> list[str]:
    """Name of every attacker observation entry, in order (each in [0, 1])."""
    groups = range(LAYER_GROUPS)
    return (["round_fraction"] + [f"update_log_norm_group{g}" for g in groups]
            + [f"update_zero_fraction_group{g}" for g in groups] + ["update_kurtosis_scaled", "update_mean_abs_over_rms",
                                                                     "matching_loss_scaled"]
            + [f"last_{n}" for n in menu.names])


def defender_obs_size(nvec: np.ndarray) -> int:
    return 5 + len(nvec)


def defender_observations(
    *,
    round_fractions: Sequence[float],
    accuracies: Sequence[float],
    losses: Sequence[float],
    num_classes: int,
    last_actions: np.ndarray,
    menu: Menu,
    audit_leakages: Sequence[float],
    fidelities: Sequence[float],
) -> np.ndarray:
    """``(G, defender_obs_size)``: the defender's observation of each of G games, one row each (every entry
    is computed elementwise, so a row equals the game's observation computed alone)."""
    scale = 2 * math.log(num_classes)
    head = np.array([[f, a, lo / scale if math.isfinite(lo) else 1.0]
                     for f, a, lo in zip(round_fractions, accuracies, losses)], np.float32).reshape(-1, 3)
    tail = np.array([[a, (f + 1) / 2] for a, f in zip(audit_leakages, fidelities)], np.float32).reshape(-1, 2)
    return _unit_interval(np.concatenate([head, menu.features(last_actions), tail], axis=1))


def attacker_obs_size(nvec: np.ndarray) -> int:
    return 1 + 2 * LAYER_GROUPS + 2 + 1 + len(nvec)


#: entries of :func:`update_summary`: per layer group a log-norm and a zero fraction, then two noise statistics
SUMMARY_SIZE = 2 * LAYER_GROUPS + 2
#: at most this many update entries per batched summary computation (memory; games are chunked)
SUMMARY_ENTRIES = 1 << 22
#: the same bound on a CPU, where a chunk of float64 rows should stay in the cache: 256 random rows of
#: LeNet's 13k entries took 85 ms as one chunk and 12 ms in chunks of 16 to 32 rows, and a vector step's
#: summaries of 256 digits games 46 -> 15 ms (one torch thread; the profiler put most of the one-chunk
#: time in elementwise products over fresh 27 MB temporaries), with bit-identical summaries (every
#: statistic is a reduction within a row)
CPU_SUMMARY_ENTRIES = 1 << 18


def update_summaries(updates: Sequence[SharedUpdate | None]) -> np.ndarray:
    """``(N, SUMMARY_SIZE)``: the fixed-size summary of each shared update (group log-norms, zero
    fractions, noise statistics; zeros for None), in float64 on the updates' device.

    Updates with the same tensors (names and sizes: the games of a vector env) are summarised together,
    one row per update, and only the ``(N, SUMMARY_SIZE)`` result comes to the host: one transfer per
    round instead of one per tensor and game. One game is the ``N = 1`` case of the same code, so a game
    of a vector env sees what it sees alone."""
    out = np.zeros((len(updates), SUMMARY_SIZE), np.float32)
    groups: dict[tuple, list[int]] = {}
    for i, update in enumerate(updates):
        if update is not None:
            key = tuple((name, t.numel(), t.device) for name, t in update.tensors.items())
            groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        names, sizes = [k[0] for k in key], [k[1] for k in key]
        cpu = bool(key) and key[0][2].type == "cpu"
        if cpu and sum(sizes) > CPU_SUMMARY_ENTRIES:  # one update alone outgrows the cache: in blocks
            for i in members:
                out[i] = _summary_in_blocks([updates[i].tensors[n] for n in names], sizes)
            continue
        bound = CPU_SUMMARY_ENTRIES if cpu else SUMMARY_ENTRIES
        chunk = max(1, bound // max(sum(sizes), 1))
        for lo in range(0, len(members), chunk):
            idx = members[lo:lo + chunk]
            with torch.no_grad():  # (one stack per name, no per-tensor detach and reshape: N = 1,024 games
                # have 8,192 tensors, and those two calls each were a host cost measured on a GPU)
                rows = torch.cat([torch.stack([updates[i].tensors[n] for i in idx]).reshape(len(idx), -1)
                                  for n in names], dim=1) if names else torch.zeros(len(idx), 0)
            out[idx] = _summary_rows(rows, sizes)
    return out


def _summary_rows(rows: Tensor, sizes: list[int]) -> np.ndarray:
    """:func:`update_summaries` of ``rows`` (``(G, D)``: each update's tensors flattened and
    concatenated; ``sizes``: the tensors' numels)."""
    if rows.device.type == "mps":  # no float64 there
        rows = rows.cpu()
    rows = torch.nan_to_num(rows.to(torch.float64))
    zero = rows.new_zeros(rows.shape[0])
    bounds = np.cumsum([0, *sizes])
    norms, zeros = [], []
    for g in np.array_split(np.arange(len(sizes)), LAYER_GROUPS):
        seg = rows[:, bounds[g[0]]:bounds[g[-1] + 1]] if len(g) else rows[:, :0]
        if seg.shape[1] == 0:
            norms.append(zero)
            zeros.append(zero)
            continue
        norms.append(((torch.log10(seg.norm(dim=1) + 1e-12) + 8) / 10).clamp(0.0, 1.0))
        zeros.append((seg == 0).to(rows.dtype).mean(dim=1))
    if rows.shape[1] == 0:
        stats = [zero, zero]
    else:
        centred = rows - rows.mean(dim=1, keepdim=True)
        squares = centred * centred  # (and their squares below): pow(4) is 3x slower on a CPU (256 x 12k: 25 vs 8 ms)
        var = squares.mean(dim=1)
        kurt = torch.where(var > 0, (squares * squares).mean(dim=1) / var**2 - 3, zero)
        rms = (rows**2).mean(dim=1).sqrt()
        mean_abs_ratio = torch.where(rms > 0, rows.abs().mean(dim=1) / rms, zero)
        stats = [(torch.tanh(kurt / 10) + 1) / 2, mean_abs_ratio]
    return torch.stack(norms + zeros + stats, dim=1).cpu().numpy().astype(np.float32)


def _summary_in_blocks(tensors: list[Tensor], sizes: list[int]) -> np.ndarray:
    """:func:`_summary_rows` of one update too large for a CPU's cache (more than :data:`CPU_SUMMARY_ENTRIES`
    entries: ResNet-18's 11.2 M), from blocks of at most that many entries: a pass for the layer groups' sums
    of squares and zeros and the sum, then one for the centred moments. The same statistics to float64
    rounding; measured for ResNet-18 updates, one thread: 342-353 ms an update as one row, 34 ms in blocks."""
    total = sum(sizes)

    def blocks():
        for g, group in enumerate(np.array_split(np.arange(len(sizes)), LAYER_GROUPS)):
            for j in group:
                for block in tensors[j].detach().reshape(-1).split(CPU_SUMMARY_ENTRIES):
                    yield g, torch.nan_to_num(block.to(torch.float64))

    squares = [0.0] * LAYER_GROUPS
    zeros = [0.0] * LAYER_GROUPS
    entries = [0] * LAYER_GROUPS
    total_sum = 0.0
    with torch.no_grad():
        for g, b in blocks():
            squares[g] += float((b * b).sum())
            zeros[g] += float((b == 0).sum())
            entries[g] += b.numel()
            total_sum += float(b.sum())
        mean = total_sum / total
        second = fourth = absolute = 0.0
        for _, b in blocks():
            centred = b - mean
            c2 = centred * centred
            second += float(c2.sum())
            fourth += float((c2 * c2).sum())
            absolute += float(b.abs().sum())
    norms = [min(max((math.log10(math.sqrt(q) + 1e-12) + 8) / 10, 0.0), 1.0) if n else 0.0
             for q, n in zip(squares, entries)]
    zero_fractions = [z / n if n else 0.0 for z, n in zip(zeros, entries)]
    var = second / total
    kurt = fourth / total / (var * var) - 3 if var > 0 else 0.0  # (var**2 of a Python float may raise OverflowError)
    rms = math.sqrt(sum(squares) / total)
    mean_abs_ratio = absolute / total / rms if rms > 0 else 0.0
    return np.array(norms + zero_fractions + [(math.tanh(kurt / 10) + 1) / 2, mean_abs_ratio], np.float32)


def update_summary(update: SharedUpdate | None) -> np.ndarray:
    """Fixed-size summary of one shared update: group log-norms, zero fractions, noise statistics
    (:func:`update_summaries` of one update)."""
    return update_summaries([update])[0]


def _matching_loss_feature(matching_loss: float | None) -> float:
    if matching_loss is not None and math.isfinite(matching_loss) and matching_loss > 0:
        return (math.tanh(math.log10(matching_loss) / 4) + 1) / 2
    return 0.0


def attacker_observations(
    *,
    round_fractions: Sequence[float],
    summaries: Sequence[np.ndarray | None],
    matching_losses: Sequence[float | None],
    last_actions: np.ndarray,
    menu: Menu,
) -> np.ndarray:
    """``(G, attacker_obs_size)``: the attacker's observation of each of G games (a summary of None: the
    round before any update, zeros), one row each, elementwise as :func:`defender_observations`."""
    zeros = np.zeros(SUMMARY_SIZE, np.float32)
    obs = np.concatenate([
        np.array(round_fractions, np.float32).reshape(-1, 1),
        np.array([zeros if u is None else u for u in summaries], np.float32).reshape(-1, SUMMARY_SIZE),
        np.array([_matching_loss_feature(m) for m in matching_losses], np.float32).reshape(-1, 1),
        menu.features(last_actions),
    ], axis=1)
    return _unit_interval(obs)


# --------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------
def _clip01(v: float) -> float:
    """``v`` clipped to [0, 1]; a NaN score is 0: nothing leaked, and rewards stay finite (``max(nan, 0.0)``
    is NaN). The game's own scoring makes none (:func:`~leakgym.game.round.unit_images` greys NaN pixels);
    a score computed elsewhere may be NaN."""
    return 0.0 if math.isnan(v) else float(min(max(v, 0.0), 1.0))


def leakage_score(scores: ReconstructionScores, metric: str) -> float:
    ssim = _clip01(scores.mean["ssim"])
    psnr = _clip01(scores.mean["psnr"] / PSNR_FOR_FULL_LEAKAGE)
    if metric == "ssim":
        return ssim
    if metric == "psnr":
        return psnr
    if metric == "ssim+psnr":
        return (ssim + psnr) / 2
    if metric == "lpips":
        return _clip01(1.0 - scores.mean["lpips"])
    raise ValueError(f"leakage metric {metric!r}; allowed: ssim, psnr, lpips, ssim+psnr")


def rewards(
    *,
    leakage: float,
    attack_units: int,
    fidelity: float,
    accuracy: float,
    defense_units: float,
    weights: RewardWeights,
) -> dict[str, float]:
    parts = {
        "attacker_leakage": leakage,
        "attacker_cost": -weights.attack_cost * attack_units / 1000.0,
        "defender_leakage": -leakage,
        "defender_fidelity": weights.fidelity * fidelity,
        "defender_accuracy": weights.accuracy * accuracy,
        "defender_overhead": -weights.defense_overhead * defense_units,
    }
    parts["attacker"] = parts["attacker_leakage"] + parts["attacker_cost"]
    parts["defender"] = (
        parts["defender_leakage"] + parts["defender_fidelity"] + parts["defender_accuracy"] + parts["defender_overhead"]
    )
    return {k: float(v) for k, v in parts.items()}


# --------------------------------------------------------------------------------------------------
# Infos
# --------------------------------------------------------------------------------------------------



#: keys of both roles' infos and their value at ``reset``
COMMON: dict[str, Any] = {
    "round": 0,
    "leakage": 0.0,
    "leakage_ssim": 0.0,
    "leakage_psnr": 0.0,
    "leakage_mse": 0.0,
    "label_accuracy": 0.0,
    "accuracy": 0.0,
    "test_loss": 0.0,
    "model_diverged": False,
    "update_skipped": False,
    "diverged_round": -1,
}

#: keys of one role's infos (besides :data:`COMMON`) and their value at ``reset``
BY_ROLE: dict[str, dict[str, Any]] = {
    "attacker": {
        "strategy_index": -1,
        "reward_leakage": 0.0,
        "reward_cost": 0.0,
        "attack_units": 0.0,
        "matching_loss": -1.0,
    },
    "defender": {
        "reward_leakage": 0.0,
        "reward_fidelity": 0.0,
        "reward_accuracy": 0.0,
        "reward_overhead": 0.0,
        "fidelity": 0.0,
        "defense_units": 0.0,
        "audit_leakage": 0.0,
    },
}

#: the key that only envs reporting LPIPS have, and its value at ``reset``
LPIPS = {"leakage_lpips": 0.0}

#: the round's records that are not numbers: in :meth:`round_details`, not in the infos
DETAILS = ("strategy", "attack_settings", "defense_settings", "defenses")


def info_template(role: str, *, lpips: bool = False, accuracy: float = 0.0, test_loss: float = 0.0) -> dict[str, Any]:
    """``role``'s infos at ``reset``: every key, with its start value (``accuracy`` and ``test_loss``: the
    initial model's); ``lpips``: whether the env reports LPIPS (``leakage_lpips``)."""
    if role not in BY_ROLE:
        raise ValueError(f"role={role!r}; allowed: {sorted(BY_ROLE)}")
    return {**COMMON, **(LPIPS if lpips else {}), **BY_ROLE[role], "accuracy": float(accuracy),
            "test_loss": float(test_loss)}


@functools.cache
def _layout(role: str, lpips: bool) -> tuple[dict[str, Any], frozenset[str], tuple[tuple[str, type], ...]]:
    """``role``'s info template, the record keys it accepts and each info key's type (bool before int: a
    bool is an int), once per (role, lpips): :data:`COMMON`, :data:`BY_ROLE` and :data:`LPIPS` are constants."""
    template = info_template(role, lpips=lpips)
    casts = tuple((k, bool if isinstance(v, bool) else int if isinstance(v, int) else float) for k, v in template.items())
    return template, frozenset(template) | frozenset(DETAILS) | frozenset(LPIPS), casts


def numeric_info(raw: Mapping[str, Any], role: str, strategies: Sequence[str], *, lpips: bool = False) -> dict[str, Any]:
    """A round's full record for ``role`` (the game's infos) -> the infos the views return.

    Every key of :func:`info_template`, each of the template value's type; ``diverged_round`` and
    ``matching_loss`` are -1 where the record has none, ``leakage_lpips`` (``lpips``) 1 (a distance: the far
    end of LPIPS's usual range) where this round's was not finite. A record key that is neither in the template nor in :data:`DETAILS` is a ``KeyError``
    (a new quantity must be given a place here, not dropped), but ``leakage_lpips`` in an env made without
    LPIPS, which stays in the record only.
    """
    template, accepted, casts = _layout(role, lpips)
    if not accepted.issuperset(raw):
        unknown = sorted(set(raw) - accepted)
        raise KeyError(f"{role} info key(s) {unknown} have no place in leakgym/game/feedback.py (numbers: info_template; "
                       "records: DETAILS)")
    out = dict(template)
    for key, cast in casts:
        value = raw.get(key)
        if value is not None:
            out[key] = cast(value)
    if lpips and "leakage_lpips" not in raw:
        out["leakage_lpips"] = 1.0
    if role == "attacker" and raw.get("strategy") is not None:
        out["strategy_index"] = list(strategies).index(raw["strategy"])
    return out


__all__ = ["BY_ROLE", "COMMON", "DETAILS", "LPIPS", "info_template", "numeric_info"]

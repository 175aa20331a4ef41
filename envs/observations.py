"""Observation vectors: only what each party could really see, normalised to [0, 1].

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
scenario's :class:`~leakgym.envs.menus.Menu` (``Menu.features``). Every entry is finite and in
[0, 1] by construction: non-finite statistics (a diverged model) map to 0. Neither party ever sees the private images
or ground-truth reconstruction metrics.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from leakgym.fl.update import SharedUpdate

from .menus import Menu

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


def defender_observation(
    *,
    round_fraction: float,
    accuracy: float,
    loss: float,
    num_classes: int,
    last_action: np.ndarray,
    menu: Menu,
    audit_leakage: float,
    fidelity: float,
) -> np.ndarray:
    loss_feature = loss / (2 * math.log(num_classes)) if math.isfinite(loss) else 1.0
    head = [round_fraction, accuracy, loss_feature]
    tail = [audit_leakage, (fidelity + 1) / 2]
    obs = np.concatenate([np.array(head, np.float32), menu.features(last_action), np.array(tail, np.float32)])
    return _unit_interval(obs)


def attacker_obs_size(nvec: np.ndarray) -> int:
    return 1 + 2 * LAYER_GROUPS + 2 + 1 + len(nvec)


def update_summary(update: SharedUpdate | None) -> np.ndarray:
    """Fixed-size summary of a shared update: group log-norms, zero fractions, noise statistics."""
    if update is None:
        return np.zeros(2 * LAYER_GROUPS + 2, np.float32)
    tensors = [torch.nan_to_num(t.detach().reshape(-1).double().cpu()) for t in update.tensors.values()]
    groups = np.array_split(np.arange(len(tensors)), LAYER_GROUPS)
    norms, zeros = [], []
    for g in groups:
        if len(g) == 0:
            norms.append(0.0)
            zeros.append(0.0)
            continue
        flat = torch.cat([tensors[i] for i in g])
        norm = float(flat.norm())
        norms.append(min(max((math.log10(norm + 1e-12) + 8) / 10, 0.0), 1.0))
        zeros.append(float((flat == 0).double().mean()))
    allv = torch.cat(tensors)
    centred = allv - allv.mean()
    var = float((centred**2).mean())
    kurt = float((centred**4).mean()) / (var**2) - 3 if var > 0 else 0.0
    rms = math.sqrt(float((allv**2).mean()))
    mean_abs_ratio = float(allv.abs().mean()) / rms if rms > 0 else 0.0
    stats = [(math.tanh(kurt / 10) + 1) / 2, mean_abs_ratio]
    return np.array(norms + zeros + stats, np.float32)


def attacker_observation(
    *,
    round_fraction: float,
    update: SharedUpdate | None,
    matching_loss: float | None,
    last_action: np.ndarray,
    menu: Menu,
) -> np.ndarray:
    if matching_loss is not None and math.isfinite(matching_loss) and matching_loss > 0:
        loss_feature = (math.tanh(math.log10(matching_loss) / 4) + 1) / 2
    else:
        loss_feature = 0.0
    obs = np.concatenate(
        [
            np.array([round_fraction], np.float32),
            update_summary(update),
            np.array([loss_feature], np.float32),
            menu.features(last_action),
        ]
    )
    return _unit_interval(obs)

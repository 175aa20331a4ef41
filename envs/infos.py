"""The step infos every view returns: the same keys from ``reset`` on, finite numbers only.

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
-- are not in the infos; :meth:`~leakgym.envs.leakgym_env.LeakGymParallelEnv.round_details` returns an
agent's full record of the last round, these included (the single-agent and vector views have it too),
and ``history`` keeps every round's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


def numeric_info(raw: Mapping[str, Any], role: str, strategies: Sequence[str], *, lpips: bool = False) -> dict[str, Any]:
    """A round's full record for ``role`` (the game's infos) -> the infos the views return.

    Every key of :func:`info_template`, each of the template value's type; ``diverged_round`` and
    ``matching_loss`` are -1 where the record has none, ``leakage_lpips`` (``lpips``) 1 (a distance: the far
    end of LPIPS's usual range) where this round's was not finite. A record key that is neither in the template nor in :data:`DETAILS` is a ``KeyError``
    (a new quantity must be given a place here, not dropped), but ``leakage_lpips`` in an env made without
    LPIPS, which stays in the record only.
    """
    out = info_template(role, lpips=lpips)
    unknown = sorted(set(raw) - set(out) - set(DETAILS) - set(LPIPS))
    if unknown:
        raise KeyError(f"{role} info key(s) {unknown} have no place in envs/infos.py (numbers: info_template; "
                       "records: DETAILS)")
    for key, start in out.items():
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(start, bool):
            out[key] = bool(value)
        elif isinstance(start, int):
            out[key] = int(value)
        else:
            out[key] = float(value)
    if lpips and "leakage_lpips" not in raw:
        out["leakage_lpips"] = 1.0
    if role == "attacker" and raw.get("strategy") is not None:
        out["strategy_index"] = list(strategies).index(raw["strategy"])
    return out


__all__ = ["BY_ROLE", "COMMON", "DETAILS", "LPIPS", "info_template", "numeric_info"]

"""The step infos every view returns: the same keys from ``reset`` on, numbers only.

RL clients stack infos: TorchRL's ``PettingZooWrapper`` builds its info spec from the ``reset`` infos and
turns every value into a tensor, Gymnasium's vector envs stack each key into an array, Tianshou into a
``Batch``. So each role's infos have one fixed set of keys (:func:`info_template`), present from
``reset`` on, each an ``int``, ``float`` or ``bool`` of one type throughout:

* before the first round (``reset``) the metrics are NaN, ``round`` is 0, the flags ``False`` and the
  indices -1;
* ``leakage_lpips`` is NaN where LPIPS is not measured (no backbone weights on disk), ``matching_loss``
  NaN for attacks without a matching loss (analytic, imprint), ``diverged_round`` -1 while the model
  has not diverged;
* ``strategy_index`` is the attacker's strategy as an index into ``scenario.strategies``.

The round's records that are not numbers -- ``strategy`` (the name), ``attack_settings`` and
``defense_settings`` (the decoded actions, dicts) and ``defenses`` (the names of the defenses applied)
-- are not in the infos; :meth:`~leakgym.envs.leakgym_env.LeakGymParallelEnv.round_details` returns an
agent's full record of the last round, these included (the single-agent and vector views have it too),
and ``history`` keeps every round's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NAN = float("nan")

#: keys of both roles' infos and their value before the first round
COMMON: dict[str, Any] = {
    "round": 0,
    "leakage": NAN,
    "leakage_ssim": NAN,
    "leakage_psnr": NAN,
    "leakage_mse": NAN,
    "leakage_lpips": NAN,
    "label_accuracy": NAN,
    "accuracy": NAN,
    "test_loss": NAN,
    "model_diverged": False,
    "update_skipped": False,
    "diverged_round": -1,
}

#: keys of one role's infos (besides :data:`COMMON`) and their value before the first round
BY_ROLE: dict[str, dict[str, Any]] = {
    "attacker": {
        "strategy_index": -1,
        "reward_leakage": NAN,
        "reward_cost": NAN,
        "attack_units": NAN,
        "matching_loss": NAN,
    },
    "defender": {
        "reward_leakage": NAN,
        "reward_fidelity": NAN,
        "reward_accuracy": NAN,
        "reward_overhead": NAN,
        "fidelity": NAN,
        "defense_units": NAN,
        "audit_leakage": NAN,
    },
}

#: the round's records that are not numbers: in :meth:`round_details`, not in the infos
DETAILS = ("strategy", "attack_settings", "defense_settings", "defenses")


def info_template(role: str) -> dict[str, Any]:
    """``role``'s infos before the first round (the ``reset`` infos): every key, with its start value."""
    if role not in BY_ROLE:
        raise ValueError(f"role={role!r}; allowed: {sorted(BY_ROLE)}")
    return {**COMMON, **BY_ROLE[role]}


def numeric_info(raw: Mapping[str, Any], role: str, strategies: Sequence[str]) -> dict[str, Any]:
    """A round's full record for ``role`` (the game's infos) -> the infos the views return.

    Every key of :func:`info_template`, each of the template value's type; a key the record lacks keeps
    the template's value (NaN, -1, ``False``). A record key that is neither in the template nor in
    :data:`DETAILS` is a ``KeyError``: a new quantity must be given a place here, not dropped.
    """
    out = info_template(role)
    unknown = sorted(set(raw) - set(out) - set(DETAILS))
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
    if role == "attacker" and raw.get("strategy") is not None:
        out["strategy_index"] = list(strategies).index(raw["strategy"])
    return out


__all__ = ["BY_ROLE", "COMMON", "DETAILS", "info_template", "numeric_info"]

"""The built-in defenses, registered in pipeline order (within a stage, the order listed here).

Adding a defense: write its module (a :class:`~leakgym.defenses.registry.InputDefense`,
``StepDefense`` or ``UpdateDefense`` with its fields, ``apply`` and ``cost``; a field's ``limit``,
``limit_option`` and ``bit_menu`` tell scenarios how to bound and offer it), add it to :data:`BUILTIN`
below (or call :func:`~leakgym.defenses.register_defense` from your own code), and give it a case in
``DEFENSE_CASES`` of ``tests/method_checks.py``.
"""

from __future__ import annotations

from leakgym.defenses.censor import CENSOR
from leakgym.defenses.dcs2 import DCS2_DEFENSE
from leakgym.defenses.encodings import INSTAHIDE, MIXUP
from leakgym.defenses.loda import LODA
from leakgym.defenses.oasis import OASIS
from leakgym.defenses.perturbation import CLIP, NOISE
from leakgym.defenses.ppp import PPP_DEFENSE
from leakgym.defenses.registry import DEFENSES, register_defense
from leakgym.defenses.soteria import SOTERIA
from leakgym.defenses.sparsification import PRUNE, TOPK
from leakgym.defenses.value_clipping import CLIP_VALUE

BUILTIN = (
    OASIS, LODA, MIXUP, INSTAHIDE,                             # input: change what is trained on
    DCS2_DEFENSE, CENSOR,                                      # step: every local step's gradient
    PPP_DEFENSE, SOTERIA, PRUNE, TOPK, CLIP, CLIP_VALUE, NOISE,  # update: selection, clipping, noise last
)

for _defense in BUILTIN:
    if _defense.name not in DEFENSES:  # idempotent under importlib.reload
        register_defense(_defense)

#: The defender menu of a scenario that names none (``Scenario().defender_menu``): field -> levels, "off" first.
DEFAULT_DEFENDER_MENU: dict[str, tuple] = {
    "noise_sigma": (0.0, 0.01, 0.1),
    "prune": (0.0, 0.5, 0.9),
    "dcs2_lambda_g": (0.0, 0.5),
    "censor_trials": (0, 5),
}

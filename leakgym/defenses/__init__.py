"""Client-side defenses against gradient leakage, composed by one pipeline.

``apply_defense(model, x, y, DefenseConfig(...))`` returns the update a defended client shares and a
:class:`DefenseReport`. See :mod:`leakgym.defenses.pipeline` for the order in which defenses
compose and :mod:`leakgym.defenses.config` for every parameter and the named presets.
"""

from leakgym.defenses.config import PIPELINE_ORDER, PRESETS, DefenseConfig
from leakgym.defenses.pipeline import DefenseReport, apply_defense

__all__ = ["PIPELINE_ORDER", "PRESETS", "DefenseConfig", "DefenseReport", "apply_defense"]

"""Client-side defenses against gradient leakage, one registry, composed by one pipeline.

``apply_defense(model, x, y, DefenseConfig(...))`` returns the update a defended client shares and a
:class:`DefenseReport`. Every defense is one registered object (:mod:`leakgym.defenses.registry`;
the built-in ones in :mod:`leakgym.defenses.catalog`) that brings its own config fields, stage,
``apply`` and cost model; :class:`DefenseConfig`, :data:`PIPELINE_ORDER` and
:func:`defense_compute_units` are derived from the registry. See :mod:`leakgym.defenses.pipeline`
for the order in which defenses compose and :mod:`leakgym.defenses.config` for the named presets.
"""

from leakgym.defenses.config import PRESETS, DefenseConfig
from leakgym.defenses.pipeline import DefenseCall, DefenseReport, apply_defense, apply_defense_many
from leakgym.defenses.registry import (
    DEFENSES,
    PIPELINE_ORDER,
    STAGES,
    BitMenu,
    Defense,
    DefenseContext,
    Field,
    GroupedStepDefense,
    InputDefense,
    StepDefense,
    UpdateDefense,
    choice_field,
    defense_compute_units,
    defense_field,
    defense_fields,
    defense_registry,
    int_field,
    reads_public_split,
    real_field,
    register_defense,
    registered,
    unregister_defense,
)

__all__ = [
    "DEFENSES",
    "PIPELINE_ORDER",
    "PRESETS",
    "STAGES",
    "BitMenu",
    "Defense",
    "DefenseCall",
    "DefenseConfig",
    "DefenseContext",
    "DefenseReport",
    "Field",
    "GroupedStepDefense",
    "InputDefense",
    "StepDefense",
    "UpdateDefense",
    "apply_defense",
    "apply_defense_many",
    "choice_field",
    "defense_compute_units",
    "defense_field",
    "defense_fields",
    "defense_registry",
    "int_field",
    "reads_public_split",
    "real_field",
    "register_defense",
    "registered",
    "unregister_defense",
]

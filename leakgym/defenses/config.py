"""`DefenseConfig`: every registered defense's parameters in one validated, immutable value.

The fields are not written here: each defense declares its own (:mod:`leakgym.defenses.registry`,
the built-in ones listed in :mod:`leakgym.defenses.catalog`), and ``DefenseConfig`` accepts,
validates and defaults exactly the fields of the registered defenses. ``defense_field(name)``
gives a field's type, default, allowed values and doc.

The default ``DefenseConfig()`` is *no defense*: each defense's first field is its switch, whose
default is "off" (0, or 1.0 for the top-k keep fraction, or ``"off"`` for PPP), and a defense is
applied only when its switch moves away from it. Any subset of defenses composes;
:mod:`leakgym.defenses.pipeline` documents the order.

Defaults of the parameters that only matter once a defense is switched on follow the papers:

* DCS² (Wu et al., AAAI 2024): ``lambda_g = 0.7`` is the paper's choice (Table 3, the value of
  its Table 2 row). The main text leaves the other weights to the supplementary material; the
  defaults here are those of the authors' MNIST script (``JingWu321/DCS-2``, ``dlg/scripts/mnist.sh``):
  ``dcs_iter=1000, dcs_lr=0.1, lambda_xsim=0.01, lambda_zsim=0.01, epsilon=0.01``, one concealed
  sample (``per_adv=1``) started from a mixup of a random image and the sensitive one (the paper's
  "MixUP" start ``0.7 x0 + 0.3 xs``, Table 5).
* LODA (§5 "Setup of LODA", LODA1): feature alignment on the first five convolutional layers,
  500 steps of normalised gradient descent with learning rate 0.1. The paper's ``c = 20`` is
  calibrated to its ResNet-18's feature scale; :data:`leakgym.defenses.loda.CALIBRATED_C` is the
  value calibrated for LeakGym's extractor (see :mod:`leakgym.defenses.loda`).
* CENSOR (Algorithm 1): ``T = 20`` trials is what the paper calls "usually sufficient" (§IV-B);
  the trial step is the FL learning rate eta, 0.1 in its experiments (§V-E). The default fallback
  is Algorithm 1 as written, ``"original"`` (line 11: the original gradient when no trial lowers the
  loss; ``"zeros"`` until issue 36, now preset ``censor-zeros``, see :mod:`leakgym.defenses.censor`);
  presets ``censor`` and ``censor-paper`` are Algorithm 1 as written.
* PPP (Scheliga et al., §5.2): NG with sigma in {1e-3, 1e-2, 1e-1, 0.5} (NG3, NG2, NG1, NG05) or
  GC with pruning ratio in {0.9, 0.99} (GC90, GC99), on the layers before the PRECODE bottleneck.
* OASIS (Jeter et al., §IV-A): see :mod:`leakgym.defenses.oasis` for the bit mask.

Named settings (the ones :mod:`leakgym.bench.defenses` runs, and the PPP presets of the PPP paper)
are in :data:`PRESETS`; ``DefenseConfig.preset("PPP-NG1")`` returns one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import leakgym.defenses.catalog  # noqa: F401 - registers the built-in defenses
from leakgym.defenses.dcs2 import STARTS as DCS2_STARTS
from leakgym.defenses.loda import CALIBRATED_C
from leakgym.defenses.oasis import ALL_BITS as OASIS_ALL_BITS
from leakgym.defenses.perturbation import NOISE_KINDS
from leakgym.defenses.ppp import PPP_MODES
from leakgym.defenses.registry import DEFENSES, PIPELINE_ORDER, Field, defense_fields, registry_generation
from leakgym.suggest import did_you_mean

__all__ = ["DCS2_STARTS", "NOISE_KINDS", "OASIS_ALL_BITS", "PIPELINE_ORDER", "PPP_MODES", "PRESETS",
           "DefenseConfig"]


class DefenseConfig:
    """The whole defense a client applies in one round. The default is no defense.

    ``DefenseConfig(noise_sigma=0.01, clip=1.0)``: keyword arguments are the fields of the
    registered defenses (``DefenseConfig.fields()``; unknown names and values out of range raise
    ``ValueError`` naming the value and the allowed values). Fields read as attributes
    (``cfg.noise_sigma``). Immutable and hashable, compared by value; :meth:`replace` makes a
    changed copy. A field of a defense registered after a config was made reads as its default.
    """

    __slots__ = ("_active", "_values")

    def __init__(self, **values: Any) -> None:
        known = defense_fields()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(
                f"unknown DefenseConfig field(s) {unknown}{did_you_mean(unknown[0], known)}; "
                f"allowed: {sorted(known)}"
            )
        values = {name: spec.normalized(values[name]) for name, spec in known.items() if name in values}
        object.__setattr__(self, "_values", {name: values.get(name, spec.default) for name, spec in known.items()})
        object.__setattr__(self, "_active", None)  # (registry generation, active defenses), see active()
        for defense in DEFENSES.values():
            defense.validate(self)

    # -- field access, immutability, value semantics ------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_values", "_active"):
            raise AttributeError(name)
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        spec = defense_fields().get(name)
        if spec is not None:  # a defense registered after this config was made
            return spec.default
        raise AttributeError(f"DefenseConfig has no field {name!r}; fields: {sorted(defense_fields())}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r} (use .replace())")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DefenseConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().items()))

    def __repr__(self) -> str:
        return f"DefenseConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def __reduce__(self) -> tuple:
        # Only the changed fields travel, so a config unpickles wherever its defenses are registered.
        known = defense_fields()
        changed = {k: v for k, v in self.to_dict().items() if v != known[k].default}
        return (_from_changed, (changed,))

    def __copy__(self) -> DefenseConfig:
        return self

    def __deepcopy__(self, memo: dict) -> DefenseConfig:
        return self

    # -- what is on --------------------------------------------------------------------------
    def active(self) -> list[str]:
        """Names of the switched-on defenses, in pipeline order (see :mod:`leakgym.defenses.pipeline`).

        Computed once per config and registry state (a config is immutable; registering or unregistering a
        defense changes the answer): the pipeline, the cost model and the reward ask it several times a round
        for every game, and each answer asks every registered defense, through this class's ``__getattr__``."""
        generation = registry_generation()
        cached = object.__getattribute__(self, "_active")
        if cached is None or cached[0] != generation:
            cached = (generation, tuple(name for name, defense in DEFENSES.items() if defense.is_active(self)))
            object.__setattr__(self, "_active", cached)
        return list(cached[1])

    @property
    def is_identity(self) -> bool:
        """True when no defense is switched on (the shared update is the clean one)."""
        return not self.active()

    # -- copies and conversion -----------------------------------------------------------------
    @staticmethod
    def fields() -> Mapping[str, Field]:
        """The field specs of the registered defenses, name -> :class:`~leakgym.defenses.registry.Field`."""
        return defense_fields()

    def replace(self, **changes: Any) -> DefenseConfig:
        """A copy with some fields changed (validated); unknown names raise ``ValueError``."""
        known = defense_fields()
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ValueError(
                f"unknown DefenseConfig field(s) {unknown}{did_you_mean(unknown[0], known)}; "
                f"allowed: {sorted(known)}"
            )
        return DefenseConfig(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Every field of the registered defenses, name -> value, in pipeline order."""
        return {name: getattr(self, name) for name in defense_fields()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DefenseConfig:
        return cls().replace(**values)

    @classmethod
    def preset(cls, name: str) -> DefenseConfig:
        """A named setting from :data:`PRESETS` (case-insensitive)."""
        key = name.lower()
        table = {k.lower(): v for k, v in PRESETS.items()}
        if key not in table:
            raise ValueError(
                f"unknown defense preset {name!r}{did_you_mean(name, PRESETS)}; allowed: {sorted(PRESETS)}"
            )
        return table[key]


def _from_changed(changed: dict[str, Any]) -> DefenseConfig:
    return DefenseConfig(**changed)


def _presets() -> dict[str, DefenseConfig]:
    d = DefenseConfig
    return {
        "none": d(),
        # Baselines. Noise scale 1e-2 is the DP-Gaussian setting of the DCS² authors' MNIST script;
        # clipping alone is a no-op against cosine-matching attacks, so it is paired with noise (DP-style).
        "gaussian": d(noise_sigma=1e-2),
        "laplace": d(noise_sigma=1e-2, noise_kind="laplace"),
        "clip+gaussian": d(clip=1.0, noise_sigma=1e-2),
        "prune": d(prune=0.9),                # GC90 of the PPP paper
        "topk": d(topk=0.1),
        "soteria": d(soteria=0.8),
        # PPP (Scheliga et al. §5.2); these need a PRECODE model (build_model(..., precode=True)).
        "PPP-NG3": d(ppp="ng", ppp_sigma=1e-3),
        "PPP-NG2": d(ppp="ng", ppp_sigma=1e-2),
        "PPP-NG1": d(ppp="ng", ppp_sigma=1e-1),
        "PPP-NG05": d(ppp="ng", ppp_sigma=0.5),
        "PPP-GC90": d(ppp="gc", ppp_prune=0.9),
        "PPP-GC99": d(ppp="gc", ppp_prune=0.99),
        "censor": d(censor_trials=20, censor_step=0.1, censor_fallback="original"),
        # The pre-issue-36 default: an all-zero update when no trial improves (never the original gradient).
        "censor-zeros": d(censor_trials=20, censor_step=0.1, censor_fallback="zeros"),
        # Algorithm 1 as written: layer-wise projection, the original gradient when no trial improves.
        "censor-paper": d(censor_trials=20, censor_step=0.1, censor_fallback="original", censor_subspace="layer"),
        "oasis": d(oasis=1 | 4),              # major rotation + shear, the paper's strongest combination
        "dcs2": d(dcs2_lambda_g=0.7),
        "loda": d(loda_c=CALIBRATED_C),       # c calibrated for LeakGym's extractor (leakgym.defenses.loda)
        "loda-paper": d(loda_c=20.0),         # LODA1's printed c = 20, in normalised pixel units (~10x the
                                              # paper's pixel weight on digits: leakgym.defenses.loda, Units)
        "mixup": d(mixup_k=4),
        "instahide": d(instahide_k=4),
    }


#: Named defense settings (documented in the module docstring and used by ``leakgym bench defenses``).
PRESETS: dict[str, DefenseConfig] = _presets()

"""Each paper's recommended setting as a named preset, mapped onto a scenario's action menu.

A preset is a role plus a *settings dict* in the scenario's own vocabulary: for the defender,
:class:`~leakgym.defenses.DefenseConfig` field names (and ``"oasis"``: a list of OASIS
augmentation names); for the attacker, ``strategy`` and fields of that attack's config
(``iterations``, ``restarts``, ``tv``, ...), which the scenario's attacker menu must offer.
:func:`preset_action` maps it to the scenario's ``MultiDiscrete`` menu through
``scenario.encode_defender`` / ``scenario.encode_attacker``, which pick the *nearest* menu value
(so DCS²'s ``lambda_g = 0.7`` becomes 0.5 in a menu ``[0, 0.5]``, and a paper's 24,000 attack
iterations become the menu's largest budget). The string ``"max"`` means "the menu's largest level".

A preset cannot be played in a scenario whose menu lacks one of its settings, or whose nearest
menu value of a switched-on setting is that dimension's *off* value (e.g. ``noise_sigma = 0.1`` in
a menu ``[0, 0.5]``): that raises ``ValueError`` naming the preset, the setting and the menu,
rather than silently playing a different defense.

Sources (the settings each paper recommends or evaluates as its main configuration):

* DCS² — Wu et al., "Concealing Sensitive Samples against Gradient Leakage in Federated Learning",
  AAAI 2024: ``lambda_g = 0.7`` (Table 3); its baselines DP-Gaussian (sigma 1e-2, the authors'
  MNIST script) and Prune (gradient compression, p = 0.9); its adaptive attack initialises the GS
  (Inverting Gradients) attack from a per-class average image (§"adaptive attack", Table 4).
* CENSOR — "Defending against gradient inversion via orthogonal subspace sampling": T = 20 trials,
  "usually sufficient" (§IV-B).
* OASIS — Jeter et al., 2023: major rotation is the strongest single augmentation against Robbing
  the Fed (imprint, Fig. 5), major rotation + shearing the combination that also stops Curious
  Abandon Honesty (trap weights, Fig. 6, §IV-B/C).
* PPP — Scheliga et al., "Privacy Preserving Partial Perturbation" (PRECODE + noise/pruning on the
  layers before the bottleneck): NG2 = Gaussian sigma 1e-2, GC90 = pruning 0.9 (§5.2); its
  targeted attack ignores the gradients of PRECODE and the layers after it and needs "more than
  tripled" iterations (§5.1) — LeakGym's ``layer-skipping`` strategy.
* DLG — Zhu et al., NeurIPS 2019: L-BFGS gradient matching without an image prior; the reference
  code runs 300 iterations.
* Inverting Gradients — Geiping et al., NeurIPS 2020: cosine matching with a total-variation
  prior, 24,000 Adam iterations.
* GradInversion — Yin et al., CVPR 2021: 20,000 iterations with image priors (TV) and several
  random seeds combined by group consistency (LeakGym: the largest restart level).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from leakgym.suggest import did_you_mean

from .scripted import check_role


@dataclass(frozen=True)
class Preset:
    """A named setting for one role; ``source`` says which paper recommends it and where."""

    name: str
    role: str
    settings: dict[str, Any] = field(default_factory=dict)
    source: str = ""


# fmt: off
#: name -> preset. Defender settings use DefenseConfig field names; "oasis" lists augmentations.
PRESETS: dict[str, Preset] = {p.name: p for p in [
    # ---- defender -------------------------------------------------------------------------------
    Preset("none",          "defender", {},                                        "no defense"),
    Preset("noise-0.01",    "defender", {"noise_sigma": 0.01},                     "DCS² baseline DP-Gaussian"),
    Preset("noise-0.1",     "defender", {"noise_sigma": 0.1},                      "strong Gaussian noise (PPP NG1 scale)"),
    Preset("prune-0.9",     "defender", {"prune": 0.9},                            "DCS² 'Prune' baseline / PPP GC90"),
    Preset("dcs2-paper",    "defender", {"dcs2_lambda_g": 0.7},                    "DCS² Table 3: lambda_g = 0.7"),
    Preset("censor-paper",  "defender", {"censor_trials": 20, "censor_fallback": "original"},
           "CENSOR §IV-B: T = 20 trials; Algorithm 1 line 11: the original gradient when no trial improves"),
    Preset("oasis-mr",      "defender", {"oasis": ["major_rotation"]},             "OASIS Fig. 5: major rotation"),
    Preset("oasis-mr+sh",   "defender", {"oasis": ["major_rotation", "shear"]},    "OASIS Fig. 6: major rotation + shear"),
    Preset("ppp-ng2",       "defender", {"ppp": "ng", "ppp_sigma": 0.01},          "PPP §5.2: NG2, sigma = 1e-2"),
    Preset("ppp-gc90",      "defender", {"ppp": "gc", "ppp_prune": 0.9},           "PPP §5.2: GC90, pruning 0.9"),
    Preset("loda-paper",    "defender", {"loda_c": 20.0},                          "LODA §5 (LODA1): its printed c = 20, in normalised pixels"),
    Preset("loda-calibrated", "defender", {"loda_c": 9.0},
           "LODA Eq. 4 with c calibrated to LeakGym's extractor (leakgym.defenses.loda.CALIBRATED_C)"),
    # ---- attacker -------------------------------------------------------------------------------
    Preset("dlg-paper",           "attacker", {"strategy": "dlg", "iterations": 300, "restarts": 1, "tv": 0.0},
           "DLG: L-BFGS, no prior, 300 iterations"),
    Preset("ig-paper",            "attacker", {"strategy": "inverting-gradients", "iterations": 24_000,
                                               "restarts": 1, "tv": 1e-4},
           "Inverting Gradients: 24,000 iterations, TV prior"),
    Preset("gradinversion-paper", "attacker", {"strategy": "gradinversion", "iterations": 20_000,
                                               "restarts": "max", "tv": 1e-4},
           "GradInversion: 20,000 iterations, TV prior, several seeds"),
    Preset("layer-skipping-ppp",  "attacker", {"strategy": "layer-skipping", "iterations": "max",
                                               "restarts": 1, "tv": 1e-4},
           "PPP §5.1: skip PRECODE's stochastic layers, >3x iterations"),
    Preset("prior-init-dcs2",     "attacker", {"strategy": "prior-init", "iterations": "max",
                                               "restarts": 1, "tv": 1e-4},
           "DCS² Table 4: GS attack started from the class-average image"),
    Preset("imprint-oasis",       "attacker", {"strategy": "imprint"},
           "OASIS §IV: Robbing the Fed (imprint module, analytic)"),
    Preset("trap-oasis",          "attacker", {"strategy": "trap-weights"},
           "OASIS §IV: Curious Abandon Honesty (trap weights, analytic)"),
]}
# fmt: on


def preset_names(role: str | None = None) -> list[str]:
    """All preset names, or those of one role, in table order."""
    if role is not None:
        check_role(role)
    return [n for n, p in PRESETS.items() if role is None or p.role == role]


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}{did_you_mean(name, preset_names())}; allowed: {preset_names()}")
    return PRESETS[name]


def _menu_value(values: list[Any], wanted: Any) -> Any:
    return max(values) if wanted == "max" else wanted


def preset_action(name: str, scenario, role: str | None = None) -> np.ndarray:
    """The scenario action that plays preset ``name`` (nearest menu values).

    ``role``, if given, must be the preset's role. Raises ``ValueError`` naming the preset, the
    setting and the scenario's menu when the preset cannot be expressed in this scenario.
    """
    preset = get_preset(name)
    if role is not None and check_role(role) != preset.role:
        raise ValueError(
            f"preset {name!r} plays the {preset.role}, not the {role}; {role} presets: {preset_names(role)}"
        )
    where = f"preset {name!r} ({preset.source}) in scenario {scenario.name!r}"
    if preset.role == "attacker":
        return _attacker_action(preset, scenario, where)
    return _defender_action(preset, scenario, where)


def _attacker_action(preset: Preset, scenario, where: str) -> np.ndarray:
    settings = dict(preset.settings)
    if settings["strategy"] not in scenario.strategies:
        raise ValueError(
            f"{where}: strategy {settings['strategy']!r} is not in the scenario's strategy menu {scenario.strategies}"
        )
    import dataclasses

    from leakgym.attacks import ATTACKS

    fields = {f.name for f in dataclasses.fields(ATTACKS[settings["strategy"]].Config)}
    menu: dict[str, list[Any]] = scenario.attacker_menu
    out = {"strategy": settings.pop("strategy")}
    for key, wanted in settings.items():
        if key in menu:
            out[key] = _menu_value(menu[key], wanted)
        elif key in fields:
            raise ValueError(
                f"{where}: setting {key!r} is not in the scenario's attacker menu; menu: "
                + ", ".join(f"{k}={v}" for k, v in menu.items())
            )
    action = scenario.encode_attacker(out)
    # A switched-on setting (a prior's weight) must not collapse onto 0, its "off" value: found in an audit,
    # ig-paper's TV prior 1e-4 became tv = 0 in SVHN's menu [0, 1e-3, 1e-2], without a word.
    played = scenario.decode_attacker(action)
    for key, wanted in out.items():
        if _is_zero(played.get(key)) and not _is_zero(wanted):
            raise ValueError(f"{where}: {key}={wanted!r} maps to the menu's off value {played[key]!r} (menu "
                             f"{key}={menu[key]}); the preset would play without it there")
    return action


def _is_zero(value: Any) -> bool:
    """A number that is 0 (an attack option's "off": no prior); not a bool, a string or ``"max"``."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and value == 0


def _defender_action(preset: Preset, scenario, where: str) -> np.ndarray:
    menu: dict[str, list[Any]] = scenario.defender_menu
    settings: dict[str, Any] = {}
    for key, wanted in preset.settings.items():
        if key in scenario.defender_bits:  # a bit-mask field (OASIS): the names of the bits to switch on
            offered = scenario.defender_bits[key]
            missing = [b for b in wanted if b not in offered]
            if missing:
                from leakgym.defenses import defense_field

                bit_menu = defense_field(key).bit_menu
                raise ValueError(
                    f"{where}: {bit_menu.what}(s) {missing} are not in the scenario's {bit_menu.option} {offered}"
                )
            settings[key] = list(wanted)
            continue
        if key not in menu and _fixed_value(scenario, key) == wanted:
            continue  # a setting the scenario fixes (defense_defaults) to the preset's value
        if key not in menu:
            raise ValueError(
                f"{where}: setting {key!r} is not in the scenario's defender menu; menu: "
                + ", ".join(f"{k}={v}" for k, v in menu.items())
            )
        values = menu[key]
        wanted = _menu_value(values, wanted)
        if isinstance(wanted, str) and wanted not in values:
            raise ValueError(f"{where}: {key}={wanted!r} is not in the scenario's menu {key}={values}")
        settings[key] = wanted
    action = scenario.encode_defender(settings)
    # A switched-on defense must not collapse onto its "off" value (its switch field's default): the value
    # played, wherever the menu lists it (an audit: with noise_sigma=[0.5, 0.0], noise-0.1 played no noise,
    # and prune-0.9 was refused for mapping to 0.99, "off" only by its index).
    from leakgym.defenses import DEFENSES, defense_field

    played = scenario.decode_defender(action)
    for key in settings:
        if key in scenario.defender_bits or key not in menu:
            continue
        spec = defense_field(key)
        switch = DEFENSES[spec.defense].fields[0].name == key
        if switch and played[key] == spec.default and preset.settings[key] != spec.default:
            raise ValueError(
                f"{where}: {key}={preset.settings[key]!r} maps to the menu's off value {played[key]!r} "
                f"(menu {key}={menu[key]}); the preset would play no defense there"
            )
    return action


def _fixed_value(scenario, key: str) -> Any:
    """The value a scenario fixes for a defense field it does not offer in its menu."""
    from leakgym.defenses import DefenseConfig

    try:
        return getattr(DefenseConfig(**scenario.defense_defaults), key)
    except (AttributeError, ValueError):
        return None


def valid_presets(scenario, role: str) -> list[str]:
    """The presets of ``role`` that can be played in ``scenario``."""
    names = []
    for name in preset_names(role):
        try:
            preset_action(name, scenario, role)
        except ValueError:
            continue
        names.append(name)
    return names


__all__ = ["PRESETS", "Preset", "get_preset", "preset_action", "preset_names", "valid_presets"]

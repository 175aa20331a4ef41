"""Gradient-inversion attacks, all behind one interface (:class:`~leakgym.attacks.base.Attack`).

=====================  ============================================================  ==========
registry name          attack                                                        server
=====================  ============================================================  ==========
dlg                    DLG, Zhu et al. 2019 (L2 matching, L-BFGS, joint labels)       honest
inverting-gradients    Inverting Gradients, Geiping et al. 2020 (cosine + TV, Adam)   honest
gradinversion          GradInversion-style, Yin et al. 2021 (BN prior, group cons.)   honest
analytic               x = dW_i / db_i from a biased linear layer (DCS² Eq. 3)        honest
layer-skipping         matching only chosen layers (PPP paper §3.3)                   honest
eot                    expectation over a randomised defense (CENSOR §V-D)            honest
prior-init             start from the public class-mean image (DCS² Table 4)          honest
loda-inversion         LODA's adaptive inversion (LODA Eq. 6)                          honest
mixup-decoding         inversion then demixing of Mixup / InstaHide encodings          honest
imprint                Robbing the Fed imprint block, Fowl et al. 2022                 malicious
trap-weights           Curious-Abandon-Honesty trap weights, Boenisch et al. 2021      malicious
=====================  ============================================================  ==========

``build_attack(name, **config_overrides)`` makes one; ``ATTACKS[name]`` is its class.
"""

from __future__ import annotations

from typing import Any

from leakgym.attacks.adaptive import EOT, LayerSkipping, PriorInit
from leakgym.attacks.analytic import AnalyticAttack, AnalyticResult
from leakgym.attacks.base import Attack, AttackCost, AttackerKnowledge, AttackResult
from leakgym.attacks.dlg import DLG
from leakgym.attacks.gradinversion import GradInversion
from leakgym.attacks.imprint import ImprintAttack
from leakgym.attacks.inverting_gradients import InvertingGradients
from leakgym.attacks.labels import infer_labels, infer_labels_many
from leakgym.attacks.loda_inversion import LodaInversion
from leakgym.attacks.mixup_decoding import MixupDecoding
from leakgym.attacks.trap_weights import TrapWeightsAttack
from leakgym.suggest import did_you_mean

ATTACKS: dict[str, type[Attack]] = {
    cls.name: cls
    for cls in (
        DLG,
        InvertingGradients,
        GradInversion,
        AnalyticAttack,
        LayerSkipping,
        EOT,
        PriorInit,
        LodaInversion,
        MixupDecoding,
        ImprintAttack,
        TrapWeightsAttack,
    )
}


def build_attack(name: str, **overrides: Any) -> Attack:
    """The attack registered as ``name`` with its config fields overridden."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}{did_you_mean(name, ATTACKS)}; allowed: {sorted(ATTACKS)}")
    return ATTACKS[name](**overrides)


__all__ = [
    "ATTACKS",
    "DLG",
    "EOT",
    "AnalyticAttack",
    "AnalyticResult",
    "Attack",
    "AttackCost",
    "AttackResult",
    "AttackerKnowledge",
    "GradInversion",
    "ImprintAttack",
    "InvertingGradients",
    "LayerSkipping",
    "LodaInversion",
    "MixupDecoding",
    "PriorInit",
    "TrapWeightsAttack",
    "build_attack",
    "infer_labels",
    "infer_labels_many",
]

"""Checks that every registered defense and attack does what its paper says, as plain functions.

``tests/test_method_checks.py`` runs them on the real methods; ``tests/test_sabotage.py`` runs them on
broken versions (a defense replaced by the identity, an attack returning noise, ...) and expects an
``AssertionError``: a check that a broken method passes checks nothing.

**Setting.** Digits at 16x16, the first images of client 0 of ``federated_split(seed=0)`` as the
victim's private batches, FedSGD, the public split known to both sides. Every model is built with
``seed=0``. A :class:`Setting` fixes the model, the batch size, how many batches and how many attack
seeds per batch; the defense of batch ``b`` is seeded with ``b``, the attack of (batch ``b``, seed
``s``) with ``1000 b + s``.

**Leakage** is the SSIM of the reconstruction against the private batch (optimal matching, unit
images), one value per problem (a batch and an attack seed), kept as a ``(batches, seeds)`` array.

**When a difference counts.** Problems are paired: a defended and a clean update of one batch are
attacked with the same seeds, an attack and its counterpart run on the same updates with the same
seeds, a baseline image is scored against the same batch. The *spread* of a method is its
seed-to-seed standard deviation, pooled over the batches; the standard error of a mean difference is
``sqrt(spread_a^2 + spread_b^2) / sqrt(problems)``. A difference counts when it exceeds :data:`K`
standard errors, the spread of either side (one draw's noise) and a floor: :data:`MIN_EFFECT` for a
defense or an adaptive attack, the case's stated margin for an attack against a baseline.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from leakgym.agents.policies.scripted import FixedAgent
from leakgym.attacks import ATTACKS, AttackCost, AttackerKnowledge, AttackResult, build_attack
from leakgym.attacks.adaptive import class_mean_images
from leakgym.data import federated_split, load_dataset
from leakgym.defenses import DEFENSES, DefenseConfig, apply_defense
from leakgym.defenses.loda import CALIBRATED_C
from leakgym.envs import parallel_env
from leakgym.fl.update import SharedUpdate
from leakgym.metrics import score_reconstruction
from leakgym.models import build_model

#: A difference counts when it exceeds this many standard errors (about 1 in 700 by chance, one-sided).
K = 3.0
#: SSIM differences below this are too small to mean anything, however many problems were run.
MIN_EFFECT = 0.02
#: A shared update "differs" from the clean one when the relative L2 norm of the difference exceeds this.
CHANGED = 1e-6


# ---------------------------------------------------------------------------------------------------
# Data, settings and problems
# ---------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def digits():
    """The federated split every check uses (digits 16x16, one client, the public split)."""
    return federated_split(load_dataset("digits", image_size=16), num_clients=1, seed=0)


@dataclass(frozen=True)
class Setting:
    """A victim setting: the model the server sends, the victim's batches, what the attacker knows."""

    name: str
    model: str = "lenet"
    width: int | None = None
    precode: bool = False
    batch_size: int = 1
    batches: int = 4
    seeds: int = 3
    labels_known: bool = True
    bn_stats: bool = False
    """Give the attacker the BatchNorm input statistics of the victim's batch (GradInversion)."""

    def build(self) -> nn.Module:
        return build_model(self.model, digits().spec, precode=self.precode, width=self.width, seed=0)


#: The reference setting: LeNet, B = 1, labels known (the DCS²/CENSOR papers' setting).
LENET = Setting("lenet-b1")
#: DLG optimises the label jointly (its paper's setting).
LENET_UNKNOWN_LABELS = Setting("lenet-b1-unknown-labels", labels_known=False)
#: Fewer problems for GradInversion's expensive L2 objective.
LENET_SMALL = Setting("lenet-b1-small", batches=3, seeds=2)
#: Mixup/InstaHide mix the images of a batch: B = 2; labels inferred, as a non-adaptive attacker does.
LENET_PAIRS = Setting("lenet-b2-labels-inferred", batch_size=2, batches=3, seeds=3, labels_known=False)
#: The decoding attack's setting (it reads the soft labels from the encoding).
LENET_PAIRS_DECODING = Setting("lenet-b2", batch_size=2, batches=3, seeds=2)
#: The PPP paper's setting: the PRECODE MLP (width 128, the reproduction's), B = 1.
PRECODE_MLP = Setting("precode-mlp128-b1", model="mlp", width=128, precode=True)
#: The analytic attack reads the first linear layer: the MLP.
MLP = Setting("mlp64-b1", model="mlp", width=64, seeds=1)
#: GradInversion's BN prior needs BatchNorm layers and B > 1.
MLP_BN_PAIRS = Setting("mlp64-b2-bn-stats", model="mlp", width=64, batch_size=2, batches=3, seeds=2,
                       bn_stats=True)
#: The malicious servers' setting (OASIS paper Figs. 5-6): B = 8 on the server's own modified model.
LENET_B8 = Setting("lenet-b8", batch_size=8, batches=2, seeds=1)


def bn_input_stats(model: nn.Module, x: Tensor) -> list[tuple[Tensor, Tensor]]:
    """``(mean, biased var)`` of the input of every BatchNorm layer for batch ``x``, in module order."""
    inputs: list[Tensor] = []
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    handles = [m.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach())) for m in layers]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    stats = []
    for t in inputs:
        dims = [0] + list(range(2, t.dim()))  # every axis but the channels
        stats.append((t.mean(dim=dims), t.var(dim=dims, unbiased=False)))
    return stats


@dataclass
class Problems:
    """``batches x seeds`` attack problems (batch-major), what the victim held and what the attacker saw."""

    setting: Setting
    updates: list[SharedUpdate]
    knowledges: list[AttackerKnowledge]
    originals: list[Tensor]
    """Unit images of each problem's private batch."""
    labels: list[Tensor]
    seeds: list[int]

    def first_of_each_batch(self) -> list[SharedUpdate]:
        return self.updates[:: self.setting.seeds]


def build_problems(setting: Setting, config: DefenseConfig,
                   prepare: Callable[[nn.Module], nn.Module] | None = None) -> Problems:
    """Every batch of ``setting`` shared through ``apply_defense(config)``, once per attack seed.

    ``prepare`` turns the model into the one the server sends (a malicious server's modification).
    """
    split = digits()
    spec = split.spec
    model = setting.build()
    if prepare is not None:
        model = prepare(model)
    cx, cy = split.clients[0]
    b = setting.batch_size
    out = Problems(setting, [], [], [], [], [])
    for i in range(setting.batches):
        xu, y = cx[i * b:(i + 1) * b], cy[i * b:(i + 1) * b]
        x = spec.normalize(xu)
        update, _ = apply_defense(model, x, y, config, seed=i, public_x=split.public_x, public_y=split.public_y)
        knowledge = AttackerKnowledge(
            model=model, spec=spec, batch_size=b, labels=y.clone() if setting.labels_known else None,
            bn_stats=bn_input_stats(copy.deepcopy(model), x) if setting.bn_stats else None,
            public_x=split.public_x, public_y=split.public_y,
        )
        for s in range(setting.seeds):
            out.updates.append(update)
            out.knowledges.append(knowledge)
            out.originals.append(xu)
            out.labels.append(y)
            out.seeds.append(1000 * i + s)
    return out


# ---------------------------------------------------------------------------------------------------
# Leakage and differences
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Leakage:
    """SSIM of every problem, ``(batches, seeds)``."""

    ssim: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.ssim.mean())

    @property
    def n(self) -> int:
        return int(self.ssim.size)

    @property
    def spread(self) -> float:
        """Seed-to-seed standard deviation, pooled over the batches (0 with one seed)."""
        if self.ssim.shape[1] < 2:
            return 0.0
        return float(math.sqrt(self.ssim.var(axis=1, ddof=1).mean()))

    def __str__(self) -> str:
        return f"{self.mean:.3f} (spread {self.spread:.3f}, n={self.n})"


def ssim_of(images_n: list[Tensor], problems: Problems) -> Leakage:
    """Leakage of one reconstruction (normalised images) per problem."""
    spec = digits().spec
    values = [score_reconstruction(spec.denormalize(im.detach().cpu()), orig).mean["ssim"]
              for im, orig in zip(images_n, problems.originals)]
    return Leakage(np.asarray(values, dtype=float).reshape(problems.setting.batches, problems.setting.seeds))


def attack_leakage(name: str, config: Mapping[str, Any], problems: Problems) -> Leakage:
    """Run attack ``name`` on every problem (one batched call, each problem with its seed)."""
    attack = build_attack(name, **config)
    results = attack.reconstruct_batch(problems.updates, problems.knowledges, seeds=problems.seeds)
    return ssim_of([r.images for r in results], problems)


def baseline_leakage(kind: str, problems: Problems) -> Leakage:
    """What a reconstruction that learnt nothing from the update scores.

    ``"noise"``: uniform noise (seeded per problem); ``"mean"``: the mean public image;
    ``"class-mean"``: the public class-mean image of each true label (prior-init's start image).
    """
    split = digits()
    spec = split.spec
    images = []
    for orig, y, seed in zip(problems.originals, problems.labels, problems.seeds):
        if kind == "noise":
            unit = torch.rand(orig.shape, generator=torch.Generator().manual_seed(seed))
        elif kind == "mean":
            unit = split.public_x.mean(dim=0, keepdim=True).expand_as(orig)
        elif kind == "class-mean":
            unit = class_mean_images(split.public_x, split.public_y, spec.num_classes)[y]
        else:
            raise ValueError(f"baseline {kind!r}; allowed: 'noise', 'mean', 'class-mean'")
        images.append(spec.normalize(unit))
    return ssim_of(images, problems)


@dataclass(frozen=True)
class Difference:
    """``higher - lower``, averaged over paired problems, with the evidence it is judged by."""

    mean: float
    se: float
    spread: float
    bar: float

    @property
    def holds(self) -> bool:
        return self.mean > self.bar

    def __str__(self) -> str:
        return f"{self.mean:+.3f} (se {self.se:.3f}, spread {self.spread:.3f}, needed > {self.bar:.3f})"


def difference(higher: Leakage, lower: Leakage, *, floor: float = MIN_EFFECT) -> Difference:
    """``higher - lower`` judged as in the module docstring: above K se, either spread and ``floor``."""
    if higher.ssim.shape != lower.ssim.shape:
        raise ValueError(f"unpaired leakages: shapes {higher.ssim.shape} and {lower.ssim.shape}")
    se = math.hypot(higher.spread, lower.spread) / math.sqrt(higher.n)
    spread = max(higher.spread, lower.spread)
    return Difference(higher.mean - lower.mean, se, spread, max(K * se, spread, floor))


def relative_change(update: SharedUpdate, reference: SharedUpdate) -> float:
    """``||update - reference|| / ||reference||`` over all shared tensors."""
    diff = sum(float((update.tensors[k].double() - t.double()).pow(2).sum()) for k, t in reference.tensors.items())
    norm = sum(float(t.double().pow(2).sum()) for t in reference.tensors.values())
    return math.sqrt(diff / max(norm, 1e-300))


# ---------------------------------------------------------------------------------------------------
# Defenses
# ---------------------------------------------------------------------------------------------------
IG = ("inverting-gradients", {"iterations": 100})


@dataclass(frozen=True, eq=False)
class DefenseCase:
    """Where a defense is checked: an active setting, the clean baseline, the reference attack."""

    config: DefenseConfig
    setting: Setting = LENET
    baseline: DefenseConfig = field(default_factory=DefenseConfig)
    """The update it is compared with: no defense, unless the defense only acts together with another."""
    attack: tuple[str, dict] = IG
    why: str = ""


#: One active test setting per registered defense; a registered defense without one fails its check.
#: Reference attack: Inverting Gradients (100 iterations, labels known) on LeNet, B = 1, except where
#: ``why`` says otherwise.
DEFENSE_CASES: dict[str, DefenseCase] = {
    "oasis": DefenseCase(DefenseConfig(oasis=1 | 4), why="major rotation + shear, the paper's strongest"),
    "loda": DefenseCase(DefenseConfig(loda_c=CALIBRATED_C, loda_steps=100),
                        why="LODA keeps the labels and B = 1: the reference attack recovers the obscured image"),
    "mixup": DefenseCase(
        DefenseConfig(mixup_k=2), LENET_PAIRS,
        why="mixing needs B >= 2; IG with labels inferred is the non-adaptive attacker of the LODA paper's "
            "Table 1 (the shared gradient is of soft labels)"),
    "instahide": DefenseCase(DefenseConfig(instahide_k=2), LENET_PAIRS, why="as Mixup"),
    "dcs2": DefenseCase(DefenseConfig(dcs2_lambda_g=0.7, dcs2_steps=30),
                        why="the paper's lambda_g; 30 synthesis steps (paper: 1000) keep it fast"),
    "censor": DefenseCase(DefenseConfig(censor_trials=20), why="T = 20, the paper's 'usually sufficient'"),
    "ppp": DefenseCase(
        DefenseConfig.preset("PPP-NG1"), PRECODE_MLP, attack=("layer-skipping", {"iterations": 100}),
        why="PPP perturbs a PRECODE model; the reference attack against PRECODE is layer skipping "
            "(PPP paper §3.3), which plain IG cannot be (it fails on PRECODE alone)"),
    "soteria": DefenseCase(DefenseConfig(soteria=0.8)),
    "prune": DefenseCase(DefenseConfig(prune=0.9), why="GC90 of the PPP paper"),
    "topk": DefenseCase(DefenseConfig(topk=0.1)),
    "clip": DefenseCase(
        DefenseConfig(clip=1.0, noise_sigma=1e-2), baseline=DefenseConfig(noise_sigma=1e-2),
        why="global L2 clipping only rescales, which a cosine attacker ignores; it protects by making the "
            "DP noise weigh more (clean norm ~10): checked as noise 1e-2 with vs without clipping to 1"),
    "clip_value": DefenseCase(DefenseConfig(clip_value=1e-3)),
    "noise": DefenseCase(DefenseConfig(noise_sigma=0.1)),
}


def changed_fields(config: DefenseConfig) -> tuple:
    """The fields of ``config`` that differ from their defaults (a key independent of what else is registered)."""
    fields = DefenseConfig.fields()
    return tuple(sorted((k, v) for k, v in config.to_dict().items() if v != fields[k].default))


@dataclass(frozen=True)
class Reference:
    """The clean side of a defense check: its problems and the reference attack's leakage on them."""

    problems: Problems
    leakage: Leakage


_REFERENCES: dict[tuple, Reference] = {}


def reference(case: DefenseCase) -> Reference:
    """The reference attack on the clean baseline of ``case`` (computed once per process).

    Call it before patching anything (a fixture): a reference computed under a sabotaged method
    would be cached.
    """
    name, config = case.attack
    key = (case.setting, changed_fields(case.baseline), name, tuple(sorted(config.items())))
    if key not in _REFERENCES:
        problems = build_problems(case.setting, case.baseline)
        _REFERENCES[key] = Reference(problems, attack_leakage(name, config, problems))
    return _REFERENCES[key]


def all_references() -> dict[str, Reference]:
    """The reference of every case in :data:`DEFENSE_CASES`, by defense name."""
    return {name: reference(case) for name, case in DEFENSE_CASES.items()}


@dataclass(frozen=True)
class DefenseCheck:
    """What :func:`check_defense` measured."""

    clean: Leakage
    defended: Leakage
    drop: Difference
    changes: list[float]


def check_defense(name: str, case: DefenseCase | None = None) -> DefenseCheck:
    """Defense ``name`` at its active setting changes the shared update and lowers the leakage.

    Asserts that (1) the setting activates the defense, (2) every batch's shared update differs from
    the clean one, and (3) the reference attack's mean SSIM drops by more than K standard errors, the
    spread of either side and :data:`MIN_EFFECT` (see the module docstring).
    """
    if case is None:
        assert name in DEFENSE_CASES, (
            f"registered defense {name!r} has no active test setting: add it to DEFENSE_CASES in tests/method_checks.py")
        case = DEFENSE_CASES[name]
    defense = DEFENSES[name]
    assert defense.is_active(case.config), f"{name}: the test setting {changed_fields(case.config)} leaves it off"
    assert not defense.is_active(case.baseline), f"{name}: the baseline {changed_fields(case.baseline)} turns it on"
    ref = reference(case)
    defended = build_problems(case.setting, case.config)
    changes = [relative_change(u, c) for u, c in zip(defended.first_of_each_batch(), ref.problems.first_of_each_batch())]
    assert min(changes) > CHANGED, (
        f"{name} does not change the shared update: relative change per batch {[f'{c:.1e}' for c in changes]}")
    attack, config = case.attack
    leak = attack_leakage(attack, config, defended)
    drop = difference(ref.leakage, leak)
    assert drop.holds, (f"{name} does not lower the leakage of {attack} beyond its noise: clean {ref.leakage}, "
                        f"defended {leak}, drop {drop}")
    return DefenseCheck(ref.leakage, leak, drop, changes)


# ---------------------------------------------------------------------------------------------------
# Attacks
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Versus:
    """An adaptive attack must beat its non-adaptive counterpart here, where its paper says it does."""

    counterpart: tuple[str, dict]
    config: dict | None = None
    """The attack's own config in this comparison (default: the case's)."""
    setting: Setting | None = None
    defense: DefenseConfig | None = None
    why: str = ""


@dataclass(frozen=True, eq=False)
class AttackCase:
    """Where an attack is checked against baselines (and, if adaptive, against its counterpart)."""

    config: dict
    setting: Setting = LENET
    defense: DefenseConfig = field(default_factory=DefenseConfig)
    """The defense of the updates it attacks (undefended unless the attack targets a defense)."""
    baselines: tuple[str, ...] = ("noise", "mean")
    margin: float = 0.2
    """How much higher than the best baseline its mean SSIM must be (at least)."""
    versus: Versus | None = None
    why: str = ""


#: One case per registered attack; a registered attack without one fails its check.
ATTACK_CASES: dict[str, AttackCase] = {
    "dlg": AttackCase({"iterations": 40}, LENET_UNKNOWN_LABELS, why="labels optimised jointly, L-BFGS"),
    "inverting-gradients": AttackCase(dict(IG[1])),
    "gradinversion": AttackCase(
        {"iterations": 200, "restarts": 1}, LENET_SMALL,
        versus=Versus(
            ("gradinversion", {"iterations": 100, "restarts": 2, "distance": "cosine", "signed": True,
                               "bn": 0.0, "group": 0.0}),
            config={"iterations": 100, "restarts": 2, "distance": "cosine", "signed": True},
            setting=MLP_BN_PAIRS,
            why="the BN-statistics and group priors (Yin et al. Eq. 6, 9) vs none, on a BN model at B = 2 "
                "with two restarts; cosine + signed Adam, because with the default L2 distance the "
                "matching loss (~1e3) swamps the default prior weights and nothing is recovered at B = 2"),
    ),
    "analytic": AttackCase({}, MLP, why="x = dW_i / db_i on the MLP's first linear layer, B = 1"),
    "layer-skipping": AttackCase(
        dict(IG[1]), PRECODE_MLP,
        versus=Versus(IG, why="PPP paper §3.3: matching only the layers before PRECODE's bottleneck defeats it; "
                              "plain IG on PRECODE fails")),
    "eot": AttackCase(
        {"iterations": 100, "noise_std": 1e-2, "eot_samples": 4}, defense=DefenseConfig(noise_sigma=1e-2),
        why="against the DP-Gaussian preset it simulates. No counterpart comparison: its paper (CENSOR §V-D) "
            "reports EOT failing against CENSOR, and against additive noise it does not beat plain IG. Measured "
            "(LeNet, B = 1, 4 images x 2 seeds, 100 iterations, E = 8): noise 0.1, IG 0.60 vs EOT 0.56 "
            "(averaged update) / 0.35 (averaged objective); noise 0.3, IG 0.18 vs 0.13 / 0.12"),
    "prior-init": AttackCase(
        {"iterations": 20}, baselines=("noise", "mean", "class-mean"), margin=0.05,
        versus=Versus(("inverting-gradients", {"iterations": 20}),
                      why="DCS² Table 4: the class-mean start helps at a small budget"),
        why="must also beat its own start image, the class mean"),
    "loda-inversion": AttackCase(
        {"iterations": 100, "inversion_steps": 20}, defense=DefenseConfig(loda_c=CALIBRATED_C, loda_steps=100),
        baselines=("noise",), margin=0.1,
        why="on LODA-obscured updates. Only the noise baseline: LODA's paper (Table 2) reports that this "
            "adaptive attack does not recover LODA's images, and here it scores no higher than its start, "
            "a random public image, below the mean image (so returning its start would pass this check: its "
            "two stages are checked in test_defenses_loda.py::test_loda_inversion_runs_both_of_its_stages)"),
    "mixup-decoding": AttackCase(
        {"iterations": 200, "decode_steps": 200}, LENET_PAIRS_DECODING, DefenseConfig(mixup_k=2), margin=0.1,
        versus=Versus(("inverting-gradients", {"iterations": 100}), config={"iterations": 100, "decode_steps": 200},
                      defense=DefenseConfig(instahide_k=2),
                      why="InstaHide's sign flips defeat plain IG; demixing |M X| (Huang et al. 2021) undoes "
                          "them. On Mixup-encoded updates decoding does not beat plain IG at this size (B = 2, "
                          "k = 2, 200 iterations: IG 0.81, decoding 0.74 with 200 demixing steps, 0.64 with "
                          "1000): the recovered encodings are close but not exact, and demixing through the "
                          "ill-conditioned mixing matrix amplifies their error"),
        why="on Mixup-encoded updates (k = 2, B = 2), the mixing matrix known"),
    "imprint": AttackCase({}, LENET_B8, why="B = 8 on its own imprint model"),
    "trap-weights": AttackCase({}, LENET_B8, why="B = 8 on its own trap-weight model"),
}


def _prepare(name: str, setting: Setting) -> Callable[[nn.Module], nn.Module] | None:
    """A malicious attack's model modification (with the public split), else None."""
    if not ATTACKS[name].malicious:
        return None
    split = digits()
    return lambda model: build_attack(name).prepare_model(model, split.spec, public_x=split.public_x)


_ATTACK_PROBLEMS: dict[tuple, Problems] = {}


def attack_problems(name: str, setting: Setting, defense: DefenseConfig) -> Problems:
    """The updates attack ``name`` is checked on (computed once per process; build them before patching)."""
    key = (setting, changed_fields(defense), name if ATTACKS[name].malicious else None)
    if key not in _ATTACK_PROBLEMS:
        _ATTACK_PROBLEMS[key] = build_problems(setting, defense, _prepare(name, setting))
    return _ATTACK_PROBLEMS[key]


def all_attack_problems() -> None:
    """Build the problems of every case in :data:`ATTACK_CASES` (a fixture calls this before any patch)."""
    for name, case in ATTACK_CASES.items():
        attack_problems(name, case.setting, case.defense)
        if case.versus is not None:
            attack_problems(name, case.versus.setting or case.setting, case.versus.defense or case.defense)


@contextmanager
def prepared(data_root: Path) -> Iterator[None]:
    """``$LEAKGYM_DATA`` set to ``data_root`` (LODA's extractor cache) and the clean side of every check
    computed, before any test patches anything (a module fixture wraps its tests in this)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAKGYM_DATA", str(data_root))
        all_references()
        all_attack_problems()
        yield


@dataclass(frozen=True)
class AttackCheck:
    """What :func:`check_attack` measured."""

    leakage: Leakage
    baselines: dict[str, Leakage]
    gains: dict[str, Difference]
    adaptive: Leakage | None = None
    counterpart: Leakage | None = None
    advantage: Difference | None = None


def check_attack(name: str, case: AttackCase | None = None) -> AttackCheck:
    """Attack ``name`` beats its baselines by the case's margin, and its counterpart where it has one."""
    if case is None:
        assert name in ATTACK_CASES, (
            f"registered attack {name!r} has no test case: add it to ATTACK_CASES in tests/method_checks.py")
        case = ATTACK_CASES[name]
    problems = attack_problems(name, case.setting, case.defense)
    leak = attack_leakage(name, case.config, problems)
    bases = {b: baseline_leakage(b, problems) for b in case.baselines}
    gains = {b: difference(leak, base, floor=case.margin) for b, base in bases.items()}
    for b, gain in gains.items():
        assert gain.holds, f"{name} does not beat the {b} baseline ({bases[b]}): it scores {leak}, gain {gain}"
    if case.versus is None:
        return AttackCheck(leak, bases, gains)
    v = case.versus
    vproblems = attack_problems(name, v.setting or case.setting, v.defense or case.defense)
    same = vproblems is problems and v.config in (None, case.config)
    mine = leak if same else attack_leakage(name, case.config if v.config is None else v.config, vproblems)
    other = attack_leakage(*v.counterpart, vproblems)
    advantage = difference(mine, other)
    assert advantage.holds, (f"{name} does not beat {v.counterpart[0]} where its paper says it should: "
                             f"{mine} vs {other}, advantage {advantage}")
    return AttackCheck(leak, bases, gains, mine, other, advantage)


# ---------------------------------------------------------------------------------------------------
# Broken versions (for tests/test_sabotage.py)
# ---------------------------------------------------------------------------------------------------
def _identity_input(self, ctx, x, y):
    return x, y, {}


def _identity_step(self, ctx, model, x, y, grad, *, step):
    return grad, {}


def _identity_update(self, ctx, update, x, y):
    return update, {}


#: ``apply`` of a defense that does nothing, per stage.
IDENTITY_APPLY = {"input": _identity_input, "step": _identity_step, "update": _identity_update}


def noise_reconstruction(self, updates, knowledges, *, seeds):
    """``_reconstruct_batch`` of an attack that returns uniform noise (and the known or zero labels)."""
    out = []
    for k, seed in zip(knowledges, seeds):
        unit = torch.rand(k.batch_size, *k.spec.shape, generator=torch.Generator().manual_seed(seed + 1))
        labels = k.labels.cpu() if k.labels is not None else torch.zeros(k.batch_size, dtype=torch.int64)
        out.append(AttackResult(k.spec.normalize(unit), labels, AttackCost(1, 1, 0.0)))
    return out


def start_image_reconstruction(self, updates, knowledges, *, seeds):
    """``_reconstruct_batch`` of prior-init returning its start image (the class means of the known labels)."""
    out = []
    for k, seed in zip(knowledges, seeds):
        start = self.initial_images(k, k.labels, 1, torch.Generator().manual_seed(seed))[0]
        out.append(AttackResult(start, k.labels.cpu(), AttackCost(1, 1, 0.0)))
    return out


# ---------------------------------------------------------------------------------------------------
# Environment seeds
# ---------------------------------------------------------------------------------------------------
@dataclass
class GameRecord:
    """What a game drew and did: the model after reset, then per round the private batch, the shared
    update, the reconstruction, the observation and the reward."""

    model: dict[str, Tensor]
    batches: list[Tensor] = field(default_factory=list)
    updates: list[dict[str, Tensor]] = field(default_factory=list)
    reconstructions: list[Tensor] = field(default_factory=list)
    observations: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def record_reset(env) -> GameRecord:
    """A record of the game of ``env`` (a parallel env: a row of a :class:`leakgym.game.batch.GameBatch`)
    right after its reset."""
    return GameRecord({k: v.detach().clone() for k, v in env.games.model(env.row).state_dict().items()})


def record_round(rec: GameRecord, env, observation: np.ndarray, reward: float) -> None:
    """Append the round the game of ``env`` (a parallel env) just played."""
    last = env.last_round
    rec.batches.append(last.originals.clone())
    rec.updates.append({k: v.detach().clone() for k, v in last.update.tensors.items()})
    rec.reconstructions.append(last.reconstructions.clone())
    rec.observations.append(np.array(observation, copy=True))
    rec.rewards.append(float(reward))


#: Two rounds of fixed joint actions (IG then DLG against two different defenses) for the seed checks.
JOINT_ACTIONS = [
    {"attacker": np.array([0, 1, 0, 1]), "defender": np.array([1, 1, 1, 1, 1, 0])},
    {"attacker": np.array([1, 0, 0, 0]), "defender": np.array([2, 0, 0, 0, 0, 1])},
]
#: The defender's fixed action when the attacker is the learner (Gymnasium views).
DEFENDER_ACTION = [1, 1, 1, 1, 1, 0]


def play_pettingzoo(overrides: dict, seed: int) -> GameRecord:
    """A PettingZoo game (:func:`leakgym.envs.parallel_env`) reset with ``seed``, playing :data:`JOINT_ACTIONS`."""
    env = parallel_env("digits", **overrides)
    env.reset(seed=seed)
    rec = record_reset(env)
    for joint in JOINT_ACTIONS:
        obs, rewards, *_ = env.step(joint)
        record_round(rec, env, np.concatenate([obs[a] for a in sorted(obs)]), rewards["attacker"])
    return rec


def play_gymnasium(overrides: dict, seed: int) -> GameRecord:
    """The Gymnasium attacker view against a fixed defender, reset with ``seed``, playing the attacker's
    half of :data:`JOINT_ACTIONS`."""
    env = gym.make("LeakGym-Digits-v0", opponent=FixedAgent(DEFENDER_ACTION), **overrides)
    env.reset(seed=seed)
    game = env.unwrapped.parallel
    rec = record_reset(game)
    for joint in JOINT_ACTIONS:
        obs, reward, *_ = env.step(joint["attacker"])
        record_round(rec, game, obs, reward)
    return rec


def play_vector(overrides: dict, seeds: list[int], *, batch_attacks: bool) -> list[GameRecord]:
    """``gym.make_vec`` with one game per seed, every game playing the attacker's half of :data:`JOINT_ACTIONS`."""
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=len(seeds), opponent=FixedAgent(DEFENDER_ACTION),
                       batch_attacks=batch_attacks, **overrides)
    vec.reset(seed=list(seeds))
    games = [e.parallel for e in vec.envs]
    recs = [record_reset(g) for g in games]
    for joint in JOINT_ACTIONS:
        obs, rewards, *_ = vec.step(np.stack([joint["attacker"]] * len(seeds)))
        for i, g in enumerate(games):
            record_round(recs[i], g, obs[i], rewards[i])
    vec.close()
    return recs


def assert_same_game(a: GameRecord, b: GameRecord) -> None:
    """Bit-identical model, private batches, updates, reconstructions, observations and rewards."""
    assert_same_draws(a, b)
    for r in range(len(a.batches)):
        assert torch.equal(a.reconstructions[r], b.reconstructions[r]), f"same seed, different reconstruction in round {r}"
        np.testing.assert_array_equal(a.observations[r], b.observations[r])
        assert a.rewards[r] == b.rewards[r], f"same seed, different reward in round {r}"


def assert_same_draws(a: GameRecord, b: GameRecord) -> None:
    """Bit-identical model, private batches and shared updates (what the game draws, not the attack)."""
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model), "same seed, different models"
    for r, (xa, xb) in enumerate(zip(a.batches, b.batches, strict=True)):
        assert torch.equal(xa, xb), f"same seed, different private batch in round {r}"
        assert all(torch.equal(a.updates[r][k], b.updates[r][k]) for k in a.updates[r]), \
            f"same seed, different shared update in round {r}"


def assert_different_games(a: GameRecord, b: GameRecord) -> None:
    """Different models, and a different private batch, update and reconstruction in every round."""
    assert any(not torch.equal(a.model[k], b.model[k]) for k in a.model), "different seeds, same initial model"
    for r, (xa, xb) in enumerate(zip(a.batches, b.batches, strict=True)):
        assert not torch.equal(xa, xb), f"different seeds, same private batch in round {r}"
        assert any(not torch.equal(a.updates[r][k], b.updates[r][k]) for k in a.updates[r]), \
            f"different seeds, same shared update in round {r}"
        assert not torch.equal(a.reconstructions[r], b.reconstructions[r]), \
            f"different seeds, same reconstruction in round {r}"


def check_reset_seed(play: Callable[[int], GameRecord], seeds: tuple[int, int] = (1, 2)) -> None:
    """``play(seed)`` resets a game with ``seed`` and plays fixed actions: the reset seed alone must decide
    the game (same seed: bit-identical; another seed: another model, other private batches, updates
    and reconstructions)."""
    first = play(seeds[0])
    assert_same_game(first, play(seeds[0]))
    assert_different_games(first, play(seeds[1]))


def check_vector_seeds(recs: list[GameRecord], *, exact: bool) -> None:
    """Games of a vector reset with seeds ``[s, t, s]``: games 0 and 2 the same (``exact``: bit-identical,
    reconstructions included; else what they draw), game 1 different."""
    assert_different_games(recs[0], recs[1])
    (assert_same_game if exact else assert_same_draws)(recs[0], recs[2])

"""Scenarios: everything that defines one LeakGym game, as data.

A :class:`Scenario` fixes the federated setting (dataset, model, batch size B, K benign clients,
rounds, FedSGD/FedAvg), the threat model, the two agents' action menus and the reward weights.
Named scenarios are TOML files in ``envs/scenarios/``; each registers a Gymnasium id on
``import leakgym`` (see :mod:`leakgym.envs.registration`).

Action menus
------------
The defender's action is a ``MultiDiscrete`` vector with one dimension per entry of
``defender_menu`` (a :class:`~leakgym.defenses.DefenseConfig` field name and the values it may take)
followed by one binary dimension per OASIS augmentation in ``oasis_bits``. The attacker's action is
``MultiDiscrete([len(strategies), len(iterations), len(restarts), len(tv)])``. Index 0 of every
defender dimension should be "off" so that the all-zero action means "no defense".
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SCENARIO_DIR = Path(__file__).parent / "scenarios"

LEAKAGE_METRICS = ("ssim", "psnr", "lpips", "ssim+psnr")
THREAT_MODELS = ("honest", "malicious")
UPDATE_KINDS = ("gradient", "model_delta")

#: PSNR (dB) that maps to leakage 1.0 when the leakage metric is PSNR-based.
PSNR_FOR_FULL_LEAKAGE = 40.0


@dataclass
class RewardWeights:
    """Weights of the reward formulas (see :mod:`leakgym.envs.rewards`)."""

    #: attacker pays this per 1000 budget units (iterations x restarts)
    attack_cost: float = 0.05
    #: defender earns this times the cosine fidelity of its shared update to the clean one
    fidelity: float = 0.5
    #: defender earns this times the global model's test accuracy
    accuracy: float = 0.5
    #: defender pays this per unit of extra client compute (one clean-gradient evaluation)
    defense_overhead: float = 0.002


@dataclass
class Scenario:
    """One LeakGym game. Every field has a default so overrides can name just what changes."""

    name: str = "digits"
    #: dataset name (see ``leakgym list``) and image side length (None = native)
    dataset: str = "digits"
    image_size: int | None = 16
    #: model name (lenet, convnet, mlp, resnet18), optional PRECODE bottleneck and width
    model: str = "lenet"
    precode: bool = False
    model_width: int | None = None
    #: private batch size B of the victim, number K of benign clients, episode length in rounds
    batch_size: int = 1
    num_clients: int = 4
    rounds: int = 8
    #: FedSGD ("gradient") or FedAvg ("model_delta") with local_steps SGD steps of local_lr
    update_kind: str = "gradient"
    local_steps: int = 1
    local_lr: float = 0.1
    #: server learning rate applied to the aggregated update
    server_lr: float = 0.1
    #: test accuracy is measured every eval_every rounds on eval_size held-out images
    eval_every: int = 1
    eval_size: int = 256
    #: federated split
    public_fraction: float = 0.1
    dirichlet_alpha: float | None = None
    #: "honest" (honest-but-curious server) or "malicious" (may modify the model it sends)
    threat_model: str = "honest"
    #: what the attacker knows besides the model and the update
    known_labels: bool = False
    #: leakage score in [0, 1] used for rewards: ssim, psnr, lpips or ssim+psnr (their mean)
    leakage_metric: str = "ssim"
    #: defender's self-audit: iterations of Inverting Gradients the client runs on its own
    #: shared update to estimate leakage (0 = no audit; the observation entry is then 0)
    audit_iterations: int = 0
    #: DefenseConfig field -> values the defender may pick (index 0 should be "off")
    defender_menu: dict[str, list[Any]] = field(
        default_factory=lambda: {
            "noise_sigma": [0.0, 0.01, 0.1],
            "prune": [0.0, 0.5, 0.9],
            "dcs2_lambda_g": [0.0, 0.5],
            "censor_trials": [0, 5],
        }
    )
    #: OASIS augmentations the defender can switch on, one binary action dimension each
    oasis_bits: list[str] = field(default_factory=lambda: ["major_rotation", "hflip"])
    #: fixed DefenseConfig settings that apply whatever the action (e.g. synthesis steps)
    defense_defaults: dict[str, Any] = field(default_factory=dict)
    #: attacker menus: strategy names from the attack registry and budget levels
    strategies: list[str] = field(
        default_factory=lambda: ["inverting-gradients", "dlg", "prior-init", "layer-skipping"]
    )
    iterations: list[int] = field(default_factory=lambda: [20, 60, 150])
    restarts: list[int] = field(default_factory=lambda: [1, 2])
    tv: list[float] = field(default_factory=lambda: [0.0, 1e-4, 1e-2])
    #: fixed attack-config settings applied to every strategy that has the field
    attack_defaults: dict[str, Any] = field(default_factory=dict)
    rewards: RewardWeights = field(default_factory=RewardWeights)

    def __post_init__(self) -> None:
        if isinstance(self.rewards, dict):
            self.rewards = RewardWeights(**self.rewards)
        self.validate()

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise ValueError(f"scenario {self.name!r}: {what}")

        need(self.batch_size >= 1, f"batch_size={self.batch_size}; must be >= 1")
        need(self.num_clients >= 0, f"num_clients={self.num_clients}; must be >= 0")
        need(self.rounds >= 1, f"rounds={self.rounds}; must be >= 1")
        need(self.update_kind in UPDATE_KINDS, f"update_kind={self.update_kind!r}; allowed {UPDATE_KINDS}")
        need(self.local_steps >= 1, f"local_steps={self.local_steps}; must be >= 1")
        need(self.eval_every >= 1, f"eval_every={self.eval_every}; must be >= 1")
        need(self.eval_size >= 1, f"eval_size={self.eval_size}; must be >= 1")
        need(self.threat_model in THREAT_MODELS, f"threat_model={self.threat_model!r}; allowed {THREAT_MODELS}")
        need(
            self.leakage_metric in LEAKAGE_METRICS,
            f"leakage_metric={self.leakage_metric!r}; allowed {LEAKAGE_METRICS}",
        )
        need(self.audit_iterations >= 0, f"audit_iterations={self.audit_iterations}; must be >= 0")
        for menu_name in ("strategies", "iterations", "restarts", "tv"):
            need(len(getattr(self, menu_name)) >= 1, f"attacker menu {menu_name!r} is empty")
        need(all(i >= 1 for i in self.iterations), f"iterations={self.iterations}; each must be >= 1")
        need(all(r >= 1 for r in self.restarts), f"restarts={self.restarts}; each must be >= 1")
        for key, values in self.defender_menu.items():
            need(len(values) >= 1, f"defender menu {key!r} is empty")

    # -- spaces ------------------------------------------------------------------------------
    @property
    def defender_nvec(self) -> np.ndarray:
        sizes = [len(v) for v in self.defender_menu.values()] + [2] * len(self.oasis_bits)
        return np.array(sizes, dtype=np.int64)

    @property
    def attacker_nvec(self) -> np.ndarray:
        return np.array(
            [len(self.strategies), len(self.iterations), len(self.restarts), len(self.tv)], dtype=np.int64
        )

    @property
    def defender_dims(self) -> list[str]:
        """Names of the defender's action dimensions, in order."""
        return list(self.defender_menu) + [f"oasis_{b}" for b in self.oasis_bits]

    @property
    def attacker_dims(self) -> list[str]:
        return ["strategy", "iterations", "restarts", "tv"]

    def decode_defender(self, action: np.ndarray) -> dict[str, Any]:
        """Defender action -> settings dict (menu values, plus the OASIS bit names switched on)."""
        action = check_action(action, self.defender_nvec, "defender", self.defender_dims)
        settings: dict[str, Any] = {}
        for i, (key, values) in enumerate(self.defender_menu.items()):
            settings[key] = values[int(action[i])]
        offset = len(self.defender_menu)
        settings["oasis"] = [b for j, b in enumerate(self.oasis_bits) if action[offset + j] == 1]
        return settings

    def decode_attacker(self, action: np.ndarray) -> dict[str, Any]:
        action = check_action(action, self.attacker_nvec, "attacker", self.attacker_dims)
        return {
            "strategy": self.strategies[int(action[0])],
            "iterations": int(self.iterations[int(action[1])]),
            "restarts": int(self.restarts[int(action[2])]),
            "tv": float(self.tv[int(action[3])]),
        }

    def encode_defender(self, settings: dict[str, Any]) -> np.ndarray:
        """Settings -> the defender action whose menu values are nearest to them.

        Keys not named in ``settings`` are off (index 0). ``settings["oasis"]`` lists the OASIS
        augmentations to switch on. Unknown keys raise ``ValueError``.
        """
        allowed = set(self.defender_menu) | {"oasis"}
        unknown = sorted(set(settings) - allowed)
        if unknown:
            raise ValueError(
                f"scenario {self.name!r}: defender settings {unknown} are not in its menu; allowed: {sorted(allowed)}"
            )
        action = np.zeros(len(self.defender_nvec), dtype=np.int64)
        for i, (key, values) in enumerate(self.defender_menu.items()):
            if key in settings:
                action[i] = _nearest(values, settings[key])
        offset = len(self.defender_menu)
        for name in settings.get("oasis", []):
            if name not in self.oasis_bits:
                raise ValueError(
                    f"scenario {self.name!r}: OASIS augmentation {name!r} is not in its menu {self.oasis_bits}"
                )
            action[offset + self.oasis_bits.index(name)] = 1
        return action

    def encode_attacker(self, settings: dict[str, Any]) -> np.ndarray:
        allowed = {"strategy", "iterations", "restarts", "tv"}
        unknown = sorted(set(settings) - allowed)
        if unknown:
            raise ValueError(f"attacker settings {unknown} unknown; allowed: {sorted(allowed)}")
        strategy = settings.get("strategy", self.strategies[0])
        if strategy not in self.strategies:
            raise ValueError(
                f"scenario {self.name!r}: strategy {strategy!r} not in its menu {self.strategies}"
            )
        return np.array(
            [
                self.strategies.index(strategy),
                _nearest(self.iterations, settings.get("iterations", self.iterations[0])),
                _nearest(self.restarts, settings.get("restarts", self.restarts[0])),
                _nearest(self.tv, settings.get("tv", self.tv[0])),
            ],
            dtype=np.int64,
        )

    # -- construction ---------------------------------------------------------------------------
    def replace(self, **overrides: Any) -> Scenario:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown scenario option(s) {unknown}; allowed: {sorted(known)}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"gym_id"})
        if unknown:
            raise ValueError(f"unknown scenario key(s) {unknown}; allowed: {sorted(known)}")
        return cls(**{k: v for k, v in data.items() if k != "gym_id"})


def _nearest(values: list[Any], wanted: Any) -> int:
    if wanted in values:
        return values.index(wanted)
    try:
        return int(np.argmin([abs(float(v) - float(wanted)) for v in values]))
    except (TypeError, ValueError):
        raise ValueError(f"value {wanted!r} is not in the menu {values}") from None


def check_action(action: Any, nvec: np.ndarray, who: str, dims: list[str]) -> np.ndarray:
    """Validate a MultiDiscrete action; raise ``ValueError`` naming the bad entry and its range."""
    arr = np.asarray(action)
    if arr.shape != nvec.shape:
        raise ValueError(f"{who} action has shape {arr.shape}; expected {nvec.shape} ({dims})")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{who} action {arr.tolist()} must be integers")
        arr = arr.astype(np.int64)
    for i, (a, n) in enumerate(zip(arr, nvec)):
        if not 0 <= a < n:
            raise ValueError(f"{who} action[{i}] ({dims[i]}) = {int(a)}; allowed range 0..{int(n) - 1}")
    return arr.astype(np.int64)


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def scenario_gym_id(name: str) -> str:
    with open(SCENARIO_DIR / f"{name}.toml", "rb") as fh:
        return tomllib.load(fh)["gym_id"]


def load_scenario(name: str | Scenario = "digits", **overrides: Any) -> Scenario:
    """A named scenario (TOML file in ``envs/scenarios``) or a Scenario, with overrides applied."""
    if isinstance(name, Scenario):
        return name.replace(**overrides) if overrides else name
    path = SCENARIO_DIR / f"{name}.toml"
    if not path.exists():
        raise ValueError(f"unknown scenario {name!r}; available: {scenario_names()}")
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    scenario = Scenario.from_dict(data)
    return scenario.replace(**overrides) if overrides else scenario

"""`DefenseConfig`: every client-side defense's parameters in one validated dataclass.

The default ``DefenseConfig()`` is *no defense*: each defense has an "off" value (0, or 1.0 for the
top-k keep fraction, or ``"off"`` for PPP) and is applied only when its field moves away from it.
Any subset of defenses composes; :mod:`leakgym.defenses.pipeline` documents the order.

Defaults of the parameters that only matter once a defense is switched on follow the papers:

* DCS² (Wu et al., AAAI 2024): ``lambda_g = 0.7`` is the paper's choice (Table 3, the value of
  its Table 2 row). The main text leaves the other weights to the supplementary material; the
  defaults here are those of the authors' MNIST script (``JingWu321/DCS-2``, ``dlg/scripts/mnist.sh``):
  ``dcs_iter=1000, dcs_lr=0.1, lambda_xsim=0.01, lambda_zsim=0.01, epsilon=0.01``, one concealed
  sample (``per_adv=1``) started from a mixup of a random image and the sensitive one (the paper's
  "MixUP" start ``0.7 x0 + 0.3 xs``, Table 5).
* LODA (§5 "Setup of LODA", LODA1): ``c = 20``, feature alignment on the first five convolutional
  layers, 500 steps of normalised gradient descent with learning rate 0.1.
* CENSOR (Algorithm 1): ``T = 20`` trials is what the paper calls "usually sufficient" (§IV-B);
  the trial step is the FL learning rate eta, 0.1 in its experiments (§V-E).
* PPP (Scheliga et al., §5.2): NG with sigma in {1e-3, 1e-2, 1e-1, 0.5} (NG3, NG2, NG1, NG05) or
  GC with pruning ratio in {0.9, 0.99} (GC90, GC99), on the layers before the PRECODE bottleneck.
* OASIS (Jeter et al., §IV-A): see :mod:`leakgym.defenses.oasis` for the bit mask.

Named settings (the ones :mod:`leakgym.bench.defenses` runs, and the PPP presets of the PPP paper)
are in :data:`PRESETS`; ``DefenseConfig.preset("PPP-NG1")`` returns one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

#: Allowed values of the string-valued fields.
NOISE_KINDS = ("gaussian", "laplace")
PPP_MODES = ("off", "ng", "gc")
DCS2_STARTS = ("random", "public", "mixup")
#: Bits of the OASIS augmentation mask (see :mod:`leakgym.defenses.oasis`).
OASIS_ALL_BITS = 1 | 2 | 4 | 8 | 16


@dataclass(frozen=True)
class DefenseConfig:
    """The whole defense a client applies in one round. The default is no defense."""

    # --- input-side transforms (applied to the private batch before any gradient) ------------
    oasis: int = 0
    """OASIS augmentation bit mask: 1 major rotation, 2 minor rotation, 4 shear, 8 hflip, 16 vflip; 0 off."""
    loda_c: float = 0.0
    """LODA pixel-distance weight c of Eq. (4); 0 off (paper: 20)."""
    loda_steps: int = 500
    """LODA normalised-gradient-descent steps T (paper: 500)."""
    loda_lr: float = 0.1
    """LODA step size tau (paper: 0.1)."""
    loda_layers: int = 5
    """LODA feature extractor g: output of the first ``loda_layers`` convolutional layers (paper LODA1: 5)."""
    mixup_k: int = 0
    """Mixup encoding: images mixed per encoded example; 0 off."""
    instahide_k: int = 0
    """InstaHide encoding: images mixed per encoded example (InstaHide paper: 4); 0 off."""

    # --- per-step gradient transforms (applied to every local step's gradient) ---------------
    dcs2_lambda_g: float = 0.0
    """DCS² weight lambda_g of Eq. (10); 0 off (paper: 0.7)."""
    dcs2_lambda_x: float = 0.01
    """DCS² lambda_x of Eq. (9) (authors' MNIST script: 0.01)."""
    dcs2_lambda_z: float = 0.01
    """DCS² lambda_z of Eq. (9) (authors' MNIST script: 0.01)."""
    dcs2_epsilon: float = 0.01
    """DCS² latent distance epsilon of Eq. (8)-(9) (authors' MNIST script: 0.01)."""
    dcs2_num_concealed: int = 1
    """DCS² number of concealed samples per batch (authors: 1)."""
    dcs2_steps: int = 1000
    """DCS² optimisation steps for the concealed sample (authors' MNIST script: 1000)."""
    dcs2_lr: float = 0.1
    """DCS² learning rate of the concealed-sample optimisation (authors: 0.1)."""
    dcs2_start: str = "mixup"
    """DCS² starting point x0: 'random' noise, a 'public' image, or 'mixup' 0.7 x0 + 0.3 xs (paper Table 5)."""
    censor_trials: int = 0
    """CENSOR number of trials T of Algorithm 1; 0 off (paper: 20)."""
    censor_step: float = 0.1
    """CENSOR trial step size eta of Algorithm 1 line 15 (paper's FL learning rate: 0.1)."""

    # --- update-side transforms (applied to the final shared update) --------------------------
    ppp: str = "off"
    """PPP partial perturbation of the layers before the PRECODE bottleneck: 'off', 'ng' (noise) or 'gc' (pruning)."""
    ppp_sigma: float = 0.1
    """PPP-NG Gaussian standard deviation (paper: 1e-3 .. 0.5; NG1 = 0.1)."""
    ppp_prune: float = 0.9
    """PPP-GC per-layer pruning ratio (paper: GC90 = 0.9, GC99 = 0.99)."""
    soteria: float = 0.0
    """Soteria: fraction of representation units whose head-weight gradient columns are pruned; 0 off."""
    prune: float = 0.0
    """Per-layer smallest-magnitude pruning fraction p (gradient compression); 0 off."""
    topk: float = 1.0
    """Global top-k sparsification: fraction of all entries kept (largest magnitudes); 1.0 off."""
    clip: float = 0.0
    """Clip the update's global L2 norm to this value; 0 off."""
    noise_sigma: float = 0.0
    """Noise scale added to every entry (Gaussian std, or Laplace scale b); 0 off."""
    noise_kind: str = "gaussian"
    """Noise distribution: 'gaussian' or 'laplace'."""

    def __post_init__(self) -> None:
        _check_int(self, "oasis", 0, OASIS_ALL_BITS)
        _check_real(self, "loda_c", 0.0, math.inf)
        _check_int(self, "loda_steps", 1, None)
        _check_real(self, "loda_lr", 0.0, math.inf, low_open=True)
        _check_int(self, "loda_layers", 1, None)
        _check_int(self, "mixup_k", 0, None)
        _check_int(self, "instahide_k", 0, None)
        if self.mixup_k == 1 or self.instahide_k == 1:
            bad = "mixup_k" if self.mixup_k == 1 else "instahide_k"
            raise ValueError(f"DefenseConfig.{bad}=1 mixes nothing; allowed: 0 (off) or an integer >= 2")
        if self.mixup_k and self.instahide_k:
            raise ValueError(
                f"DefenseConfig.mixup_k={self.mixup_k} and instahide_k={self.instahide_k}: InstaHide already "
                "is a Mixup encoding; set at most one of them > 0"
            )
        _check_real(self, "dcs2_lambda_g", 0.0, 1.0)
        _check_real(self, "dcs2_lambda_x", 0.0, math.inf)
        _check_real(self, "dcs2_lambda_z", 0.0, math.inf)
        _check_real(self, "dcs2_epsilon", 0.0, math.inf)
        _check_int(self, "dcs2_num_concealed", 1, None)
        _check_int(self, "dcs2_steps", 1, None)
        _check_real(self, "dcs2_lr", 0.0, math.inf, low_open=True)
        _check_choice(self, "dcs2_start", DCS2_STARTS)
        _check_int(self, "censor_trials", 0, None)
        _check_real(self, "censor_step", 0.0, math.inf, low_open=True)
        _check_choice(self, "ppp", PPP_MODES)
        _check_real(self, "ppp_sigma", 0.0, math.inf)
        _check_real(self, "ppp_prune", 0.0, 1.0, high_open=True)
        _check_real(self, "soteria", 0.0, 1.0, high_open=True)
        _check_real(self, "prune", 0.0, 1.0, high_open=True)
        _check_real(self, "topk", 0.0, 1.0, low_open=True)
        _check_real(self, "clip", 0.0, math.inf)
        _check_real(self, "noise_sigma", 0.0, math.inf)
        _check_choice(self, "noise_kind", NOISE_KINDS)

    # -- what is on --------------------------------------------------------------------------
    def active(self) -> list[str]:
        """Names of the switched-on defenses, in pipeline order (see :mod:`leakgym.defenses.pipeline`)."""
        on = {
            "oasis": self.oasis > 0,
            "loda": self.loda_c > 0,
            "mixup": self.mixup_k > 0,
            "instahide": self.instahide_k > 0,
            "dcs2": self.dcs2_lambda_g > 0,
            "censor": self.censor_trials > 0,
            "ppp": self.ppp != "off",
            "soteria": self.soteria > 0,
            "prune": self.prune > 0,
            "topk": self.topk < 1.0,
            "clip": self.clip > 0,
            "noise": self.noise_sigma > 0,
        }
        return [name for name in PIPELINE_ORDER if on[name]]

    @property
    def is_identity(self) -> bool:
        """True when no defense is switched on (the shared update is the clean one)."""
        return not self.active()

    def replace(self, **changes: Any) -> DefenseConfig:
        """A copy with some fields changed (validated); unknown names raise ``ValueError``."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown DefenseConfig field(s) {unknown}; allowed: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DefenseConfig:
        return cls().replace(**values)

    @classmethod
    def preset(cls, name: str) -> DefenseConfig:
        """A named setting from :data:`PRESETS` (case-insensitive)."""
        key = name.lower()
        table = {k.lower(): v for k, v in PRESETS.items()}
        if key not in table:
            raise ValueError(f"unknown defense preset {name!r}; allowed: {sorted(PRESETS)}")
        return table[key]


#: Canonical application order; see :mod:`leakgym.defenses.pipeline`.
PIPELINE_ORDER: tuple[str, ...] = (
    "oasis", "loda", "mixup", "instahide",          # input side
    "dcs2", "censor",                                # per local step
    "ppp", "soteria", "prune", "topk", "clip", "noise",  # update side
)


def _field_range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None or high == math.inf else f"{high:g}"
    return f"{'(' if low_open else '['}{lo}, {hi}{')' if high_open or hi == 'inf' else ']'}"


def _check_real(cfg: DefenseConfig, name: str, low: float, high: float, *,
                low_open: bool = False, high_open: bool = False) -> None:
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(
            f"DefenseConfig.{name}={value!r}; allowed range {_field_range(low, high, low_open, high_open)}"
        )


def _check_int(cfg: DefenseConfig, name: str, low: int, high: int | None) -> None:
    value = getattr(cfg, name)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        rng = f"integers in [{low}, {high}]" if high is not None else f"integers >= {low}"
        raise ValueError(f"DefenseConfig.{name}={value!r}; allowed: {rng}")


def _check_choice(cfg: DefenseConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ValueError(f"DefenseConfig.{name}={value!r}; allowed: {', '.join(map(repr, choices))}")


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
        "censor": d(censor_trials=20, censor_step=0.1),
        "oasis": d(oasis=1 | 4),              # major rotation + shear, the paper's strongest combination
        "dcs2": d(dcs2_lambda_g=0.7),
        "loda": d(loda_c=20.0),
        "mixup": d(mixup_k=4),
        "instahide": d(instahide_k=4),
    }


#: Named defense settings (documented in the module docstring and used by ``leakgym bench defenses``).
PRESETS: dict[str, DefenseConfig] = _presets()

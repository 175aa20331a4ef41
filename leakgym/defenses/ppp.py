"""PPP: PRECODE with Partial gradient Perturbation (Scheliga, Mäder & Seeland, "Combining Variational Modeling with
Partial Gradient Perturbation to Prevent Deep Gradient Leakage", 2022; the copy in the papers folder names no venue).

"Combining Variational Modeling with Partial Gradient Perturbation to Prevent Deep Gradient
Leakage", §3.4: PRECODE's variational bottleneck already protects the gradients of every layer
*after* it (their stochasticity defeats inversion, §3.2), but the layers *before* it still leak to
the attack of §3.3 (Eq. 4), which matches only those gradients. PPP therefore perturbs **only the
gradients of the layers preceding the bottleneck** (:func:`leakgym.models.precode_layer_split`),
with one of the two perturbations of §5.2:

* **NG** (noisy gradients): add ``N(0, sigma^2)`` to every entry; presets NG3, NG2, NG1, NG05 are
  ``sigma = 1e-3, 1e-2, 1e-1, 0.5``.
* **GC** (gradient compression): in every layer prune the fraction ``p`` of smallest-magnitude
  entries to zero; presets GC90 and GC99 are ``p = 0.9, 0.99``.

The presets are available as ``DefenseConfig.preset("PPP-NG1")`` etc. (names ``PPP-NG3``,
``PPP-NG2``, ``PPP-NG1``, ``PPP-NG05``, ``PPP-GC90``, ``PPP-GC99``). PPP needs a PRECODE model,
``build_model(..., precode=True)``. The registered defense :data:`PPP` (fields ``ppp``,
``ppp_sigma``, ``ppp_prune``) applies it to the shared update (update stage; free in the cost model).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from leakgym.defenses.perturbation import NOISE_SIGMA_MAX, add_noise
from leakgym.defenses.registry import DefenseContext, UpdateDefense, choice_field, real_field
from leakgym.defenses.sparsification import prune_smallest
from leakgym.models import precode_layer_split

Update = dict[str, Tensor]
#: ``"off"`` and the two perturbations of §5.2.
PPP_MODES = ("off", "ng", "gc")


def ppp(update: Update, model: nn.Module, mode: str, *, sigma: float, prune: float,
        generator: torch.Generator) -> tuple[Update, dict]:
    """Apply PPP-NG (``mode="ng"``) or PPP-GC (``mode="gc"``) to the pre-bottleneck layers.

    Returns ``(update', {"mode": mode, "layers": [names perturbed]})``. Raises ``ValueError`` for a
    model without a PRECODE bottleneck.
    """
    if mode not in ("ng", "gc"):
        raise ValueError(f"PPP mode={mode!r}; allowed: 'ng', 'gc'")
    before, _ = precode_layer_split(model)
    layers = [n for n in before if n in update]
    if mode == "ng":
        out = add_noise(update, sigma, kind="gaussian", generator=generator, names=layers)
    else:
        out = prune_smallest(update, prune, names=layers)
    return out, {"mode": mode, "layers": layers}


def _needs_precode(mode: str, scenario) -> str | None:
    """A scenario that offers PPP must train a PRECODE model (its layers before the bottleneck)."""
    if mode != "off" and not scenario.precode:
        return "perturbs the layers before a PRECODE bottleneck; needs precode=True"
    return None


class PPP(UpdateDefense):
    """PPP-NG / PPP-GC on the layers before the PRECODE bottleneck."""

    name = "ppp"
    public_split = False
    fields = (
        choice_field("ppp", "off", "PPP partial perturbation of the layers before the PRECODE bottleneck: 'off', "
                     "'ng' (noise) or 'gc' (pruning).", PPP_MODES, scenario_check=_needs_precode),
        # Both > 0: with 0 the defense is reported as applied and changes nothing. ppp_sigma's upper bound
        # as noise_sigma's (NOISE_SIGMA_MAX): beyond it float32 updates overflow.
        real_field("ppp_sigma", 0.1, "PPP-NG Gaussian standard deviation (paper: 1e-3 .. 0.5; NG1 = 0.1).",
                   low_open=True, high=NOISE_SIGMA_MAX),
        real_field("ppp_prune", 0.9, "PPP-GC per-layer pruning ratio (paper: GC90 = 0.9, GC99 = 0.99).",
                   low_open=True, high=1.0, high_open=True),
    )

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        cfg = ctx.config
        return ppp(update, ctx.model, cfg.ppp, sigma=cfg.ppp_sigma, prune=cfg.ppp_prune, generator=ctx.generator)


PPP_DEFENSE = PPP()

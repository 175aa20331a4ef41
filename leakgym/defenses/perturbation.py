"""Update perturbation baselines: additive Gaussian / Laplacian noise and L2 norm clipping.

Noisy gradients (Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019, §5; Wei et al. 2020)
add i.i.d. noise to every entry of the shared update. Clipping bounds the update's global L2 norm
(Abadi et al. 2016, Algorithm 1, applied here to the client's whole update rather than per example):
``u <- u * min(1, C / ||u||_2)``. Clipping then noise is the DP-SGD recipe; note that clipping
alone rescales the update and so leaves cosine-matching attacks (Geiping et al.) unaffected.

All functions are pure: they return new dictionaries and never modify their inputs. The registered
defenses :data:`CLIP` (``clip``) and :data:`NOISE` (``noise_sigma``, ``noise_kind``) apply them to the
shared update (update stage); both are free in the cost model (a pass over the update).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from leakgym.defenses.registry import DefenseContext, UpdateDefense, choice_field, real_field

Update = dict[str, Tensor]
#: Allowed noise distributions.
NOISE_KINDS = ("gaussian", "laplace")
NOISE_SIGMA_MAX = 1e6
"""Largest noise scale a configuration takes: a million times an ordinary gradient entry, far beyond any
paper's (DP-SGD and PPP use <= 1) and far below float32 overflow (a scale near 1e38 made updates inf)."""


def laplace_like(t: Tensor, scale: float, generator: torch.Generator) -> Tensor:
    """Laplace(0, b=scale) samples shaped like ``t``, by inverse CDF from generator-driven uniforms.

    ``torch.distributions.Laplace`` takes no generator, so we draw ``u ~ U(-1/2, 1/2)`` and return
    ``-b * sign(u) * log(1 - 2|u|)``.
    """
    u = torch.rand(t.shape, generator=generator, device=generator.device, dtype=t.dtype).to(t.device) - 0.5
    # 1 - 2|u| lies in (0, 1]; clamp keeps log finite for the (measure-zero) u = -1/2 draw.
    return -scale * torch.sign(u) * torch.log1p(-2 * u.abs()).clamp(min=math.log(torch.finfo(t.dtype).tiny))


def add_noise(update: Update, sigma: float, *, kind: str = "gaussian", generator: torch.Generator,
              names: list[str] | None = None) -> Update:
    """Add i.i.d. noise to the entries of ``update`` (only to ``names`` if given).

    Noise is drawn on ``generator``'s device and moved to each tensor's.

    ``kind="gaussian"``: N(0, sigma^2). ``kind="laplace"``: Laplace(0, b=sigma) (variance 2 sigma^2).
    """
    if sigma < 0 or not math.isfinite(sigma):
        raise ValueError(f"noise sigma={sigma!r}; allowed range [0, inf)")
    if kind not in NOISE_KINDS:
        raise ValueError(f"noise kind={kind!r}; allowed: 'gaussian', 'laplace'")
    selected = set(update) if names is None else set(names)
    out: Update = {}
    for name, t in update.items():
        if name not in selected or sigma == 0:
            out[name] = t.clone()
        elif kind == "gaussian":
            noise = torch.randn(t.shape, generator=generator, device=generator.device, dtype=t.dtype)
            out[name] = t + sigma * noise.to(t.device)
        else:
            out[name] = t + laplace_like(t, sigma, generator)
    return out


def global_norm(update: Update) -> Tensor:
    """L2 norm of all entries of the update together."""
    return torch.sqrt(sum((t.detach().double() ** 2).sum() for t in update.values()))


def clip_norm(update: Update, max_norm: float) -> tuple[Update, float]:
    """Scale the update so its global L2 norm is at most ``max_norm``; returns (update, factor)."""
    if not (max_norm > 0) or not math.isfinite(max_norm):
        raise ValueError(f"clip max_norm={max_norm!r}; allowed range (0, inf)")
    norm = float(global_norm(update))
    factor = min(1.0, max_norm / norm) if norm > 0 else 1.0
    return {k: t * factor for k, t in update.items()}, factor


class Clip(UpdateDefense):
    """Global L2 clipping of the shared update, ``u * min(1, C / ||u||_2)``."""

    name = "clip"
    public_split = False
    fields = (real_field("clip", 0.0, "Clip the update's global L2 norm to this value; 0 off."),)

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        norm_before = float(global_norm(update))
        out, factor = clip_norm(update, ctx.config.clip)
        return out, {"norm_before": norm_before, "factor": factor}

    def apply_many(self, ctxs, updates, xs, ys) -> list[tuple[Update, dict]]:
        """Clients with the same layer shapes as one computation: every client's global norm from one
        stacked reduction (one transfer to the host), then one scaling per layer."""
        groups: dict[tuple, list[int]] = {}
        for i, u in enumerate(updates):
            groups.setdefault(tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in u.items()), []).append(i)
        out: list[tuple[Update, dict] | None] = [None] * len(updates)
        for layout, members in groups.items():
            limits = [ctxs[i].config.clip for i in members]
            bad = [c for c in limits if not (c > 0) or not math.isfinite(c)]
            if bad:
                raise ValueError(f"clip max_norm={bad[0]!r}; allowed range (0, inf)")
            stacked = {name: torch.stack([updates[i][name] for i in members]) for name, *_ in layout}
            norms = torch.sqrt(sum((t.detach().double() ** 2).flatten(1).sum(dim=1) for t in stacked.values()))
            norms = norms.tolist()
            factors = [min(1.0, c / n) if n > 0 else 1.0 for c, n in zip(limits, norms)]
            scale = torch.tensor(factors, dtype=torch.float64)
            scaled = {name: t * scale.to(device=t.device, dtype=t.dtype).view(-1, *([1] * (t.dim() - 1)))
                      for name, t in stacked.items()}
            for row, i in enumerate(members):
                out[i] = ({name: t[row] for name, t in scaled.items()},
                          {"norm_before": norms[row], "factor": factors[row]})
        return out  # type: ignore[return-value]


class Noise(UpdateDefense):
    """I.i.d. Gaussian or Laplace noise on every entry of the shared update (applied last: never pruned)."""

    name = "noise"
    public_split = False
    fields = (
        real_field("noise_sigma", 0.0, "Noise scale added to every entry (Gaussian std, or Laplace scale b); 0 off.",
                   high=NOISE_SIGMA_MAX),
        choice_field("noise_kind", "gaussian", "Noise distribution: 'gaussian' or 'laplace'.", NOISE_KINDS),
    )

    def apply(self, ctx: DefenseContext, update: Update, x: Tensor, y: Tensor) -> tuple[Update, dict]:
        cfg = ctx.config
        out = add_noise(update, cfg.noise_sigma, kind=cfg.noise_kind, generator=ctx.generator)
        return out, {"kind": cfg.noise_kind, "sigma": cfg.noise_sigma}


CLIP = Clip()
NOISE = Noise()

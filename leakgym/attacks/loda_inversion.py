"""The adaptive attack on LODA (Wan et al., "Defense Against Gradient Leakage Attacks via Learning
to Obscure Data", Sec. 4.2, Eq. 5-6).

A LODA client trains on obscured images ``x' = E(x*)`` (Eq. 4). The attack has two stages:

1. **Gradient inversion** of the shared update with the reference
   :class:`~leakgym.attacks.inverting_gradients.InvertingGradients` (same engine, prior, schedule
   and label handling), which recovers an estimate of the obscured images ``x'``.
2. **Inverting the obscuring** (Eq. 6). If ``x'`` is a stationary point of Eq. 4 it satisfies
   ``J_g(x')^T (g(x') - g(x*)) - c (x' - x*) = 0`` (Eq. 5), so the attacker, who knows the feature
   extractor ``g`` and the public data used by the defense, solves

   ``x* = argmin_{x in X} || J_g(x')^T (g(x') - g(x)) - c (x' - x) ||_2^2``

   by gradient descent, with ``c`` a hyper-parameter of the attack (paper: searched in
   {0, 1, 5, 10, 20}, set to 1; 100 steps searched in {50, 100, 200, 400}).

``J_g(x')^T v`` is a vector-Jacobian product at the fixed ``x'``, differentiable in ``v`` (hence in
``x``). The extractor is :func:`leakgym.defenses.loda.feature_extractor` with the defense's seed,
architecture and public split (``knowledge.public_x``, unit images, normalised here), so it loads
the defense's cached extractor.

Implementation choices the paper leaves open: Eq. 6 is minimised with Adam (``inversion_lr``) and
projected onto the valid image box after each step. Its trivial root ``x = x'`` must not be the
start, so ``x`` starts from a random public image (``start="public"``, what LODA itself starts
from) or from noise (``start="random"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from leakgym.attacks.base import AttackerKnowledge, AttackResult, check_integer, check_seed, limited
from leakgym.attacks.inverting_gradients import InvertingGradients, InvertingGradientsConfig
from leakgym.defenses.loda import (
    DEFAULT_ARCH,
    DEFAULT_EPOCHS,
    DEFAULT_WIDTH,
    LayerFeatures,
    extractor_layers,
    feature_extractor,
)
from leakgym.fl.update import SharedUpdate
from leakgym.models import MODEL_NAMES, build_model

STARTS = ("public", "random")


@dataclass
class LodaInversionConfig(InvertingGradientsConfig):
    """Inverting Gradients followed by the LODA inversion of Eq. 6."""

    c: float = 1.0
    """Pixel weight ``c`` of Eq. 6 (paper: 1, searched over {0, 1, 5, 10, 20})."""
    inversion_steps: int = limited(100, 30_000)
    """Gradient-descent steps on Eq. 6 (paper: 100), >= 1 (they start from a public image or noise: no
    step would return that start)."""
    inversion_lr: float = 0.05
    """Adam step size on Eq. 6 (not given in the paper)."""
    start: str = "public"
    """Start of Eq. 6's descent: ``"public"`` image or ``"random"`` noise (never the trivial root x')."""
    layers: int | str | tuple[str, ...] = 5
    """The defense's ``g``: first k conv layers, ``"all"``, or module names (LODA1: 5)."""
    extractor_seed: int = 0
    """Seed of the defense's extractor (the attacker knows the defense)."""
    extractor_epochs: int = limited(DEFAULT_EPOCHS, 1_000)
    extractor_arch: str = DEFAULT_ARCH
    extractor_width: int | None = limited(DEFAULT_WIDTH, 512)
    cache_dir: str | None = None
    """Extractor cache (None: :func:`leakgym.defenses.loda.default_cache_dir`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.c >= 0 and math.isfinite(self.c)):
            raise ValueError(f"c={self.c}; must be a finite number >= 0")
        self.inversion_steps = check_integer(self.inversion_steps, "inversion_steps", 1)
        self.extractor_seed = check_seed(self.extractor_seed, "extractor_seed")
        self.extractor_epochs = check_integer(self.extractor_epochs, "extractor_epochs", 0)
        if self.extractor_arch not in MODEL_NAMES:
            raise ValueError(f"extractor_arch={self.extractor_arch!r}; allowed: {MODEL_NAMES}")
        if self.extractor_width is not None:
            self.extractor_width = check_integer(self.extractor_width, "extractor_width", 1)
        if not (self.inversion_lr > 0 and math.isfinite(self.inversion_lr)):
            raise ValueError(f"inversion_lr={self.inversion_lr}; must be a finite number > 0")
        if self.start not in STARTS:
            raise ValueError(f"start={self.start!r}; allowed: {STARTS}")
        if isinstance(self.layers, list):
            self.layers = tuple(self.layers)
        # The defense's layer choice, checked now (it used to fail after the whole inversion stage):
        # an int >= 1, "all", or a non-empty tuple of module names (checked against the extractor then).
        layers = self.layers
        if not (layers == "all" or (isinstance(layers, int) and not isinstance(layers, bool) and layers >= 1)
                or (isinstance(layers, tuple) and layers and all(isinstance(n, str) and n for n in layers))):
            raise ValueError(f"layers={layers!r}; allowed: an integer >= 1, 'all', or a list of module names")


def invert_obscuring(
    x_obscured: Tensor, g: torch.nn.Module, x_start: Tensor, *, c: float, steps: int, lr: float,
    lower: Tensor, upper: Tensor,
) -> tuple[Tensor, list[float]]:
    """Minimise Eq. 6 over ``x`` from ``x_start`` for a batch of obscured images ``x'``.

    Returns the recovered images and the per-step mean squared residual of Eq. 5.
    """
    xp = x_obscured.detach().clone().requires_grad_(True)
    g_xp = g(xp)
    x = x_start.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    history: list[float] = []
    for _ in range(steps):
        v = g_xp.detach() - g(x)
        (jtv,) = torch.autograd.grad(g_xp, xp, grad_outputs=v, retain_graph=True, create_graph=True)
        residual = jtv - c * (xp.detach() - x)
        loss = residual.flatten(1).pow(2).sum(1)
        (grad,) = torch.autograd.grad(loss.sum(), [x])
        history.append(float(loss.detach().mean()))
        x.grad = grad
        opt.step()
        with torch.no_grad():
            x.copy_(torch.maximum(torch.minimum(x, upper), lower))
    return x.detach(), history


class LodaInversion(InvertingGradients):
    """LODA's adaptive attack: Inverting Gradients, then Eq. 6 to undo the obscuring."""

    name = "loda-inversion"
    public_split = True
    Config = LodaInversionConfig

    @classmethod
    def check_scenario(cls, config: LodaInversionConfig, model, spec) -> None:
        super().check_scenario(config, model, spec)
        # the layers it reads must be the extractor's: one of its architecture has them (built on the meta
        # device: nothing is allocated, whatever its width)
        with torch.device("meta"):
            extractor = build_model(config.extractor_arch, spec, width=config.extractor_width, seed=config.extractor_seed)
        extractor_layers(extractor, config.layers)

    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int]
    ) -> list[AttackResult]:
        c = self.config
        for i, k in enumerate(knowledges):
            if k.public_x is None or k.public_y is None:
                raise ValueError(f"knowledge {i}: LodaInversion needs the public split (public_x, public_y)")
        generators = self.generators(seeds, knowledges)
        results = self.invert(updates, knowledges, generators)
        for res, k, gen in zip(results, knowledges, generators):
            spec = k.spec
            public_x = spec.normalize(k.public_x.to(res.images))
            extractor = feature_extractor(
                spec, public_x, k.public_y, seed=c.extractor_seed, cache_dir=c.cache_dir,
                epochs=c.extractor_epochs, arch=c.extractor_arch, width=c.extractor_width,
            ).to(res.images.device)
            g = LayerFeatures(extractor, c.layers)
            # The problem's generator continues after the inversion stage (same device as the images).
            if c.start == "public":
                pick = torch.randint(0, public_x.shape[0], (res.images.shape[0],), generator=gen, device=gen.device)
                x_start = public_x[pick.to(public_x.device)]
            else:
                x_start = torch.randn(res.images.shape, generator=gen, device=gen.device, dtype=res.images.dtype)
            lower, upper = spec.unit_bounds(res.images)
            recovered, hist = invert_obscuring(
                res.images, g, x_start, c=c.c, steps=c.inversion_steps, lr=c.inversion_lr, lower=lower, upper=upper
            )
            res.history["inversion_residual"] = hist
            res.images = recovered
            res.cost.once += c.inversion_steps  # (run once, on the best restart)
        return results

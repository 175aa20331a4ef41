"""Adaptive attacks: Inverting Gradients adapted to a known defense.

Three adaptations, each a subclass of :class:`~leakgym.attacks.inverting_gradients.InvertingGradients`
(same optimiser, prior, restarts and label inference):

* :class:`LayerSkipping` -- match only the layers a defense leaves informative. PPP paper
  (Scheliga et al. 2022, Sec. 3.3, Eq. 4): PRECODE's sampling makes the gradients of the bottleneck
  and every later layer stochastic, and matching them stops the attack from converging; matching
  only the layers *before* the bottleneck disables PRECODE. The same idea (Balunovic et al. 2022)
  defeats pruning defenses such as Soteria: layers whose update is mostly exact zeros are dropped.
* :class:`EOT` -- Expectation over Transformation against randomised defenses. CENSOR paper
  (Zhang et al. 2025, Sec. V-D): the attacker applies the defense's own random transformation to its
  dummy update E times and matches the average.
* :class:`PriorInit` -- start from the class-mean image of the public data for each (inferred)
  label. DCS^2 paper (Table 4, "AvgImg" initialisation of the GS attack).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from leakgym.attacks.base import AttackerKnowledge, check_integer, limited
from leakgym.attacks.engine import DefenseSimulator, MatchingObjective
from leakgym.attacks.inverting_gradients import InvertingGradients, InvertingGradientsConfig
from leakgym.attacks.public_split import derived
from leakgym.fl.update import SharedUpdate
from leakgym.models import precode_layer_split
from leakgym.optim.randomness import BatchedGenerator

# --------------------------------------------------------------------------------------------------
# (a) Layer skipping
# --------------------------------------------------------------------------------------------------
LAYER_PRESETS = ("auto", "all", "before_bottleneck")


@dataclass
class LayerSkippingConfig(InvertingGradientsConfig):
    """Inverting Gradients restricted to a subset of layers."""

    layers: str | tuple[str, ...] = "auto"
    """``"before_bottleneck"`` (PPP Eq. 4: the layers preceding PRECODE's bottleneck), ``"all"``,
    ``"auto"`` (before the bottleneck when the model has one, else all), or a tuple of parameter
    names / name prefixes (``"body.conv1"`` selects ``body.conv1.weight`` and ``body.conv1.bias``)."""
    skip_zeros: bool = True
    """Also drop layers whose update is mostly exact zeros (pruned by the defense)."""
    zero_fraction: float = 0.5
    """A layer is "mostly zeros" when at least this fraction of its update entries are exactly 0."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.layers, str):
            if self.layers not in LAYER_PRESETS:
                raise ValueError(f"layers={self.layers!r}; allowed: {LAYER_PRESETS} or a tuple of names/prefixes")
        else:
            self.layers = tuple(self.layers)
            if not self.layers or not all(isinstance(s, str) and s for s in self.layers):
                raise ValueError(f"layers={self.layers!r}; a non-empty tuple of parameter names/prefixes")
        if not 0.0 < self.zero_fraction <= 1.0:
            raise ValueError(f"zero_fraction={self.zero_fraction}; allowed range (0, 1]")


def _matches(name: str, entry: str) -> bool:
    """Whether parameter ``name`` is ``entry`` or lies under it (``entry`` a module prefix, with or without its
    final dot)."""
    return name == entry or name.startswith(entry if entry.endswith(".") else entry + ".")


def _check_matched(layers: tuple[str, ...], names: list[str], what: str) -> None:
    """``ValueError`` naming the entries of ``layers`` (names or prefixes) that match none of ``names`` (by
    :func:`_matches`, the rule :func:`select_layers` selects by: found in a review, two rules let a scenario
    build with an entry the round then matched to nothing)."""
    unmatched = [s for s in layers if not any(_matches(n, s) for n in names)]
    if unmatched:
        raise ValueError(f"layers {unmatched} match no parameter of {what}; parameters: {names}")


def select_layers(
    update: SharedUpdate, model: torch.nn.Module, layers: str | tuple[str, ...] = "auto", *,
    skip_zeros: bool = False, zero_fraction: float = 0.5,
) -> list[str]:
    """Parameter names to match under a layer-selection rule (see :class:`LayerSkippingConfig`)."""
    names = [n for n, _ in model.named_parameters() if n in update.tensors]
    has_bottleneck = getattr(model, "bottleneck", None) is not None
    if layers == "before_bottleneck" or (layers == "auto" and has_bottleneck):
        before = set(precode_layer_split(model)[0])  # raises ValueError without a bottleneck
        chosen = [n for n in names if n in before]
    elif layers in ("auto", "all"):
        chosen = names
    else:
        chosen = [n for n in names if any(_matches(n, s) for s in layers)]
        _check_matched(layers, names, "the update")
    if skip_zeros and chosen:
        zeros = {n: float((update.tensors[n] == 0).float().mean()) for n in chosen}
        kept = [n for n in chosen if zeros[n] < zero_fraction]
        if not kept:
            # Every candidate layer is pruned (e.g. layer-wise pruning 0.9 hits all of them): the
            # attack then matches the least-pruned of its candidate layers, zeros included, as the
            # PPP paper's targeted attack does on pruned (GC) updates (§3.3: it targets the layers
            # before the bottleneck, whatever the client perturbed), instead of giving up.
            least = min(zeros.values())
            kept = [n for n in chosen if zeros[n] <= least + 1e-6]
        chosen = kept
    if not chosen:
        raise ValueError(f"layer selection layers={layers!r}, skip_zeros={skip_zeros} leaves no layer to match")
    return chosen


class LayerSkipping(InvertingGradients):
    """Inverting Gradients on a subset of layers (PPP paper Sec. 3.3; pruned layers skipped)."""

    name = "layer-skipping"
    public_split = False
    Config = LayerSkippingConfig

    @classmethod
    def check_scenario(cls, config: LayerSkippingConfig, model, spec) -> None:
        super().check_scenario(config, model, spec)
        if config.layers == "before_bottleneck":
            precode_layer_split(model())  # raises ValueError without a bottleneck
        elif not isinstance(config.layers, str):
            _check_matched(config.layers, [n for n, _ in model().named_parameters()], "the model")

    def matched_names(self, update: SharedUpdate, knowledge: AttackerKnowledge) -> list[str]:
        c = self.config
        return select_layers(update, knowledge.model, c.layers, skip_zeros=c.skip_zeros,
                             zero_fraction=c.zero_fraction)


# --------------------------------------------------------------------------------------------------
# (b) Expectation over Transformation
# --------------------------------------------------------------------------------------------------
def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    return (a.reshape(a.shape[0], -1) * b.reshape(b.shape[0], -1)).sum(dim=1)


def _normal_like(grads: dict[str, Tensor], generator: BatchedGenerator) -> dict[str, Tensor]:
    """Standard normal noise shaped like every ``(P, ...)`` tensor of ``grads``.

    Row ``p`` comes from its own problem's generator; one draw per problem covers all layers.
    """
    ref = next(iter(grads.values()))
    if generator.rows != ref.shape[0]:
        raise ValueError(f"generator draws {generator.rows} rows; the updates have {ref.shape[0]}")
    sizes = [g[0].numel() for g in grads.values()]
    flat = generator.randn((sum(sizes),), dtype=ref.dtype)
    return {k: chunk.reshape(g.shape) for (k, g), chunk in zip(grads.items(), flat.split(sizes, dim=1))}


def gaussian_noise_simulator(std: float) -> DefenseSimulator:
    """Additive Gaussian noise ``g + std * N(0, I)`` on every layer (the noisy-gradient defense)."""
    if not (std >= 0 and math.isfinite(std)):
        raise ValueError(f"std={std}; must be a finite number >= 0")

    def simulate(grads: dict[str, Tensor], generator: BatchedGenerator) -> dict[str, Tensor]:
        noise = _normal_like(grads, generator)
        return {k: g + std * noise[k] for k, g in grads.items()}

    return simulate


def orthogonal_resampling_simulator() -> DefenseSimulator:
    """CENSOR's candidate generation (Alg. 1 lines 24-36), per layer and per problem.

    ``g_r ~ N(0, I)``; ``g_o = g_r - <g_r, g>/<g, g> g`` (Eq. 12); ``g_o <- g_o ||g|| / ||g_o||``.
    CENSOR then keeps the candidate with the lowest loss on the *private* batch (lines 15-19), which
    the attacker cannot evaluate, so the simulation stops at the normalised candidate.
    """

    def simulate(grads: dict[str, Tensor], generator: BatchedGenerator) -> dict[str, Tensor]:
        noise = _normal_like(grads, generator)
        out = {}
        for k, g in grads.items():
            view = (-1,) + (1,) * (g.dim() - 1)
            r = noise[k]
            gg = _row_dot(g, g).clamp_min(torch.finfo(g.dtype).tiny)
            o = r - (_row_dot(r, g) / gg).view(view) * g
            scale = gg.sqrt() / _row_dot(o, o).clamp_min(torch.finfo(g.dtype).tiny).sqrt()
            out[k] = o * scale.view(view)
        return out

    return simulate


SIMULATORS = ("gaussian", "orthogonal")


@dataclass
class EOTConfig(InvertingGradientsConfig):
    """Inverting Gradients matched against the average of E simulated defense transformations."""

    eot_samples: int = limited(8, 64)
    """E: simulated transformations per objective evaluation (E = 1: one sample, no averaging)."""
    simulator: str = "gaussian"
    """Built-in defense simulation: ``"gaussian"`` (additive noise) or ``"orthogonal"`` (CENSOR)."""
    noise_std: float = 0.01
    """Standard deviation of the ``"gaussian"`` simulator (the defense's noise level)."""
    eot_average: str = "gradient"
    """``"gradient"``: match the mean simulated update (CENSOR Sec. V-D); ``"objective"``: average the
    E matching losses."""
    simulate_defense: Callable | None = None
    """Custom ``simulate_defense(grads, generator) -> grads`` replacing ``simulator``: rows of every
    ``grads`` tensor are problems x restarts, ``generator`` a :class:`BatchedGenerator` drawing the same
    rows from each problem's own generator (see :data:`leakgym.attacks.engine.DefenseSimulator`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.eot_samples = check_integer(self.eot_samples, "eot_samples", 1)
        if self.simulator not in SIMULATORS:
            raise ValueError(f"simulator={self.simulator!r}; allowed: {SIMULATORS}")
        if not (self.noise_std >= 0 and math.isfinite(self.noise_std)):
            raise ValueError(f"noise_std={self.noise_std}; must be a finite number >= 0")
        if self.eot_average not in ("gradient", "objective"):
            raise ValueError(f"eot_average={self.eot_average!r}; allowed: 'gradient', 'objective'")
        if self.simulate_defense is not None and not callable(self.simulate_defense):
            raise ValueError(f"simulate_defense={self.simulate_defense!r} must be callable")


class EOT(InvertingGradients):
    """Expectation over Transformation (CENSOR paper Sec. V-D) on top of Inverting Gradients.

    At every evaluation the attacker computes its dummy update ``g(x)`` for all problems, draws E
    transformations ``T_1..T_E`` from ``simulate_defense`` (each problem from its own generator, seeded
    with the problem's seed; fresh draws every evaluation) and minimises

    * ``eot_average="gradient"`` (default): ``D( (1/E) sum_e T_e(g(x)), t ) + tv TV(x)``, or
    * ``eot_average="objective"``: ``(1/E) sum_e D( T_e(g(x)), t ) + tv TV(x)``,

    differentiating through the transformations. With E = 1 this is a single-sample stochastic
    objective; larger E lowers the variance of the simulated update (for additive noise its variance
    falls as 1/E) and, for zero-mean transformations, shrinks the random component of the matched
    direction. CENSOR's orthogonal candidates have mean zero, so their average carries almost no
    information about ``g(x)`` -- which is the paper's explanation of why EOT fails against it.
    """

    name = "eot"
    public_split = False
    Config = EOTConfig

    def simulator(self) -> DefenseSimulator:
        c = self.config
        if c.simulate_defense is not None:
            return c.simulate_defense
        if c.simulator == "gaussian":
            return gaussian_noise_simulator(c.noise_std)
        return orthogonal_resampling_simulator()

    def objective(self) -> MatchingObjective:
        c = self.config
        return MatchingObjective(distance=c.distance, layer_weights=c.layer_weights, tv=c.tv,
                                 eot_samples=c.eot_samples, eot_average=c.eot_average,
                                 simulate_defense=self.simulator())


# --------------------------------------------------------------------------------------------------
# (c) Prior initialisation
# --------------------------------------------------------------------------------------------------
@dataclass
class PriorInitConfig(InvertingGradientsConfig):
    """Inverting Gradients started from the public data's class-mean images."""

    prior_noise: float = 0.0
    """Std of Gaussian noise (normalised space) added to the class means; give restarts > 1 a noise
    level > 0 or every restart starts from the same image."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.prior_noise >= 0 and math.isfinite(self.prior_noise)):
            raise ValueError(f"prior_noise={self.prior_noise}; must be a finite number >= 0")


def class_mean_images(public_x: Tensor, public_y: Tensor, num_classes: int) -> Tensor:
    """Mean unit image per class ``(num_classes, C, H, W)`` on ``public_x``'s device; the overall mean
    for absent classes."""
    if public_x.shape[0] == 0 or public_x.shape[0] != public_y.shape[0]:
        raise ValueError(
            f"public_x ({public_x.shape[0]} images) and public_y ({public_y.shape[0]} labels) must be non-empty and pair up"
        )
    x = public_x.double()
    y = public_y.long().reshape(-1).to(x.device)
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise ValueError(f"public_y has labels outside [0, {num_classes - 1}]")
    sums = torch.zeros(num_classes, *x.shape[1:], dtype=x.dtype, device=x.device).index_add_(0, y, x)
    counts = torch.bincount(y, minlength=num_classes).to(x.dtype)
    means = sums / counts.clamp_min(1).view(-1, *([1] * (x.dim() - 1)))
    absent = counts == 0
    means[absent] = x.mean(dim=0)
    return means.to(public_x.dtype)


class PriorInit(InvertingGradients):
    """Inverting Gradients initialised with the class-mean image (DCS^2 paper Table 4 "AvgImg").

    Measured (``tests/method_checks.py``: digits 16x16, LeNet, B = 1, labels known, 4 images x 3 seeds):
    after 20 iterations mean SSIM 0.877, against 0.764 for its start image (the class mean itself) and
    0.172 for Inverting Gradients started from noise with the same budget.
    """

    name = "prior-init"
    public_split = True
    Config = PriorInitConfig

    def initial_images(
        self, knowledge: AttackerKnowledge, labels: Tensor | None, restarts: int, generator: torch.Generator
    ) -> Tensor:
        """Class means of the (known or inferred) labels, plus ``prior_noise`` times standard normal noise."""
        if knowledge.public_x is None or knowledge.public_y is None:
            raise ValueError("prior-init needs knowledge.public_x and knowledge.public_y (the public split)")
        if labels is None:
            raise ValueError("prior-init needs known or inferred labels to pick class means")
        spec, device = knowledge.spec, generator.device
        public_x, public_y = knowledge.public_x, knowledge.public_y
        # computed once per public split (public_split.derived): a game's split is fixed for its episode
        means = derived(public_x, ("class means", spec.num_classes, torch.device(device)),
                        lambda: class_mean_images(public_x.to(device), public_y, spec.num_classes), also=(public_y,))
        start = spec.normalize(means[labels.to(device)].float())  # (B, C, H, W)
        noise = torch.randn(restarts, *start.shape, generator=generator, device=device)
        return start.unsqueeze(0) + self.config.prior_noise * noise

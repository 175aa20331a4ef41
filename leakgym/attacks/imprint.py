"""Robbing the Fed: the imprint module of a malicious server (Fowl et al., ICLR 2022).

Fowl, Geiping, Czaja, Goldblum & Goldstein, "Robbing the Fed: Directly Obtaining Private Data in
Federated Learning with Modified Models" (RTF), as the OASIS paper uses it (Jeter et al., §III-A and
§IV-A: the malicious fully connected layer is placed right after the input, FedSGD updates):

* The server inserts, before the model, a layer ``Linear(d, n)`` followed by a ReLU. Every row measures
  the same scalar quantity of the flattened input, ``m(x) = w . x`` -- its brightness (``w = 1/d``, the
  "average" measurement) or a random direction -- and row ``i`` has bias ``-t_i`` with thresholds
  ``t_0 < t_1 < ... < t_{n-1}`` at the quantiles ``i / n`` of the measurement's distribution, so
  neuron ``i`` is active exactly for the inputs with ``m(x) > t_i`` (a *cumulative* binning; ``t_0``
  is below any possible measurement, so neuron 0 is always active).
* A second layer ``Linear(n, d)`` with all-one weights maps the bin activations back to input size.
  Because every column of it is the same, an example ``x_j`` contributes the same coefficient
  ``c_j = 1 . dL/d(out_j)`` to every neuron it activates: ``dL/dW_i = sum_{m_j > t_i} c_j x_j`` and
  ``dL/db_i = sum_{m_j > t_i} c_j``.
* Recovery (RTF Eq. 4; OASIS §III-A): consecutive neurons differ exactly by the examples whose
  measurement falls in bin ``[t_i, t_{i+1})``, so

      x = (dL/dW_i - dL/dW_{i+1}) / (dL/db_i - dL/db_{i+1})

  is exact whenever that bin holds a single example (the last bin uses neuron ``n-1`` alone). Bins
  with several examples give their ``c``-weighted mixture -- which is what OASIS exploits: rotated and
  flipped copies of an image have the same brightness, fall in the same bin, and only their mixture
  can be recovered.

Thresholds. With public data (``public_x`` passed to :meth:`ImprintAttack.prepare_model`, unit images
of the public split) the thresholds are the empirical quantiles of the public measurements (linear
interpolation). Without data they are the quantiles of a standard normal, ``t_i = Phi^{-1}(i / n)``,
the fallback of Fowl et al. (and of breaching's ``ImprintBlock``), which assumes the measurement of a
normalised image is roughly ``N(0, 1)``. That fits poorly for brightness (the per-image mean of a
normalised image has a much smaller spread), so far fewer bins are used; pass public data when you have
it.

Deviation, and why. In RTF (and breaching) the second linear layer's output *replaces* the input, so
the rest of the network sees a distorted image. Here the block is a straight-through residual,
``out = x + (u - stopgrad(u))`` with ``u = linear2(relu(linear0(stopgrad(x))))``: its value is exactly
``x`` -- the wrapped model computes the same function as the original, with the same input gradient --
while the parameter gradients of ``linear0`` are exactly those of RTF's block with an identity
connection. The server thus gains the imprint without harming the task. Wrapping keeps every original
parameter name and adds ``imprint.linear0.*`` and ``imprint.linear2.*``; the block is applied by a
forward pre-hook (:func:`insert_input_block`), so ``forward(x, return_kl=...)``, ``head``,
``bottleneck`` and :func:`leakgym.models.task_loss` keep working on the wrapped model.
``LeakGymModel.features`` and ``backbone_features`` bypass the hook; as the block's value is the
identity they return the same values.

FedAvg. After one local step the model delta is ``lr`` times the gradient and the recovery is
unchanged (the ratio cancels ``lr``) up to the delta's float32 rounding: a bin whose bias difference lies
within that rounding counts as empty (:func:`~leakgym.attacks.analytic.delta_rounding`). After several
steps the imprint layer's own weights move between steps (bins shift by ``lr * dL/db``), and bins become
approximate.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init

from leakgym.attacks.analytic import (
    InputBlockAttack,
    image_box,
    recover_linear_input,
)
from leakgym.attacks.base import check_integer, check_option_types, check_seed, check_tolerance, limited
from leakgym.attacks.public_split import derived
from leakgym.data import DatasetSpec
from leakgym.optim.randomness import seeded_generator

__all__ = [
    "IMPRINT_MEASUREMENTS",
    "ImprintAttack",
    "ImprintBlock",
    "ImprintConfig",
    "imprint_thresholds",
    "insert_input_block",
    "recover_imprint_bins",
]

IMPRINT_MEASUREMENTS = ("brightness", "random")


class ImprintBlock(nn.Module):
    """``Linear(d, n) -> ReLU -> Linear(n, d)``, added to the flattened input straight-through.

    The structure shared by the malicious layers of Robbing the Fed (:class:`ImprintAttack`) and of
    trap weights (:class:`~leakgym.attacks.trap_weights.TrapWeightsAttack`); they differ only in how
    ``linear0`` and ``linear2`` are set. ``forward(x)`` returns ``x`` (exactly), and backpropagates into
    ``linear0``/``linear2`` as if ``linear2(relu(linear0(x)))`` had been added to ``x``.
    """

    def __init__(self, in_features: int, num_neurons: int) -> None:
        super().__init__()
        if in_features < 1:
            raise ValueError(f"in_features={in_features}; must be >= 1")
        if num_neurons < 1:
            raise ValueError(f"num_neurons={num_neurons}; must be >= 1")
        # Its users set every weight, so the layers start at zero (torch.nn.utils.skip_init): no draw from
        # torch's global RNG (which PRECODE clients sample from), and no random initialisation to overwrite
        # (42 ms a block at TinyImageNet's 12,288 inputs and 500 neurons, one thread, every round).
        self.linear0 = skip_init(nn.Linear, in_features, num_neurons)
        self.linear2 = skip_init(nn.Linear, num_neurons, in_features)
        with torch.no_grad():
            for p in self.parameters():
                p.zero_()

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(1)
        if flat.shape[1] != self.linear0.in_features:
            raise ValueError(
                f"the malicious block expects inputs of {self.linear0.in_features} values, got shape {tuple(x.shape)}"
            )
        u = self.linear2(F.relu(self.linear0(flat.detach())))
        return x + (u - u.detach()).reshape(x.shape)

    def input_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Forward pre-hook: pass the model's input ``x`` (first positional or ``x=``) through the block."""
        if args:
            return (self(args[0]), *args[1:]), kwargs
        if "x" in kwargs:
            return args, {**kwargs, "x": self(kwargs["x"])}
        raise ValueError("the wrapped model was called without an input tensor")


def insert_input_block(model: nn.Module, block: nn.Module, name: str) -> nn.Module:
    """A deep copy of ``model`` whose input first goes through ``block`` (registered as ``name``).

    The original model is not modified. The copy keeps its class, its parameter names and its
    methods; ``block``'s parameters appear as ``<name>.*``. ``block`` must define
    ``input_hook(module, args, kwargs)`` (see :class:`ImprintBlock`).
    """
    if not name or "." in name:
        raise ValueError(f"block name {name!r} must be a non-empty name without dots")
    if hasattr(model, name):
        raise ValueError(f"{type(model).__name__} already has an attribute {name!r}; was it prepared twice?")
    wrapped = copy.deepcopy(model)
    ref = next(wrapped.parameters(), None)
    if ref is not None:
        block = block.to(device=ref.device, dtype=ref.dtype)
    wrapped.add_module(name, block)
    wrapped.register_forward_pre_hook(block.input_hook, with_kwargs=True)
    return wrapped


#: Where in the gap between two public measurements a threshold goes (see :func:`_between_values`).
GAP_FRACTION = 1 - 1 / math.sqrt(2)


def _between_values(thresholds: Tensor, measured: Tensor) -> Tensor:
    """Move every threshold into the gap between the public measurements around it, off their lattice.

    Digit images take few distinct brightness values, so a quantile often *equals* a measurement that
    many images share; an image measured exactly on a threshold falls on either side by float32
    rounding of the server's layer, i.e. by the BLAS kernel's summation order. Then the rotated or
    flipped copies of one image (same brightness: OASIS's argument) land in different bins, and which
    images are recovered changes with the torch build. Brightness values lie on a lattice (sums of
    quantised pixels), and the middle of a gap of an even number of lattice steps is itself a lattice
    point, i.e. the brightness of some other image; so each threshold is put at the fraction
    ``1 - 1/sqrt(2)`` of its gap, which is no lattice point for any gap (irrational) and at least 5%
    of a step away from one for gaps of up to 10 steps. It splits the public data as the quantile
    does, except that images tied with the quantile all count as below it. A threshold equal to the
    largest measurement (the top public images share one brightness) moves above it by the same
    fraction of the last gap; thresholds beyond it stay where they are.
    """
    values = torch.unique(measured)  # sorted
    # Images of equal brightness measure equal only up to float64 rounding (their pixels are summed in
    # another order): values closer than this are one value, or a "gap" would be a rounding error.
    tol = 1e-9 * max(float(values.abs().max()), 1.0)
    values = values[torch.cat([torch.ones(1, dtype=torch.bool), values.diff() > tol])]
    idx = torch.searchsorted(values, thresholds, right=True)  # values[idx - 1] <= t < values[idx]
    inside = (idx > 0) & (idx < values.numel())
    lo = values[(idx - 1).clamp(min=0)]
    hi = values[idx.clamp(max=values.numel() - 1)]
    top = values[-1]
    last_gap = top - values[-2] if values.numel() > 1 else top.abs().clamp_min(1.0)
    on_top = (idx == values.numel()) & (thresholds <= top + tol)  # `right=True` puts t == max past the end
    moved = torch.where(on_top, top + last_gap * GAP_FRACTION, thresholds)
    return torch.where(inside, lo + (hi - lo) * GAP_FRACTION, moved)


def imprint_thresholds(
    direction: Tensor,
    num_bins: int,
    spec: DatasetSpec,
    public_x: Tensor | None = None,
) -> Tensor:
    """Ascending thresholds ``t_0 < ... < t_{n-1}`` of the cumulative bins (float64, ``(n,)``).

    ``t_i`` is the quantile ``i / n`` of the measurement ``direction . x`` over the normalised
    ``public_x`` (unit images), moved into the gap between the public measurements around it
    (:func:`_between_values`), or of ``N(0, 1)`` without public data (Fowl et al.'s fallback).
    ``t_0`` lies below every measurement a valid image can produce, so neuron 0 is always active.
    """
    if num_bins < 2:
        raise ValueError(f"num_bins={num_bins}; must be >= 2")
    levels = torch.arange(1, num_bins, dtype=torch.float64) / num_bins
    w = direction.detach().to(torch.float64).cpu()
    if public_x is not None:
        if public_x.dim() != 4 or tuple(public_x.shape[1:]) != spec.shape or public_x.shape[0] < 2:
            raise ValueError(
                f"public_x must be (N >= 2, {', '.join(map(str, spec.shape))}) unit images, got shape "
                f"{tuple(public_x.shape)}"
            )
        measured = spec.normalize(public_x.detach().to(torch.float64).cpu()).flatten(1) @ w
        inner = _between_values(torch.quantile(measured, levels), measured)
    else:
        normal = NormalDist()
        inner = torch.tensor([normal.inv_cdf(float(q)) for q in levels], dtype=torch.float64)
    lo, hi = image_box(spec)
    max_abs = float(torch.maximum(lo.abs(), hi.abs()).max())
    floor = -(float(w.abs().sum()) * max_abs + 1.0)
    return torch.cat([torch.tensor([floor], dtype=torch.float64), inner])


def recover_imprint_bins(
    weight_grad: Tensor, bias_grad: Tensor, bias: Tensor, *, rel_tol: float = 1e-6,
    rounding: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-bin inputs ``(dW_i - dW_{i+1}) / (db_i - db_{i+1})`` of a cumulative imprint layer (RTF Eq. 4).

    Args:
        weight_grad: ``(n, d)`` gradient of ``linear0.weight``.
        bias_grad: ``(n,)`` gradient of ``linear0.bias``.
        bias: ``(n,)`` the layer's bias as sent (``-t_i``); it orders the neurons by threshold, so the
            rows may come in any order.
        rel_tol: bins with ``|db_i - db_{i+1}| <= rel_tol * max`` count as empty.
        rounding: optional bounds of the rounding in ``weight_grad`` and ``bias_grad`` entries (a model
            delta's, :func:`~leakgym.attacks.analytic.delta_rounding`): a bin whose bias difference does
            not exceed the two rows' bounds counts as empty too.

    Returns:
        ``(candidates (K, d) float64, strength (K,))``: one vector per non-empty bin and the magnitude
        of its bias-gradient difference.
    """
    if bias.shape != bias_grad.shape:
        raise ValueError(f"bias has shape {tuple(bias.shape)}; bias_grad has {tuple(bias_grad.shape)}")
    order = torch.argsort(bias.detach().to(device=weight_grad.device, dtype=torch.float64), descending=True, stable=True)
    cum_w = weight_grad.detach().to(torch.float64)[order]
    cum_b = bias_grad.detach().to(torch.float64)[order]
    bin_w = cum_w - torch.cat([cum_w[1:], torch.zeros_like(cum_w[:1])])
    bin_b = cum_b - torch.cat([cum_b[1:], torch.zeros_like(cum_b[:1])])
    bin_rounding = None
    if rounding is not None:
        cum_r = rounding[1].to(device=cum_b.device, dtype=torch.float64)[order]
        bin_rounding = cum_r + torch.cat([cum_r[1:], torch.zeros_like(cum_r[:1])])
    candidates, rows = recover_linear_input(bin_w, bin_b, rel_tol=rel_tol, bias_rounding=bin_rounding)
    return candidates, bin_b[rows].abs()


@dataclass
class ImprintConfig:
    """Options of :class:`ImprintAttack`."""

    num_bins: int = limited(256, 4096)
    """Number n of attacked neurons (bins); OASIS uses 500-900 on CIFAR-100/ImageNet."""
    measurement: str = "brightness"
    """What the bins measure: "brightness" (mean normalised pixel) or "random" (a random direction)."""
    seed: int = 0
    """Seed of the random measurement direction."""
    rel_tol: float = 1e-6
    """Bins with |db_i - db_{i+1}| <= rel_tol * max count as empty, in [0, 1)."""
    box_tol: float = 0.05
    """Slack of the valid-image box test (ranks bins when there are more than batch_size), >= 0."""

    def __post_init__(self) -> None:
        check_option_types(self)
        self.num_bins = check_integer(self.num_bins, "num_bins", 2)  # (True passed isinstance(..., int))
        if self.measurement not in IMPRINT_MEASUREMENTS:
            raise ValueError(f"measurement={self.measurement!r}; allowed: {IMPRINT_MEASUREMENTS}")
        if not 0.0 <= self.rel_tol < 1.0:
            raise ValueError(f"rel_tol={self.rel_tol}; allowed range [0, 1)")
        self.box_tol = check_tolerance(self.box_tol, "box_tol")
        self.seed = check_seed(self.seed)


class ImprintAttack(InputBlockAttack):
    """Robbing the Fed (Fowl et al. 2022): imprint bins before the model, invert bin differences.

    ``prepare_model(model, spec, public_x=None)`` returns a wrapped copy (see the module docstring);
    :meth:`reconstruct` recovers one image per non-empty bin. When more bins are non-empty than
    ``knowledge.batch_size`` (a client that trains on more examples than it declares, e.g. OASIS's
    augmented copies), the bins whose vectors lie inside the valid-image box are preferred, then the
    ones with the largest bias-gradient difference. Empty slots hold zeros (the dataset-mean image).
    """

    name: ClassVar[str] = "imprint"
    public_split = True
    Config: ClassVar[type] = ImprintConfig
    malicious: ClassVar[bool] = True
    #: Name of the inserted block; its layers are ``imprint.linear0`` and ``imprint.linear2``.
    block_name: ClassVar[str] = "imprint"

    def measurement_direction(self, spec: DatasetSpec) -> Tensor:
        """The ``(C*H*W,)`` float64 direction every bin measures (on the CPU: the server builds its block
        there once, from ``config.seed``, and :func:`insert_input_block` moves it to the model's device)."""
        d = math.prod(spec.shape)
        if self.config.measurement == "brightness":
            return torch.full((d,), 1.0 / d, dtype=torch.float64)
        w = torch.randn(d, generator=seeded_generator(self.config.seed), dtype=torch.float64)
        return (w - w.mean()) / w.std() / math.sqrt(d)

    def prepare_model(self, model: nn.Module, spec: DatasetSpec, *, public_x: Tensor | None = None) -> nn.Module:
        """A copy of ``model`` with the imprint block before it; ``model`` itself is unchanged.

        Args:
            model: the honest global model.
            spec: its dataset description.
            public_x: optional unit images of the public split, to place the bins at the empirical
                quantiles of the measurement (else standard-normal quantiles).
        """
        cfg: ImprintConfig = self.config
        d = math.prod(spec.shape)
        direction = self.measurement_direction(spec)
        if public_x is None:
            thresholds = imprint_thresholds(direction, cfg.num_bins, spec)
        else:  # once per public split (public_split.derived): the direction is fixed by the settings and spec
            thresholds = derived(public_x, ("imprint thresholds", cfg.measurement, cfg.seed, cfg.num_bins, spec),
                                 lambda: imprint_thresholds(direction, cfg.num_bins, spec, public_x))
        block = ImprintBlock(d, cfg.num_bins)
        with torch.no_grad():
            block.linear0.weight.copy_(direction.expand(cfg.num_bins, d))
            block.linear0.bias.copy_(-thresholds)
            block.linear2.weight.fill_(1.0)
            block.linear2.bias.zero_()
        return insert_input_block(model, block, self.block_name)

    def _candidates(self, update, knowledge, weight_grad, bias_grad, rounding):
        params = dict(knowledge.model.named_parameters())
        if f"{self.layer}.bias" not in params:
            raise ValueError(
                f"knowledge.model has no parameter {self.layer + '.bias'!r}; pass the model returned by prepare_model"
            )
        candidates, strength = recover_imprint_bins(
            weight_grad, bias_grad, params[f"{self.layer}.bias"], rel_tol=self.config.rel_tol, rounding=rounding
        )
        return candidates, strength, {}

"""Trap weights: the malicious first layer of "When the Curious Abandon Honesty" (Boenisch et al.).

Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov & Papernot, "When the Curious Abandon Honesty:
Federated Learning Is Not Private" (CAH; arXiv 2021, IEEE EuroS&P 2023), as the OASIS paper uses it
(Jeter et al., §III-A: the malicious fully connected layer sits right after the input).

The server sets the weights of a fully connected layer followed by a ReLU so that each neuron is
activated by only a few inputs: then, in a batch, many neurons are activated by exactly one example
``x_t``, their gradients are that example's alone, and

    x_t = dL/dW_i / dL/db_i                                                     (OASIS Eq. 6)

recovers it exactly. CAH's *trap weights* achieve this for nonnegative inputs (unit images): every
row is drawn with positive entries, a random half of them is made negative, and the two halves are
rescaled against each other so that the negative half slightly dominates; the pre-activation of a
typical image is then negative, and only images whose mass happens to fall on the row's positive
entries activate it. Here: magnitudes ``U(0, 1)``, exactly ``floor(d / 2)`` entries negated per row,
positive entries multiplied by ``scale_factor`` (``< 1``: the negative half dominates; only the ratio
of the two halves matters, because the bias is zero and a positive rescaling of a row changes no
activation pattern), bias zero.

The rows act on unit images ``u``; the model receives normalised images ``x = (u - mean) / std``, so
the layer absorbs the normalisation: ``W' = W diag(std)``, ``b' = W mean`` give ``W' x + b' = W u``.

Which rows to trust. A row activated by one example gives that example; a row activated by several
gives a mixture. The recovered vectors are grouped (:func:`~leakgym.attacks.analytic.select_candidates`):
an example alone in two or more neurons gives the same vector in each, whereas a mixture of the same
examples is weighted differently by different neurons -- the second layer's columns are random
Gaussian vectors, so the coefficient ``dL/dy_i`` an example contributes differs from neuron to neuron.
Agreeing vectors come first, then vectors inside the valid-image box, then the rest; ``batch_size``
slots are filled (set ``certified_only=True`` to keep agreeing vectors only).

The block is the straight-through :class:`~leakgym.attacks.imprint.ImprintBlock` (the wrapped model
computes exactly the original function; see :mod:`leakgym.attacks.imprint` for the deviation from the
papers' replacing layer) registered as ``trap``: its parameters are ``trap.linear0.*`` and
``trap.linear2.*``.

FedAvg: after one local step the model delta is ``lr`` times the gradient and the recovery is exact up to
the delta's float32 rounding, which the agreement test's tolerance allows for
(:func:`~leakgym.attacks.analytic.agreement_tolerance`);
after several, the trap layer's weights move between steps and the recovered vectors are approximate.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from leakgym.attacks.analytic import (
    InputBlockAttack,
    agreement_tolerance,
    recover_linear_input,
)
from leakgym.attacks.base import check_integer, check_option_types, check_seed, check_tolerance, limited
from leakgym.attacks.imprint import ImprintBlock, insert_input_block
from leakgym.data import DatasetSpec
from leakgym.optim.randomness import seeded_generator

__all__ = ["TrapWeightsAttack", "TrapWeightsConfig", "trap_weights"]


def trap_weights(
    num_neurons: int, in_features: int, scale_factor: float, *, generator: torch.Generator
) -> Tensor:
    """CAH trap weights for unit (nonnegative) inputs: ``(num_neurons, in_features)`` float64.

    Each row: magnitudes ``U(0, 1)``; a random ``floor(in_features / 2)`` of them negated; the positive
    ones multiplied by ``scale_factor`` in (0, 1].
    """
    if num_neurons < 1 or in_features < 2:
        raise ValueError(f"need num_neurons >= 1 and in_features >= 2, got {num_neurons} and {in_features}")
    if not 0.0 < scale_factor <= 1.0:
        raise ValueError(f"scale_factor={scale_factor}; allowed range (0, 1]")
    magnitudes = torch.rand((num_neurons, in_features), generator=generator, dtype=torch.float64)
    # A random half of each row: the first floor(d/2) entries of a per-row random permutation.
    ranks = torch.argsort(torch.rand((num_neurons, in_features), generator=generator, dtype=torch.float64), dim=1)
    negative = ranks < in_features // 2
    return torch.where(negative, -magnitudes, scale_factor * magnitudes)


@functools.lru_cache(maxsize=2)
def _trap_block(num_neurons: int, scale_factor: float, seed: int, spec: DatasetSpec,
                dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """The trap block's ``linear0`` weight and bias and ``linear2`` weight in ``dtype`` (read-only: shared).

    Built on the CPU from ``seed`` (the same block whatever the model's device; ``insert_input_block`` moves
    it to the model's device), once per setting: every game and round of a scenario sends the same block,
    and drawing it took 0.75 s at TinyImageNet's 12,288 inputs and 500 neurons (one thread, each round).
    Held for the process, at most two settings: 2 x neurons x inputs values each (49 MB at that size in
    float32, 602 MB at Imagenette's 224 px), as large as the block every prepared model carries.
    """
    d = math.prod(spec.shape)
    generator = seeded_generator(seed)
    weight = trap_weights(num_neurons, d, scale_factor, generator=generator)
    # Absorb the normalisation: W u = W (std * x + mean) = (W diag(std)) x + W mean.
    like = torch.zeros((1, *spec.shape), dtype=torch.float64)
    ones = torch.ones_like(like)
    mean = spec.denormalize(like).flatten()            # the unit image of x = 0
    std = (spec.denormalize(ones) - spec.denormalize(like)).flatten()
    out = torch.randn((d, num_neurons), generator=generator, dtype=torch.float64) / math.sqrt(d)
    return (weight * std).to(dtype), (weight @ mean).to(dtype), out.to(dtype)


@dataclass
class TrapWeightsConfig:
    """Options of :class:`TrapWeightsAttack`."""

    num_neurons: int = limited(500, 4096)
    """Number n of neurons of the trap layer (OASIS uses 100-700)."""
    scale_factor: float = 0.85
    """Factor on each row's positive half, in (0, 1]; smaller: fewer inputs activate a neuron.

    0.85 activates each neuron for ~18% of 16x16 digit images (0.8: ~10%, 0.95: ~40%); tune it per
    dataset, as CAH do, so that a neuron is rarely activated by more than one example of a batch."""
    seed: int = 0
    """Seed of the trap weights and of the second layer."""
    rel_tol: float = 1e-6
    """Rows with |dL/db_i| <= rel_tol * max |dL/db| count as inactive, in [0, 1)."""
    match_tol: float = 1e-5
    """Relative distance under which two rows' recovered vectors count as the same, in (0, 1)."""
    box_tol: float = 0.05
    """Slack of the valid-image box test, as a fraction of the box width, >= 0."""
    certified_only: bool = False
    """Return only vectors that two or more neurons agree on; else fill every slot with the best candidates."""

    def __post_init__(self) -> None:
        check_option_types(self)
        self.num_neurons = check_integer(self.num_neurons, "num_neurons", 1)  # (True passed isinstance(..., int))
        if not 0.0 < self.scale_factor <= 1.0:
            raise ValueError(f"scale_factor={self.scale_factor}; allowed range (0, 1]")
        if not 0.0 <= self.rel_tol < 1.0:
            raise ValueError(f"rel_tol={self.rel_tol}; allowed range [0, 1)")
        if not 0.0 < self.match_tol < 1.0:
            raise ValueError(f"match_tol={self.match_tol}; allowed range (0, 1)")
        self.box_tol = check_tolerance(self.box_tol, "box_tol")
        self.seed = check_seed(self.seed)
        if not isinstance(self.certified_only, bool):
            raise ValueError(f"certified_only={self.certified_only!r}; allowed: True or False")  # noqa: TRY004 - bad input is a ValueError


class TrapWeightsAttack(InputBlockAttack):
    """Curious Abandon Honesty (Boenisch et al.): a trap-weight layer before the model.

    ``prepare_model(model, spec)`` returns a wrapped copy; :meth:`reconstruct` inverts every active
    neuron and returns the most credible ``batch_size`` recovered images (see the module docstring).
    """

    name: ClassVar[str] = "trap-weights"
    public_split = False
    Config: ClassVar[type] = TrapWeightsConfig
    malicious: ClassVar[bool] = True
    #: Name of the inserted block; its layers are ``trap.linear0`` and ``trap.linear2``.
    block_name: ClassVar[str] = "trap"

    def prepare_model(self, model: nn.Module, spec: DatasetSpec, *, public_x: Tensor | None = None) -> nn.Module:
        """A copy of ``model`` with the trap layer before it; ``model`` itself is unchanged."""
        cfg: TrapWeightsConfig = self.config
        d = math.prod(spec.shape)
        block = ImprintBlock(d, cfg.num_neurons)
        weight, bias, out = _trap_block(cfg.num_neurons, cfg.scale_factor, cfg.seed, spec, block.linear0.weight.dtype)
        with torch.no_grad():
            block.linear0.weight.copy_(weight)
            block.linear0.bias.copy_(bias)
            block.linear2.weight.copy_(out)
            block.linear2.bias.zero_()
        return insert_input_block(model, block, self.block_name)

    def _candidates(self, update, knowledge, weight_grad, bias_grad, rounding):
        cfg: TrapWeightsConfig = self.config
        candidates, rows = recover_linear_input(weight_grad, bias_grad, rel_tol=cfg.rel_tol,
                                                bias_rounding=None if rounding is None else rounding[1])
        strength = bias_grad.detach().to(torch.float64)[rows].abs()
        match_tol = agreement_tolerance(cfg.match_tol, rounding, weight_grad, bias_grad, rows)
        return candidates, strength, {"match_tol": match_tol, "require_agreement": cfg.certified_only}

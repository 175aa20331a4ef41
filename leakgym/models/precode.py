"""PRECODE: the variational bottleneck privacy module.

PRECODE (Scheliga, Mäder & Seeland, WACV 2022, "PRECODE - A Generic Model Extension to Prevent Deep
Gradient Leakage"; analysed in Scheliga et al. 2022, "Combining Variational Modeling with Partial
Gradient Perturbation to Prevent Deep Gradient Leakage", the PPP paper) inserts a variational
bottleneck (VB) between the last feature-extracting layer and the classifier head:

* PPP Eq. 2: a probabilistic encoder maps the feature vector ``h`` to a Gaussian
  ``q(z | h) = N(mu(h), diag(sigma(h)^2))`` with ``K`` latent dimensions; a sample ``z`` is drawn with
  the reparameterisation trick ``z = mu + sigma * eps, eps ~ N(0, I)`` and a decoder maps ``z`` back to
  the feature dimension, ``h' = W_dec z + b_dec``; the head then classifies ``h'``.
* PPP Eq. 3: the training loss becomes ``L = CE(y, f(h')) + beta * KL(q(z | h) || N(0, I))``.

Details follow the official implementation (github.com/dAI-SY-Group/PRECODE,
``src/VariationalBottleneck.py``): one ``Linear(D, 2K)`` encoder whose first ``K`` outputs are ``mu``
and whose last ``K`` outputs give ``sigma = softplus(.)``; a ``Linear(K, D)`` decoder; defaults
``K = 256`` and ``beta = 1e-3``; the KL term is summed over latent dimensions, averaged over the batch
and expressed in bits (divided by ``ln 2``), exactly as ``VariationalBottleneck.loss`` computes it.

Deviations, and why:

* Evaluation mode. The official module samples in every mode. Here the block samples in training mode
  and returns the decoder of the mean ``mu`` in eval mode, so server-side test accuracy is
  deterministic. Set ``sample_in_eval=True`` to reproduce the official behaviour. Clients compute
  their updates in train mode, so the gradients an attacker sees are stochastic either way.
* Randomness. ``eps`` comes from ``torch.randn_like`` (the global torch RNG: ``randn_like`` takes no
  generator argument). This is what makes the block usable under ``torch.func.vmap(...,
  randomness="different")``; seed with ``torch.manual_seed`` / ``torch.random.fork_rng``.
* ``log sigma`` is evaluated as ``log(max(sigma, 1e-12))`` so that an underflowing softplus cannot turn
  the KL into ``inf``; this changes nothing for ``sigma >= 1e-12``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

DEFAULT_PRECODE_DIM = 256
"""Bottleneck size ``K`` of the official PRECODE implementation."""

DEFAULT_PRECODE_BETA = 1e-3
"""KL weight ``beta`` of PPP Eq. 3 (official default)."""


def check_precode_beta(beta: object) -> float:
    """``beta`` as a float when it is a finite real number >= 0 (numpy floats too, not a bool); a ``ValueError``
    naming it otherwise (``inf`` made every task loss ``inf``; a string or None raised a ``TypeError``)."""
    if isinstance(beta, (bool, np.bool_)) or not isinstance(beta, numbers.Real) or not 0 <= beta < math.inf:  # NaN too
        raise ValueError(f"precode_beta={beta!r}; allowed: a finite number >= 0")
    return float(beta)

_LOG_FLOOR = 1e-12


class VariationalBottleneck(nn.Module):
    """The PRECODE variational bottleneck (PPP paper Eq. 2), acting on flat features ``(N, D)``.

    Args:
        in_features: feature dimension ``D`` (the classifier head's ``in_features``).
        latent_dim: bottleneck size ``K``.
        sample_in_eval: if True, sample ``z`` in eval mode too (official behaviour); otherwise eval
            mode uses ``z = mu``.

    ``forward(h)`` returns ``(h_out, kl)`` with ``h_out`` of shape ``(N, D)`` and ``kl`` the 0-dim
    batch-mean KL divergence ``KL(N(mu, sigma^2) || N(0, I))`` in bits (unweighted; the model's
    ``precode_beta`` weights it in :func:`leakgym.models.task_loss`).
    """

    def __init__(self, in_features: int, latent_dim: int = DEFAULT_PRECODE_DIM, *,
                 sample_in_eval: bool = False) -> None:
        super().__init__()
        if in_features < 1:
            raise ValueError(f"in_features={in_features} must be >= 1")
        if latent_dim < 1:
            raise ValueError(f"latent_dim (precode_dim)={latent_dim} must be >= 1")
        self.in_features = in_features
        self.latent_dim = latent_dim
        self.sample_in_eval = sample_in_eval
        self.encoder = nn.Linear(in_features, 2 * latent_dim)
        self.decoder = nn.Linear(latent_dim, in_features)

    def encode(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior parameters ``(mu, sigma)``, each ``(N, K)``."""
        stats = self.encoder(h)
        mu, pre_sigma = stats[:, : self.latent_dim], stats[:, self.latent_dim:]
        return mu, F.softplus(pre_sigma)

    @staticmethod
    def kl_divergence(mu: Tensor, sigma: Tensor) -> Tensor:
        """``KL(N(mu, sigma^2) || N(0, I))`` summed over latent dims, batch-averaged, in bits."""
        log_sigma = sigma.clamp_min(_LOG_FLOOR).log()
        kl_nats = 0.5 * (mu.pow(2) + sigma.pow(2) - 1.0 - 2.0 * log_sigma).sum(dim=1)
        return kl_nats.mean() / math.log(2.0)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        if h.dim() != 2 or h.shape[1] != self.in_features:
            raise ValueError(f"VariationalBottleneck expects (N, {self.in_features}) features, "
                             f"got shape {tuple(h.shape)}")
        mu, sigma = self.encode(h)
        if self.training or self.sample_in_eval:
            z = mu + sigma * torch.randn_like(sigma)  # reparameterisation trick
        else:
            z = mu
        return self.decoder(z), self.kl_divergence(mu, sigma)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, latent_dim={self.latent_dim}, " \
               f"sample_in_eval={self.sample_in_eval}"


def precode_layer_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """Split parameter names at the PRECODE bottleneck (PPP paper Sec. 3.3-3.4).

    Returns ``(before, after)``: ``before`` are the parameters of the layers preceding the
    bottleneck (the only gradients the PPP attack of Eq. 4 matches, and the ones PPP perturbs);
    ``after`` are the bottleneck's encoder/decoder and the classifier head, whose gradients are
    stochastic. Both lists follow ``model.named_parameters()`` order and together cover every
    parameter exactly once.

    Raises:
        ValueError: if ``model`` has no PRECODE bottleneck.
    """
    bottleneck = getattr(model, "bottleneck", None)
    if not isinstance(bottleneck, VariationalBottleneck):
        raise ValueError(  # noqa: TRY004 - the library reports all bad input as ValueError
            f"precode_layer_split needs a model with a PRECODE bottleneck; {type(model).__name__} has "
            f"bottleneck={bottleneck!r} (build it with build_model(..., precode=True))"
        )
    after_prefixes = ("bottleneck.", "head.")
    before, after = [], []
    for name, _ in model.named_parameters():
        (after if name.startswith(after_prefixes) else before).append(name)
    return before, after

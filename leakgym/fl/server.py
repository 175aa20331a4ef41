"""The federated-learning server: holds the global model, aggregates updates, measures accuracy."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leakgym.fl.update import SharedUpdate
from leakgym.models import in_mode


def correct_predictions(logits: Tensor, labels: Tensor) -> Tensor:
    """Whether each example is classified correctly: the arg-max class is its label *and* its logits
    are finite. ``argmax`` over NaN logits returns an index (the first NaN), so a diverged model
    would otherwise score the share of one class (~10% on ten classes) instead of nothing."""
    return (logits.argmax(dim=-1) == labels) & torch.isfinite(logits).all(dim=-1)


def check_weights(weights) -> None:
    """Aggregation weights (example counts) must be finite and >= 0: ``ValueError`` naming them. A weight
    of 0 leaves its update out; when every weight is 0 the model does not change."""
    values = [float(w) for w in weights]
    if not all(math.isfinite(w) and w >= 0 for w in values):
        raise ValueError(f"aggregation weights {values}; allowed: finite numbers >= 0 (example counts)")


class Server:
    """Global model + aggregation (FedSGD or FedAvg) + held-out evaluation.

    Aggregation is the example-weighted mean of the clients' updates over the global model's
    parameters (keys a maliciously modified model adds, such as an imprint block, are ignored).
    FedSGD updates are gradients and are applied as ``w -= lr * mean_gradient``; FedAvg updates are
    model differences ``w_before - w_after`` and are applied as ``w -= mean_delta`` (server learning
    rate 1, the original FedAvg). BatchNorm running statistics are averaged from the clients'
    ``buffers`` when they share them. An update marked ``metadata["skipped"] = True`` (a client that
    withheld its update this round, e.g. CENSOR's ``"skip"`` fallback) is left out entirely, as if
    the client had not been selected; when every update is skipped the model does not change.
    """

    def __init__(self, model: nn.Module, *, lr: float, eval_x: Tensor, eval_y: Tensor) -> None:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:  # NaN too
            raise ValueError(f"server lr={lr!r}; allowed range (0, inf)")
        if eval_x.shape[0] == 0 or eval_x.shape[0] != eval_y.shape[0]:
            raise ValueError(f"the held-out set needs >= 1 image and one label per image; got {eval_x.shape[0]} "
                             f"images and {eval_y.shape[0]} labels")
        self.model = model
        self.lr = float(lr)
        self.eval_x = eval_x
        self.eval_y = eval_y

    @torch.no_grad()
    def aggregate(self, updates: list[SharedUpdate], weights: list[float] | None = None) -> None:
        if weights is None:
            weights = [float(u.batch_size) for u in updates]
        if len(weights) != len(updates):
            raise ValueError(f"{len(weights)} weights for {len(updates)} updates")
        check_weights(weights)
        # a weight of 0 leaves its update out (0 * NaN would poison the mean), as aggregate_many does
        sent = [(w, u) for w, u in zip(weights, updates) if not u.metadata.get("skipped", False) and w > 0]
        if not sent:
            return
        weights, updates = [w for w, _ in sent], [u for _, u in sent]
        kinds = sorted({u.kind for u in updates})
        if len(kinds) > 1:  # the server step (lr for gradients, 1 for model differences) is one per round
            raise ValueError(f"updates of kinds {kinds} in one aggregation; allowed: one protocol per round")
        params = dict(self.model.named_parameters())
        step = self.lr if updates[0].kind == "gradient" else 1.0
        for name, param in params.items():
            parts = [(w, u.tensors[name]) for w, u in zip(weights, updates) if name in u.tensors]
            if not parts:
                continue
            wsum = sum(w for w, _ in parts)
            mean = sum(w * t.to(param) for w, t in parts) / wsum
            param.sub_(step * mean)
        buffers = dict(self.model.named_buffers())
        shared = [(w, u.buffers) for w, u in zip(weights, updates) if u.buffers]
        for name, buf in buffers.items():
            parts = [(w, b[name]) for w, b in shared if name in b]
            if parts and buf.is_floating_point():
                buf.copy_(sum(w * t.to(buf) for w, t in parts) / sum(w for w, _ in parts))

    @torch.no_grad()
    def evaluate(self, batch_size: int = 512) -> tuple[float, float]:
        """Test accuracy and mean cross-entropy of the global model on the held-out split (an example
        with non-finite logits counts as wrong, :func:`correct_predictions`); every submodule keeps its
        mode (:func:`~leakgym.models.in_mode`)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}; allowed: integers >= 1")
        correct, loss_sum = 0, 0.0
        with in_mode(self.model, False):
            for start in range(0, len(self.eval_x), batch_size):
                xb = self.eval_x[start : start + batch_size]
                yb = self.eval_y[start : start + batch_size]
                logits = self.model(xb)
                loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
                correct += int(correct_predictions(logits, yb).sum())
        n = len(self.eval_x)
        return correct / n, loss_sum / n

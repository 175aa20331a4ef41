"""Objectives of optimisation-based gradient inversion, batched over independent problems.

Every function here takes tensors with a leading *problem* dimension ``P`` (victims x restarts) and
returns one value per problem, shape ``(P,)``. Problems never mix: the gradient of
``loss.sum()`` with respect to problem ``p``'s dummy images is the gradient of ``loss[p]`` alone,
which is what lets the engine (:mod:`leakgym.attacks.engine`) optimise all of them in one
computation.

* :func:`gradient_distance` -- the matching term ``D(grad_dummy, grad_victim)``: squared Euclidean
  distance (Zhu et al. 2019, DLG Eq. 4) or one minus cosine similarity over all matched layers
  (Geiping et al. 2020, "Inverting Gradients", Eq. 4), optionally with per-layer weights.
* :func:`total_variation` -- the anisotropic TV prior of Inverting Gradients (Eq. 4, ``alpha TV(x)``).
* :func:`l2_prior` -- the image-norm prior ``R_l2`` of Yin et al. 2021 (GradInversion, Eq. 5).
* :func:`bn_statistics_loss` -- the BatchNorm-statistics prior ``R_BN`` of GradInversion Eq. 6.
* :func:`group_consistency` -- the group-consistency prior ``R_group`` of GradInversion Eq. 9.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

LAYER_WEIGHT_SCHEMES = ("equal", "linear", "exp")


def check_weight_mapping(weights: Mapping[str, float]) -> None:
    """``ValueError`` unless every weight of ``name -> weight`` is a finite number >= 0 and one is > 0
    (an infinite weight made the matching loss NaN, and the attack returned its start silently)."""
    bad = {k: v for k, v in weights.items()
           if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float))
           or not (math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"layer weights {bad}: each must be a finite number in [0, inf), keyed by a layer name")
    if not any(v > 0 for v in weights.values()):
        raise ValueError(f"layer weights {dict(weights)}: at least one must be > 0")


def layer_weights(names: Sequence[str], scheme: str | Mapping[str, float] = "equal") -> dict[str, float]:
    """Per-layer weights of the matching term, keyed by parameter name.

    Schemes follow the reference code of Inverting Gradients (``reconstruction_costs``,
    github.com/JonasGeiping/invertinggradients): ``"equal"`` weighs every layer 1; ``"linear"``
    decreases linearly from 1 at the first layer to ``1/L`` at the last; ``"exp"`` is a softmax over
    ``L, L-1, ..., 1`` rescaled so that the first layer has weight 1 (later layers decay as
    ``e^{-k}``). A mapping gives explicit weights; names it omits get weight 0.
    """
    n = len(names)
    if n == 0:
        raise ValueError("layer_weights needs at least one layer name; got an empty list")
    if isinstance(scheme, Mapping):
        unknown = sorted(set(scheme) - set(names))
        if unknown:
            raise ValueError(f"layer weights name unknown layers {unknown}; allowed: {list(names)}")
        check_weight_mapping(scheme)
        return {k: float(scheme.get(k, 0.0)) for k in names}
    if scheme == "equal":
        w = torch.ones(n, dtype=torch.float64)
    elif scheme == "linear":
        w = torch.arange(n, 0, -1, dtype=torch.float64) / n
    elif scheme == "exp":
        w = torch.arange(n, 0, -1, dtype=torch.float64).softmax(dim=0)
        w = w / w[0]
    else:
        raise ValueError(f"layer weight scheme {scheme!r}; allowed: {LAYER_WEIGHT_SCHEMES} or a mapping")
    return {k: float(v) for k, v in zip(names, w)}


def _per_problem_dot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot product of ``a (P, ...)`` with ``b (N, ...)`` where ``P = N * R``.

    ``b`` is broadcast over the ``R`` restarts of each problem without being copied.
    """
    p, n = a.shape[0], b.shape[0]
    if p == n:
        return (a.reshape(p, -1) * b.reshape(n, -1)).sum(dim=1)
    r = p // n
    return (a.reshape(n, r, -1) * b.reshape(n, 1, -1)).sum(dim=2).reshape(p)


def target_sq_norms(targets: Mapping[str, Tensor], weights: Mapping[str, float]) -> Tensor:
    """``sum_l w_l ||t_l||^2`` per victim, shape ``(N,)`` (precomputed once per attack)."""
    total = None
    for name, t in targets.items():
        w = weights[name]
        if w == 0:
            continue
        term = w * t.reshape(t.shape[0], -1).pow(2).sum(dim=1)
        total = term if total is None else total + term
    if total is None:
        raise ValueError("every matched layer has weight 0; at least one weight must be > 0")
    return total


FLAT_MAX_ENTRIES = 2**24
"""Largest ``rows x matched parameters`` that :func:`gradient_distance` concatenates into one matrix."""


def flat_layers(tensors: Mapping[str, Tensor], names: Sequence[str]) -> Tensor:
    """Layers ``names`` of ``name -> (rows, *shape)`` as one ``(rows, D)`` matrix (layer after layer)."""
    rows = tensors[names[0]].shape[0]
    return torch.cat([tensors[name].reshape(rows, -1) for name in names], dim=1)


class FlatWeights:
    """The per-entry weights of the flattened layers ``names``: one scale when every layer has the same
    weight (no weight vector), else a ``(D,)`` vector."""

    def __init__(self, targets: Mapping[str, Tensor], weights: Mapping[str, float], names: Sequence[str], *,
                 dtype: torch.dtype, device: torch.device) -> None:
        levels = {weights[name] for name in names}
        self.scale = float(next(iter(levels))) if len(levels) == 1 else 1.0
        self.vector = None if len(levels) == 1 else torch.cat([
            torch.full((targets[name][0].numel(),), float(weights[name]), dtype=dtype, device=device)
            for name in names])

    def sum(self, values: Tensor) -> Tensor:
        """``sum_j w_j values[..., j]``."""
        return self.scale * (values.sum(dim=-1) if self.vector is None else values @ self.vector)


def matrix_distance(g: Tensor, t: Tensor, weights: FlatWeights, *, distance: str,
                    target_norm_sq: Tensor | None) -> Tensor:
    """:func:`gradient_distance` of flattened updates: ``g (P, D)`` against ``t (N, D)``, ``P = N x R``
    (the targets broadcast over each victim's restarts); ``target_norm_sq (N,)`` is needed by the cosine only.

    Where only ``g`` needs a gradient (the engine: the targets are data), the backward is
    :class:`_FlatDistance`'s, written out; otherwise autograd's."""
    constants = [x for x in (t, target_norm_sq, weights.vector) if x is not None]
    if torch.is_grad_enabled() and g.requires_grad and not any(x.requires_grad for x in constants):
        return _FlatDistance.apply(g, t, weights, distance, target_norm_sq)
    return _matrix_distance(g, t, weights, distance, target_norm_sq)[0]


def _matrix_distance(g: Tensor, t: Tensor, weights: FlatWeights, distance: str,
                     target_norm_sq: Tensor | None) -> tuple[Tensor, tuple]:
    """:func:`matrix_distance` and what its backward needs: ``(diff,)`` (l2) or ``(dot, dummy_sq)``."""
    p, n = g.shape[0], t.shape[0]
    if distance == "l2":
        diff = g.reshape(n, p // n, -1) - t.reshape(n, 1, -1)
        return weights.sum(diff.pow(2)).reshape(p), (diff,)
    dot = weights.sum(g.reshape(n, p // n, -1) * t.reshape(n, 1, -1)).reshape(p)
    dummy_sq = weights.sum(g.pow(2))
    return _cosine(dot, dummy_sq, target_norm_sq), (dot, dummy_sq)


class _FlatDistance(torch.autograd.Function):
    """:func:`matrix_distance` (the same forward operations, so the same values) with the backward
    with respect to ``g`` written out, two passes over ``(P, D)``.

    Why: autograd's backward of the forward's broadcast products and squares takes five passes over
    the ``(P, D)`` matrix, two of them with a stride-0 innermost operand that does not vectorise -- in a
    profile at 64 rows (LeNet on digits, D = 13,078, one CPU thread) about a third of an engine iteration.
    The gradient is

    * l2, ``d = s sum_j w_j (g_j - t_j)^2``: ``dd/dg = 2 s w (g - t)``;
    * cosine, ``d = 1 - dot / max(sqrt(max(q, tiny)) |t|, tiny)`` with ``dot = s sum_j w_j g_j t_j`` and
      ``q = s sum_j w_j g_j^2``: ``dd/dg = s w (a t + 2 b g)``, ``a = dd/d dot``, ``b = dd/dq`` -- the
      clamps pass no gradient where they bind, as autograd's ``clamp_min``.

    Only once differentiable (the engine differentiates the matching loss once, with respect to the
    images through ``g``'s graph); ``t``, ``target_norm_sq`` and the weights must not need a gradient
    (:func:`matrix_distance` uses autograd's path then). Test: ``tests/test_attack_engine.py`` compares
    both backwards and runs ``gradcheck``.
    """

    @staticmethod
    def forward(ctx, g: Tensor, t: Tensor, weights: FlatWeights, distance: str,
                target_norm_sq: Tensor | None) -> Tensor:
        ctx.weights, ctx.distance = weights, distance
        ctx.blocks = _victim_blocks(g, t, weights)
        if ctx.blocks is not None:
            out, saved = _blockwise_distance(g, t, weights, distance, target_norm_sq, ctx.blocks)
            ctx.save_for_backward(g, t, target_norm_sq, *saved)
            return out
        out, saved = _matrix_distance(g, t, weights, distance, target_norm_sq)
        if distance == "l2":
            ctx.save_for_backward(*saved)
        else:
            ctx.save_for_backward(g, t, target_norm_sq, *saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        w = ctx.weights
        if ctx.blocks is not None:
            return _blockwise_backward(ctx, grad_out), None, None, None, None
        if ctx.distance == "l2":
            (diff,) = ctx.saved_tensors
            n, r = diff.shape[0], diff.shape[1]
            grad = diff * (2.0 * w.scale * grad_out).reshape(n, r, 1)
        else:
            g, t, target_norm_sq, dot, dummy_sq = ctx.saved_tensors
            p, n = g.shape[0], t.shape[0]
            r = p // n
            a, b = _cosine_partials(grad_out, r, target_norm_sq, dot, dummy_sq)
            grad = torch.addcmul((g * (2.0 * w.scale * b).unsqueeze(1)).reshape(n, r, -1),
                                 (w.scale * a).reshape(n, r, 1), t.reshape(n, 1, -1))
        if w.vector is not None:
            grad = grad * w.vector
        return grad.reshape(grad.shape[0] * grad.shape[1], -1), None, None, None, None


def _cosine_partials(grad_out: Tensor, r: int, target_norm_sq: Tensor, dot: Tensor,
                     dummy_sq: Tensor) -> tuple[Tensor, Tensor]:
    """``(a, b)`` of :class:`_FlatDistance`'s cosine gradient: ``d out / d dot`` and ``d out / d dummy_sq``
    per row, the clamps passing no gradient where they bind."""
    tiny = torch.finfo(dot.dtype).tiny
    t_norm = target_norm_sq.to(dot.dtype).repeat_interleave(r).sqrt()
    root = dummy_sq.clamp_min(tiny).sqrt()
    product = root * t_norm
    denom = product.clamp_min(tiny)
    a = -grad_out / denom  # d out / d dot
    # d out / d dummy_sq, through denom = max(max(q, tiny)^(1/2) |t|, tiny)
    b = grad_out * dot / denom.square() * t_norm * 0.5 / root
    return a, torch.where((product >= tiny) & (dummy_sq >= tiny), b, torch.zeros_like(b))


CACHE_BLOCK_ENTRIES = 2**18
"""Entries (1 MiB of float32) of the row blocks in which :class:`_FlatDistance` makes its passes on a CPU."""


def _victim_blocks(g: Tensor, t: Tensor, weights: FlatWeights,
                   block_entries: int | None = None) -> list[slice] | None:
    """The victim blocks in which :class:`_FlatDistance` passes over ``g (P, D)`` on a CPU, or None (one pass
    over the whole matrix: on a GPU, with per-entry weights, or where a block would not hold two rows).

    Why: each product, square and gradient of the whole matrix is a temporary of ``P x D`` entries (256
    LeNet updates on digits: 13 MB) written out and read back, a fresh allocation each time. In blocks of
    about a MiB the temporaries stay in the core's cache. Bit for bit the same: a row's sum over its
    ``D`` entries is the same reduction whatever the number of rows beside it, as long as there are at
    least two (one output row alone may be split over threads) -- and the elementwise products are
    elementwise. The ``(D,)`` weight vector's matrix-vector product is not (its kernel depends on the
    row count), so per-entry weights keep the one pass. ``tests/test_attack_engine.py`` checks both."""
    p, n = g.shape[0], t.shape[0]
    per_victim = (p // n) * g.shape[1]
    per_block = (CACHE_BLOCK_ENTRIES if block_entries is None else block_entries) // max(per_victim, 1)
    if g.device.type != "cpu" or weights.vector is not None or per_block >= n or per_block * (p // n) < 2:
        return None
    starts = list(range(0, n, per_block))
    if (n - starts[-1]) * (p // n) < 2:  # a last block of one row joins the one before it
        starts.pop()
    return [slice(i, j) for i, j in zip(starts, [*starts[1:], n])]


def _blockwise_distance(g: Tensor, t: Tensor, weights: FlatWeights, distance: str, target_norm_sq: Tensor | None,
                        blocks: list[slice]) -> tuple[Tensor, tuple]:
    """:func:`_matrix_distance` (one scale, no weight vector) victim block by victim block: the same values;
    what the backward needs beyond ``g`` and ``t``: nothing (l2) or ``(dot, dummy_sq)`` (cosine)."""
    p, n = g.shape[0], t.shape[0]
    r = p // n
    rows, victims = g.reshape(n, r, -1), t.reshape(n, 1, -1)
    if distance == "l2":
        total = torch.cat([(rows[b] - victims[b]).pow(2).sum(dim=-1) for b in blocks])
        return (weights.scale * total).reshape(p), ()
    dot = weights.scale * torch.cat([(rows[b] * victims[b]).sum(dim=-1) for b in blocks]).reshape(p)
    dummy_sq = weights.scale * torch.cat([rows[b].pow(2).sum(dim=-1) for b in blocks]).reshape(p)
    return _cosine(dot, dummy_sq, target_norm_sq), (dot, dummy_sq)


def _blockwise_backward(ctx, grad_out: Tensor) -> Tensor:
    """:class:`_FlatDistance`'s gradient with respect to ``g``, victim block by victim block (the same
    elementwise operations as the one-pass backward, so the same values)."""
    g, t, target_norm_sq, *saved = ctx.saved_tensors
    p, n = g.shape[0], t.shape[0]
    r, s = p // n, ctx.weights.scale
    rows, victims = g.reshape(n, r, -1), t.reshape(n, 1, -1)
    grad = torch.empty_like(rows)
    if ctx.distance == "l2":
        factor = (2.0 * s * grad_out).reshape(n, r, 1)
        for block in ctx.blocks:
            torch.mul(rows[block] - victims[block], factor[block], out=grad[block])
    else:
        a, b = _cosine_partials(grad_out, r, target_norm_sq, *saved)
        a, b = (s * a).reshape(n, r, 1), (2.0 * s * b).reshape(n, r, 1)
        for block in ctx.blocks:
            torch.addcmul(rows[block] * b[block], a[block], victims[block], out=grad[block])
    return grad.reshape(p, -1)


def _flat_distance(dummy: Mapping[str, Tensor], targets: Mapping[str, Tensor], weights: Mapping[str, float],
                   names: list[str], distance: str, target_norm_sq: Tensor | None) -> Tensor:
    """:func:`gradient_distance` with all matched layers as one ``(rows, D)`` matrix."""
    g = flat_layers(dummy, names)
    t = flat_layers(targets, names).to(g.dtype)
    if distance == "cosine" and target_norm_sq is None:
        target_norm_sq = target_sq_norms(targets, weights)
    flat = FlatWeights(targets, weights, names, dtype=g.dtype, device=g.device)
    return matrix_distance(g, t, flat, distance=distance, target_norm_sq=target_norm_sq)


def _cosine(dot: Tensor, dummy_sq: Tensor, target_norm_sq: Tensor) -> Tensor:
    """``1 - dot / (sqrt(dummy_sq) * sqrt(target_norm_sq))``, targets broadcast over restarts."""
    p, n = dot.shape[0], target_norm_sq.shape[0]
    t_norm = target_norm_sq.to(dot.dtype).repeat_interleave(p // n).sqrt()
    # The epsilons only guard the all-zero dummy gradient (e.g. a constant image), far below any gradient
    # norm met in practice: clamped before the root too, whose backward at 0 is 0 * inf = NaN.
    tiny = torch.finfo(dot.dtype).tiny
    denom = (dummy_sq.clamp_min(tiny).sqrt() * t_norm).clamp_min(tiny)
    return 1.0 - dot / denom


def gradient_distance(
    dummy: Mapping[str, Tensor],
    targets: Mapping[str, Tensor],
    weights: Mapping[str, float],
    *,
    distance: str = "cosine",
    target_norm_sq: Tensor | None = None,
    flat_max: int = FLAT_MAX_ENTRIES,
) -> Tensor:
    """Gradient-matching distance per problem, shape ``(P,)``.

    Args:
        dummy: the attacker's simulated update for each problem, ``name -> (P, *shape)``.
        targets: the victim updates, ``name -> (N, *shape)`` with ``P = N * R`` (restarts of victim
            ``n`` are rows ``n*R .. n*R+R-1`` of ``dummy``).
        weights: per-layer weights ``w_l`` (see :func:`layer_weights`); only names in ``targets``
            are matched.
        distance: ``"l2"``: ``sum_l w_l ||g_l - t_l||^2`` (DLG Eq. 4). ``"cosine"``:
            ``1 - sum_l w_l <g_l, t_l> / (sqrt(sum_l w_l ||g_l||^2) sqrt(sum_l w_l ||t_l||^2))``
            (Inverting Gradients Eq. 4 with the layer weights of its reference code).
        target_norm_sq: optional precomputed :func:`target_sq_norms` of ``targets``.
        flat_max: up to this many entries (rows x matched parameters) all layers are matched as one
            ``(rows, D)`` matrix -- a handful of kernels instead of a few per layer (the engine evaluates
            this every iteration: 12% of a LeNet vector step) -- and layer by layer above it, where the
            concatenated copies would cost memory (ResNet-18 at 64 rows ran out of 23 GB).
    """
    if distance not in ("l2", "cosine"):
        raise ValueError(f"distance={distance!r}; allowed: 'l2', 'cosine'")
    names = [name for name in targets if weights[name] != 0]
    if names and dummy[names[0]].shape[0] * sum(targets[n][0].numel() for n in names) <= flat_max:
        return _flat_distance(dummy, targets, weights, names, distance, target_norm_sq)
    dot = None
    dummy_sq = None
    for name, t in targets.items():
        w = weights[name]
        if w == 0:
            continue
        g = dummy[name]
        if distance == "l2":
            p, n = g.shape[0], t.shape[0]
            diff = g.reshape(n, p // n, -1) - t.reshape(n, 1, -1).to(g.dtype)
            term = w * diff.pow(2).sum(dim=2).reshape(p)
            dot = term if dot is None else dot + term
        else:
            d_term = w * _per_problem_dot(g, t.to(g.dtype))
            s_term = w * g.reshape(g.shape[0], -1).pow(2).sum(dim=1)
            dot = d_term if dot is None else dot + d_term
            dummy_sq = s_term if dummy_sq is None else dummy_sq + s_term
    if dot is None:
        raise ValueError("every matched layer has weight 0; at least one weight must be > 0")
    if distance == "l2":
        return dot
    if target_norm_sq is None:
        target_norm_sq = target_sq_norms(targets, weights)
    return _cosine(dot, dummy_sq, target_norm_sq)


def total_variation(x: Tensor) -> Tensor:
    """Anisotropic total variation per problem, ``x (P, B, C, H, W) -> (P,)``.

    ``TV(x) = mean|x[..., :, 1:] - x[..., :, :-1]| + mean|x[..., 1:, :] - x[..., :-1, :]|`` over the
    problem's whole batch, as in the Inverting Gradients reference code.
    """
    if x.dim() != 5:
        raise ValueError(f"total_variation expects (P, B, C, H, W), got shape {tuple(x.shape)}")
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(dim=1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(dim=1)
    return dx + dy


def l2_prior(x: Tensor) -> Tensor:
    """Mean squared pixel value per problem (GradInversion's ``R_l2``), ``(P, ...) -> (P,)``."""
    return x.flatten(1).pow(2).mean(dim=1)


def bn_statistics_loss(
    dummy_stats: Sequence[tuple[Tensor, Tensor]], target_stats: Sequence[tuple[Tensor, Tensor]]
) -> Tensor:
    """GradInversion Eq. 6: ``sum_l ||mu_l(x) - mu_l||_2 + ||var_l(x) - var_l||_2`` per problem.

    Args:
        dummy_stats: per BN layer, the dummy batch's ``(mean, var)`` at the layer input, each
            ``(P, C_l)`` (biased variance: the statistic BN normalises with).
        target_stats: per BN layer, the victim batch's ``(mean, var)``, each ``(N, C_l)``.
    """
    if len(dummy_stats) != len(target_stats):
        raise ValueError(
            f"bn_stats has {len(target_stats)} layers but the model has {len(dummy_stats)} BatchNorm layers"
        )
    total = None
    for (mu, var), (t_mu, t_var) in zip(dummy_stats, target_stats):
        p, n = mu.shape[0], t_mu.shape[0]
        r = p // n
        d_mu = (mu.reshape(n, r, -1) - t_mu.reshape(n, 1, -1).to(mu.dtype)).norm(dim=2)
        d_var = (var.reshape(n, r, -1) - t_var.reshape(n, 1, -1).to(var.dtype)).norm(dim=2)
        term = (d_mu + d_var).reshape(p)
        total = term if total is None else total + term
    if total is None:
        raise ValueError("bn_statistics_loss got no BatchNorm layers")
    return total


def group_consistency(x: Tensor, restarts: int) -> Tensor:
    """GradInversion's group consistency (Eq. 9) towards the restarts' consensus, as the pixel mean of
    ``(x_g - E(x))^2``.

    ``x`` is ``(P, ...)`` with ``P = N * restarts``; the consensus ``E(x)`` of victim ``n`` is the
    pixel-wise mean of its restarts, treated as a constant (detached), as the paper updates it
    between optimisation steps. Deviations: Yin et al. write the term as the Euclidean norm
    ``||x_g - E(x)||_2`` (not squared, not divided by the pixel count); here it is its square over the
    pixel count, so that the pull grows with the distance from the consensus (the norm's gradient has unit
    length wherever the restart is) and the weight does not depend on the image size; the default weight
    (:class:`~leakgym.attacks.gradinversion.GradInversionConfig` ``group``) was set for this form. Yin et
    al. also register (align) the restarts before averaging; LeakGym's images are small and unaugmented, so
    the registration step is omitted.
    """
    p = x.shape[0]
    if restarts < 1 or p % restarts:
        raise ValueError(f"restarts={restarts} must divide the problem count {p}")
    grouped = x.reshape(p // restarts, restarts, -1)
    consensus = grouped.mean(dim=1, keepdim=True).detach()
    return (grouped - consensus).pow(2).mean(dim=2).reshape(p)

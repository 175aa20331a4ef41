"""CENSOR: share a loss-reducing gradient drawn orthogonally to the true one (Zhang et al., NDSS 2025).

"Censor: Defense Against Gradient Inversion via Orthogonal Subspace Bayesian Sampling", Algorithm 1
(LOCAL_UPDATE, lines 8-36):

1. ``G0 = grad f(D, theta)`` (line 9) and ``l* = L(f_theta(x), y)`` (line 10); ``G* = G0`` (line 11).
2. For each of ``T`` trials (line 12):

   * Phase 1, ORTHOGONAL_GRAD (lines 24-30, Eq. 12): for every layer ``l`` sample
     ``g_r ~ N(0, I)`` shaped like ``g_l`` and keep its component orthogonal to ``g_l``,
     ``g_l^o = g_r - <g_r, g_l> / <g_l, g_l> * g_l``.
   * Phase 2, NORMALIZE_GRAD (lines 31-36): rescale it to the layer's gradient norm,
     ``g~_l^o = g_l^o * ||g_l|| / ||g_l^o||``.
   * Phase 3 (lines 15-19): take a trial step ``theta^t = theta - eta * G_N^t``, evaluate the loss on
     the private batch and keep the candidate if ``l^t < l*``.

Subspace (``subspace``, config field ``censor_subspace``):

* ``"layer"`` — Algorithm 1 / Eq. 12 as above: each layer's candidate is orthogonal to that layer
  of the *batch* gradient.
* ``"samples"`` — Eq. 11 (§IV-A, Obstacle 3): the candidate lies in the subspace orthogonal to the
  gradient of *every example* ``{grad l(f_theta(X_j), Y_j)}_j``, "obtained through the Gram-Schmidt
  algorithm". Implemented layer by layer so that Phase 2's per-layer rescaling keeps the
  orthogonality: for each layer an orthonormal basis ``Q_l`` of ``span{G0_l, g_1,l, ..., g_N,l}`` is
  built (in float64, by SVD rather than Gram-Schmidt: the same span, computed stably, and
  rank-revealing, so that directions made of rounding are left out, :func:`example_bases`), and
  ``g_l^o = g_r - Q_l Q_l^T g_r`` (projected twice, "twice is enough"). The batch gradient ``G0_l``
  is in the set explicitly: it is the mean of the per-example gradients for deterministic models,
  but PRECODE's per-example forward draws its own noise.
  Per-example gradients are the rows of the Jacobian of the per-example losses of *one* batch
  forward (``torch.func.jacrev``), so with BatchNorm in train mode they include the coupling through
  the batch statistics and still average to the batch gradient; for PRECODE every row carries the
  batch's KL term (the KL is a batch mean). When the examples' gradients span a whole layer (a
  layer with fewer entries than ``N + 1``) that layer's candidate is zero. Deviation: Eq. 11 also
  quantifies over every label ``c in [1, C]``; the paper's text (§I; Obstacle 3) describes the
  subspace as orthogonal to "the gradients of k training data instances" with their own labels,
  which is what is implemented. Memory: ``N x |theta|`` for the Jacobian.

Fallback when no trial lowers the loss (``fallback``, config field ``censor_fallback``):

* ``"original"`` — Algorithm 1 line 11 as written: ``G*`` starts as ``G0``, so the client sends its
  *original* gradient. The paper's setting and the library default (issue 36: the default is the
  algorithm as published; until then it was ``"zeros"``). It sends exactly what CENSOR exists to
  hide (the paper's own §I: "we will not inadvertently return the original gradients"), in the
  rounds where no trial improves.
* ``"zeros"`` — ``G*`` starts as zeros: the client sends an all-zero update (preset ``censor-zeros``;
  the default before issue 36). A deviation from the paper: it never leaks the original gradient,
  but a client whose trials keep failing stops contributing -- measured on digits LeNet, FedSGD,
  every client defending: the model stays near chance (``docs/results/bench_defenses.md``).
* ``"skip"`` — the client sends no update this round: the step uses zeros and the pipeline marks
  the shared update ``metadata["skipped"] = True`` (tensors all zero); the server leaves it out of
  the aggregate (:meth:`leakgym.fl.server.Server.aggregate`).

``l*`` is initialised as in line 10 (the loss of the unchanged model), so every sent candidate
strictly lowers the batch loss at step ``eta``. Every step's details record ``sent``:
``"candidate"``, or the fallback used (``"original"``, ``"zeros"``, ``"skip"``).

Layers are the entries of the update dict (one per parameter tensor, weights and biases separately).
A layer whose gradient is exactly zero has no direction to avoid; its candidate is set to zero
(``||g_l|| = 0`` after normalisation anyway). Projections are computed in float64 so the
orthogonality holds to ~1e-7 relative after casting back.

Several clients (the victims of a vector step's games, trained in lock-step) evaluate their trials
together (:func:`censor_gradients`: every client's ``T + 1`` parameter sets as rows of one vmapped
forward pass; the candidates are drawn per client, as above; BatchNorm in eval mode -- a client's batch
of one, ``bn_eval_if_single`` -- with each client's running statistics). Models with BatchNorm in train
mode, dropout or a PRECODE bottleneck, the ``"samples"`` subspace and a client alone keep
:func:`censor_gradient`.

The registered defense :data:`CENSOR` (fields ``censor_*``, switch ``censor_trials``) runs on every
local step's gradient (step stage). Cost: one loss evaluation per trial, counted as half a gradient
(``T / 2`` units), plus one unit for the per-example gradients with ``subspace="samples"`` (a
vectorised per-example Jacobian takes about the FLOPs of one batch gradient).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, jacrev

from leakgym.defenses.registry import DefenseContext, GroupedStepDefense, choice_field, int_field, real_field
from leakgym.devices import seed_generators
from leakgym.fl.batched import independent_rows, signature, stack_buffers
from leakgym.models import task_loss

Update = dict[str, Tensor]
#: What the client sends when no trial lowers the loss (see the module docstring).
FALLBACKS = ("zeros", "original", "skip")
#: The subspace candidates are drawn from: Algorithm 1's layer-wise one or Eq. 11's per-example one.
SUBSPACES = ("layer", "samples")


def example_gradients(model: nn.Module, x: Tensor, y: Tensor) -> Update:
    """Per-example gradients ``d l_j / d theta`` of one batch forward, shaped ``(N, *param.shape)``.

    ``l_j`` is example ``j``'s cross-entropy (hard or soft label) plus, for PRECODE, the batch's
    ``beta * KL``, so ``mean_j l_j`` is :func:`leakgym.models.task_loss`. The model runs in its
    current mode; BatchNorm running statistics are updated on copies only.
    """
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    beta = model.precode_beta if getattr(model, "bottleneck", None) is not None else 0.0

    def losses(p: Update) -> Tensor:
        # Fresh buffer copies absorb BatchNorm's in-place running-stat update (forbidden on captured tensors).
        logits, kl = functional_call(model, {**{n: b.clone() for n, b in buffers.items()}, **p}, (x,),
                                     {"return_kl": True})
        ce = F.cross_entropy(logits, y if y.is_floating_point() else y.long(), reduction="none")
        return ce + beta * kl if beta else ce

    return {n: j.detach() for n, j in jacrev(losses)(params).items()}


#: A direction of the examples' span whose singular value (columns scaled to unit norm) is below this many
#: machine epsilons of the gradients' dtype is rounding, not a direction (see :func:`example_bases`).
RANK_TOLERANCE_EPS = 100


def example_bases(grad: Update, per_example: Update) -> dict[str, Tensor]:
    """Per layer, an orthonormal float64 basis ``(n_l, k)`` of ``span{G0_l, g_1,l, ..., g_N,l}`` (Eq. 11).

    The basis spans the *numerical* span: the vectors, each scaled to unit norm (zero ones left out), are
    decomposed by SVD, and the left singular vectors whose singular value exceeds
    :data:`RANK_TOLERANCE_EPS` machine epsilons of the gradients' dtype form the basis. The set is
    rank-deficient by construction (for a deterministic model ``G0`` is the mean of the ``g_j``; the
    softmax's bias gradients sum to zero): a basis of all ``N + 1`` vectors (reduced QR) adds
    a direction made of float32 rounding, which projects a rounding-dependent random direction out of
    every candidate (the same client's candidate then changed by 5% when its gradient moved by 1e-7).
    Measured on LeNet/digits, batches of 2 to 32: rounding directions at most 3e-7, genuine ones at
    least 5e-4 (near-duplicate images: 3.6e-5), the tolerance 1.2e-5 (float32). A candidate is then
    orthogonal to every example's gradient up to the dropped directions (cosine below about 1e-5)."""
    bases: dict[str, Tensor] = {}
    for name, g in grad.items():
        rows = torch.cat([g.detach().reshape(1, -1), per_example[name].reshape(per_example[name].shape[0], -1)])
        columns = rows.double().T
        norms = columns.norm(dim=0)
        columns = columns[:, norms > 0] / norms[norms > 0]
        if columns.shape[1] == 0:
            bases[name] = columns  # nothing to avoid
            continue
        u, sv, _ = torch.linalg.svd(columns, full_matrices=False)
        # An absolute bound: the columns have unit norm (scaling by the largest singular value, up to
        # sqrt(N + 1) for near-parallel columns, dropped genuine directions of near-duplicate images).
        bases[name] = u[:, sv > RANK_TOLERANCE_EPS * torch.finfo(g.dtype).eps]
    return bases


_Stats = list[tuple[str, Tensor, Tensor, Tensor, bool, Tensor]]


def _layer_stats(grad: Update) -> _Stats:
    """Per layer ``(name, g, g64, <g, g>, <g, g> == 0, ||g||)`` in float64, computed once per CENSOR call."""
    out = []
    for name, g in grad.items():
        g64 = g.detach().double().reshape(-1)
        gg = g64 @ g64
        out.append((name, g, g64, gg, bool(gg == 0), gg.sqrt()))
    return out


def orthogonal_candidate(grad: Update, generator: torch.Generator, bases: dict[str, Tensor] | None = None,
                         *, _stats: _Stats | None = None) -> Update:
    """Phases 1-2: a layer-wise orthogonal, norm-matched Gaussian sample (Algorithm 1 lines 24-36).

    Without ``bases`` each layer avoids the layer's gradient (Eq. 12); with ``bases`` (from
    :func:`example_bases`) it avoids the span of the layer's basis (Eq. 11). ``_stats`` (from
    :func:`_layer_stats` of the same ``grad``) saves recomputing the float64 gradient for every trial.
    """
    out: Update = {}
    for name, g, g64, gg, zero, root in (_layer_stats(grad) if _stats is None else _stats):
        if zero:
            out[name] = torch.zeros_like(g)
            continue
        r = torch.randn(g64.shape, generator=generator, device=generator.device, dtype=torch.float64).to(g.device)
        if bases is not None and bases[name].shape[1] >= g64.numel():
            out[name] = torch.zeros_like(g)  # the avoided vectors span the whole layer
            continue
        if bases is None:
            o = r - (r @ g64) / gg * g64               # Eq. (12)
        else:
            q = bases[name]
            o = r - q @ (q.T @ r)                       # Eq. (11)
            o = o - q @ (q.T @ o)                       # second pass: orthogonal to float64 precision
        norm = o.norm()
        if norm == 0:
            out[name] = torch.zeros_like(g)
            continue
        o = o * (root / norm)                           # line 34
        out[name] = o.to(g.dtype).view_as(g)
    return out


def _layer_candidates(stats: _Stats, generator: torch.Generator, trials: int) -> list[Update]:
    """``trials`` candidates of :func:`orthogonal_candidate` without bases (Eq. 12), computed together.

    The Gaussian draws and the float64 dot products ``<g_r, g_l>`` happen one by one in the order of
    ``trials`` successive :func:`orthogonal_candidate` calls; the element-wise projection, the norms and the
    rescaling run on all trials of a layer at once. Every step is the same floating-point operation on the
    same numbers (row norms of a ``(T, n)`` tensor equal the norms of its rows, checked in the tests), so
    the candidates are bit for bit those of the one-by-one calls, at a fraction of the per-call overhead.
    """
    live = [s for s in stats if not s[4]]
    draws = {name: torch.empty(trials, g64.numel(), dtype=torch.float64, device=generator.device)
             for name, _, g64, *_ in live}
    dots = {name: torch.empty(trials, dtype=torch.float64, device=g.device) for name, g, *_ in live}
    for t in range(trials):
        for name, g, g64, *_ in live:
            r = draws[name][t]
            torch.randn(r.shape, generator=generator, device=generator.device, dtype=torch.float64, out=r)
            dots[name][t] = r.to(g.device) @ g64
    out: list[Update] = [{} for _ in range(trials)]
    for name, g, g64, gg, zero, root in stats:
        if zero:
            for cand in out:
                cand[name] = torch.zeros_like(g)
            continue
        r = draws[name].to(g.device)
        o = r - (dots[name] / gg)[:, None] * g64              # Eq. (12), every trial
        norm = torch.linalg.vector_norm(o, dim=1)
        rows = (o * (root / norm)[:, None]).to(g.dtype).unbind(0)   # line 34
        flat = bool((norm == 0).any())  # r parallel to g leaves no direction: that trial's layer is zero
        for t, cand in enumerate(out):
            cand[name] = torch.zeros_like(g) if flat and norm[t] == 0 else rows[t].view_as(g)
    return out


@torch.no_grad()
def _loss_at(model: nn.Module, x: Tensor, y: Tensor, params: dict[str, Tensor]) -> float:
    return float(task_loss(model, x, y, params=params))


def censor_gradient(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    grad: Update,
    *,
    trials: int,
    step: float,
    generator: torch.Generator,
    fallback: str = "original",
    subspace: str = "layer",
) -> tuple[Update, dict]:
    """Algorithm 1 LOCAL_UPDATE: the best of ``trials`` orthogonal candidates, or the fallback.

    Args:
        model: the model at the parameters ``theta`` the gradient was computed at (not modified).
        x, y: the private batch (the EVALUATE data of lines 21-23).
        grad: ``G0``, keyed by parameter name.
        trials: ``T``.
        step: the trial step size ``eta`` of line 15.
        generator: source of the Gaussian samples (draws happen on its device).
        fallback: ``"original"`` (line 11, the default), ``"zeros"`` or ``"skip"`` (see the module docstring).
        subspace: ``"layer"`` (Eq. 12) or ``"samples"`` (Eq. 11).

    Returns:
        ``(G*, details)`` with ``details = {"sent": "candidate" | fallback, "chosen_trial": t or -1,
        "initial_loss": l0, "best_loss": l*, "trial_losses": [l^1, ..., l^T], "subspace": ...}``.
        With ``fallback="skip"`` and no improving trial, ``G*`` is zeros and ``sent == "skip"``.
    """
    _check(trials, step, fallback, subspace)
    theta = {n: p.detach() for n, p in model.named_parameters()}
    # The loss is evaluated by the same forward pass the client trains with (model mode kept);
    # PRECODE's sampling makes it stochastic, so the global RNG is re-seeded per evaluation to
    # compare all candidates under the same noise draw (forked once, restored on return).
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))

    def evaluate(params: dict[str, Tensor]) -> float:
        seed_generators(seed, x.device)
        return _loss_at(model, x, y, params)

    with torch.random.fork_rng(devices=[] if x.device.type == "cpu" else [x.device]):
        bases = None
        if subspace == "samples":
            seed_generators(seed, x.device)
            bases = example_bases(grad, example_gradients(model, x, y))
        initial = evaluate(theta)
        losses: list[float] = []
        cands: list[Update] = []
        stats = _layer_stats(grad)
        batched = _layer_candidates(stats, generator, trials) if bases is None else None
        for t in range(trials):
            cand = batched[t] if batched is not None else orthogonal_candidate(grad, generator, bases, _stats=stats)
            trial_params = {n: theta[n] - step * cand[n] if n in cand else theta[n] for n in theta}
            losses.append(evaluate(trial_params))
            cands.append(cand)
    return _choose(grad, cands, initial, losses, fallback, subspace)


def _check(trials: int, step: float, fallback: str, subspace: str) -> None:
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"CENSOR trials={trials!r}; allowed: integers >= 1")
    if not (step > 0):
        raise ValueError(f"CENSOR step={step!r}; allowed range (0, inf)")
    if fallback not in FALLBACKS:
        raise ValueError(f"CENSOR fallback={fallback!r}; allowed: {', '.join(map(repr, FALLBACKS))}")
    if subspace not in SUBSPACES:
        raise ValueError(f"CENSOR subspace={subspace!r}; allowed: {', '.join(map(repr, SUBSPACES))}")


def _choose(grad: Update, candidates: list[Update], initial: float, losses: list[float], fallback: str,
            subspace: str) -> tuple[Update, dict]:
    """Lines 11 and 16-19: the first trial with the lowest loss below ``l*``, else the fallback."""
    best_loss, chosen = initial, -1
    for t, loss_t in enumerate(losses):
        if loss_t < best_loss:
            best_loss, chosen = loss_t, t
    if chosen >= 0:
        best = {n: t.clone() for n, t in candidates[chosen].items()}  # own storage, not a row of the trials' tensor
    elif fallback == "original":
        best = {n: g.detach().clone() for n, g in grad.items()}
    else:
        best = {n: torch.zeros_like(g) for n, g in grad.items()}
    details = {"sent": "candidate" if chosen >= 0 else fallback, "chosen_trial": chosen, "initial_loss": initial,
               "best_loss": best_loss, "trial_losses": losses, "subspace": subspace}
    return best, details


#: Largest number of parameter entries :func:`censor_gradients` copies into the rows of one vmapped call
#: (2^25 float32: 128 MiB); more rows are evaluated in chunks.
ROW_ENTRIES = 2**25


def batchable(model: nn.Module, subspace: str) -> bool:
    """Whether :func:`censor_gradients` takes ``model``: Algorithm 1's layer subspace, and a forward pass
    that draws nothing from torch's global RNG and does not couple the examples of a batch
    (:func:`leakgym.fl.batched.independent_rows`: BatchNorm only in eval mode)."""
    return subspace == "layer" and independent_rows(model)


def censor_gradients(models: Sequence[nn.Module], xs: Sequence[Tensor], ys: Sequence[Tensor], grads: Sequence[Update],
                     settings: Sequence[dict], generators: Sequence[torch.Generator]) -> list[tuple[Update, dict]]:
    """:func:`censor_gradient` of K clients, every loss evaluation of every client in one vmapped forward pass.

    The clients' models share one architecture and their images one shape (:func:`batchable` models);
    ``settings`` are :func:`censor_gradient`'s keyword arguments (``trials``, ``step``, ``fallback``;
    ``subspace="layer"``), which may differ. Each client draws its evaluation seed and its candidates
    from its own generator as :func:`censor_gradient` does (Algorithm 1 lines 24-36); the ``T_k + 1``
    parameter sets of client ``k`` (``theta`` and the trial steps ``theta - eta G_N^t``, line 15) are
    rows of one computation, each image of the client's batch a row with its parameter set, and each
    set's mean loss the ``1 / B_k``-weighted sum of its images' cross-entropies. Lines 16-19 (keep the
    best improving trial) then run per client. The losses equal :func:`censor_gradient`'s to float32
    rounding (a trial whose loss ties the best one's to rounding could be chosen differently; test:
    ``tests/test_defenses_censor.py``).
    """
    k = len(models)
    if not (k == len(xs) == len(ys) == len(grads) == len(settings) == len(generators)) or k == 0:
        raise ValueError("censor_gradients needs one model, batch, gradient, settings and generator per client")
    for i, (m, x, s) in enumerate(zip(models, xs, settings)):
        if not batchable(m, s.get("subspace", "layer")) or signature(m) != signature(models[0]):
            raise ValueError(f"client {i}'s model or subspace is not client 0's batchable kind; use censor_gradient")
        if tuple(x.shape[1:]) != tuple(xs[0].shape[1:]):
            raise ValueError(f"client {i} has images {tuple(x.shape[1:])}; client 0 has {tuple(xs[0].shape[1:])}")
        _check(s["trials"], s["step"], s.get("fallback", "original"), s.get("subspace", "layer"))
    device = xs[0].device
    names = [n for n, _ in models[0].named_parameters()]
    sets: dict[str, list[Tensor]] = {n: [] for n in names}  # the parameter sets, client after client
    candidates = []
    for m, grad, s, gen in zip(models, grads, settings, generators):
        torch.randint(0, 2**31 - 1, (1,), generator=gen, device=gen.device)  # censor_gradient's evaluation seed
        cands = _layer_candidates(_layer_stats(grad), gen, s["trials"])
        candidates.append(cands)
        theta = dict(m.named_parameters())
        for n in names:
            t = theta[n].detach()
            sets[n] += [t] + [t - s["step"] * c[n] if n in c else t for c in cands]
    counts = [s["trials"] + 1 for s in settings]
    batch = [int(x.shape[0]) for x in xs]
    set_of_client = torch.repeat_interleave(torch.arange(sum(counts), device=device),
                                            torch.tensor([b for b, c in zip(batch, counts) for _ in range(c)],
                                                         device=device))  # each image row's parameter set
    images = torch.cat([x.repeat(c, *([1] * (x.dim() - 1))) for x, c in zip(xs, counts)])
    labels = torch.cat([y.repeat(c, *([1] * (y.dim() - 1))) for y, c in zip(ys, counts)])
    weight = torch.cat([torch.full((b * c,), 1.0 / b, dtype=xs[0].dtype, device=device) for b, c in zip(batch, counts)])
    base = models[0]
    # BatchNorm in eval mode (batchable) normalises with running statistics: each image row gets its
    # client's, the other buffers (BN's step counters, unused in eval mode) are model 0's.
    stacked_buffers = stack_buffers(models)
    constants = {n: b.detach() for n, b in base.named_buffers() if n not in stacked_buffers}
    client_of_row = torch.repeat_interleave(torch.arange(k, device=device), torch.tensor(
        [b * c for b, c in zip(batch, counts)], device=device))

    def loss(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(base, {**constants, **b, **p}, (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))  # one image: hard or soft label

    evaluate = torch.func.vmap(loss, randomness="error")
    with torch.no_grad():
        stacked = {n: torch.stack(v) for n, v in sets.items()}
        # image rows in chunks: each row holds a copy of its parameter set (bounded memory for large models)
        chunk = max(1, ROW_ENTRIES // sum(t[0].numel() for t in stacked.values()))
        per_image = torch.cat([
            evaluate({n: t.index_select(0, set_of_client[i:i + chunk]) for n, t in stacked.items()},
                     {n: t.index_select(0, client_of_row[i:i + chunk]) for n, t in stacked_buffers.items()},
                     images[i:i + chunk], labels[i:i + chunk])
            for i in range(0, images.shape[0], chunk)])
        losses = torch.zeros(sum(counts), dtype=per_image.dtype, device=device).index_add(
            0, set_of_client, per_image * weight).tolist()
    out, first = [], 0
    for grad, s, cands, c in zip(grads, settings, candidates, counts):
        mine = losses[first:first + c]
        first += c
        out.append(_choose(grad, cands, mine[0], mine[1:], s.get("fallback", "original"), "layer"))
    return out


#: Upper bound of CENSOR's trial step (the paper's is 0.1): far beyond any useful value and still finite in
#: float32. From about 1e20 (ConvNet) or 1e38 (LeNet) the trial parameters overflowed: the update was the
#: (finite) fallback, but the reported trial losses were NaN.
CENSOR_STEP_MAX = 1e6


class Censor(GroupedStepDefense):
    """CENSOR on every local step's gradient; ``fallback="skip"`` withholds the round's update."""

    name = "censor"
    public_split = False
    min_group = 2  # a client alone keeps the reference computation (bit-identical to before batching)
    fields = (
        # limit: a scenario's documented bound (paper: T = 20; the batched trials hold T + 1 parameter copies)
        int_field("censor_trials", 0, "CENSOR number of trials T of Algorithm 1; 0 off (paper: 20).", limit=1_000),
        real_field("censor_step", 0.1, "CENSOR trial step size eta of Algorithm 1 line 15 (paper's FL learning "
                   "rate: 0.1).", low_open=True, high=CENSOR_STEP_MAX),
        choice_field("censor_fallback", "original", "CENSOR when no trial lowers the loss: send the 'original' "
                     "gradient (Algorithm 1 line 11, the paper's; default), 'zeros' or 'skip' the round.", FALLBACKS),
        choice_field("censor_subspace", "layer", "CENSOR candidates orthogonal to each 'layer' of the batch gradient "
                     "(Algorithm 1) or to every example's gradient, 'samples' (Eq. 11).", SUBSPACES),
    )

    @staticmethod
    def settings(ctx: DefenseContext) -> dict:
        """:func:`censor_gradient`'s keyword arguments from a context (all but the generator)."""
        c = ctx.config
        return {"trials": c.censor_trials, "step": c.censor_step, "fallback": c.censor_fallback,
                "subspace": c.censor_subspace}

    def apply(self, ctx: DefenseContext, model: nn.Module, x: Tensor, y: Tensor, grad: Update, *,
              step: int) -> tuple[Update, dict]:
        out, info = censor_gradient(model, x, y, grad, **self.settings(ctx), generator=ctx.generator)
        if info["sent"] == "skip":
            ctx.skip_round()
        return out, info

    def group_key(self, ctx: DefenseContext, model: nn.Module, x: Tensor) -> tuple | None:
        """Clients whose models :func:`batchable` takes, grouped by architecture and image shape, evaluate
        their trials together (:func:`censor_gradients`); the others, and a client alone (:attr:`min_group`),
        run the reference :func:`censor_gradient`."""
        return (signature(model), tuple(x.shape[1:]), x.dtype) if batchable(model, ctx.config.censor_subspace) else None

    def apply_group(self, ctxs: Sequence[DefenseContext], models: Sequence[nn.Module], xs: Sequence[Tensor],
                    ys: Sequence[Tensor], grads: Sequence[Update], *, step: int) -> list[tuple[Update, dict]]:
        results = censor_gradients(models, xs, ys, grads, [self.settings(c) for c in ctxs], [c.generator for c in ctxs])
        for ctx, (_, info) in zip(ctxs, results):
            if info["sent"] == "skip":
                ctx.skip_round()
        return results

    def cost(self, config) -> float:
        return 0.5 * config.censor_trials + (1.0 if config.censor_subspace == "samples" else 0.0)


CENSOR = Censor()

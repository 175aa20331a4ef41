"""The batched gradient-matching engine: N reconstruction problems as one vectorised computation.

Optimisation-based attacks (DLG, Inverting Gradients, GradInversion and their adaptive variants)
all solve, for every victim update ``t`` (Geiping et al. 2020, Eq. 4; Yin et al. 2021, Eq. 3),

    x* = argmin_x  D(U(theta, x, y), t) + sum_k alpha_k R_k(x)

where ``U`` simulates what the victim shared: the gradient ``grad_theta L(theta; x, y)`` (FedSGD) or
the model difference ``theta_0 - theta_K`` after ``K = local_steps`` SGD steps with ``local_lr`` on the
same batch (FedAvg; the attacker unrolls the steps functionally, as Geiping et al. Sec. 5 do for
multi-step updates). This module runs ``P = N x R`` such problems -- N victims (or environments,
possibly with different parameters of the same architecture), each with R restarts folded into the
batch dimension -- as *one* computation per iteration:

* the dummy updates of all problems come from one ``torch.func.vmap`` over ``torch.func.grad`` of
  :func:`leakgym.models.task_loss` (``functional_call``), with the model parameters shared
  (``in_dims=None``) when all problems attack the same model and stacked otherwise;
* the distances and priors of :mod:`leakgym.attacks.losses` are computed batched over ``P``;
* one outer ``torch.autograd.grad`` of ``sum_p loss_p`` differentiates through the inner gradient
  (double backward) and yields every problem's image gradient, because problems never interact;
* the optimisers are per-problem by construction: Adam is element-wise, and L-BFGS is implemented
  here with per-problem dot products and histories (:class:`BatchedLBFGS`).

``vectorize=False`` runs the same maths as a plain Python loop over problems with
``torch.autograd.grad(..., create_graph=True)`` -- the reference formulation of the attack papers.
It exists to check the vectorised path (tests assert both agree) and as the benchmark's baseline.

BatchNorm: clients compute updates in train mode, so for batches of more than one example BN
normalises with the batch's own statistics. The engine works on a private copy of the model whose
BN layers have no running statistics (``torch.func.replace_all_batch_norm_modules_``), so BN always
uses batch statistics and ``vmap`` never meets an in-place running-stat update. Batches of one
example are computed with BN in eval mode (running statistics), mirroring
:func:`leakgym.models.bn_eval_if_single` on the client.

Randomness: initial images come from the caller. Stochastic models (PRECODE's sampling uses
``torch.randn_like``, which takes no generator) run inside ``torch.random.fork_rng`` seeded from
``seed``, so results are reproducible and the caller's global RNG is untouched; under ``vmap`` each
problem draws its own noise (``randomness="different"``), so for stochastic models the vectorised and
sequential paths are equal in distribution only. EOT simulations use an explicit generator.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import grad, vmap

from leakgym.attacks.base import Attack, AttackCost, AttackerKnowledge, AttackResult, seeded_generator
from leakgym.attacks.labels import LABEL_METHODS, infer_labels
from leakgym.attacks.losses import (
    LAYER_WEIGHT_SCHEMES,
    bn_statistics_loss,
    gradient_distance,
    group_consistency,
    l2_prior,
    layer_weights,
    target_sq_norms,
    total_variation,
)
from leakgym.fl.update import SharedUpdate
from leakgym.models import task_loss

#: ``simulate_defense(grads, generator) -> grads``: a randomised transformation applied to the
#: attacker's dummy updates (EOT). ``grads`` maps names to ``(P, *shape)`` tensors (one row per
#: problem); the callable must treat rows independently and stay differentiable.
DefenseSimulator = Callable[[dict[str, Tensor], torch.Generator], dict[str, Tensor]]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


# --------------------------------------------------------------------------------------------------
# Objective and schedule
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatchingObjective:
    """What each problem minimises: a gradient distance plus weighted image priors."""

    distance: Literal["l2", "cosine"] = "cosine"
    """``"l2"`` (DLG) or ``"cosine"`` (Inverting Gradients); see :func:`~leakgym.attacks.losses.gradient_distance`."""
    layer_weights: str | Mapping[str, float] = "equal"
    """Per-layer weights of the distance: ``"equal"``, ``"linear"``, ``"exp"`` or a name->weight mapping."""
    tv: float = 0.0
    """Weight of the total-variation prior."""
    l2: float = 0.0
    """Weight of the image-norm prior (GradInversion ``R_l2``)."""
    bn: float = 0.0
    """Weight of the BatchNorm-statistics prior (GradInversion ``R_BN``); needs target statistics."""
    group: float = 0.0
    """Weight of the group-consistency prior across restarts (GradInversion ``R_group``)."""
    eot_samples: int = 1
    """Number of samples E of ``simulate_defense`` averaged per evaluation (EOT)."""
    eot_average: Literal["gradient", "objective"] = "gradient"
    """EOT: match the mean of the E simulated updates, or average the E distances."""
    simulate_defense: DefenseSimulator | None = None
    """Randomised defense the attacker simulates on its own dummy updates (None: none)."""

    def __post_init__(self) -> None:
        if self.distance not in ("l2", "cosine"):
            raise ValueError(f"distance={self.distance!r}; allowed: 'l2', 'cosine'")
        if isinstance(self.layer_weights, str) and self.layer_weights not in LAYER_WEIGHT_SCHEMES:
            raise ValueError(f"layer_weights={self.layer_weights!r}; allowed: {LAYER_WEIGHT_SCHEMES} or a mapping")
        for name in ("tv", "l2", "bn", "group"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}={v}; must be a finite number >= 0")
        if self.eot_samples < 1:
            raise ValueError(f"eot_samples={self.eot_samples}; must be >= 1")
        if self.eot_average not in ("gradient", "objective"):
            raise ValueError(f"eot_average={self.eot_average!r}; allowed: 'gradient', 'objective'")


@dataclass(frozen=True)
class Schedule:
    """The optimisation budget and optimiser: ``iterations x restarts`` evaluations per victim."""

    iterations: int
    """Optimiser iterations (one objective and gradient evaluation each)."""
    restarts: int = 1
    """Independent restarts per victim, folded into the batch; the best by matching loss is kept."""
    optimizer: Literal["adam", "lbfgs"] = "adam"
    """``"adam"`` (Inverting Gradients, GradInversion) or ``"lbfgs"`` (DLG)."""
    lr: float = 0.1
    """Step size (Adam learning rate; L-BFGS fixed step length as in ``torch.optim.LBFGS``)."""
    signed: bool = False
    """Replace the image gradient by its sign before the Adam step (Inverting Gradients)."""
    lr_decay: bool = False
    """Multiply the Adam learning rate by 0.1 at 3/8, 5/8 and 7/8 of the iterations (Inverting Gradients)."""
    boxed: bool = False
    """Project images onto the valid normalised range after every step (``DatasetSpec.unit_bounds``)."""
    history_size: int = 100
    """L-BFGS memory (pairs kept)."""

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations={self.iterations}; must be >= 1")
        if self.restarts < 1:
            raise ValueError(f"restarts={self.restarts}; must be >= 1")
        if self.optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"optimizer={self.optimizer!r}; allowed: 'adam', 'lbfgs'")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr}; must be a finite number > 0")
        if self.history_size < 1:
            raise ValueError(f"history_size={self.history_size}; must be >= 1")


# --------------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------------
def _bn_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class _BNRecorder:
    """Forward pre-hooks on every BN layer that record the batch ``(mean, biased var)`` of its input.

    The hooks only record between :meth:`start` and :meth:`stop`, and the statistics are returned as
    outputs of the (vmapped) function, so they are ordinary differentiable tensors afterwards.
    """

    def __init__(self, model: nn.Module, enabled: bool) -> None:
        self.enabled = enabled
        self._stats: list[tuple[Tensor, Tensor]] | None = None
        if enabled:
            for m in _bn_modules(model):
                m.register_forward_pre_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        if self._stats is None:
            return
        h = inputs[0]
        dims = [0, *range(2, h.dim())]
        self._stats.append((h.mean(dim=dims), h.var(dim=dims, unbiased=False)))

    def start(self) -> None:
        self._stats = [] if self.enabled else None

    def stop(self) -> tuple[tuple[Tensor, Tensor], ...]:
        stats = tuple(self._stats or ())
        self._stats = None
        return stats


@dataclass
class ProblemSet:
    """N reconstruction problems that share an architecture, batch size and update protocol.

    Build with :meth:`from_updates`. Tensors with a leading problem dimension have size N; the
    engine broadcasts them over restarts.
    """

    model: nn.Module
    """Private working copy of the architecture (BN without running stats for batches > 1)."""
    free: dict[str, Tensor]
    """Parameters differentiated by the simulated update: ``(N, ...)`` if ``batched`` else shared."""
    fixed: dict[str, Tensor]
    """Remaining parameters and buffers, same layout as ``free``."""
    batched: bool
    """Whether parameters differ between problems (stacked) or are shared."""
    targets: dict[str, Tensor]
    """Victim updates of the matched layers, ``name -> (N, *shape)``."""
    labels: Tensor | None
    """Known/inferred labels ``int64 (N, B)``, or None to optimise soft labels jointly (DLG)."""
    kind: str
    local_steps: int
    local_lr: Tensor
    """``(N,)`` local learning rates (FedAvg)."""
    batch_size: int
    image_shape: tuple[int, int, int]
    num_classes: int
    lower: Tensor
    upper: Tensor
    """Box constraint: per-channel bounds of valid normalised images, shape ``(C, 1, 1)``."""
    bn_targets: list[tuple[Tensor, Tensor]] | None = None
    """Per BN layer, victim batch ``(mean, var)`` stacked over problems: ``(N, C_l)`` each."""

    @property
    def n(self) -> int:
        return next(iter(self.targets.values())).shape[0]

    @property
    def device(self) -> torch.device:
        return self.lower.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lower.dtype

    @classmethod
    def from_updates(
        cls,
        updates: Sequence[SharedUpdate],
        knowledges: Sequence[AttackerKnowledge],
        *,
        names: Sequence[str],
        labels: Tensor | None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        use_bn_stats: bool = False,
    ) -> ProblemSet:
        """Stack N compatible problems.

        Args:
            updates, knowledges: one per problem; same architecture, batch size, update kind and
                local step count (callers group problems by these).
            names: parameter names whose updates are matched (a subset of the update's tensors).
            labels: ``int64 (N, B)`` labels, or None to optimise soft labels.
            use_bn_stats: record BN statistics of the dummy batch and take the victim's from
                ``knowledge.bn_stats`` (GradInversion's BN prior).
        """
        if not updates or len(updates) != len(knowledges):
            raise ValueError(f"need matching, non-empty updates ({len(updates)}) and knowledges ({len(knowledges)})")
        device = torch.device(device)
        k0, u0 = knowledges[0], updates[0]
        b = k0.batch_size
        for u, k in zip(updates, knowledges):
            if k.batch_size != b or u.kind != u0.kind or u.local_steps != u0.local_steps:
                raise ValueError("problems of one ProblemSet must share batch_size, update kind and local_steps")
            if u.batch_size != k.batch_size:
                raise ValueError(
                    f"update.batch_size={u.batch_size} differs from knowledge.batch_size={k.batch_size}"
                )
        if u0.kind == "model_delta" and u0.local_steps < 1:
            raise ValueError(f"local_steps={u0.local_steps}; must be >= 1")
        names = list(names)
        if not names:
            raise ValueError("no layers to match; select at least one parameter name")
        param_names = [n for n, _ in k0.model.named_parameters()]
        unknown = [n for n in names if n not in param_names]
        if unknown:
            raise ValueError(f"matched names {unknown} are not parameters of the model; allowed: {param_names}")
        for u in updates:
            missing = [n for n in names if n not in u.tensors]
            if missing:
                raise ValueError(f"update lacks matched tensors {missing}")

        model = copy.deepcopy(k0.model).to(device=device, dtype=dtype)
        model.train()
        if b > 1:
            torch.func.replace_all_batch_norm_modules_(model)
        else:
            for m in _bn_modules(model):
                m.eval()
        for p in model.parameters():
            p.requires_grad_(False)

        # Shared parameters when every problem attacks the same model (the common case).
        models = [k.model for k in knowledges]
        state_names = param_names + [n for n, _ in model.named_buffers()]

        def state(m: nn.Module) -> dict[str, Tensor]:
            sd = dict(m.named_parameters())
            sd.update(dict(m.named_buffers()))
            return {n: sd[n].detach() for n in state_names}

        s0 = state(models[0])
        batched = False
        for m in models[1:]:
            if m is models[0]:
                continue
            sm = state(m)
            if any(sm[n].shape != s0[n].shape for n in state_names):
                raise ValueError("problems of one ProblemSet must share the architecture")
            if not all(torch.equal(sm[n], s0[n]) for n in state_names):
                batched = True
                break
        def cast(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device=device)

        if batched:
            states = [state(m) for m in models]
            full = {n: cast(torch.stack([s[n] for s in states])) for n in state_names}
        else:
            full = {n: cast(s0[n]) for n in state_names}
        if u0.kind == "gradient":
            free_names = names
        else:
            free_names = param_names  # every parameter moves during the simulated local steps
        free = {n: full[n] for n in free_names}
        fixed = {n: full[n] for n in state_names if n not in free}

        targets = {n: torch.stack([u.tensors[n].detach() for u in updates]).to(device=device, dtype=dtype)
                   for n in names}
        local_lr = torch.tensor([float(u.local_lr) for u in updates], device=device, dtype=dtype)
        if u0.kind == "model_delta" and not bool((local_lr > 0).all()):
            raise ValueError(f"model_delta updates need local_lr > 0; got {local_lr.tolist()}")
        spec = k0.spec
        lower, upper = spec.unit_bounds(torch.zeros(1, spec.channels, 1, 1, device=device, dtype=dtype))
        bn_targets = None
        if use_bn_stats:
            n_bn = len(_bn_modules(model))
            if n_bn == 0:
                raise ValueError("the BN-statistics prior needs a model with BatchNorm layers")
            if any(k.bn_stats is None for k in knowledges):
                raise ValueError("the BN-statistics prior needs knowledge.bn_stats for every problem")
            if any(len(k.bn_stats) != n_bn for k in knowledges):
                raise ValueError(f"knowledge.bn_stats must list {n_bn} (mean, var) pairs, one per BN layer")
            bn_targets = [
                (torch.stack([k.bn_stats[i][0] for k in knowledges]).to(device=device, dtype=dtype),
                 torch.stack([k.bn_stats[i][1] for k in knowledges]).to(device=device, dtype=dtype))
                for i in range(n_bn)
            ]
        if labels is not None:
            labels = labels.to(device=device, dtype=torch.int64)
            if labels.shape != (len(updates), b):
                raise ValueError(f"labels must have shape ({len(updates)}, {b}); got {tuple(labels.shape)}")
        return cls(
            model=model, free=free, fixed=fixed, batched=batched, targets=targets, labels=labels,
            kind=u0.kind, local_steps=int(u0.local_steps), local_lr=local_lr, batch_size=b,
            image_shape=tuple(spec.shape), num_classes=spec.num_classes,
            lower=lower.reshape(-1, 1, 1), upper=upper.reshape(-1, 1, 1), bn_targets=bn_targets,
        )

    def subset(self, index: int) -> ProblemSet:
        """Problem ``index`` alone (used by the sequential reference path)."""
        pick = (lambda t: t[index:index + 1]) if self.batched else (lambda t: t)
        return dataclasses.replace(
            self,
            free={n: pick(t) for n, t in self.free.items()},
            fixed={n: pick(t) for n, t in self.fixed.items()},
            targets={n: t[index:index + 1] for n, t in self.targets.items()},
            labels=None if self.labels is None else self.labels[index:index + 1],
            local_lr=self.local_lr[index:index + 1],
            bn_targets=None if self.bn_targets is None else [
                (m[index:index + 1], v[index:index + 1]) for m, v in self.bn_targets],
        )


# --------------------------------------------------------------------------------------------------
# Batched L-BFGS
# --------------------------------------------------------------------------------------------------
class BatchedLBFGS:
    """L-BFGS without line search (as ``torch.optim.LBFGS(line_search_fn=None)``), per problem.

    The variables are tensors with a leading problem dimension ``P``; every dot product, history
    pair and curvature estimate is per problem, so P problems optimised together follow exactly the
    iterates each would follow alone. One :meth:`step` is one iteration of
    ``torch.optim.LBFGS``'s inner loop: the two-loop recursion (Nocedal & Wright, Alg. 7.4) and a
    step of length ``lr`` (the first step scaled by ``min(1, 1/||g||_1)``).

    Deviations from ``torch.optim.LBFGS``: a curvature pair with ``y.s <= 1e-10`` is stored as a
    zero pair (it contributes nothing) instead of being skipped, so that histories stay aligned
    across problems; the tolerance-based early exits are replaced by freezing problems whose gradient
    is below ``tolerance_grad`` (the engine always spends its full budget).
    """

    def __init__(self, variables: Sequence[Tensor], *, lr: float = 1.0, history_size: int = 100,
                 tolerance_grad: float = 1e-7) -> None:
        self.variables = list(variables)
        self.lr = lr
        self.history_size = history_size
        self.tolerance_grad = tolerance_grad
        self.p = self.variables[0].shape[0]
        self._s: list[Tensor] = []
        self._y: list[Tensor] = []
        self._rho: list[Tensor] = []
        self._h_diag: Tensor | None = None
        self._prev_g: Tensor | None = None
        self._d: Tensor | None = None
        self._t: Tensor | None = None

    def _flat(self, tensors: Sequence[Tensor]) -> Tensor:
        return torch.cat([t.reshape(self.p, -1) for t in tensors], dim=1)

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor]) -> None:
        g = self._flat(grads)
        if self._prev_g is None:
            d = -g
            self._h_diag = torch.ones(self.p, dtype=g.dtype, device=g.device)
            t = (1.0 / g.abs().sum(dim=1)).clamp(max=1.0) * self.lr
        else:
            y = g - self._prev_g
            s = self._d * self._t[:, None]
            ys = (y * s).sum(dim=1)
            ok = ys > 1e-10
            rho = torch.where(ok, 1.0 / torch.where(ok, ys, torch.ones_like(ys)), torch.zeros_like(ys))
            if len(self._s) == self.history_size:
                self._s.pop(0), self._y.pop(0), self._rho.pop(0)
            self._s.append(torch.where(ok[:, None], s, torch.zeros_like(s)))
            self._y.append(torch.where(ok[:, None], y, torch.zeros_like(y)))
            self._rho.append(rho)
            yy = (y * y).sum(dim=1)
            self._h_diag = torch.where(ok, ys / torch.where(ok, yy, torch.ones_like(yy)), self._h_diag)
            q = -g
            alphas = []
            for s_i, y_i, r_i in zip(reversed(self._s), reversed(self._y), reversed(self._rho)):
                a_i = (s_i * q).sum(dim=1) * r_i
                q = q - a_i[:, None] * y_i
                alphas.append(a_i)
            d = q * self._h_diag[:, None]
            for s_i, y_i, r_i, a_i in zip(self._s, self._y, self._rho, reversed(alphas)):
                b_i = (y_i * d).sum(dim=1) * r_i
                d = d + s_i * (a_i - b_i)[:, None]
            t = torch.full((self.p,), self.lr, dtype=g.dtype, device=g.device)
        converged = g.abs().amax(dim=1) <= self.tolerance_grad
        t = torch.where(converged, torch.zeros_like(t), t)
        self._prev_g, self._d, self._t = g, d, t
        step = d * t[:, None]
        offset = 0
        for v in self.variables:
            size = v[0].numel()
            v.add_(step[:, offset:offset + size].reshape(v.shape))
            offset += size


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------
@dataclass
class MatchingOutput:
    """Engine result for N problems (best restart of each)."""

    images: Tensor
    """``(N, B, C, H, W)`` reconstructions, normalised space."""
    soft_labels: Tensor | None
    """``(N, B, num_classes)`` optimised label distributions (None when labels were given)."""
    matching_loss: Tensor
    """``(N,)`` matching loss of the returned images."""
    total_loss: Tensor
    """``(N,)`` full objective (matching loss plus weighted priors) of the returned images."""
    history: Tensor
    """``(iterations, N)`` matching loss per iteration of the returned restart."""
    best_restart: Tensor
    """``(N,)`` index of the returned restart."""
    iterations: int
    restarts: int


class _Simulator:
    """Computes dummy updates (and BN statistics) for all problems: vectorised or looped."""

    def __init__(self, problems: ProblemSet, restarts: int, record_bn: bool) -> None:
        self.ps = problems
        self.r = restarts
        self.names = list(problems.targets)
        self.recorder = _BNRecorder(problems.model, record_bn)
        model, recorder = problems.model, self.recorder
        kind, steps, names = problems.kind, problems.local_steps, self.names

        def loss_fn(free: dict[str, Tensor], fixed: dict[str, Tensor], x: Tensor, y: Tensor):
            recorder.start()
            loss = task_loss(model, x, y, params={**fixed, **free})
            return loss, recorder.stop()

        def update_fn(free, fixed, x, y, lr):
            if kind == "gradient":
                g, stats = grad(loss_fn, has_aux=True)(free, fixed, x, y)
                return {n: g[n] for n in names}, stats
            p, stats = free, None
            for _ in range(steps):
                g, st = grad(loss_fn, has_aux=True)(p, fixed, x, y)
                stats = st if stats is None else stats
                p = {n: p[n] - lr * g[n] for n in p}
            return {n: free[n] - p[n] for n in names}, stats

        self.loss_fn = loss_fn
        pdim = 0 if problems.batched else None
        self.vmapped = vmap(update_fn, in_dims=(pdim, pdim, 0, 0, 0), randomness="different")

    def _expand(self, t: Tensor) -> Tensor:
        return t.repeat_interleave(self.r, dim=0) if self.r > 1 else t

    def vectorised(self, x: Tensor, y: Tensor) -> tuple[dict[str, Tensor], tuple]:
        ps = self.ps
        free = {n: self._expand(t) for n, t in ps.free.items()} if ps.batched else ps.free
        fixed = {n: self._expand(t) for n, t in ps.fixed.items()} if ps.batched else ps.fixed
        return self.vmapped(free, fixed, x, y, self._expand(ps.local_lr))

    def prepare_sequential(self) -> None:
        # Leaf copies of each problem's parameters that autograd can differentiate.
        ps = self.ps
        n = ps.n
        self._leaves = []
        for i in range(n):
            src = {k: (t[i] if ps.batched else t) for k, t in ps.free.items()}
            self._leaves.append({k: v.detach().clone().requires_grad_(True) for k, v in src.items()})
        self._fixed = [{k: (t[i] if ps.batched else t) for k, t in ps.fixed.items()} for i in range(n)]

    def sequential(self, x: Tensor, y: Tensor) -> tuple[dict[str, Tensor], tuple]:
        """The same dummy updates, one problem at a time with ``torch.autograd.grad``."""
        ps = self.ps
        outs: list[dict[str, Tensor]] = []
        all_stats: list[tuple] = []
        for p in range(x.shape[0]):
            i = p // self.r
            free, fixed = self._leaves[i], self._fixed[i]
            lr = ps.local_lr[i]
            if ps.kind == "gradient":
                loss, stats = self.loss_fn(free, fixed, x[p], y[p])
                gs = torch.autograd.grad(loss, [free[n] for n in self.names], create_graph=True)
                outs.append(dict(zip(self.names, gs)))
            else:
                cur, stats = dict(free), None
                keys = list(cur)
                for _ in range(ps.local_steps):
                    loss, st = self.loss_fn(cur, fixed, x[p], y[p])
                    stats = st if stats is None else stats
                    gs = torch.autograd.grad(loss, [cur[k] for k in keys], create_graph=True)
                    cur = {k: cur[k] - lr * g for k, g in zip(keys, gs)}
                outs.append({n: free[n] - cur[n] for n in self.names})
            all_stats.append(stats)
        update = {n: torch.stack([o[n] for o in outs]) for n in self.names}
        stats = tuple(
            (torch.stack([s[j][0] for s in all_stats]), torch.stack([s[j][1] for s in all_stats]))
            for j in range(len(all_stats[0]))
        )
        return update, stats


def run_gradient_matching(
    problems: ProblemSet,
    objective: MatchingObjective,
    schedule: Schedule,
    init: Tensor,
    *,
    seed: int = 0,
    vectorize: bool = True,
    label_init: Tensor | None = None,
) -> MatchingOutput:
    """Optimise dummy images for all problems and restarts at once.

    Args:
        problems: the N problems (:meth:`ProblemSet.from_updates`).
        objective: distance and priors.
        schedule: optimiser and budget; ``schedule.restarts`` must equal ``init.shape[1]``.
        init: initial images ``(N, R, B, C, H, W)`` in normalised space.
        seed: seeds the stochastic parts (PRECODE sampling via ``fork_rng``, EOT simulations).
        vectorize: True for the vmapped computation, False for the reference Python loop.
        label_init: ``(N, R, B, num_classes)`` initial label logits when ``problems.labels`` is None
            (DLG's joint label optimisation); drawn from a seeded normal distribution if omitted.

    Returns:
        :class:`MatchingOutput`; each victim's restart with the lowest matching loss of its best
        iterate (iterates are kept by lowest total objective, as in the ``breaching`` library).
    """
    n, r = problems.n, schedule.restarts
    b = problems.batch_size
    expected = (n, r, b, *problems.image_shape)
    if tuple(init.shape) != expected:
        raise ValueError(f"init has shape {tuple(init.shape)}; expected (N, R, B, C, H, W) = {expected}")
    if objective.bn > 0 and problems.bn_targets is None:
        raise ValueError("objective.bn > 0 needs a ProblemSet built with use_bn_stats=True")
    if objective.group > 0 and r < 2:
        raise ValueError(f"group consistency needs restarts >= 2; got restarts={r}")
    device, dtype = problems.device, problems.dtype
    p_count = n * r
    weights = layer_weights(list(problems.targets), objective.layer_weights)
    t_norm = target_sq_norms(problems.targets, weights) if objective.distance == "cosine" else None

    x = init.to(device=device, dtype=dtype).reshape(p_count, b, *problems.image_shape).clone()
    x.requires_grad_(True)
    variables = [x]
    logits = None
    if problems.labels is None:
        if label_init is None:
            g = seeded_generator(seed)
            label_init = torch.randn(n, r, b, problems.num_classes, generator=g, dtype=torch.float64)
        logits = label_init.to(device=device, dtype=dtype).reshape(p_count, b, problems.num_classes).clone()
        logits.requires_grad_(True)
        variables.append(logits)
        hard = None
    else:
        hard = problems.labels.repeat_interleave(r, dim=0)

    sim = _Simulator(problems, r, record_bn=objective.bn > 0)
    if not vectorize:
        sim.prepare_sequential()
    eot_gen = seeded_generator(seed, device)
    lower, upper = problems.lower, problems.upper

    def evaluate(need_grad: bool) -> tuple[Tensor, Tensor, list[Tensor] | None]:
        y = hard if logits is None else logits.softmax(dim=-1)
        dummy, stats = sim.vectorised(x, y) if vectorize else sim.sequential(x, y)
        if objective.simulate_defense is None:
            matching = gradient_distance(dummy, problems.targets, weights, distance=objective.distance,
                                         target_norm_sq=t_norm)
        else:
            samples = [objective.simulate_defense(dict(dummy), eot_gen) for _ in range(objective.eot_samples)]
            if objective.eot_average == "gradient":
                mean = {k: torch.stack([s[k] for s in samples]).mean(dim=0) for k in problems.targets}
                matching = gradient_distance(mean, problems.targets, weights, distance=objective.distance,
                                             target_norm_sq=t_norm)
            else:
                matching = torch.stack([
                    gradient_distance(s, problems.targets, weights, distance=objective.distance,
                                      target_norm_sq=t_norm) for s in samples]).mean(dim=0)
        total = matching
        if objective.tv > 0:
            total = total + objective.tv * total_variation(x)
        if objective.l2 > 0:
            total = total + objective.l2 * l2_prior(x)
        if objective.bn > 0:
            total = total + objective.bn * bn_statistics_loss(stats, problems.bn_targets)
        if objective.group > 0:
            total = total + objective.group * group_consistency(x, r)
        grads = None
        if need_grad:
            grads = list(torch.autograd.grad(total.sum(), variables))
        return matching.detach(), total.detach(), grads

    if schedule.optimizer == "adam":
        opt = torch.optim.Adam(variables, lr=schedule.lr)
        milestones = [int(schedule.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)] if schedule.lr_decay else []
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    else:
        lbfgs = BatchedLBFGS(variables, lr=schedule.lr, history_size=schedule.history_size)

    history = torch.empty(schedule.iterations, p_count, dtype=dtype, device=device)
    best_total = torch.full((p_count,), math.inf, dtype=dtype, device=device)
    best_match = torch.full((p_count,), math.inf, dtype=dtype, device=device)
    best_x = x.detach().clone()
    best_logits = None if logits is None else logits.detach().clone()
    view = (-1,) + (1,) * (x.dim() - 1)

    def keep_best(matching: Tensor, total: Tensor) -> None:
        nonlocal best_x, best_logits
        better = total < best_total  # False for NaN: diverged iterates are never kept
        best_total.copy_(torch.where(better, total, best_total))
        best_match.copy_(torch.where(better, matching, best_match))
        best_x = torch.where(better.view(view), x.detach(), best_x)
        if logits is not None:
            best_logits = torch.where(better.view(-1, 1, 1), logits.detach(), best_logits)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for it in range(schedule.iterations):
            matching, total, grads = evaluate(need_grad=True)
            history[it] = matching
            keep_best(matching, total)
            if schedule.optimizer == "adam":
                if schedule.signed:
                    grads[0] = grads[0].sign()
                for v, g in zip(variables, grads):
                    v.grad = g
                opt.step()
                sched.step()
            else:
                lbfgs.step(grads)
            if schedule.boxed:
                with torch.no_grad():
                    x.copy_(torch.maximum(torch.minimum(x, upper), lower))
            with torch.no_grad():
                # A diverged problem restarts from its best iterate; others are unaffected.
                bad = ~torch.isfinite(x).flatten(1).all(dim=1)
                x.copy_(torch.where(bad.view(view), best_x, x))
        matching, total, _ = evaluate(need_grad=False)
        keep_best(matching, total)

    score = best_match.reshape(n, r)
    score = torch.where(torch.isfinite(score), score, torch.full_like(score, math.inf))
    best_r = score.argmin(dim=1)
    pick = torch.arange(n, device=device) * r + best_r
    images = best_x[pick].detach()
    soft = None if best_logits is None else best_logits[pick].softmax(dim=-1)
    return MatchingOutput(
        images=images, soft_labels=soft, matching_loss=best_match[pick], total_loss=best_total[pick],
        history=history[:, pick], best_restart=best_r, iterations=schedule.iterations, restarts=r,
    )


# --------------------------------------------------------------------------------------------------
# Base class of the optimisation-based attacks
# --------------------------------------------------------------------------------------------------
@dataclass
class OptimizationConfig:
    """Options shared by every optimisation-based attack."""

    iterations: int = 300
    """Optimiser iterations per restart."""
    restarts: int = 1
    """Restarts per victim (folded into the batch; the best by matching loss is returned)."""
    lr: float = 0.1
    """Optimiser step size."""
    label_method: str = "auto"
    """Label inference when labels are unknown: ``"auto"``, ``"idlg"``, ``"llg"``, ``"yin"`` (see labels.py)."""
    device: str | None = None
    """Device of the computation (None: the model's device)."""
    dtype: str = "float32"
    """Floating-point type of the computation: ``"float32"`` or ``"float64"``."""

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations={self.iterations}; must be >= 1")
        if self.restarts < 1:
            raise ValueError(f"restarts={self.restarts}; must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr}; must be a finite number > 0")
        if self.label_method not in LABEL_METHODS:
            raise ValueError(f"label_method={self.label_method!r}; allowed: {LABEL_METHODS}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; allowed: {tuple(_DTYPES)}")


class OptimizationAttack(Attack):
    """Shared driver of the optimisation-based attacks: grouping, labels, initialisation, results.

    Subclasses provide :meth:`objective` and :meth:`schedule`, and may override
    :meth:`matched_names`, :meth:`label_mode` and :meth:`initial_images`. A call to
    :meth:`reconstruct_batch` groups the problems by (architecture, batch size, update protocol,
    matched layers) and runs one engine call per group; problem ``i`` of the call draws its initial
    images from ``seed + i``, so ``reconstruct_batch(us, ks, seed=s)[i]`` equals
    ``reconstruct(us[i], ks[i], seed=s + i)`` (up to floating-point reassociation; exactly in
    distribution for stochastic models).
    """

    Config: Any = OptimizationConfig
    #: Computation path of the engine; False runs the reference per-problem loop.
    vectorize: bool = True

    # -- hooks -----------------------------------------------------------------------------------
    def objective(self) -> MatchingObjective:
        raise TypeError(f"{type(self).__name__} must define objective()")

    def schedule(self) -> Schedule:
        raise TypeError(f"{type(self).__name__} must define schedule()")

    def matched_names(self, update: SharedUpdate, knowledge: AttackerKnowledge) -> list[str]:
        """Layers whose updates are matched; default: every parameter present in the update."""
        return [n for n, _ in knowledge.model.named_parameters() if n in update.tensors]

    def label_mode(self, knowledge: AttackerKnowledge) -> Literal["known", "infer", "optimize"]:
        return "known" if knowledge.labels is not None else "infer"

    def uses_bn_stats(self, knowledge: AttackerKnowledge) -> bool:
        return False

    def initial_images(
        self, knowledge: AttackerKnowledge, labels: Tensor | None, restarts: int, generator: torch.Generator
    ) -> Tensor:
        """``(R, B, C, H, W)`` starting points; default: standard normal in normalised space."""
        return torch.randn(restarts, knowledge.batch_size, *knowledge.spec.shape, generator=generator)

    # -- driver ----------------------------------------------------------------------------------
    def _device(self, knowledge: AttackerKnowledge) -> torch.device:
        if self.config.device is not None:
            return torch.device(self.config.device)
        p = next(knowledge.model.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seed: int
    ) -> list[AttackResult]:
        objective, schedule = self.objective(), self.schedule()
        dtype = _DTYPES[self.config.dtype]
        prepared = []
        for i, (u, k) in enumerate(zip(updates, knowledges)):
            if u.batch_size != k.batch_size:
                raise ValueError(f"update {i}: batch_size={u.batch_size} but knowledge.batch_size={k.batch_size}")
            mode = self.label_mode(k)
            if mode == "known":
                labels = k.labels.detach().to(torch.int64).cpu()
            elif mode == "infer":
                labels = infer_labels(u, k, method=self.config.label_method)
            else:
                labels = None
            names = tuple(self.matched_names(u, k))
            signature = tuple((n, tuple(p.shape)) for n, p in k.model.named_parameters())
            key = (type(k.model), signature, k.batch_size, u.kind, u.local_steps, names, mode == "optimize",
                   self.uses_bn_stats(k), self._device(k))
            prepared.append((key, labels, names))

        results: list[AttackResult | None] = [None] * len(updates)
        groups: dict[tuple, list[int]] = {}
        for i, (key, _, _) in enumerate(prepared):
            groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            names, device = prepared[idx[0]][2], key[-1]
            optimise = key[6]
            labels = None if optimise else torch.stack([prepared[i][1] for i in idx])
            problems = ProblemSet.from_updates(
                [updates[i] for i in idx], [knowledges[i] for i in idx], names=names, labels=labels,
                device=device, dtype=dtype, use_bn_stats=key[7],
            )
            inits, label_inits = [], []
            for i in idx:
                g = seeded_generator(seed + i)
                inits.append(self.initial_images(knowledges[i], prepared[i][1], schedule.restarts, g))
                if optimise:
                    label_inits.append(torch.randn(schedule.restarts, knowledges[i].batch_size,
                                                   knowledges[i].spec.num_classes, generator=g))
            group_objective = objective if key[7] else dataclasses.replace(objective, bn=0.0)
            out = run_gradient_matching(
                problems, group_objective, schedule, torch.stack(inits), seed=seed + idx[0], vectorize=self.vectorize,
                label_init=torch.stack(label_inits) if optimise else None,
            )
            history = out.history.cpu()
            for j, i in enumerate(idx):
                if optimise:
                    lab = out.soft_labels[j].argmax(dim=-1).cpu()
                else:
                    lab = prepared[i][1]
                results[i] = AttackResult(
                    images=out.images[j],
                    labels=lab,
                    cost=AttackCost(iterations=out.iterations, restarts=out.restarts, wall_time_s=0.0),
                    history={"matching_loss": history[:, j].tolist()},
                    final_loss=float(out.matching_loss[j]),
                )
        return results  # type: ignore[return-value]


def config_fields(config: Any) -> dict[str, Any]:
    """The options of a config dataclass as a plain dict (for reports and benchmarks)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


__all__ = [
    "BatchedLBFGS",
    "DefenseSimulator",
    "MatchingObjective",
    "MatchingOutput",
    "OptimizationAttack",
    "OptimizationConfig",
    "ProblemSet",
    "Schedule",
    "config_fields",
    "run_gradient_matching",
]

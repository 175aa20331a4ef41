"""DCS²: Defense by Concealing Sensitive Samples (Wu, Hayat, Zhou & Harandi, AAAI 2024).

The client hides the gradient of its sensitive batch ``x_s`` among the gradients of synthesised
*concealed samples* ``x~_c`` that look nothing like ``x_s`` but have nearly the same gradient:

1. **Synthesis** (Eq. 9): starting from ``x0`` (Algorithm 1, line 2), minimise

   ``L_obj = 1 - cos(grad L(x~_c, y~_c), grad L(x_s, y_s))
            + exp(-lambda_x * ||x~_c - x_s||)
            + lambda_z * (||f(x~_c) - f(x_s)|| / ||f(x_s)|| - epsilon)``

   over ``x~_c`` with Adam, ``f`` being the latent representation (``model.features``).
2. **Mixing** (Eq. 10): ``g_c = grad{ L(x_s, y_s) + lambda_g L(x~_c, y~_c) + (1 - lambda_g) L(x~_c, y_s) }``.
3. **Projection** (Eq. 11-12, after GEM, Lopez-Paz & Ranzato 2017): if ``<g, g_c> < 0``, share
   ``g^_c = g_c + v* g`` with ``v* = argmin_{v >= 0} 1/2 g'g v^2 + g_c'g v``.

Implementation notes and deviations (all deliberate):

* The QP of Eq. 12 has one scalar variable and one constraint, so its exact solution is the clamp
  ``v* = max(0, -<g_c, g> / <g, g>)``; a numerical QP solver (scipy, or quadprog as in the
  authors' code) would only approximate this closed form. The projection is computed in float64.
  The authors' code solves the QP with ``v >= 0.5`` (GEM's "margin"); we follow the paper's
  ``v >= 0``, which makes the projected gradient exactly orthogonal to ``g`` when it triggers.
* Eq. 10 is realised as the mean loss over the *augmented* batch (sensitive + concealed samples),
  the concealed samples carrying the soft label ``lambda_g * onehot(y~_c) + (1 - lambda_g) *
  onehot(y_s)``. Cross-entropy is linear in its target, so this is Eq. 10 up to a positive scale
  for one concealed sample per sensitive sample, and for ``lambda_g = 1`` it is exactly "the
  gradient of the mini-batch augmented by the concealed sample" of the paper's remark. The scale
  keeps the shared gradient the size of an ordinary mean-loss gradient (the authors divide by 3).
* ``num_concealed`` concealed samples are made *per sensitive sample* (the authors' ``per_adv``);
  each is paired with its sensitive sample in the pixel and latent terms, while the gradient
  cosine compares whole-batch gradients, as in the authors' code. Every sample of the batch is
  sensitive (the paper's setting, "100% of the training data ... as sensitive samples").
* Start points (Algorithm 1 line 2; Table 5): ``"random"``: standard-normal noise in normalised
  space with a uniformly random label (the paper's Remark); ``"public"``: a random image of the
  public split with its label ``y0``; ``"mixup"``: ``0.7 x0 + 0.3 x_s`` with ``x0`` a public image,
  label ``y0``.
* The optimiser follows the authors' script: Adam, learning rate divided by 10 at 3/8, 5/8 and 7/8
  of the steps. Their optional early stop on the pixel distance is not in the paper and not used.

* Several clients (the victims of a vector step's games) synthesise together
  (:func:`dcs2_gradients`, one vmapped computation per Adam step over all their concealed samples;
  each client's result equals its own :func:`dcs2_gradient` to float32 rounding). BatchNorm in eval
  mode (a client's batch of one normalises with the running statistics, ``bn_eval_if_single``) is
  batched too, each client's concealed samples with its own running statistics; models with
  BatchNorm in train mode, dropout or a PRECODE bottleneck keep the one-client path (:func:`batchable`).
  "To float32 rounding" holds per step; over many Adam steps the synthesis can amplify rounding: on the
  LeNet and the ConvNet the shared updates agree to 2e-6 after 1,000 (300) steps, but on the ReLU MLP
  with BatchNorm they differed by up to 28% after 1,000 steps (its one-client path moves by 5% when
  the image moves by 1e-7: chaotic, not a batching error; helper review). Compare such models' batched
  and one-by-one results statistically, not entry by entry.

The model is not modified: parameters are used through :func:`torch.func.functional_call`-style
copies, and any buffers (BatchNorm statistics) are restored after the call.

The registered defense :data:`DCS2` (fields ``dcs2_*``, switch ``dcs2_lambda_g``) transforms every
local step's gradient (step stage). Its cost is ``num_concealed * steps + 1`` clean-gradient units
per round: each synthesis step differentiates a gradient (about one gradient per concealed sample),
plus the gradient of the augmented batch.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from leakgym.defenses.registry import DefenseContext, GroupedStepDefense, choice_field, int_field, real_field
from leakgym.fl.batched import independent_rows, signature, stack_buffers, stack_parameters
from leakgym.models import has_batchnorm, task_loss
from leakgym.models.parameter_sets import batched_forward, vmap_pays_off
from leakgym.models.rowwise import RowwiseForward
from leakgym.optim.adam import BatchedAdam, decayed_rates

#: Allowed start points of the concealed-sample optimisation (Algorithm 1 line 2, Table 5).
STARTS = ("random", "public", "mixup")
#: Weight of the public image in the "mixup" start ``0.7 x0 + 0.3 x_s`` (paper, Table 5).
MIXUP_START_WEIGHT = 0.7


@contextlib.contextmanager
def _buffers_restored(model: nn.Module) -> Iterator[None]:
    """Run a block and put every buffer of ``model`` (e.g. BatchNorm statistics) back afterwards."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])


def _flat(tensors: list[Tensor] | tuple[Tensor, ...]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _soft(y: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    return torch.nn.functional.one_hot(y, num_classes).to(dtype)


def project_gradient(g: Tensor, g_c: Tensor) -> tuple[Tensor, bool, float]:
    """Eq. 11-12: the closest vector to ``g_c`` with ``<g, g^_c> >= 0``.

    Returns ``(g^_c, projected, v*)``. Computed in float64 and cast back to ``g_c``'s dtype.
    """
    g64, gc64 = g.double(), g_c.double()
    dot = float(g64 @ gc64)
    gg = float(g64 @ g64)
    if dot >= 0 or gg == 0.0:
        return g_c, False, 0.0
    v = max(0.0, -dot / gg)
    return (gc64 + v * g64).to(g_c.dtype), True, v


def _validate(
    x: Tensor, y: Tensor, lambda_g: float, lambda_x: float, lambda_z: float, epsilon: float,
    num_concealed: int, steps: int, lr: float, start: str, public_x: Tensor | None,
    public_y: Tensor | None,
) -> None:
    if x.ndim != 4 or y.ndim != 1 or y.shape[0] != x.shape[0] or x.shape[0] < 1:
        raise ValueError(f"x must be (B, C, H, W) and y (B,); got {tuple(x.shape)} and {tuple(y.shape)}")
    if y.dtype != torch.int64:
        raise ValueError(f"DCS² needs hard int64 labels; got dtype {y.dtype}")
    for name, value, lo, hi in (
        ("lambda_g", lambda_g, 0.0, 1.0), ("lambda_x", lambda_x, 0.0, math.inf),
        ("lambda_z", lambda_z, 0.0, math.inf), ("epsilon", epsilon, 0.0, math.inf),
    ):
        if not (lo <= value <= hi) or not math.isfinite(value):
            raise ValueError(f"{name}={value}; allowed range [{lo}, {hi}]")
    if num_concealed < 1:
        raise ValueError(f"num_concealed={num_concealed}; must be >= 1")
    if steps < 0:
        raise ValueError(f"steps={steps}; must be >= 0")
    if not lr > 0:
        raise ValueError(f"lr={lr}; must be > 0")
    if start not in STARTS:
        raise ValueError(f"start={start!r}; allowed: {', '.join(map(repr, STARTS))}")
    if start in ("public", "mixup"):
        if public_x is None or public_y is None or public_x.shape[0] == 0:
            raise ValueError(f"start={start!r} needs public_x and public_y (a non-empty public split)")
        if public_x.shape[1:] != x.shape[1:] or public_y.shape[0] != public_x.shape[0]:
            raise ValueError(
                f"public_x {tuple(public_x.shape)} / public_y {tuple(public_y.shape)} do not match x {tuple(x.shape)}"
            )


def _start_points(
    x_s: Tensor, num_classes: int, start: str, public_x: Tensor | None, public_y: Tensor | None,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Algorithm 1 line 2: ``x~_c <- x0``, ``y~_c <- y0`` for every (already repeated) sensitive sample."""
    m = x_s.shape[0]
    dev = generator.device  # draw where the generator lives, then move
    if start == "random":
        x0 = torch.randn(x_s.shape, generator=generator, device=dev).to(x_s)
        y0 = torch.randint(0, num_classes, (m,), generator=generator, device=dev).to(x_s.device)
        return x0, y0
    assert public_x is not None and public_y is not None
    pick = torch.randint(0, public_x.shape[0], (m,), generator=generator, device=dev).to(public_x.device)
    x0 = public_x[pick].to(x_s)
    y0 = public_y[pick.to(public_y.device)].to(device=x_s.device, dtype=torch.int64)
    if start == "mixup":
        x0 = MIXUP_START_WEIGHT * x0 + (1.0 - MIXUP_START_WEIGHT) * x_s
    return x0, y0


@dataclass
class _Concealment:
    """One client's synthesis problem (Algorithm 1 lines 1-2): what Eq. 9-12 need besides ``x~_c``."""

    names: list[str]
    g: Tensor  # flat clean gradient
    g_norm: Tensor
    x: Tensor
    y: Tensor
    x_s: Tensor  # sensitive samples repeated num_concealed times
    y_s: Tensor
    z_rep: Tensor  # their latent representations, repeated
    z_norm: Tensor
    x0: Tensor
    y_c: Tensor
    y_c_soft: Tensor
    num_classes: int


def _conceal(model: nn.Module, x: Tensor, y: Tensor, clean_grad: dict[str, Tensor], *, lambda_g: float,
             lambda_x: float, lambda_z: float, epsilon: float, num_concealed: int, steps: int, lr: float, start: str,
             public_x: Tensor | None, public_y: Tensor | None, generator: torch.Generator) -> _Concealment:
    """Validate one client's arguments and set up its synthesis (start points drawn from ``generator``)."""
    _validate(x, y, lambda_g, lambda_x, lambda_z, epsilon, num_concealed, steps, lr, start, public_x, public_y)
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # what a client shares (frozen: not)
    missing = [n for n in names if n not in clean_grad]
    if missing:
        raise ValueError(f"clean_grad lacks parameter(s) {missing[:3]}{'...' if len(missing) > 3 else ''}")
    params = dict(model.named_parameters())
    g = _flat([clean_grad[n].detach().to(params[n]) for n in names])
    with _buffers_restored(model), torch.no_grad():
        z_s = model.features(x).flatten(1)
        head = getattr(model, "head", None)
        num_classes = int(head.out_features) if isinstance(head, nn.Linear) else int(model(x).shape[-1])
    x_s = x.repeat_interleave(num_concealed, dim=0)
    y_s = y.repeat_interleave(num_concealed, dim=0)
    z_rep = z_s.repeat_interleave(num_concealed, dim=0)
    x0, y_c = _start_points(x_s, num_classes, start, public_x, public_y, generator)
    return _Concealment(names=names, g=g, g_norm=g.norm().clamp_min(1e-12), x=x, y=y, x_s=x_s, y_s=y_s, z_rep=z_rep,
                        z_norm=z_rep.norm(dim=1).clamp_min(1e-12), x0=x0, y_c=y_c,
                        y_c_soft=_soft(y_c, num_classes, x.dtype), num_classes=num_classes)


def _eq9(cos: Tensor, pix: Tensor, lat: Tensor, lambda_x: float | Tensor, lambda_z: float | Tensor,
         epsilon: float | Tensor) -> Tensor:
    """Eq. 9 from its ingredients: ``(1 - cos) + exp(-lambda_x * pix) + lambda_z * (lat - epsilon)``."""
    return (1 - cos) + torch.exp(-lambda_x * pix) + lambda_z * (lat - epsilon)


def _milestones(steps: int) -> list[int]:
    """The authors' decay points (x0.1 at 3/8, 5/8, 7/8 of the steps), each once."""
    return sorted({int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)})


@dataclass
class _Synthesised:
    """The outcome of Eq. 9's optimisation for one client."""

    xc: Tensor
    objective: float
    cos: float
    pix: float
    lat: float
    cos0: float
    pix0: float


def _mix_and_project(model: nn.Module, c: _Concealment, s: _Synthesised, lambda_g: float,
                     clean_grad: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict]:
    """Eq. 10 (mixing, as the mean loss of the augmented batch) and Eq. 11-12 (projection)."""
    params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
    num_classes, dtype = c.num_classes, c.x.dtype
    soft_c = lambda_g * c.y_c_soft + (1 - lambda_g) * _soft(c.y_s, num_classes, dtype)
    x_aug = torch.cat([c.x, s.xc])
    y_aug = torch.cat([_soft(c.y, num_classes, dtype), soft_c])
    # A functional call: the model's buffers (BatchNorm statistics) are used as copies, never updated.
    loss = task_loss(model, x_aug, y_aug, params=params)
    g_c = _flat(torch.autograd.grad(loss, [params[n] for n in c.names])).detach()
    g = c.g
    shared, projected, v = project_gradient(g, g_c)
    dot = float(g.double() @ g_c.double())
    shared_cos = float((shared.double() @ g.double())
                       / (shared.double().norm().clamp_min(1e-12) * g.double().norm().clamp_min(1e-12)))
    out: dict[str, Tensor] = {}
    offset = 0
    for n in c.names:
        ref = clean_grad[n]
        out[n] = shared[offset : offset + ref.numel()].view_as(ref).to(ref)
        offset += ref.numel()
    details = {
        "gradient_cosine": s.cos,
        "gradient_cosine_init": s.cos0,
        "pixel_distance": s.pix,
        "pixel_distance_init": s.pix0,
        "latent_distance": s.lat,
        "objective": s.objective,
        "dot": dot,
        "projected": projected,
        "v": v,
        "shared_cosine": shared_cos,
        "augmented_batch_size": int(x_aug.shape[0]),
        "concealed_x": s.xc,
        "concealed_y": c.y_c,
    }
    return out, details


def dcs2_gradient(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    clean_grad: dict[str, Tensor],
    *,
    lambda_g: float,
    lambda_x: float,
    lambda_z: float,
    epsilon: float,
    num_concealed: int,
    steps: int,
    lr: float,
    start: str,
    public_x: Tensor | None,
    public_y: Tensor | None,
    generator: torch.Generator,
) -> tuple[dict[str, Tensor], dict]:
    """The gradient DCS² shares for one step on the sensitive batch ``(x, y)`` (Algorithm 1).

    The reference implementation, one client at a time with plain autograd; it handles every model
    (BatchNorm, PRECODE). :func:`dcs2_gradients` computes the same for several clients at once.

    Args:
        model: the current model (not modified).
        x: ``(B, C, H, W)`` normalised sensitive images; ``y``: ``(B,)`` int64 labels.
        clean_grad: ``g``, the gradient of the mean task loss on ``(x, y)``, keyed by parameter name.
        lambda_g: weight of the concealed label in Eq. 10 (paper: 0.7).
        lambda_x, lambda_z, epsilon: weights of Eq. 9 (authors' MNIST script: 0.01, 0.01, 0.01).
        num_concealed: concealed samples per sensitive sample (authors: 1).
        steps, lr: Adam steps and learning rate of the synthesis (authors: 1000, 0.1).
        start: ``"random"``, ``"public"`` or ``"mixup"`` (see module docstring).
        public_x, public_y: public split, normalised like ``x`` (needed by "public" and "mixup").
        generator: source of all randomness (start points, random labels).

    Returns:
        ``(shared_grad, details)``: the gradient to share, keyed like ``clean_grad``, and a dict with
        ``gradient_cosine`` (concealed vs sensitive gradient, Eq. 6, after synthesis),
        ``gradient_cosine_init``, ``pixel_distance`` / ``pixel_distance_init`` (mean L2 between
        each concealed sample and its sensitive sample, normalised space), ``latent_distance``
        (relative, Eq. 8), ``objective`` (final Eq. 9 value), ``dot`` (``<g, g_c>``),
        ``projected`` (whether Eq. 11 triggered), ``v`` (``v*``), ``shared_cosine`` (cosine of the
        shared gradient to ``g``), ``augmented_batch_size`` and the ``concealed_x`` / ``concealed_y``.
    """
    c = _conceal(model, x, y, clean_grad, lambda_g=lambda_g, lambda_x=lambda_x, lambda_z=lambda_z, epsilon=epsilon,
                 num_concealed=num_concealed, steps=steps, lr=lr, start=start, public_x=public_x, public_y=public_y,
                 generator=generator)
    # A private copy whose parameters are the differentiation variables: called directly, it computes what
    # ``task_loss(model, ..., params=...)`` computes, without ``functional_call``'s per-call re-parametrisation
    # (a large share of a step on small models). Its buffers absorb BatchNorm's running-statistics updates.
    work = copy.deepcopy(model)
    params = dict(work.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    plist = [params[n] for n in c.names]

    with _buffers_restored(model):
        # Without a PRECODE bottleneck or BatchNorm, the representation f(x~_c) is the head's input in the loss's
        # own forward pass (same parameters, same values as ``model.features``): captured there, Eq. 9 needs one
        # forward and one double backward per step instead of a second forward/backward through the body (about
        # a fifth of a step). The gradient is the same up to float32 summation order (measured: <= 2e-6 relative
        # after 30 steps on LeNet). A PRECODE bottleneck samples, so there ``model.features`` keeps drawing its own
        # sample; with BatchNorm the input gradient has directions where it is zero up to rounding, which Adam's
        # normalised step turns into full steps, so any change of summation order changes the concealed sample:
        # both keep the separate forward pass.
        shared_forward = (getattr(model, "bottleneck", None) is None and not has_batchnorm(model)
                          and isinstance(getattr(work, "head", None), nn.Module))

        def objective(xc: Tensor, create_graph: bool) -> tuple[Tensor, float, float, float]:
            """Eq. 9 and its three ingredients (gradient cosine, pixel distance, latent distance)."""
            seen: list[Tensor] = []
            hook = work.head.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) if shared_forward \
                else None
            try:
                loss = task_loss(work, xc, c.y_c_soft)
            finally:
                if hook is not None:
                    hook.remove()
            grads = torch.autograd.grad(loss, plist, create_graph=create_graph)
            gc = _flat(grads)
            cos = (gc @ c.g) / (gc.norm().clamp_min(1e-12) * c.g_norm)
            pix = (xc - c.x_s).flatten(1).norm(dim=1).mean()
            z_c = seen[0] if shared_forward else model.features(xc)
            lat = ((z_c.flatten(1) - c.z_rep).norm(dim=1) / c.z_norm).mean()
            obj = _eq9(cos, pix, lat, lambda_x, lambda_z, epsilon)
            return obj, float(cos.detach()), float(pix.detach()), float(lat.detach())

        xc = c.x0.detach().clone().requires_grad_(True)
        _, cos0, pix0, _ = objective(xc, create_graph=False)
        opt = torch.optim.Adam([xc], lr=lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=_milestones(steps), gamma=0.1)
        for _ in range(steps):
            obj, *_ = objective(xc, create_graph=True)
            (grad_x,) = torch.autograd.grad(obj, [xc])
            opt.zero_grad(set_to_none=True)
            xc.grad = grad_x
            opt.step()
            sched.step()
        xc = xc.detach()
        obj, cos, pix, lat = objective(xc.clone().requires_grad_(True), create_graph=False)
    done = _Synthesised(xc=xc, objective=float(obj.detach()), cos=cos, pix=pix, lat=lat, cos0=cos0, pix0=pix0)
    return _mix_and_project(model, c, done, lambda_g, clean_grad)


def batchable(model: nn.Module) -> bool:
    """Whether :func:`dcs2_gradients` takes ``model``: a :class:`~leakgym.models.LeakGymModel`-style
    model with a ``head``, whose forward pass draws nothing from torch's global RNG and does not couple
    the examples of a batch (:func:`leakgym.fl.batched.independent_rows`: no dropout or PRECODE
    bottleneck, BatchNorm only in eval mode). The others keep :func:`dcs2_gradient`."""
    return isinstance(getattr(model, "head", None), nn.Module) and independent_rows(model)


def synthesised_together(model: nn.Module) -> bool:
    """Whether the :class:`DCS2` defense synthesises ``model``'s clients with :func:`dcs2_gradients`: a
    :func:`batchable` model for which the vmap form pays on its device
    (:func:`~leakgym.models.parameter_sets.vmap_pays_off`). On a CPU, ResNet-18's synthesis is faster client
    by client with :func:`dcs2_gradient` (1,440 against 1,852 ms a client at 4 clients and 3 steps)."""
    return batchable(model) and vmap_pays_off(model)


def dcs2_gradients(models: list[nn.Module], xs: list[Tensor], ys: list[Tensor], clean_grads: list[dict[str, Tensor]],
                   settings: list[dict], generators: list[torch.Generator]) -> list[tuple[dict[str, Tensor], dict]]:
    """:func:`dcs2_gradient` of K clients at once: their Eq. 9 syntheses as one computation per step.

    The clients' models share one architecture (:func:`batchable`, equal parameter shapes), their
    images one shape and their ``settings`` (:func:`dcs2_gradient`'s keyword arguments) one ``steps``;
    batch sizes, ``num_concealed``, ``lr``, ``lambda_x``, ``lambda_z``, ``epsilon``, ``lambda_g`` and
    ``start`` may differ. The rows of the computation are the concealed samples of all clients, each
    with its client's parameters (``sum_k M_k`` rows; the means of Eq. 9 over client ``k``'s ``M_k``
    samples become sums with weight ``1 / M_k``), so every row is a one-image forward pass whose small
    convolutions take the unfolded form.

    Each step evaluates every client's Eq. 9 with a vmapped forward pass over the rows (client ``k``'s
    concealed samples through client ``k``'s model), takes every client's parameter gradient with one
    ``torch.autograd.grad(..., create_graph=True)`` of the rows' weighted losses (the clients' losses
    are independent, so the gradient of their sum is each one's own) and every row's image gradient
    with one more, and steps a per-row Adam (:class:`~leakgym.optim.adam.BatchedAdam`,
    ``torch.optim.Adam`` with ``MultiStepLR``, each row at its client's step size). The rows' forward pass
    is :func:`~leakgym.models.parameter_sets.batched_forward`: under vmap, small convolutions take the
    unfolded form (:mod:`leakgym.models.convolution`: a per-row weight would make them grouped
    convolutions, whose double backward loops over the groups); a plain layer stack (DLG's LeNet) skips
    vmap and computes every row in its row-wise form (:mod:`leakgym.models.rowwise`; measured,
    20 steps, one image per client, one CPU thread: 1 client 69 -> 44 ms, 16 clients 185 -> 148 ms;
    test: ``test_batched_synthesis_of_lenet_is_rowwise_and_equals_the_vmap_form``). Start points
    come from each client's own generator, drawn as :func:`dcs2_gradient` draws them; the mixing and
    projection (Eq. 10-12) run client by client. Client ``k``'s result equals :func:`dcs2_gradient`'s
    to float32 rounding (test: ``tests/test_defenses_dcs2.py``). Measured (LeNet 16x16, one CPU thread,
    20 steps, 8 clients): 137 ms against 642 ms one by one with one image each; 206 ms against 708 ms
    with 1-3 images and 1-2 concealed samples per image (an earlier form that padded every client to
    the largest count took 322 ms).
    """
    k = len(models)
    if not (k == len(xs) == len(ys) == len(clean_grads) == len(settings) == len(generators)) or k == 0:
        raise ValueError("dcs2_gradients needs one model, batch, clean gradient, settings and generator per client")
    steps = settings[0]["steps"]
    for i, (m, x, s) in enumerate(zip(models, xs, settings)):
        if not batchable(m) or signature(m) != signature(models[0]):
            raise ValueError(f"client {i}'s model is not of client 0's batchable architecture; use dcs2_gradient")
        if tuple(x.shape[1:]) != tuple(xs[0].shape[1:]) or s["steps"] != steps:
            raise ValueError(f"client {i} has images {tuple(x.shape[1:])} and steps={s['steps']}; client 0 has "
                             f"{tuple(xs[0].shape[1:])} and {steps}")
    cs = [_conceal(m, x, y, g, **s, generator=gen)
          for m, x, y, g, s, gen in zip(models, xs, ys, clean_grads, settings, generators)]
    device, dtype = xs[0].device, xs[0].dtype
    sizes = [c.x_s.shape[0] for c in cs]
    owner = torch.repeat_interleave(torch.arange(k, device=device), torch.tensor(sizes, device=device))  # (R,)
    weight = torch.cat([torch.full((m,), 1.0 / m, dtype=dtype, device=device) for m in sizes])  # the means

    def per_client(values: Tensor) -> Tensor:
        """``(R,)`` per-row terms -> ``(K,)`` per-client sums."""
        return torch.zeros(k, dtype=values.dtype, device=device).index_add(0, owner, values)

    column = {key: torch.tensor([s[key] for s in settings], dtype=dtype, device=device)
              for key in ("lambda_x", "lambda_z", "epsilon")}
    g, g_norm = torch.stack([c.g for c in cs]), torch.stack([c.g_norm for c in cs])
    x_s, z_rep, z_norm = (torch.cat([getattr(c, a) for c in cs]) for a in ("x_s", "z_rep", "z_norm"))
    y_soft = torch.cat([c.y_c_soft for c in cs])
    names = cs[0].names
    base = copy.deepcopy(models[0])
    leaves = {n: t.requires_grad_(True) for n, t in stack_parameters(models).items()}
    # BatchNorm in eval mode (batchable) normalises with running statistics: each row gets its client's,
    # the other buffers (BN's step counters, unused in eval mode) are model 0's.
    stacked = stack_buffers(models)
    constants = {n: b.detach() for n, b in base.named_buffers() if n not in stacked}
    row_buffers = {n: t.index_select(0, owner) for n, t in stacked.items()}
    # The row-wise form for a plain layer stack (DLG's LeNet), else None: the vmap form (leakgym.models.parameter_sets)
    rowwise = RowwiseForward.of(base, 1, tuple(xs[0].shape[1:]))

    def forward_all(p: dict[str, Tensor], b: dict[str, Tensor], xc: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        # every concealed sample a row of one image; f(x~_c) of Eq. 8 is the head's input in this same forward pass
        logits, z = batched_forward(base, p, xc.unsqueeze(1), b, shared=constants, rowwise=rowwise, features=True)
        return torch.nn.functional.cross_entropy(logits.squeeze(1), y, reduction="none"), z.squeeze(1)

    def objective(xc: Tensor, create_graph: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Eq. 9 of every client ``(K,)`` and its ingredients (cosine, pixel and latent distances)."""
        rows = {n: leaf.index_select(0, owner) for n, leaf in leaves.items()}  # each row: its client's parameters
        losses, z = forward_all(rows, row_buffers, xc, y_soft)
        # d/d(client k's parameters) of its mean loss: the rows' weighted losses, summed per client by autograd
        grads = torch.autograd.grad((losses * weight).sum(), [leaves[n] for n in names], create_graph=create_graph)
        gc = torch.cat([t.reshape(k, -1) for t in grads], dim=1)
        cos = (gc * g).sum(dim=1) / (gc.norm(dim=1).clamp_min(1e-12) * g_norm)
        pix = per_client((xc - x_s).flatten(1).norm(dim=1) * weight)
        lat = per_client((z.flatten(1) - z_rep).norm(dim=1) / z_norm * weight)
        return _eq9(cos, pix, lat, column["lambda_x"], column["lambda_z"], column["epsilon"]), cos, pix, lat

    milestones = _milestones(steps)
    rates = torch.tensor([decayed_rates(s["lr"], milestones) for s in settings], dtype=torch.float64, device=device)
    xc = torch.cat([c.x0 for c in cs]).detach().clone().requires_grad_(True)
    _, cos0, pix0, _ = objective(xc, create_graph=False)
    opt = BatchedAdam([xc], lr=rates.index_select(0, owner),
                      milestones=torch.tensor([milestones] * xc.shape[0], device=device).reshape(xc.shape[0], -1))
    for _ in range(steps):
        obj = objective(xc, create_graph=True)[0]
        (grad_x,) = torch.autograd.grad(obj.sum(), [xc])
        opt.step([grad_x])
    xc = xc.detach()
    final = objective(xc.clone().requires_grad_(True), create_graph=False)
    obj, cos, pix, lat = (t.detach().tolist() for t in final)
    cos0, pix0 = cos0.detach().tolist(), pix0.detach().tolist()
    mine = xc.split(sizes)
    return [_mix_and_project(m, c, _Synthesised(xc=mine[i], objective=obj[i], cos=cos[i], pix=pix[i],
                                                lat=lat[i], cos0=cos0[i], pix0=pix0[i]), s["lambda_g"], grad)
            for i, (m, c, s, grad) in enumerate(zip(models, cs, settings, clean_grads))]


#: Upper bound of DCS²'s weights, latent margin and step size (the paper's are 0.01 and 0.1): far beyond any
#: useful value and still finite in float32 (at 1e30-1e39 the synthesis overflowed and the client sent NaN).
DCS2_SETTING_MAX = 1e6


class DCS2(GroupedStepDefense):
    """DCS²: every step's gradient mixed with concealed samples' gradients, then projected (Eq. 9-12)."""

    name = "dcs2"
    fields = (
        real_field("dcs2_lambda_g", 0.0, "DCS² weight lambda_g of Eq. (10); 0 off (paper: 0.7).", high=1.0),
        real_field("dcs2_lambda_x", 0.01, "DCS² lambda_x of Eq. (9) (authors' MNIST script: 0.01).",
                   high=DCS2_SETTING_MAX),
        real_field("dcs2_lambda_z", 0.01, "DCS² lambda_z of Eq. (9) (authors' MNIST script: 0.01).",
                   high=DCS2_SETTING_MAX),
        real_field("dcs2_epsilon", 0.01, "DCS² latent distance epsilon of Eq. (8)-(9) (authors' MNIST script: 0.01).",
                   high=DCS2_SETTING_MAX),
        # limits: a scenario's documented bounds on the synthesis (the authors': 1 sample, 1,000 steps)
        int_field("dcs2_num_concealed", 1, "DCS² number of concealed samples per sensitive sample (authors: 1).",
                  low=1, limit=64),
        int_field("dcs2_steps", 1000, "DCS² optimisation steps for the concealed sample (authors' MNIST script: 1000).",
                  low=1, limit=30_000),
        real_field("dcs2_lr", 0.1, "DCS² learning rate of the concealed-sample optimisation (authors: 0.1).",
                   low_open=True, high=DCS2_SETTING_MAX),
        choice_field("dcs2_start", "mixup", "DCS² starting point x0: 'random' noise, a 'public' image, or 'mixup' "
                      "0.7 x0 + 0.3 xs (paper Table 5).", STARTS),
    )

    def validate(self, config) -> None:
        encodings = {k: getattr(config, k) for k in ("mixup_k", "instahide_k") if getattr(config, k)}
        if config.dcs2_lambda_g > 0 and encodings:
            raise ValueError(
                f"DefenseConfig.dcs2_lambda_g={config.dcs2_lambda_g} with "
                f"{', '.join(f'{k}={v}' for k, v in encodings.items())}: DCS² synthesises concealed samples for "
                "the client's labelled images (Eq. 9), and a Mixup/InstaHide client trains on mixed images with "
                "soft labels; use one of them")

    def reads_public_split(self, config) -> bool:
        """Only the 'public' and 'mixup' starts draw a public image (:func:`_start_points`)."""
        return config.dcs2_start in ("public", "mixup")

    def settings(self, ctx: DefenseContext) -> dict:
        """:func:`dcs2_gradient`'s keyword arguments from a context (all but the generator); the public split
        only for the starts that draw from it."""
        c = ctx.config
        public = self.reads_public_split(c)
        return {"lambda_g": c.dcs2_lambda_g, "lambda_x": c.dcs2_lambda_x, "lambda_z": c.dcs2_lambda_z,
                "epsilon": c.dcs2_epsilon, "num_concealed": c.dcs2_num_concealed, "steps": c.dcs2_steps,
                "lr": c.dcs2_lr, "start": c.dcs2_start, "public_x": ctx.public_x if public else None,
                "public_y": ctx.public_y if public else None}

    def apply(self, ctx: DefenseContext, model: nn.Module, x: Tensor, y: Tensor, grad: dict[str, Tensor], *,
              step: int) -> tuple[dict[str, Tensor], dict]:
        if synthesised_together(model):  # the batched form with one client: what the same client gets in a group
            return self.apply_group([ctx], [model], [x], [y], [grad], step=step)[0]
        return dcs2_gradient(model, x, y, grad, **self.settings(ctx), generator=ctx.generator)

    def group_key(self, ctx: DefenseContext, model: nn.Module, x: Tensor) -> tuple | None:
        """Clients whose models are :func:`synthesised_together`, grouped by architecture, image shape and
        ``steps``, are synthesised together; the others one by one (:func:`dcs2_gradient`)."""
        return (signature(model), tuple(x.shape[1:]), x.dtype, ctx.config.dcs2_steps) \
            if synthesised_together(model) else None

    def apply_group(self, ctxs: Sequence[DefenseContext], models: Sequence[nn.Module], xs: Sequence[Tensor],
                    ys: Sequence[Tensor], grads: Sequence[dict[str, Tensor]], *,
                    step: int) -> list[tuple[dict[str, Tensor], dict]]:
        return dcs2_gradients(list(models), list(xs), list(ys), list(grads), [self.settings(c) for c in ctxs],
                              [c.generator for c in ctxs])

    def cost(self, config) -> float:
        return float(config.dcs2_num_concealed * config.dcs2_steps + 1)


DCS2_DEFENSE = DCS2()

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
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from leakgym.defenses.registry import DefenseContext, StepDefense, choice_field, int_field, real_field
from leakgym.models import has_batchnorm, task_loss

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
    _validate(x, y, lambda_g, lambda_x, lambda_z, epsilon, num_concealed, steps, lr, start, public_x, public_y)
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in clean_grad]
    if missing:
        raise ValueError(f"clean_grad lacks parameter(s) {missing[:3]}{'...' if len(missing) > 3 else ''}")
    # A private copy whose parameters are the differentiation variables: called directly, it computes what
    # ``task_loss(model, ..., params=...)`` computes, without ``functional_call``'s per-call re-parametrisation
    # (a large share of a step on small models). Its buffers absorb BatchNorm's running-statistics updates.
    work = copy.deepcopy(model)
    params = dict(work.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    plist = [params[n] for n in names]
    g = _flat([clean_grad[n].detach().to(params[n]) for n in names])
    g_norm = g.norm().clamp_min(1e-12)

    with _buffers_restored(model):
        with torch.no_grad():
            z_s = model.features(x).flatten(1)
            head = getattr(model, "head", None)
            num_classes = int(head.out_features) if isinstance(head, nn.Linear) else int(model(x).shape[-1])
        x_s = x.repeat_interleave(num_concealed, dim=0)
        y_s = y.repeat_interleave(num_concealed, dim=0)
        z_rep = z_s.repeat_interleave(num_concealed, dim=0)
        z_norm = z_rep.norm(dim=1).clamp_min(1e-12)
        x0, y_c = _start_points(x_s, num_classes, start, public_x, public_y, generator)
        y_c_soft = _soft(y_c, num_classes, x.dtype)

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
                loss = task_loss(work, xc, y_c_soft)
            finally:
                if hook is not None:
                    hook.remove()
            grads = torch.autograd.grad(loss, plist, create_graph=create_graph)
            gc = _flat(grads)
            cos = (gc @ g) / (gc.norm().clamp_min(1e-12) * g_norm)
            pix = (xc - x_s).flatten(1).norm(dim=1).mean()
            z_c = seen[0] if shared_forward else model.features(xc)
            lat = ((z_c.flatten(1) - z_rep).norm(dim=1) / z_norm).mean()
            obj = (1 - cos) + torch.exp(-lambda_x * pix) + lambda_z * (lat - epsilon)
            return obj, float(cos.detach()), float(pix.detach()), float(lat.detach())

        xc = x0.detach().clone().requires_grad_(True)
        _, cos0, pix0, _ = objective(xc, create_graph=False)
        opt = torch.optim.Adam([xc], lr=lr)
        milestones = sorted({int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)})
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        for _ in range(steps):
            obj, *_ = objective(xc, create_graph=True)
            (grad_x,) = torch.autograd.grad(obj, [xc])
            opt.zero_grad(set_to_none=True)
            xc.grad = grad_x
            opt.step()
            sched.step()
        xc = xc.detach()
        obj, cos, pix, lat = objective(xc.clone().requires_grad_(True), create_graph=False)

        # Eq. 10 as the mean loss of the augmented batch (see module docstring).
        soft_c = lambda_g * y_c_soft + (1 - lambda_g) * _soft(y_s, num_classes, x.dtype)
        x_aug = torch.cat([x, xc])
        y_aug = torch.cat([_soft(y, num_classes, x.dtype), soft_c])
        loss_aug = task_loss(work, x_aug, y_aug)
        g_c = _flat(torch.autograd.grad(loss_aug, plist)).detach()

    shared, projected, v = project_gradient(g, g_c)
    dot = float(g.double() @ g_c.double())
    shared_cos = float((shared.double() @ g.double()) / (shared.double().norm().clamp_min(1e-12) * g.double().norm()))
    out: dict[str, Tensor] = {}
    offset = 0
    for n in names:
        ref = clean_grad[n]
        out[n] = shared[offset : offset + ref.numel()].view_as(ref).to(ref)
        offset += ref.numel()
    details = {
        "gradient_cosine": cos,
        "gradient_cosine_init": cos0,
        "pixel_distance": pix,
        "pixel_distance_init": pix0,
        "latent_distance": lat,
        "objective": float(obj.detach()),
        "dot": dot,
        "projected": projected,
        "v": v,
        "shared_cosine": shared_cos,
        "augmented_batch_size": int(x_aug.shape[0]),
        "concealed_x": xc,
        "concealed_y": y_c,
    }
    return out, details


class DCS2(StepDefense):
    """DCS²: every step's gradient mixed with concealed samples' gradients, then projected (Eq. 9-12)."""

    name = "dcs2"
    fields = (
        real_field("dcs2_lambda_g", 0.0, "DCS² weight lambda_g of Eq. (10); 0 off (paper: 0.7).", high=1.0),
        real_field("dcs2_lambda_x", 0.01, "DCS² lambda_x of Eq. (9) (authors' MNIST script: 0.01)."),
        real_field("dcs2_lambda_z", 0.01, "DCS² lambda_z of Eq. (9) (authors' MNIST script: 0.01)."),
        real_field("dcs2_epsilon", 0.01, "DCS² latent distance epsilon of Eq. (8)-(9) (authors' MNIST script: 0.01)."),
        int_field("dcs2_num_concealed", 1, "DCS² number of concealed samples per batch (authors: 1).", low=1),
        int_field("dcs2_steps", 1000, "DCS² optimisation steps for the concealed sample (authors' MNIST script: 1000).",
                  low=1),
        real_field("dcs2_lr", 0.1, "DCS² learning rate of the concealed-sample optimisation (authors: 0.1).",
                   low_open=True),
        choice_field("dcs2_start", "mixup", "DCS² starting point x0: 'random' noise, a 'public' image, or 'mixup' "
                      "0.7 x0 + 0.3 xs (paper Table 5).", STARTS),
    )

    def apply(self, ctx: DefenseContext, model: nn.Module, x: Tensor, y: Tensor, grad: dict[str, Tensor], *,
              step: int) -> tuple[dict[str, Tensor], dict]:
        c = ctx.config
        return dcs2_gradient(
            model, x, y, grad, lambda_g=c.dcs2_lambda_g, lambda_x=c.dcs2_lambda_x, lambda_z=c.dcs2_lambda_z,
            epsilon=c.dcs2_epsilon, num_concealed=c.dcs2_num_concealed, steps=c.dcs2_steps, lr=c.dcs2_lr,
            start=c.dcs2_start, public_x=ctx.public_x, public_y=ctx.public_y, generator=ctx.generator,
        )

    def cost(self, config) -> float:
        return float(config.dcs2_num_concealed * config.dcs2_steps + 1)


DCS2_DEFENSE = DCS2()

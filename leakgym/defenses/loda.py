"""LODA: Learning to Obscure Data (Wan, Xu, Liu, Ren, Fan & Tang, "Defense Against Gradient
Leakage Attacks via Learning to Obscure Data").

Every private image ``x*`` is replaced, before training, by an obscured image (Eq. 4)

    ``E(x*) = argmin_{x' in X} ||g(x') - g(x*)||^2 - c ||x' - x*||^2``

that a feature extractor ``g`` trained on public data sees like ``x*`` while its pixels are pushed
away from ``x*``. Algorithm 1 (Appendix A): start from a random public image, take ``T`` steps of
*normalised* gradient descent ``x' <- x' - tau * grad / ||grad||`` (per image) and project onto the
valid image box after each step. The client then trains on ``(E(x*), y*)``.

``g`` is the concatenated output of the first ``layers`` convolutional layers of the extractor
(LODA1: five; LODA2: all, ``layers="all"``); a list of module names selects other layers.

Deviations, and why:

* The paper's extractor is a ResNet-18 trained on a *different* public dataset (CIFAR-100 for
  CIFAR-10). LeakGym trains the extractor on the public split of the same dataset (the only public
  data an offline environment has) and uses the library's ConvNet (Inverting Gradients' eight
  conv-BN-ReLU blocks, width 8) by default, which has enough convolutional layers for LODA1's
  "first five" and runs on a CPU; ``arch="resnet18"`` gives the paper's architecture.
* The extractor is trained with Adam (lr 1e-3, batch 32, ``epochs`` epochs) and cached on disk;
  the paper does not state its training recipe. It is trained once per dataset ("once for all",
  LODA §1) with the fixed seed :data:`LODA_EXTRACTOR_SEED`.
* **Deviation, by default: obscured every round.** The paper obscures each private image *once*
  ("once for all", §1: the obscured data replace the private data for the whole training); with
  ``loda_mode="per-round"`` (the default, kept so that existing games do not change) every batch is
  obscured anew each round, from start images (Algorithm 1 line 3) drawn from the round's own
  generator -- so an image shared twice is obscured twice from different starts, and an attacker
  sees several obscured versions of it. ``loda_mode="once"`` is the paper's protocol (and the one
  ``leakgym reproduce loda`` uses): ``E(x*)`` is a function of the image alone -- its start image is
  picked by a hash of the image's bytes, not by the round's generator -- computed the first time the
  image is shared and remembered (an in-process memo of at most :data:`ONCE_MEMO_IMAGES` images;
  an image that fell out of it is obscured again from the same start, to the same result up to the
  rounding of the extractor's kernels at another batch size).
* Units. LeakGym's images are normalised model inputs ``(x_unit - mean) / std``; the paper (and its
  code) works on [0, 1] images. The step ``tau`` is applied in image units, as in Algorithm 1: every
  step moves the [0, 1] image by ``tau`` in L2 (an earlier version took the step in normalised units:
  ``tau * std`` = 0.032 per step on digits, 3.1x shorter than the paper's). The pixel term of Eq. 4
  is in normalised units: ``c ||x' - x||^2`` (normalised) is ``(c / std^2) ||x' - x||^2`` on [0, 1]
  images, so the paper's ``c = 20`` equals our ``c = 20 * std^2`` (2.0 on digits, std 0.319) and our
  ``c = 9`` is 88 in the paper's units.
* ``c``. The paper's ``c = 20`` (LODA1) balances the pixel term against a ResNet-18's feature scale;
  Eq. 4 is not scale-free (``||g(x') - g(x)||^2`` grows with the extractor's activations), and near
  ``x`` the objective is ``(x' - x)^T (J^T J - c I)(x' - x)``: ``c`` is a threshold on the
  extractor's sensitivity, pixel directions less sensitive than ``c`` are pushed away from ``x``,
  the others pulled in. For LeakGym's extractor the paper's value pushes every direction away.
  :data:`CALIBRATED_C` is calibrated on digits 16x16 (LODA1: first five conv layers, 500 steps of
  ``tau = 0.1`` in image units, extractor seed 0): 64 private images (the first 32 of clients 0 and 1
  of ``federated_split(..., num_clients=4, seed=0)``), two independent draws of public start images
  each (generators seeded 0 and 1; 128 obscured images per row). Measured means of the relative
  feature distance ``||g(x')-g(x)|| / ||g(x)||`` (0.97 at the public start), the pixel L2 distance to
  the private image (normalised units; 15.12 at the start), the distance travelled from the start
  image, SSIM to the private image (:func:`leakgym.metrics.ssim` on [0, 1] images; 0.20 at the start)
  and the share that collapses onto the private image (SSIM > 0.9):

  =====  ============  ==========  ==========  =====  =========
  c      feature dist  pixel dist  from start  SSIM   collapsed
  =====  ============  ==========  ==========  =====  =========
  3      0.06          0.29        15.09       1.00   128/128
  5      0.11          1.72        14.76       0.98   124/128
  6      0.23          4.66        13.82       0.89   97/128
  7      0.42          9.02        12.29       0.68   48/128
  8      0.59          13.41       11.81       0.45   17/128
  **9**  **0.72**      **16.92**   **13.26**   0.28   7/128
  10     0.86          20.87       16.12       0.12   2/128
  12     1.11          27.96       22.77       -0.12  0/128
  20     1.49          37.07       31.80       -0.39  0/128
  =====  ============  ==========  ==========  =====  =========

  Eq. 4 acts image by image like a threshold: an image either falls back onto the private one
  (the attracting directions win) or is pushed away, so the mean hides a bimodal spread. ``c = 9``
  is kept as the smallest value at which only a few images collapse onto their private original
  (7 of 128) while the features still move a quarter of the way to the target (0.97 -> 0.72); at
  ``c = 10`` the features barely move (0.86), at ``c = 8`` 13% of the images collapse. Smaller ``c``
  align the features better on average but hand a growing share of the private images to the
  attacker unchanged. With the reproduction's 100 steps ``c = 9`` reaches feature distance 0.69,
  SSIM 0.31 and 3/128 collapsed (``c = 7``: 0.56, 0.51, 15/128; ``c = 5``: 0.38, 0.75, 47/128).
  At the paper's printed ``c = 20``, taken in our units, the features end *further* from the target than
  the start image was (1.49): the pixel term wins everywhere. ``c = 20`` remains available (preset
  ``loda-paper``: the number the paper prints, taken in LeakGym's normalised units, so about 10x the
  paper's pixel weight on digits; the paper's weight itself, 2.0 here, lies below the ``c = 3`` row,
  where every image collapsed onto its private original); it is the right value only for its own
  extractor and its own pixel units.

Images in and out are normalised model inputs; ``public_x`` must be normalised the same way.

Several clients that share the settings and the public split (so the extractor) -- the victims of a
vector step's games -- obscure their images in one run (:func:`loda_obscure_many`, the registered
defense's ``apply_many``): every image's objective and step are its own, so batching them changes
only the rounding of the extractor's kernels. Measured (digits 16x16, one CPU thread, 100 steps, 16
clients of one image each): 0.63 s together against 1.96 s one by one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from leakgym.data.spec import DatasetSpec
from leakgym.defenses.registry import DefenseContext, InputDefense, choice_field, int_field, real_field
from leakgym.models import build_model

#: ``loda_mode``: obscure every round (the default, a deviation) or each image once (the paper's).
LODA_MODES = ("per-round", "once")
#: Seed of the feature extractor, trained once per dataset and cached (not the start-image draw).
LODA_EXTRACTOR_SEED = 0
#: ``c`` calibrated for the default extractor on digits (module docstring; the paper's LODA1: 20).
CALIBRATED_C = 9.0
#: Default extractor architecture (see module docstring) and training epochs.
DEFAULT_ARCH = "convnet"
DEFAULT_WIDTH = 8
EXTRACTOR_CONV_LAYERS = 8
"""Convolutional layers of the default extractor (``DEFAULT_ARCH``): the most ``loda_layers`` can take
(the registered field's bound, checked when a configuration is built, not after the extractor trained)."""
DEFAULT_EPOCHS = 20
#: Largest number of obscured images ``loda_mode="once"`` remembers per process (oldest first out): ~100 MB
#: of 32x32 RGB float32 images.
ONCE_MEMO_IMAGES = 8192
#: Extractor training hyper-parameters (not given in the paper).
TRAIN_LR = 1e-3
TRAIN_BATCH = 32

LayerSpec = int | str | Sequence[str]


def default_cache_dir() -> Path:
    """``$LEAKGYM_DATA/loda`` if ``LEAKGYM_DATA`` is set, else ``~/.cache/leakgym/loda``."""
    root = os.environ.get("LEAKGYM_DATA")
    return Path(root) / "loda" if root else Path.home() / ".cache" / "leakgym" / "loda"


def _fingerprint(public_x: Tensor, public_y: Tensor) -> str:
    h = hashlib.sha256()
    h.update(public_x.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    h.update(public_y.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _check_public(spec: DatasetSpec, public_x: Tensor | None, public_y: Tensor | None) -> tuple[Tensor, Tensor]:
    if public_x is None or public_y is None or public_x.shape[0] == 0:
        raise ValueError("LODA needs a non-empty public split (public_x, public_y)")
    if tuple(public_x.shape[1:]) != spec.shape:
        raise ValueError(f"public_x has image shape {tuple(public_x.shape[1:])}; spec {spec.name!r} needs {spec.shape}")
    if public_y.shape != (public_x.shape[0],):
        raise ValueError(f"public_y must have shape ({public_x.shape[0]},); got {tuple(public_y.shape)}")
    return public_x, public_y


def feature_extractor(
    spec: DatasetSpec,
    public_x: Tensor,
    public_y: Tensor,
    *,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    epochs: int = DEFAULT_EPOCHS,
    arch: str = DEFAULT_ARCH,
    width: int | None = DEFAULT_WIDTH,
) -> nn.Module:
    """The LODA feature extractor for this dataset and seed: trained once, then loaded from disk.

    The classifier ``arch`` is trained on the normalised public split ``(public_x, public_y)``
    and saved as a state dict under ``cache_dir`` (default :func:`default_cache_dir`), keyed by
    dataset, image size, architecture, epochs, seed and a fingerprint of the public data. Later
    calls load it with ``torch.load(weights_only=True)``. Returned in eval mode with frozen
    parameters; its ``loaded_from_cache`` attribute tells whether it was loaded.
    """
    public_x, public_y = _check_public(spec, public_x, public_y)
    if epochs < 0:
        raise ValueError(f"epochs={epochs}; must be >= 0")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = (f"{spec.name}-{spec.image_size}px-{arch}-w{width}-ep{epochs}-seed{seed}-"
           f"{_fingerprint(public_x, public_y)}.pt")
    path = cache / key
    model = build_model(arch, spec, width=width, seed=seed, device=public_x.device, dtype=public_x.dtype)
    if path.exists():
        _load_cached(model, path, public_x.device)
        model.loaded_from_cache = True
    else:
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=TRAIN_LR)
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        n = public_x.shape[0]
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen).to(public_x.device)
            for start in range(0, n, TRAIN_BATCH):
                idx = order[start : start + TRAIN_BATCH]
                if idx.numel() < 2:  # BatchNorm needs two examples
                    continue
                opt.zero_grad(set_to_none=True)
                loss_fn(model(public_x[idx]), public_y[idx]).backward()
                opt.step()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            cache.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), tmp)
            tmp.replace(path)  # atomic: concurrent readers never see a partial file
        except OSError as exc:  # (found in an audit: a bare FileNotFoundError naming no path)
            raise ValueError(f"LODA extractor cache {str(cache)!r}: cannot write there ({exc.strerror or exc}); "
                             "allowed: a folder you can create and write (cache_dir, or $LEAKGYM_DATA)") from None
        model.loaded_from_cache = False
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _load_cached(model: nn.Module, path: Path, device) -> None:
    """The cached extractor's state into ``model``; a file that cannot be read (truncated, not a state dict
    of this architecture) or holds non-finite weights is a ``ValueError`` naming it: every later LODA round
    failed with an error that did not say which file, and NaN weights obscured every image to NaN features
    (fidelity 0) without a word. Deleting the file makes the next call retrain it."""
    fix = "delete it and the next LODA round trains the extractor again"
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a damaged file (EOF, zip, pickle, keys)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"LODA extractor cache {path} is damaged ({first}); {fix}") from None
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        raise ValueError(f"LODA extractor cache {path} holds non-finite weights ({bad[0]}); {fix}")


def extractor_layers(extractor: nn.Module, layers: LayerSpec) -> list[nn.Module]:
    """The modules of ``extractor`` that ``layers`` selects (:class:`LayerFeatures`); ``ValueError`` naming
    what is allowed otherwise."""
    convs = [(n, m) for n, m in extractor.named_modules() if isinstance(m, nn.Conv2d)]
    if isinstance(layers, bool):
        raise ValueError(f"layers={layers!r}; allowed: int >= 1, 'all', or a list of module names")  # noqa: TRY004
    if isinstance(layers, int):
        if not 1 <= layers <= len(convs):
            raise ValueError(f"layers={layers}; the extractor has {len(convs)} conv layers, allowed [1, {len(convs)}]")
        return [m for _, m in convs[:layers]]
    if layers == "all":
        return [m for _, m in convs]
    if isinstance(layers, str):
        raise ValueError(f"layers={layers!r}; allowed: int >= 1, 'all', or a list of module names")  # noqa: TRY004
    named = dict(extractor.named_modules())
    unknown = [name for name in layers if name not in named]
    if unknown or not layers:
        raise ValueError(f"unknown extractor module(s) {unknown}; allowed: {sorted(n for n in named if n)}")
    return [named[name] for name in layers]


class LayerFeatures(nn.Module):
    """``g(x)``: the flattened, concatenated outputs of chosen modules of an extractor (LODA Eq. 4)."""

    def __init__(self, extractor: nn.Module, layers: LayerSpec) -> None:
        super().__init__()
        self.extractor = extractor
        self.layers = extractor_layers(extractor, layers)  # a plain list: already submodules of extractor

    def forward(self, x: Tensor) -> Tensor:
        outs: list[Tensor] = []
        wanted = {id(m) for m in self.layers}
        last = self.layers[-1]

        def hook(module: nn.Module, _inp: tuple, out: Tensor) -> None:
            if id(module) in wanted:
                outs.append(out.flatten(1))
                if module is last:
                    raise _StopForward

        handles = [m.register_forward_hook(hook) for m in self.layers]
        try:
            self.extractor(x)
        except _StopForward:
            pass
        finally:
            for h in handles:
                h.remove()
        return torch.cat(outs, dim=1)


class _StopForward(Exception):
    """Raised by the last hook: the rest of the extractor is not needed."""


#: Images obscured together in one tensor by :func:`obscure`. Every image's objective and normalised step
#: depend on that image alone (the extractor is frozen, in eval mode), so chunking does not change the
#: result; 64 is the fastest size measured on one CPU thread (per image and step: 0.47 ms in chunks of 64,
#: 0.67 ms for a whole 324-image shard at once, which leaves the cache).
OBSCURE_CHUNK = 64


def obscure(
    x: Tensor, g: nn.Module, x0: Tensor, *, c: float, steps: int, lr: float, lo: Tensor, hi: Tensor,
    chunk: int | None = OBSCURE_CHUNK, pixel_scale: Tensor | None = None,
) -> tuple[Tensor, list[float]]:
    """Algorithm 1 lines 4-8 for a batch: normalised gradient descent on Eq. 4 from ``x0``.

    ``x``, ``x0`` are normalised model inputs ``(x_unit - mean) / std``. ``pixel_scale``: the ``std``
    (broadcastable to ``x``); given, every step moves the *image* (``x_unit``, in [0, 1]) by ``lr`` in L2
    along its normalised gradient, as Algorithm 1 (and the paper's code, which works on [0, 1] images)
    does; ``None``: the step is taken in normalised-input units (``lr * std`` in image units). The
    pixel term ``c ||x' - x||^2`` is in normalised-input units either way (``c`` is calibrated in them).
    The images are processed ``chunk`` at a time (``None``: all at once); the result does not depend
    on ``chunk``. Returns the obscured images and the per-step mean objective over all images.
    """
    out, objective = _obscure_images(x, g, x0, c=c, steps=steps, lr=lr, lo=lo, hi=hi, chunk=chunk,
                                     pixel_scale=pixel_scale)
    return out, objective.mean(dim=1).tolist() if x.shape[0] else [0.0] * steps


def _obscure_images(
    x: Tensor, g: nn.Module, x0: Tensor, *, c: float, steps: int, lr: float, lo: Tensor, hi: Tensor,
    chunk: int | None = OBSCURE_CHUNK, pixel_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`obscure`, with every image's objective at every step: ``(steps, n)`` float64."""
    n = x.shape[0]
    size = n if chunk is None else int(chunk)
    if size < 1:
        raise ValueError(f"chunk={chunk}; must be >= 1 or None")
    parts: list[Tensor] = []
    objective = torch.zeros(steps, n, dtype=torch.float64, device=x.device)
    for start in range(0, n, size):
        xc, xp = x[start:start + size], x0[start:start + size].detach().clone()
        with torch.no_grad():
            target = g(xc)
        for t in range(steps):
            xp.requires_grad_(True)
            per_image = (g(xp) - target).pow(2).sum(1) - c * (xp - xc).flatten(1).pow(2).sum(1)
            (grad,) = torch.autograd.grad(per_image.sum(), [xp])
            objective[t, start:start + xp.shape[0]] = per_image.detach()
            if pixel_scale is not None:  # d/dx_unit = d/dx / std; the image moves by lr, x by lr / std
                grad = grad / pixel_scale
            norm = grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)
            step = lr * grad / norm
            if pixel_scale is not None:
                step = step / pixel_scale
            with torch.no_grad():
                xp = torch.max(torch.min(xp - step, hi), lo)
        parts.append(xp.detach())
    out = torch.cat(parts) if parts else x0.detach().clone()
    return out, objective


def loda_obscure(
    x: Tensor,
    y: Tensor,
    *,
    spec: DatasetSpec,
    c: float,
    steps: int,
    lr: float,
    layers: LayerSpec,
    public_x: Tensor,
    public_y: Tensor,
    seed: int = LODA_EXTRACTOR_SEED,
    generator: torch.Generator | None = None,
    cache_dir: str | Path | None = None,
    epochs: int = DEFAULT_EPOCHS,
    arch: str = DEFAULT_ARCH,
    width: int | None = DEFAULT_WIDTH,
    once: bool = False,
) -> tuple[Tensor, dict]:
    """Obscure a batch with LODA (Eq. 4, Algorithm 1); labels are kept.

    Args:
        x: ``(B, C, H, W)`` normalised private images; ``y``: their labels (unchanged by LODA).
        spec: the dataset description (image box, cache key).
        c: pixel-distance weight, on normalised inputs (paper: LODA1 c=20, LODA2 c=30, on [0, 1] images;
            see "Units" in the module docstring).
        steps, lr: normalised-gradient-descent steps ``T`` and step size ``tau``, an L2 step of the image in
            [0, 1] units (paper: 500, 0.1).
        layers: which extractor layers form ``g`` (int: first k conv layers, paper LODA1: 5;
            ``"all"``: every conv layer, LODA2; or module names).
        public_x, public_y: normalised public split (extractor training and start images).
        seed: extractor seed (cache key); keep it fixed so the extractor is trained once.
        generator: source of the start-image draw (Algorithm 1 line 3), drawn on its device;
            ``None``: a CPU generator seeded with ``seed`` (the same starts for every call).
        cache_dir: extractor cache (default :func:`default_cache_dir`).
        once: obscure each image once for all rounds (the paper's protocol, see :func:`loda_obscure_many`);
            ``generator`` is then not drawn from.

    Returns:
        ``(x_obscured, details)``; details has ``feature_distance`` / ``pixel_distance`` (mean per
        image, relative feature distance ``||g(x')-g(x)|| / ||g(x)||`` and L2 in normalised space),
        their values at the start image, ``objective`` (history), ``start_indices`` and
        ``extractor_cached``.
    """
    (xo, details), = loda_obscure_many([x], [y], spec=spec, c=c, steps=steps, lr=lr, layers=layers,
                                       public_x=public_x, public_y=public_y, seed=seed,
                                       generators=[torch.Generator().manual_seed(seed) if generator is None
                                                   else generator],
                                       cache_dir=cache_dir, epochs=epochs, arch=arch, width=width, once=once)
    return xo, details


def loda_obscure_many(
    xs: Sequence[Tensor],
    ys: Sequence[Tensor],
    *,
    spec: DatasetSpec,
    c: float,
    steps: int,
    lr: float,
    layers: LayerSpec,
    public_x: Tensor,
    public_y: Tensor,
    generators: Sequence[torch.Generator],
    seed: int = LODA_EXTRACTOR_SEED,
    cache_dir: str | Path | None = None,
    epochs: int = DEFAULT_EPOCHS,
    arch: str = DEFAULT_ARCH,
    width: int | None = DEFAULT_WIDTH,
    once: bool = False,
) -> list[tuple[Tensor, dict]]:
    """:func:`loda_obscure` of several clients' batches that share the dataset, the public split (so
    the extractor) and the settings: each client's start images drawn from its own generator, every
    image of every client obscured in one run of Algorithm 1 (:func:`obscure`: each image's objective
    and normalised step are its own, so this is each client's own result, to the rounding of the
    extractor's kernels at another batch size). Returns ``(x_obscured, details)`` per client.

    ``once``: the paper's "once for all" (module docstring): every image's start is picked by a hash of
    its bytes (the generators are not drawn from), and an image obscured before with the same settings,
    dataset and public split is taken from the memo instead of being obscured again (``details``:
    ``memo_hits``, the images of the batch that were)."""
    for x, y in zip(xs, ys):
        if x.ndim != 4 or tuple(x.shape[1:]) != spec.shape:
            raise ValueError(f"x must be (B, {', '.join(map(str, spec.shape))}); got {tuple(x.shape)}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y has {y.shape[0]} labels for {x.shape[0]} images")
    if len(xs) != len(ys) or len(xs) != len(generators) or not xs:
        raise ValueError("loda_obscure_many needs one batch, label set and generator per client")
    if not (c >= 0):
        raise ValueError(f"c={c}; must be >= 0")
    if steps < 0:
        raise ValueError(f"steps={steps}; must be >= 0")
    if not lr > 0:
        raise ValueError(f"lr={lr}; must be > 0")
    public_x, public_y = _check_public(spec, public_x, public_y)
    extractor = feature_extractor(
        spec, public_x, public_y, seed=seed, cache_dir=cache_dir, epochs=epochs, arch=arch, width=width
    )
    g = LayerFeatures(extractor, layers)
    if once:  # the start image is a function of the image: E(x*) depends on x* alone
        picks = [torch.tensor([_image_hash(im) % public_x.shape[0] for im in x], dtype=torch.int64,
                              device=public_x.device) for x in xs]
    else:
        picks = [torch.randint(0, public_x.shape[0], (x.shape[0],), generator=gen, device=gen.device).to(
            public_x.device) for x, gen in zip(xs, generators)]
    x = torch.cat(list(xs))
    x0 = public_x[torch.cat(picks)].to(x)
    lo, hi = spec.unit_bounds(x)
    x0 = torch.max(torch.min(x0, hi), lo)
    std = torch.tensor(spec.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    hits = [False] * x.shape[0]
    if once:
        setting = (c, steps, lr, str(layers), spec, seed, epochs, arch, width, _fingerprint(public_x, public_y),
                   x.dtype, str(x.device))
        keys = [(setting, _image_hash(im)) for im in x]
        hits = [k in _ONCE_MEMO for k in keys]
        todo = [i for i, hit in enumerate(hits) if not hit]
        xp = torch.empty_like(x)
        objective = torch.zeros(steps, x.shape[0], dtype=torch.float64, device=x.device)
        if todo:
            index = torch.tensor(todo, device=x.device)
            fresh, obj = _obscure_images(x[index], g, x0[index], c=c, steps=steps, lr=lr, lo=lo, hi=hi,
                                         pixel_scale=std)
            xp[index], objective[:, index] = fresh, obj
            for i, im in zip(todo, fresh):
                _ONCE_MEMO[keys[i]] = im.detach().clone()
            while len(_ONCE_MEMO) > ONCE_MEMO_IMAGES:
                _ONCE_MEMO.pop(next(iter(_ONCE_MEMO)))
        for i, hit in enumerate(hits):
            if hit:
                xp[i] = _ONCE_MEMO[keys[i]]
    else:
        xp, objective = _obscure_images(x, g, x0, c=c, steps=steps, lr=lr, lo=lo, hi=hi, pixel_scale=std)
    with torch.no_grad():

        def distances(z: Tensor) -> tuple[Tensor, Tensor]:
            """Per image: relative feature distance to its private image, and pixel L2 distance."""
            feat = []
            for i in range(0, x.shape[0], OBSCURE_CHUNK):  # chunked: 1,300 images' features take ~140 MB
                fx = g(x[i:i + OBSCURE_CHUNK])
                feat.append((g(z[i:i + OBSCURE_CHUNK]) - fx).norm(dim=1) / fx.norm(dim=1).clamp_min(1e-12))
            return torch.cat(feat), (z - x).flatten(1).norm(dim=1)

        f0, p0 = distances(x0)
        f1, p1 = distances(xp)
    cached = bool(getattr(extractor, "loaded_from_cache", False))
    out, first = [], 0
    for xi, pick in zip(xs, picks):
        mine = slice(first, first + xi.shape[0])
        first += xi.shape[0]
        out.append((xp[mine], {
            "feature_distance": float(f1[mine].mean()),
            "pixel_distance": float(p1[mine].mean()),
            "feature_distance_init": float(f0[mine].mean()),
            "pixel_distance_init": float(p0[mine].mean()),
            "objective": objective[:, mine].mean(dim=1).tolist(),
            "start_indices": pick,
            "extractor_cached": cached,
            **({"memo_hits": sum(hits[mine])} if once else {}),
        }))
    return out


#: ``loda_mode="once"``: (settings, image hash) -> the obscured image (insertion order: oldest first).
_ONCE_MEMO: dict[tuple, Tensor] = {}


def _image_hash(image: Tensor) -> int:
    """A 64-bit hash of an image's bytes (its dtype's), the same on every device and in every process."""
    data = image.detach().to("cpu").contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


#: Upper bound of ``loda_c`` (the paper's is 20, the calibrated 9): far beyond any useful value (at ``c = 20``
#: the pixel term already wins everywhere, see the table above) and still finite in float32. At ``c`` near
#: 1e38 (accepted before) the objective overflowed, every obscured image became NaN and the client sent a NaN
#: update without an error (helper review; ``tests/test_defenses_many.py``).
LODA_C_MAX = 1e6


class Loda(InputDefense):
    """LODA1-style obscuring of every private image (Eq. 4, Algorithm 1); labels are kept."""

    name = "loda"
    fields = (
        real_field("loda_c", 0.0, "LODA pixel-distance weight c of Eq. (4), normalised pixel units; 0 off (paper: 20 for its "
                   "ResNet-18 on [0, 1] pixels, 20 * std^2 here; "
                   f"calibrated for LeakGym's extractor: {CALIBRATED_C:g}).", high=LODA_C_MAX),
        int_field("loda_steps", 500, "LODA normalised-gradient-descent steps T (paper: 500).", low=1,
                  limit=30_000),  # a scenario's documented bound
        real_field("loda_lr", 0.1, "LODA step size tau: L2 step of the [0, 1] image (paper: 0.1).", low_open=True),
        int_field("loda_layers", 5, "LODA feature extractor g: output of the first ``loda_layers`` convolutional "
                  "layers (paper LODA1: 5).", low=1, high=EXTRACTOR_CONV_LAYERS),
        choice_field("loda_mode", "per-round", "LODA: obscure every batch anew each round ('per-round', a "
                     "deviation) or each image once for all training ('once', the paper's).", LODA_MODES),
    )

    def apply(self, ctx: DefenseContext, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, dict]:
        c = ctx.config
        if ctx.public_x is None or ctx.public_y is None:
            raise ValueError("LODA needs the public split: pass public_x and public_y to apply_defense")
        xo, info = loda_obscure(x, y, spec=ctx.spec, c=c.loda_c, steps=c.loda_steps, lr=c.loda_lr,
                                layers=c.loda_layers, public_x=ctx.public_x, public_y=ctx.public_y,
                                seed=LODA_EXTRACTOR_SEED, generator=ctx.generator, once=c.loda_mode == "once")
        return xo, y, info

    def apply_many(self, ctxs: Sequence[DefenseContext], xs: Sequence[Tensor],
                   ys: Sequence[Tensor]) -> list[tuple[Tensor, Tensor, dict]]:
        """Clients with the same settings, dataset and public split (so the same extractor) obscure their
        images in one run (:func:`loda_obscure_many`); each draws its start images from its own generator."""
        groups: list[tuple[DefenseContext, list[int]]] = []
        for i, ctx in enumerate(ctxs):
            if ctx.public_x is None or ctx.public_y is None:
                raise ValueError("LODA needs the public split: pass public_x and public_y to apply_defense")
            for lead, members in groups:
                if _same_extractor_and_settings(lead, ctx):
                    members.append(i)
                    break
            else:
                groups.append((ctx, [i]))
        out: list = [None] * len(ctxs)
        for lead, members in groups:
            c = lead.config
            results = loda_obscure_many(
                [xs[i] for i in members], [ys[i] for i in members], spec=lead.spec, c=c.loda_c, steps=c.loda_steps,
                lr=c.loda_lr, layers=c.loda_layers, public_x=lead.public_x, public_y=lead.public_y,
                seed=LODA_EXTRACTOR_SEED, generators=[ctxs[i].generator for i in members], once=c.loda_mode == "once")
            for i, (xo, info) in zip(members, results):
                out[i] = (xo, ys[i], info)
        return out

    def cost(self, config) -> float:
        """One unit per obscuring step (a forward and backward through part of the extractor)."""
        return float(config.loda_steps)


def _same_extractor_and_settings(a: DefenseContext, b: DefenseContext) -> bool:
    """Whether two clients' LODA runs can be one: equal settings, dataset, device and public split."""
    fields = ("loda_c", "loda_steps", "loda_lr", "loda_layers", "loda_mode")
    return (all(getattr(a.config, f) == getattr(b.config, f) for f in fields) and a.spec == b.spec
            and a.device == b.device and a.public_x.shape == b.public_x.shape and a.public_y.shape == b.public_y.shape
            and bool(torch.equal(a.public_x, b.public_x)) and bool(torch.equal(a.public_y, b.public_y)))


LODA = Loda()

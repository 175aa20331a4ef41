"""Why do Mixup and InstaHide train (or not)? FedSGD under each part of the encoding, measured.

InstaHide (:func:`leakgym.defenses.encodings.instahide_encode`) is three things at once: a Mixup of
``k`` images (cross-dataset: the private image, one other private image and ``k - 2`` public
images), soft labels that mix only the private labels, and a fresh uniformly random pixel-wise sign
mask per example and round. :func:`diagnose` trains the same LeNet by the same FedSGD loop under
each part alone and together, at two learning rates, and evaluates every model twice: on the plain
test images (what the reproduction's utility column measures) and on sign-flipped test images (a
fresh random mask per image: the input distribution an InstaHide-trained model has seen). The
gradient is the one the defense pipeline shares (``task_loss`` on the encoded batch with soft labels);
the loop is written out here only so that the variants that are not defenses (no sign flip, signs
only) can run through it.
"""

from __future__ import annotations

import time

import torch

from leakgym.defenses.encodings import instahide_encode, mixup_encode, random_signs

#: variant -> (encoding, learning-rate multiplier, model or None for the run's, seeds: None all, n the first n);
#: encodings are applied to normalised images. The ConvNet (BatchNorm after every conv) rows ask whether
#: the sign mask is learnable at all by a model with normalisation layers, as the official InstaHide
#: ResNet-18 has; lr 0.1 (0.5 diverges for it), every seed, beside the ConvNet's own undefended accuracy
#: (issue 36: one seed of the sign flip alone had been quoted as "InstaHide trains to 95.3%").
CONVNET_WIDTH = 8
#: The ConvNet rows (model with BatchNorm): the InstaHide row and its undefended baseline.
CONVNET_NONE = "ConvNet width 8 (BatchNorm), no encoding, lr 0.1"
CONVNET_INSTAHIDE = "ConvNet width 8 (BatchNorm), InstaHide k=4, lr 0.1"
VARIANTS = {
    "none": ("none", 1.0, None, None),
    "Mixup k=4": ("mixup", 1.0, None, None),
    "InstaHide k=4 (as implemented)": ("instahide", 1.0, None, None),
    "InstaHide k=4, lr / 5": ("instahide", 0.2, None, None),
    "InstaHide k=4 without the sign flip": ("instahide-nosign", 1.0, None, None),
    "InstaHide k=4 inside-dataset (no public images)": ("instahide-inside", 1.0, None, None),
    "sign flip only (k=1)": ("signs", 1.0, None, None),
    CONVNET_NONE: ("none", 0.2, "convnet", None),
    "ConvNet width 8 (BatchNorm), sign flip only, lr 0.1": ("signs", 0.2, "convnet", None),
    CONVNET_INSTAHIDE: ("instahide", 0.2, "convnet", None),
}


def _encode(kind: str, x, y, *, k: int, num_classes: int, gen, public_x):
    if kind == "none":
        return x, torch.nn.functional.one_hot(y, num_classes).float()
    if kind == "mixup":
        xe, ys, _ = mixup_encode(x, y, k=k, num_classes=num_classes, generator=gen)
        return xe, ys
    if kind == "signs":
        return x * random_signs(x.shape, gen, x), torch.nn.functional.one_hot(y, num_classes).float()
    xe, ys, info = instahide_encode(x, y, k=k, num_classes=num_classes, generator=gen,
                                    public_x=None if kind == "instahide-inside" else public_x)
    if kind == "instahide-nosign":
        xe = xe * info["signs"]  # the signs are exactly +-1: this undoes the flip
    return xe, ys


def _accuracy(model, x, y) -> float:
    model.eval()
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return acc


def diagnose(split, *, model: str = "lenet", rounds: int = 250, clients: int = 4, batch: int = 16, lr: float = 0.5,
             k: int = 4, seeds=(0, 1, 2), eval_every: int = 25) -> dict:
    """Train one model per (variant, seed); returns ``{variant: {"plain": [...], "flipped": [...], "curve": ...}}``.

    ``plain``/``flipped``: final test accuracy per seed on the plain / sign-flipped test images;
    ``curve``: ``[[round, mean plain accuracy over seeds], ...]``.
    """
    from leakgym.models import build_model, task_loss

    spec = split.spec
    tx, ty = spec.normalize(split.test_x), split.test_y
    public_x = spec.normalize(split.public_x)
    out: dict[str, dict] = {}
    start = time.perf_counter()
    for name, (kind, lr_mult, arch, n_seeds) in VARIANTS.items():
        plain, flipped, curves = [], [], []
        for seed in seeds[:n_seeds] if n_seeds else seeds:
            net = build_model(arch or model, spec, seed=seed, width=CONVNET_WIDTH if arch == "convnet" else None)
            gen = torch.Generator().manual_seed(seed * 7919 + 1)
            params = [p for p in net.parameters() if p.requires_grad]
            curve = []
            for rnd in range(rounds):
                grads = [torch.zeros_like(p) for p in params]
                for cx, cy in split.clients[:clients]:
                    idx = torch.randperm(len(cx), generator=gen)[:batch]
                    xe, ys = _encode(kind, spec.normalize(cx[idx]), cy[idx], k=k, num_classes=spec.num_classes,
                                     gen=gen, public_x=public_x)
                    g = torch.autograd.grad(task_loss(net, xe, ys), params)
                    grads = [a + b / clients for a, b in zip(grads, g)]
                with torch.no_grad():
                    for p, g in zip(params, grads):
                        p -= lr * lr_mult * g
                if (rnd + 1) % eval_every == 0:
                    curve.append([rnd + 1, _accuracy(net, tx, ty)])
            plain.append(_accuracy(net, tx, ty))
            flipped.append(_accuracy(net, tx * random_signs(tx.shape, torch.Generator().manual_seed(seed), tx), ty))
            curves.append(curve)
        out[name] = {"plain": plain, "flipped": flipped, "model": arch or model, "lr": lr * lr_mult,
                     "curve": [[c[0][0], sum(x[1] for x in c) / len(c)] for c in zip(*curves)]}
    return {"variants": out, "rounds": rounds, "clients": clients, "batch": batch, "lr": lr, "k": k,
            "seeds": list(seeds), "wall_s": time.perf_counter() - start}

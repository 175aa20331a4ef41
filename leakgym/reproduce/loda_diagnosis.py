"""Why does FedSGD on LODA-obscured shards reach a lower accuracy than on the plain ones? Measured.

LODA (Eq. 4, Algorithm 1) replaces every training image once; the reproduction's utility column then
trains on the obscured shards. :func:`diagnose` measures, for each obscuring setting (``c``, steps):

* **the extractor's view**: the share of obscured training images that the LODA extractor's *own
  classifier* (the network whose first conv layers form ``g``) assigns to the private image's label,
  and the share it assigns to the label of the public image the obscuring started from (Algorithm 1
  line 3). Does an obscured image keep the class of its private original?
* **privacy side**: SSIM of each obscured image to its private original, and the share that collapsed
  onto it (SSIM > 0.9);
* **training**: the utility column's FedSGD (:func:`fedsgd` replays
  :func:`leakgym.reproduce.harness.measure_utility` without a defense: same model, clients, batch, lr
  and batch draws, bit for bit) on the obscured shards, after the utility run's rounds and after
  ``long_rounds``, evaluated on the plain test images and on obscured test images (a model that only
  suffers a distribution shift would do better on obscured test images than on plain ones);
* **steps**: on a subset of images, the extractor's view after 100 and after the paper's 500
  obscuring steps, and at the paper's c (20, 30).
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import Tensor

from leakgym.defenses import DefenseConfig

#: ``obscure_split``'s start-image generator for ``seed`` (the same draw for every run of that seed).
SHARD_SEED = (7_919, 5)
TEST_SEED = (7_919, 6)
SUBSET_SEED = 11
COLLAPSED_SSIM = 0.9


def _gen(seed: int, base: tuple[int, int]) -> torch.Generator:
    return torch.Generator().manual_seed(seed * base[0] + base[1])


def _obscure(spec, x_unit: Tensor, y: Tensor, config: DefenseConfig, public, gen) -> tuple[Tensor, Tensor, dict]:
    """LODA-obscure unit images ``x_unit`` (labels ``y``); returns unit images, start-image labels, details."""
    from leakgym.defenses.loda import loda_obscure

    px, py = public
    xo, det = loda_obscure(spec.normalize(x_unit), y, spec=spec, c=config.loda_c, steps=config.loda_steps,
                           lr=config.loda_lr, layers=config.loda_layers, public_x=spec.normalize(px), public_y=py,
                           generator=gen, once=config.loda_mode == "once")
    return spec.denormalize(xo).clamp(0, 1), py[det["start_indices"].cpu()], det


def obscure_split(split, config: DefenseConfig, seed: int) -> tuple[object, dict]:
    """``split`` with every client's shard replaced by its LODA-obscured images (start images drawn with ``seed``).

    Returns ``(obscured split, info)``; ``info["start_labels"]``: per client, the labels of the public
    images the obscuring started from; ``info["wall_s"]``: obscuring time.
    """
    spec, gen, start = split.spec, _gen(seed, SHARD_SEED), time.perf_counter()
    clients, starts = [], []
    for cx, cy in split.clients:
        xo, ys, _ = _obscure(spec, cx, cy, config, (split.public_x, split.public_y), gen)
        clients.append((xo, cy))
        starts.append(ys)
    return dataclasses.replace(split, clients=clients), {"start_labels": starts, "wall_s": time.perf_counter() - start}


def _extractor(split):
    from leakgym.defenses.loda import feature_extractor

    spec = split.spec
    return feature_extractor(spec, spec.normalize(split.public_x), split.public_y)


def _predict(model, x: Tensor, batch: int = 512) -> Tensor:
    was = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)])
    model.train(was)
    return out


def extractor_view(spec, extractor, x_unit: Tensor, y: Tensor, *, original: Tensor | None = None,
                   start_labels: Tensor | None = None) -> dict:
    """Share of ``x_unit`` the extractor's classifier assigns to ``y`` (and to ``start_labels``); SSIM to ``original``."""
    from leakgym.metrics import ssim

    pred = _predict(extractor, spec.normalize(x_unit))
    out = {"label": int((pred == y).sum()) / len(y)}
    if start_labels is not None:
        out["start_label"] = int((pred == start_labels).sum()) / len(y)
    if original is not None:
        s = ssim(x_unit, original)
        out["ssim"] = float(s.mean())
        out["collapsed"] = float((s > COLLAPSED_SSIM).float().mean())
    return out


def fedsgd(split, *, model: str = "lenet", width: int | None = None, rounds: int, clients: int, batch: int,
           lr: float, seed: int, eval_every: int, tests: dict[str, tuple[Tensor, Tensor]]) -> dict:
    """The FedSGD of :func:`leakgym.reproduce.harness.measure_utility` without a defense, on several test sets.

    Same model initialisation, batch draws (``Generator(seed + 17)``), per-client gradients and
    example-weighted server step as the harness (whose pipeline adds nothing without a defense), so the
    curves equal its curve for the same split and seed; only for models without BatchNorm (the harness
    also averages BatchNorm statistics). ``tests``: ``{name: (unit images, labels)}``, each evaluated
    every ``eval_every`` rounds. Returns ``{"curves": {name: [[round, accuracy], ...]}, "wall_s": ...}``.
    """
    from leakgym.models import build_model, has_batchnorm, task_loss

    spec = split.spec
    net = build_model(model, spec, width=width, seed=seed)
    if has_batchnorm(net):
        raise ValueError(f"fedsgd() replays the harness only for models without BatchNorm; {model!r} has it")
    params = [p for p in net.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(seed + 17)
    shards = split.clients[:clients]
    evals = {k: (spec.normalize(x), y) for k, (x, y) in tests.items()}
    start = time.perf_counter()

    def evaluate(done: int) -> None:
        for k, (x, y) in evals.items():
            curves[k].append([done, int((_predict(net, x) == y).sum()) / len(y)])

    curves: dict[str, list] = {k: [] for k in evals}
    evaluate(0)
    net.train()
    for rnd in range(rounds):
        parts = []
        for cx, cy in shards:
            idx = torch.randperm(len(cx), generator=gen)[:batch]
            grads = torch.autograd.grad(task_loss(net, spec.normalize(cx[idx]), cy[idx]), params)
            parts.append((float(len(idx)), grads))
        wsum = sum(w for w, _ in parts)
        with torch.no_grad():
            for i, p in enumerate(params):
                p.sub_(lr * (sum(w * g[i] for w, g in parts) / wsum))
        done = rnd + 1
        if done % eval_every == 0 or done == rounds:
            evaluate(done)
    return {"curves": curves, "wall_s": time.perf_counter() - start}


def at_round(curve: list, rnd: int) -> float:
    """The accuracy of ``curve`` (``[[round, accuracy], ...]``) at round ``rnd``."""
    for r, a in curve:
        if r == rnd:
            return a
    raise ValueError(f"round {rnd} not evaluated; evaluated: {[r for r, _ in curve]}")


def diagnose(split, *, settings: dict[str, tuple[DefenseConfig, int]], shards: dict | None = None,
             short_rounds: int, long_rounds: int, clients: int, batch: int, lr: float, seeds, eval_every: int,
             obscured_test: tuple[str, ...] = (), subset: dict[str, DefenseConfig] | None = None,
             subset_images: int = 16, model: str = "lenet", width: int | None = None) -> dict:
    """Measure why LODA-obscured shards train worse (see the module docstring).

    Args:
        split: the federated split (unit images).
        settings: ``{name: (LODA config, number of seeds)}`` of obscured training sets (first n of ``seeds``);
            a plain, unobscured row ("plain") is always measured with every seed.
        shards: ``{name: {seed: (obscured split, info)}}`` already obscured by :func:`obscure_split`
            (reused, e.g. from the utility column); the others are obscured here.
        short_rounds, long_rounds: report the accuracy after both (``long_rounds`` >= ``short_rounds``).
        clients, batch, lr, eval_every: the utility column's FedSGD.
        obscured_test: setting names whose models are also evaluated on the test images obscured with that
            setting (start images drawn with the first seed).
        subset: ``{name: LODA config}`` run on the first ``subset_images`` images of every client (no
            training): the extractor's view at more steps or other ``c``.
    """
    if not 0 < short_rounds <= long_rounds or short_rounds % eval_every:
        raise ValueError(f"short_rounds={short_rounds}, long_rounds={long_rounds}, eval_every={eval_every}; need "
                         "0 < short_rounds <= long_rounds with short_rounds a multiple of eval_every")
    spec, seeds, start = split.spec, list(seeds), time.perf_counter()
    extractor = _extractor(split)
    shards = {k: dict(v) for k, v in (shards or {}).items()}
    plain_x = torch.cat([cx for cx, _ in split.clients])
    plain_y = torch.cat([cy for _, cy in split.clients])
    test = (split.test_x, split.test_y)
    rows: dict[str, dict] = {}

    def train(data_split, seed: int, tests: dict) -> dict:
        return fedsgd(data_split, model=model, width=width, rounds=long_rounds, clients=clients, batch=batch, lr=lr, seed=seed,
                      eval_every=eval_every, tests=tests)

    plain = {"c": None, "steps": None, "layers": None, "seeds": seeds, "curves": [], "curves_obscured_test": [],
             "view": [extractor_view(spec, extractor, plain_x, plain_y)]}
    for seed in seeds:
        plain["curves"].append(train(split, seed, {"plain": test})["curves"]["plain"])
    rows["plain (no LODA)"] = plain
    for name, (config, n_seeds) in settings.items():
        use = seeds[:n_seeds]
        row = {"c": config.loda_c, "steps": config.loda_steps, "layers": config.loda_layers, "seeds": use,
               "view": [], "curves": [], "curves_obscured_test": [], "obscure_s": 0.0}
        tests = {"plain": test}
        if name in obscured_test:
            tx, _, det = _obscure(spec, split.test_x, split.test_y, config, (split.public_x, split.public_y),
                                  _gen(use[0], TEST_SEED))
            tests["obscured"] = (tx, split.test_y)
            row["test_view"] = extractor_view(spec, extractor, tx, split.test_y, original=split.test_x,
                                              start_labels=split.public_y[det["start_indices"].cpu()])
        for seed in use:
            if seed not in shards.get(name, {}):
                shards.setdefault(name, {})[seed] = obscure_split(split, config, seed)
            data, info = shards[name][seed]
            row["obscure_s"] += info["wall_s"]
            xo = torch.cat([cx for cx, _ in data.clients])
            row["view"].append(extractor_view(spec, extractor, xo, plain_y, original=plain_x,
                                              start_labels=torch.cat(info["start_labels"])))
            curves = train(data, seed, tests)["curves"]
            row["curves"].append(curves["plain"])
            if "obscured" in curves:
                row["curves_obscured_test"].append(curves["obscured"])
        rows[name] = row
    sub: dict[str, dict] = {}
    if subset:
        idx = [(cx[:subset_images], cy[:subset_images]) for cx, cy in split.clients]
        sx, sy = torch.cat([a for a, _ in idx]), torch.cat([b for _, b in idx])
        for name, config in subset.items():
            t0 = time.perf_counter()
            xo, ys, det = _obscure(spec, sx, sy, config, (split.public_x, split.public_y),
                                   torch.Generator().manual_seed(SUBSET_SEED))
            sub[name] = {"c": config.loda_c, "steps": config.loda_steps, "layers": config.loda_layers,
                         "images": len(sx), "feature_distance": det["feature_distance"],
                         "feature_distance_init": det["feature_distance_init"],
                         **extractor_view(spec, extractor, xo, sy, original=sx, start_labels=ys),
                         "wall_s": time.perf_counter() - t0}
    return {"rows": rows, "subset": sub, "short_rounds": short_rounds, "long_rounds": long_rounds, "eval_every": eval_every,
            "clients": clients, "batch": batch, "lr": lr, "seeds": seeds, "model": model,
            "extractor_test_accuracy": extractor_view(spec, extractor, *test)["label"],
            "wall_s": time.perf_counter() - start}

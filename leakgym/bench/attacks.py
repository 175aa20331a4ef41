"""``leakgym bench attacks``: the batched attack engine against a sequential Python loop.

For each model and each N, the same Inverting Gradients attack (same model, budget and victim images)
reconstructs N single-image victims twice in one process:

* **batched** -- one :meth:`~leakgym.attacks.base.Attack.reconstruct_batch` call: all N problems are
  one vmapped computation per iteration (:mod:`leakgym.attacks.engine`);
* **sequential** -- a Python loop over the N victims, each attacked alone with the engine's reference
  path (``vectorize=False``: ``torch.autograd.grad(create_graph=True)`` per problem), i.e. what an
  attack written one victim at a time costs.

Reported per row: milliseconds per optimisation iteration for all N problems together, and the
speedup ``sequential / batched``. Victim images are random unit images (the benchmark measures time,
not reconstruction quality), so nothing is downloaded. Models: DLG's LeNet on 32x32 RGB inputs and
ResNet-18 (a few iterations; ``--quick`` shrinks everything for smoke tests). Results go to a JSON
file and a markdown table beside it (same stem, ``.md``), rewritten after every finished row; Ctrl-C
keeps the finished rows (exit status 130).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from leakgym.bench import (
    check_distinct,
    check_output,
    device_label,
    interrupted,
    machine_label,
    markdown_table,
    parse_counts,
    progress_bar,
    smallest_image_side,
    write_results,
)
from leakgym.devices import device_argument, in_library_modes, synchronize
from leakgym.files import json_safe
from leakgym.suggest import did_you_mean

DEFAULT_MODELS = "lenet,resnet18"
DEFAULT_NS = "1,16,64"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="runs/bench/bench_attacks.json",
                        help="output JSON path, a .md table is written beside it (default: %(default)s; the "
                        "committed docs/results/bench_attacks.json is rewritten only when named here)")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device (default: cpu)")
    parser.add_argument("--iterations", type=int, default=20,
                        help="attack iterations per timed run for LeNet (default: 20)")
    parser.add_argument("--resnet-iterations", type=int, default=2,
                        help="attack iterations per timed run for ResNet-18 (default: 2)")
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated models (default: {DEFAULT_MODELS})")
    parser.add_argument("--ns", default=DEFAULT_NS, help=f"comma-separated problem counts N (default: {DEFAULT_NS})")
    from leakgym.models import MODEL_CLASSES

    smallest = ", ".join(f"{name} {cls.min_image_size}" for name, cls in MODEL_CLASSES.items())
    parser.add_argument("--image-size", type=int, default=32,
                        help=f"image side in pixels: at least the smallest image side of every model of --models "
                        f"({smallest}) (default: 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke-test settings: N in {1, 2}, 2 iterations, 1 for ResNet-18")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar (rows done / total)")


def parse_models(text: str) -> list[str]:
    """``"lenet,resnet18"`` -> ``["lenet", "resnet18"]``; ValueError naming ``--models`` and every unknown name."""
    from leakgym.models import MODEL_NAMES

    models = [s.strip() for s in str(text).split(",") if s.strip()]
    unknown = [m for m in models if m not in MODEL_NAMES]
    if unknown or not models:
        what = (f"unknown model(s) {unknown}{did_you_mean(unknown[0], MODEL_NAMES)}" if unknown
                else "names no model")  # fmt: skip
        raise ValueError(f"--models={text!r}: {what}; allowed: {', '.join(MODEL_NAMES)} (comma-separated)")
    check_distinct(models, "--models", text)
    return models


def parse_ns(text: str) -> list[int]:
    """``"1,16,64"`` -> ``[1, 16, 64]``; ValueError naming ``--ns`` and the bad entry."""
    return parse_counts(text, "--ns", "1,16")


def _problems(model_name: str, n: int, image_size: int, device: str, seed: int = 0):
    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.data import DatasetSpec
    from leakgym.fl.update import SharedUpdate
    from leakgym.models import build_model, task_loss

    spec = DatasetSpec(name=f"synthetic{image_size}", channels=3, image_size=image_size, num_classes=10,
                       mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    torch.manual_seed(seed)
    model = build_model(model_name, spec).to(device)
    model.eval()  # batches of one: BN uses running statistics, as on the client
    g = torch.Generator().manual_seed(seed)
    x = spec.normalize(torch.rand(n, *spec.shape, generator=g)).to(device)
    y = torch.randint(0, spec.num_classes, (n,), generator=g).to(device)
    names = [k for k, _ in model.named_parameters()]
    updates, knowledges = [], []
    for i in range(n):
        grads = torch.autograd.grad(task_loss(model, x[i:i + 1], y[i:i + 1]), list(model.parameters()))
        updates.append(SharedUpdate({k: v.detach() for k, v in zip(names, grads)}, batch_size=1))
        knowledges.append(AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y[i:i + 1]))
    return updates, knowledges


@in_library_modes
def measure(model_name: str, n: int, iterations: int, image_size: int, device: str) -> dict:
    """Time the batched engine and the sequential loop on the same N problems."""
    from leakgym.attacks.inverting_gradients import InvertingGradients

    updates, knowledges = _problems(model_name, n, image_size, device)
    batched = InvertingGradients(iterations=iterations, device=device)
    sequential = InvertingGradients(iterations=iterations, device=device)
    sequential.vectorize = False
    # Warm-up (allocator, vmap/autograd caches) on one problem and one iteration.
    warm = InvertingGradients(iterations=1, device=device)
    warm.reconstruct_batch(updates[:1], knowledges[:1])
    warm.vectorize = False
    warm.reconstruct_batch(updates[:1], knowledges[:1])

    synchronize(device)
    start = time.perf_counter()
    batched.reconstruct_batch(updates, knowledges, seed=0)
    synchronize(device)
    t_batched = time.perf_counter() - start

    start = time.perf_counter()
    for i, (u, k) in enumerate(zip(updates, knowledges)):
        sequential.reconstruct(u, k, seed=i)
    synchronize(device)
    t_seq = time.perf_counter() - start
    return {
        "model": model_name,
        "n": n,
        "iterations": iterations,
        "batched_ms_per_iter": 1000 * t_batched / iterations,
        "sequential_ms_per_iter": 1000 * t_seq / iterations,
        "speedup": t_seq / t_batched,
        "device": device_label(device),
    }


def to_markdown(rows: list[dict], machine: str) -> str:
    return markdown_table(
        f"Batched attack engine vs sequential loop, Inverting Gradients, one image per problem ({machine})",
        [("model", lambda r: r["model"]), ("N", lambda r: str(r["n"])), ("iterations", lambda r: str(r["iterations"])),
         ("batched ms/iter", lambda r: f"{r['batched_ms_per_iter']:.1f}"),
         ("sequential ms/iter", lambda r: f"{r['sequential_ms_per_iter']:.1f}"),
         ("speedup", lambda r: f"{r['speedup']:.2f}x"), ("device", lambda r: r["device"])],
        rows, key=["model", "n"], error_width=80,
    )


def main(args: argparse.Namespace) -> int:
    models = parse_models(args.models)
    ns = parse_ns(args.ns)
    iterations, resnet_iterations = args.iterations, args.resnet_iterations
    for flag, value in (("--iterations", iterations), ("--resnet-iterations", resnet_iterations)):
        if value < 1:  # (checked before --quick replaces them: a bad value is refused with it too)
            raise ValueError(f"{flag}={value}; allowed: integers >= 1")
    if args.quick:
        ns, iterations, resnet_iterations = [1, 2], 2, 1
    smallest, needs = smallest_image_side(models)  # (a model that cannot take it failed at its first row)
    if args.image_size < smallest:
        raise ValueError(f"--image-size={args.image_size}; allowed: integers >= {smallest} (smallest image side of "
                         f"{', '.join(needs)})")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads={args.threads}; allowed: integers >= 1")
    out = check_output(args.json)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    machine = machine_label(torch.get_num_threads(), args.device)
    rows: list[dict] = []
    total = len(models) * len(ns)
    try:
        with progress_bar(total, "bench attacks", not getattr(args, "no_progress", False)) as bar:
            for model_name in models:
                its = resnet_iterations if model_name.startswith("resnet") else iterations
                for n in ns:
                    bar.set_postfix_str(f"{model_name} N={n}")
                    try:
                        row = measure(model_name, n, its, args.image_size, args.device)
                    except (RuntimeError, MemoryError) as exc:  # e.g. out of memory at large N: recorded, not hidden
                        row = {"model": model_name, "n": n, "device": args.device,
                               "error": f"{type(exc).__name__}: {exc}"}
                    rows.append(row)
                    bar.write(json.dumps(json_safe(row)), file=sys.stdout)
                    write_results(out, machine, rows, to_markdown(rows, machine), echo=False)
                    bar.update()
    except KeyboardInterrupt:
        return interrupted(len(rows), total, out, out.with_suffix(".md"),
                           save=lambda: write_results(out, machine, rows, to_markdown(rows, machine), echo=False))
    print(to_markdown(rows, machine))
    return 0

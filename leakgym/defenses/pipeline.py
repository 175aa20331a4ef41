"""The client-side defense pipeline: (model, private batch, DefenseConfig) -> (SharedUpdate, report).

A client's shared update is built in three stages; within a stage defenses apply in the order listed
(the canonical order, :data:`~leakgym.defenses.config.PIPELINE_ORDER`), and any subset composes:

1. **Input side** — transform the private batch the client trains on:
   ``oasis`` (add augmented copies, :mod:`.oasis`) -> ``loda`` (replace images by obscured ones,
   :mod:`.loda`) -> ``mixup`` / ``instahide`` (mix images, soft labels, :mod:`.encodings`).
2. **Training** — one gradient (FedSGD, ``update_kind="gradient"``) or ``local_steps`` SGD steps
   (FedAvg, ``update_kind="model_delta"``) via :func:`leakgym.fl.client.compute_update`; every step's
   gradient passes through the per-step transforms ``dcs2`` (concealed samples, :mod:`.dcs2`) ->
   ``censor`` (orthogonal resampling, :mod:`.censor`).
3. **Update side** — transform the final shared update:
   ``ppp`` (perturb the pre-bottleneck layers, :mod:`.ppp`) -> ``soteria`` (prune head-weight columns,
   :mod:`.soteria`) -> ``prune`` (per-layer magnitude pruning) -> ``topk`` (global top-k,
   :mod:`.sparsification`) -> ``clip`` (global L2 clipping) -> ``noise`` (Gaussian/Laplace,
   :mod:`.perturbation`).

Input-side first because they change what is trained on; update-side last because they post-process
what is sent; within the update side, selection/pruning precedes clipping, and noise comes last so
that it is never pruned away (the DP-SGD order clip -> noise).

The declared ``batch_size`` of the shared update is always the original ``B``: OASIS adds copies,
and the client does not tell the server. The model passed in is never modified.

The report compares against the *clean* update — the same computation with no defense, same seed —
so ``fidelity`` (cosine between shared and clean update over all parameters) is 1.0 exactly and
``overhead_s`` is 0 when no defense is on. ``overhead_s`` is the measured wall time of the defended
computation minus that of the clean one (clamped at 0; both include the gradient computation).

Randomness: every defense draws from its own ``torch.Generator`` derived from ``seed`` and its name,
so switching one defense on does not change another's draws. The PRECODE bottleneck samples from the
global RNG (``torch.randn_like`` has no generator), so both the clean and the defended computation
run inside ``torch.random.fork_rng`` seeded with ``seed``; the caller's global RNG state is untouched.
"""

from __future__ import annotations

import copy
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from leakgym.defenses.censor import censor_gradient
from leakgym.defenses.config import DefenseConfig
from leakgym.defenses.oasis import augment, black_fill, copies_per_image
from leakgym.defenses.perturbation import add_noise, clip_norm, global_norm
from leakgym.defenses.ppp import ppp
from leakgym.defenses.soteria import soteria
from leakgym.defenses.sparsification import density, prune_smallest, top_k
from leakgym.fl.client import compute_update
from leakgym.fl.update import SharedUpdate, UpdateKind, cosine_similarity
from leakgym.models import bn_eval_if_single

#: LODA's ``seed`` keys its feature extractor, which a client trains once on public data and caches
#: ("once for all", LODA §1); it is fixed so that the extractor is not retrained for every update.
LODA_EXTRACTOR_SEED = 0


@dataclass
class DefenseReport:
    """What a defense did to one client's update.

    Attributes:
        applied: names of the defenses applied, in pipeline order (``[]`` for no defense).
        overhead_s: extra wall time over computing the clean update (seconds, measured, >= 0).
        fidelity: cosine similarity between the shared and the clean update (1.0 = unchanged).
        details: per-defense numbers, e.g. ``details["censor"]`` (one entry per local step: chosen
            trial, initial/best/trial losses), ``details["examples_used"]`` (examples actually
            trained on), ``details["declared_batch_size"]``, ``details["soteria"]["pruned_units"]``.
    """

    applied: list[str]
    overhead_s: float
    fidelity: float
    details: dict = field(default_factory=dict)


def derived_generator(seed: int, name: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from ``(seed, name)``: independent streams per defense."""
    g = torch.Generator(device=device)
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
    return g


@contextmanager
def _seeded_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


def apply_defense(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    config: DefenseConfig | None = None,
    *,
    update_kind: UpdateKind = "gradient",
    local_steps: int = 1,
    local_lr: float = 0.1,
    seed: int = 0,
    public_x: Tensor | None = None,
    public_y: Tensor | None = None,
) -> tuple[SharedUpdate, DefenseReport]:
    """Compute the update a defended client shares (see the module docstring for the order).

    Args:
        model: the global model (a :class:`~leakgym.models.LeakGymModel`, which carries its ``spec``).
        x: the private batch, normalised images ``(B, C, H, W)``.
        y: its labels, ``int64 (B,)``.
        config: the defense; ``None`` or ``DefenseConfig()`` is no defense.
        update_kind: ``"gradient"`` (FedSGD) or ``"model_delta"`` (FedAvg).
        local_steps, local_lr: FedAvg local training (``local_steps`` must be 1 for FedSGD).
        seed: seeds every random choice of the defenses (and PRECODE's sampling).
        public_x, public_y: the public split as *unit* images ``[0, 1]`` and labels (the
            convention of :class:`~leakgym.attacks.base.AttackerKnowledge`); used by LODA, DCS² and
            cross-dataset InstaHide.

    Returns:
        ``(SharedUpdate, DefenseReport)``.
    """
    config = DefenseConfig() if config is None else config
    if not isinstance(config, DefenseConfig):
        raise ValueError(f"config must be a DefenseConfig, got {type(config).__name__}")  # noqa: TRY004 (contract)
    if x.dim() != 4 or x.shape[0] < 1:
        raise ValueError(f"x must be a non-empty (B, C, H, W) batch, got shape {tuple(x.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y has {y.shape[0]} entries but x has {x.shape[0]} images")
    if (public_x is None) != (public_y is None):
        raise ValueError("public_x and public_y must be given together")
    batch = int(x.shape[0])
    device = x.device

    t0 = time.perf_counter()
    with _seeded_global_rng(seed, device):
        clean = compute_update(model, x, y, kind=update_kind, local_steps=local_steps, local_lr=local_lr)
    t_clean = time.perf_counter() - t0
    applied = config.active()
    details: dict = {"declared_batch_size": batch, "examples_used": batch}
    if not applied:
        return clean, DefenseReport(applied=[], overhead_s=0.0, fidelity=1.0, details=details)

    spec = model.spec
    public_xn = None if public_x is None else spec.normalize(public_x.to(x))
    gen = {name: derived_generator(seed, name, device) for name in applied}

    t1 = time.perf_counter()
    # ---- 1. input side ---------------------------------------------------------------------
    x_in, y_in = x, y
    if "oasis" in applied:
        x_in, y_in, names = augment(x_in, y_in, config.oasis, fill=black_fill(spec.mean, spec.std))
        details["oasis"] = {"mask": config.oasis, "copies_per_image": copies_per_image(config.oasis),
                            "transforms": names}
    if "loda" in applied:
        from leakgym.defenses.loda import loda_obscure  # lazy: LODA pulls in its feature extractor

        x_in, info = loda_obscure(
            x_in, y_in, spec=spec, c=config.loda_c, steps=config.loda_steps, lr=config.loda_lr,
            layers=config.loda_layers, public_x=public_xn, public_y=public_y, seed=LODA_EXTRACTOR_SEED,
            cache_dir=None,
        )
        details["loda"] = info
    if "mixup" in applied or "instahide" in applied:
        from leakgym.defenses.encodings import instahide_encode, mixup_encode

        if "mixup" in applied:
            x_in, y_in, info = mixup_encode(x_in, y_in, k=config.mixup_k, num_classes=spec.num_classes,
                                            generator=gen["mixup"])
            details["mixup"] = info
        else:
            x_in, y_in, info = instahide_encode(x_in, y_in, k=config.instahide_k, num_classes=spec.num_classes,
                                                generator=gen["instahide"], public_x=public_xn)
            details["instahide"] = info
    details["examples_used"] = int(x_in.shape[0])

    # ---- 2. training with per-step gradient transforms -------------------------------------
    transform = None
    if "dcs2" in applied or "censor" in applied:
        per_step: dict[str, list] = {name: [] for name in ("dcs2", "censor") if name in applied}

        def transform(work: nn.Module, xb: Tensor, yb: Tensor, grad: dict[str, Tensor], *,
                      step: int) -> dict[str, Tensor]:
            if "dcs2" in applied:
                from leakgym.defenses.dcs2 import dcs2_gradient  # lazy: optional heavy defense

                grad, info = dcs2_gradient(
                    work, xb, yb, grad, lambda_g=config.dcs2_lambda_g, lambda_x=config.dcs2_lambda_x,
                    lambda_z=config.dcs2_lambda_z, epsilon=config.dcs2_epsilon,
                    num_concealed=config.dcs2_num_concealed, steps=config.dcs2_steps, lr=config.dcs2_lr,
                    start=config.dcs2_start, public_x=public_xn, public_y=public_y, generator=gen["dcs2"],
                )
                per_step["dcs2"].append(info)
            if "censor" in applied:
                grad, info = censor_gradient(work, xb, yb, grad, trials=config.censor_trials,
                                             step=config.censor_step, generator=gen["censor"])
                per_step["censor"].append(info)
            return grad

        details.update(per_step)

    with _seeded_global_rng(seed, device):
        shared = compute_update(model, x_in, y_in, kind=update_kind, local_steps=local_steps,
                                local_lr=local_lr, gradient_transform=transform, batch_size=batch)

    # ---- 3. update side ----------------------------------------------------------------------
    tensors = shared.tensors
    if "ppp" in applied:
        tensors, details["ppp"] = ppp(tensors, model, config.ppp, sigma=config.ppp_sigma,
                                      prune=config.ppp_prune, generator=gen["ppp"])
    if "soteria" in applied:
        # Scores come from a train-mode copy (as the client trained), so the caller's model and
        # its BatchNorm statistics stay untouched.
        work = copy.deepcopy(model).train()
        with bn_eval_if_single(work, x_in.shape[0]), _seeded_global_rng(seed, device):
            tensors, details["soteria"] = soteria(tensors, work, x_in, config.soteria)
    if "prune" in applied:
        tensors = prune_smallest(tensors, config.prune)
        details["prune"] = {"density": density(tensors)}
    if "topk" in applied:
        tensors = top_k(tensors, config.topk)
        details["topk"] = {"density": density(tensors)}
    if "clip" in applied:
        norm_before = float(global_norm(tensors))
        tensors, factor = clip_norm(tensors, config.clip)
        details["clip"] = {"norm_before": norm_before, "factor": factor}
    if "noise" in applied:
        tensors = add_noise(tensors, config.noise_sigma, kind=config.noise_kind, generator=gen["noise"])
        details["noise"] = {"kind": config.noise_kind, "sigma": config.noise_sigma}
    shared.tensors = tensors
    for scheme in ("mixup", "instahide"):
        if scheme in applied:
            # The encoding's mixing matrix travels with the update for the *upper-bound* threat model
            # of the decoding attack (GradAttack's evaluation, see leakgym.attacks.mixup_decoding):
            # an attacker that estimated M perfectly. Sign masks and coefficients per pixel stay secret.
            info = details[scheme]
            shared.metadata["encoding"] = {
                "scheme": scheme,
                "mixing_matrix": info["mixing_matrix"].detach(),
                "labels": y_in.detach(),
                **({"public_matrix": info["public_matrix"].detach()} if "public_matrix" in info else {}),
            }
    t_def = time.perf_counter() - t1

    report = DefenseReport(
        applied=applied,
        overhead_s=max(0.0, t_def - t_clean),
        fidelity=cosine_similarity(shared.tensors, clean.tensors),
        details=details,
    )
    return shared, report

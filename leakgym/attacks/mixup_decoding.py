"""Decoding attack on Mixup / InstaHide-encoded updates (the "adaptive attack" of the LODA paper,
Wan et al., Sec. 3.2 and 5.1, following Carlini et al. 2020 as implemented for gradients by
Huang et al. 2021, GradAttack ``examples/attack_decode.py``).

A client that encodes its batch shares the gradient of ``E(X) = sigma(M X)`` (LODA Eq. 2) with
soft labels ``M Y``. The attack has two stages:

1. **Gradient inversion of the encodings.** The reference Inverting Gradients objective and
   schedule (:mod:`leakgym.attacks.inverting_gradients`) run through the shared engine
   (:func:`~leakgym.attacks.engine.run_gradient_matching`) with soft labels optimised jointly (the
   encoded labels are soft), initialised at the encodings' soft labels ``M onehot(y)``. For
   InstaHide the box constraint and the TV prior are switched off: sign-flipped images are
   neither valid images nor smooth. The recovered batch comes back in an arbitrary order; it is
   put back in encoding order by optimal assignment (``scipy.optimize.linear_sum_assignment``) of
   the recovered soft labels to ``M onehot(y)``.
2. **Demixing** (LODA Eq. 3, Carlini et al.'s regression): with the recovered encodings ``E^``
   solve ``min_X || M X + O - E^ ||^2`` (Mixup) or ``min_X || abs(M X + O) - abs(E^) ||^2``
   (InstaHide; ``abs`` cancels the unknown sign mask) over valid images ``X`` with Adam (lr 0.01,
   LODA Sec. 5.1 / GradAttack; 1000 steps, GradAttack), where ``O`` is the known contribution of
   public images in cross-dataset InstaHide (``O = 0`` when the public images are unknown).

Threat model (stated precisely, as in Huang et al. 2021's decode): the attacker knows the mixing
matrix ``M`` -- which images were mixed with which coefficients -- but **not** the sign mask.
Carlini et al. *estimate* ``M`` from many encodings of the same images (a similarity network plus
clustering over ~50 epochs of encodings); one FL round gives one encoding per image, so LeakGym
takes ``M`` from ``update.metadata["encoding"]`` (an upper bound on what such estimation achieves,
as GradAttack says of its own evaluation). That entry holds ``scheme`` (``"mixup"`` or
``"instahide"``), ``mixing_matrix`` ``(B, B)``, optionally ``public_matrix`` ``(B, P)`` (with
``knowledge.public_x``) and optionally the soft ``labels`` ``(B, num_classes)`` (else computed
from ``knowledge.labels``). A batch enlarged before it was mixed (Mixup or InstaHide after OASIS, whose
copies make the mixing matrix ``(B', B')`` with ``B'`` a multiple of ``B``) is inverted as an unencoded
one: the private images are not the mixtures' sources, so stage 2 has nothing to demix them from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from leakgym.attacks.base import AttackCost, AttackerKnowledge, AttackResult, check_integer, limited
from leakgym.attacks.engine import ProblemSet, run_gradient_matching
from leakgym.attacks.inverting_gradients import InvertingGradients, InvertingGradientsConfig
from leakgym.attacks.labels import infer_labels
from leakgym.fl.update import SharedUpdate
from leakgym.optim.randomness import BatchedGenerator

SCHEMES = ("mixup", "instahide")


@dataclass
class MixupDecodingConfig(InvertingGradientsConfig):
    """Inverting Gradients on the encodings, then least-squares demixing."""

    decode_steps: int = limited(1000, 30_000)
    """Adam steps of the demixing regression (GradAttack: 1000), >= 1 (it starts from noise: no step would
    return the noise)."""
    decode_lr: float = 0.01
    """Adam learning rate of the demixing regression (LODA Sec. 5.1: 0.01)."""
    joint: bool = False
    """Treat the call's updates as rounds re-encoding one private batch and demix them together."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.decode_steps = check_integer(self.decode_steps, "decode_steps", 1)
        if not (self.decode_lr > 0 and math.isfinite(self.decode_lr)):
            raise ValueError(f"decode_lr={self.decode_lr}; must be a finite number > 0")


def _demixed_labels(encoding: tuple[str, Tensor, Tensor, Tensor]) -> Tensor:
    """Each decoded image's label: the soft labels are ``M onehot(Y)`` with rows renormalised (public
    images carry no label), so ``onehot(Y)`` solves ``M Z = soft * rowsum(M)`` (least squares where ``M``
    is singular); the arg-max of each row of ``Z``. Image ``j`` of the decoded batch is column ``j`` of
    ``M``, so the arg-max of *encoding* ``j``'s soft label -- its largest mixing coefficient, often
    below 0.5 -- is another image's label as often as not."""
    _, mixing, soft, _ = encoding
    return torch.linalg.lstsq(mixing, soft * mixing.sum(dim=1, keepdim=True)).solution.argmax(dim=1)


def _enlarged(enc: object, batch_size: int) -> bool:
    """Does ``enc`` mix a batch an input-side defense enlarged first (``(B', B')``, ``B'`` a multiple > 1 of
    ``batch_size``: OASIS's originals and their transformed copies)?"""
    mixing = enc.get("mixing_matrix") if isinstance(enc, dict) else None
    if not isinstance(mixing, Tensor) or mixing.ndim != 2 or mixing.shape[0] != mixing.shape[1]:
        return False
    return mixing.shape[0] > batch_size and mixing.shape[0] % batch_size == 0


def _encoding(update: SharedUpdate, knowledge: AttackerKnowledge, index: int,
              label_method: str = "auto") -> tuple[str, Tensor, Tensor, Tensor]:
    """``(scheme, M, soft labels, public offset O)`` of one problem, validated.

    Returned on the CPU in float64: they are small, the optimal assignment needs them there, and
    :func:`demix` moves them to the device of the recovered encodings.
    """
    enc = update.metadata.get("encoding")
    if enc is None or _enlarged(enc, knowledge.batch_size):
        # An unencoded batch is the Mixup encoding with M = I: nothing to demix, the attack is its
        # inversion stage alone (plain gradient inversion), so it never fails against other defenses.
        # So is a batch enlarged before it was mixed (OASIS's transformed copies: M is (B', B'), B' a
        # multiple of B): the B private images are not the mixtures' sources, and the attack inverts the
        # update as Inverting Gradients does against OASIS (it failed every such round, found in an audit).
        b = knowledge.batch_size
        if knowledge.labels is not None:
            labels = knowledge.labels.detach().cpu().long()
        else:
            labels = infer_labels(update, knowledge, method=label_method).cpu().long()
        soft = torch.nn.functional.one_hot(labels, knowledge.spec.num_classes).double()
        enc = {"scheme": "mixup", "mixing_matrix": torch.eye(b, dtype=torch.float64), "labels": soft}
    if not isinstance(enc, dict) or "mixing_matrix" not in enc:
        raise ValueError(
            f"update {index}: MixupDecoding needs update.metadata['encoding'] with the mixing matrix "
            "(see leakgym.attacks.mixup_decoding for the threat model)"
        )
    scheme = enc.get("scheme", "mixup")
    if scheme not in SCHEMES:
        raise ValueError(f"update {index}: encoding scheme={scheme!r}; allowed: {SCHEMES}")
    b, spec = knowledge.batch_size, knowledge.spec
    mixing = enc["mixing_matrix"].detach().double().cpu()
    if mixing.shape != (b, b):
        raise ValueError(f"update {index}: mixing_matrix has shape {tuple(mixing.shape)}; expected ({b}, {b})")
    if "labels" in enc:
        soft = enc["labels"].detach().double().cpu()
    elif knowledge.labels is not None:
        onehot = torch.nn.functional.one_hot(knowledge.labels.cpu().long(), spec.num_classes).double()
        soft = mixing @ onehot
        soft = soft / soft.sum(dim=1, keepdim=True).clamp_min(1e-12)
    else:
        raise ValueError(f"update {index}: need metadata['encoding']['labels'] or knowledge.labels")
    if soft.shape != (b, spec.num_classes):
        raise ValueError(f"update {index}: soft labels have shape {tuple(soft.shape)}; expected ({b}, {spec.num_classes})")
    offset = torch.zeros(b, *spec.shape, dtype=torch.float64)
    public_matrix = enc.get("public_matrix")
    if public_matrix is not None and knowledge.public_x is not None:
        pub = spec.normalize(knowledge.public_x.detach().double().cpu())
        offset = torch.einsum("ij,jchw->ichw", public_matrix.detach().double().cpu(), pub)
    return scheme, mixing, soft, offset


def demix(
    encoded: Tensor, mixing: Tensor, offset: Tensor, *, scheme: str, steps: int, lr: float,
    lower: Tensor, upper: Tensor, generator: torch.Generator,
) -> tuple[Tensor, list[float]]:
    """LODA Eq. 3: recover ``X`` (``B`` images) from (recovered) encodings under known mixing.

    ``encoded`` is ``(R*B, C, H, W)``: ``R >= 1`` encodings of the same batch stacked (one per
    observed round), ``mixing`` the matching ``(R*B, B)`` stacked mixing matrices and ``offset`` the
    ``(R*B, C, H, W)`` public contributions. ``scheme="mixup"`` fits ``M X + O`` to ``encoded``;
    ``"instahide"`` fits absolute values. ``X`` starts from small noise (``abs`` has a saddle at 0)
    and is kept in the image box; ``generator`` (on ``encoded``'s device) draws that noise.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}; allowed: {SCHEMES}")
    target = encoded.detach()
    m = mixing.to(target)
    o = offset.to(target)
    b = m.shape[1]
    x = 0.1 * torch.randn(b, *target.shape[1:], generator=generator, device=generator.device, dtype=target.dtype)
    x = x.to(target.device).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    history: list[float] = []
    for _ in range(steps):
        pred = torch.einsum("ij,jchw->ichw", m, x) + o
        if scheme == "instahide":
            loss = (pred.abs() - target.abs()).pow(2).mean()
        else:
            loss = (pred - target).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history.append(float(loss.detach()))
        with torch.no_grad():
            x.copy_(torch.maximum(torch.minimum(x, upper), lower))
    return x.detach(), history


class MixupDecoding(InvertingGradients):
    """Gradient inversion of Mixup/InstaHide encodings, then demixing with the known mixing matrix.

    With ``joint=True`` the updates of one call are taken to be successive rounds in which the
    *same* private batch was re-encoded with fresh coefficients (LODA Sec. 5.1: "we combine the
    reconstructed images from 50 iterations"); their recovered encodings are demixed together,
    which makes the regression over-determined, and every result holds the same decoded batch.
    """

    name = "mixup-decoding"
    public_split = True  # (the cross-dataset public offset, when the encoding names public images)
    Config = MixupDecodingConfig

    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int]
    ) -> list[AttackResult]:
        cfg = self.config
        generators = self.generators(seeds, knowledges)
        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        encodings = []
        for i, (u, k) in enumerate(zip(updates, knowledges)):
            if u.batch_size != k.batch_size:
                raise ValueError(f"update {i}: batch_size={u.batch_size} but knowledge.batch_size={k.batch_size}")
            encodings.append(_encoding(u, k, i, cfg.label_method))
        schemes = {e[0] for e in encodings}
        if cfg.joint and (len(schemes) > 1 or len({k.batch_size for k in knowledges}) > 1):
            raise ValueError("joint=True needs updates of one scheme and one batch size (one private batch)")

        # Stage 1: invert every update's encodings, one engine call per scheme.
        recovered: list[Tensor | None] = [None] * len(updates)
        stage1: list[tuple[int, int, float, list[float]]] = [(0, 0, math.nan, [])] * len(updates)
        for scheme in sorted(schemes):
            idx = [i for i, e in enumerate(encodings) if e[0] == scheme]
            objective, schedule = self.objective(), self.schedule()
            if scheme == "instahide":  # sign-flipped encodings are neither valid nor smooth images
                objective = dataclasses.replace(objective, tv=0.0)
                schedule = dataclasses.replace(schedule, boxed=False)
            u0, k0 = updates[idx[0]], knowledges[idx[0]]
            problems = ProblemSet.from_updates(
                [updates[i] for i in idx], [knowledges[i] for i in idx], names=self.matched_names(u0, k0),
                labels=None, device=self._device(k0), dtype=dtype,
            )
            inits, label_inits = [], []
            for i in idx:
                inits.append(self.initial_images(knowledges[i], None, schedule.restarts, generators[i]))
                label_inits.append(encodings[i][2].clamp_min(1e-6).log().expand(schedule.restarts, -1, -1))
            out = run_gradient_matching(
                problems, objective, schedule, torch.stack(inits),
                generator=BatchedGenerator([generators[i] for i in idx]), vectorize=self.vectorize,
                label_init=torch.stack(label_inits),
            )
            for j, i in enumerate(idx):
                # Put the recovered encodings in encoding order (a batch gradient is order-free).
                cost = torch.cdist(out.soft_labels[j].double().cpu(), encodings[i][2], p=1).numpy()
                rows, cols = linear_sum_assignment(cost)
                order = np.empty(len(cols), dtype=np.int64)
                order[cols] = rows
                recovered[i] = out.images[j][torch.from_numpy(order).to(out.images.device)]
                stage1[i] = (out.iterations, out.restarts, float(out.matching_loss[j]), out.history[:, j].tolist())

        # Stage 2: demix, per update or jointly over all updates (from the first update's generator,
        # which continues after stage 1; a joint result is by design a function of all the updates).
        groups = [list(range(len(updates)))] if cfg.joint else [[i] for i in range(len(updates))]
        results: list[AttackResult | None] = [None] * len(updates)
        for group in groups:
            k0 = knowledges[group[0]]
            enc = torch.cat([recovered[i] for i in group])
            lower, upper = k0.spec.unit_bounds(enc)
            decoded, hist = demix(
                enc, torch.cat([encodings[i][1] for i in group]), torch.cat([encodings[i][3] for i in group]),
                scheme=encodings[group[0]][0], steps=cfg.decode_steps, lr=cfg.decode_lr, lower=lower, upper=upper,
                generator=generators[group[0]],
            )
            for i in group:
                k = knowledges[i]
                iters, restarts, loss, match_hist = stage1[i]
                labels = k.labels.detach().long().cpu() if k.labels is not None else _demixed_labels(encodings[i])
                results[i] = AttackResult(
                    images=decoded.clone(),
                    labels=labels,
                    cost=AttackCost(iterations=iters, restarts=restarts, wall_time_s=0.0, once=cfg.decode_steps),
                    history={"matching_loss": match_hist, "decode_loss": hist},
                    final_loss=loss,
                )
        return results  # type: ignore[return-value]

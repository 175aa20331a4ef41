"""Analytic recovery of the input of a fully connected layer with bias.

For a fully connected layer ``y = W x + b`` (``W`` of shape ``(m, n)``) and a single example, the
gradient of any loss ``L`` satisfies, row by row,

    dL/dW_i = (dL/dy_i) x      and      dL/db_i = dL/dy_i,

so every row with a non-zero bias gradient gives the input exactly (DCS² paper, Eq. 3; OASIS paper,
Eq. 6; Phong et al. 2017; Geiping et al. 2020, Prop. D.1):

    x = dL/dW_i / dL/db_i.                                                      (DCS² Eq. 3)

:func:`recover_linear_input` applies this to every row. On a batch the gradients are sums over the
examples, so row ``i`` gives ``sum_j d_ij x_j / sum_j d_ij`` (``d_ij = dL_j/dy_i``): a *mixture* of the
examples that reach row ``i`` (OASIS §III-A). Behind a ReLU only the examples that activate neuron
``i`` contribute, and a row that a single example activates gives that example exactly. Several rows
giving the *same* vector certify such single-example rows: mixtures of different examples, weighted by
row-specific coefficients, do not coincide. :func:`select_candidates` uses that agreement (and, for
images, whether a candidate lies inside the box of valid images) to choose which recovered vectors to
return.

:class:`AnalyticAttack` (registry name ``"analytic"``) runs this on one layer of the model as sent and
by default returns only certified vectors (``certified_only=True``): at batch size ``B > 1``, the
examples that some rows isolate (up to ``B``), and the dataset-mean image in the remaining slots.
Which layer:

* ``layer=None`` (default): the first ``nn.Linear`` executed in the forward pass. For the MLP this is
  ``body.fc1`` on the flattened image, and the attack returns images (exact at batch size 1).
* ``layer="bottleneck"``: the first linear layer inside PRECODE's bottleneck, i.e. its encoder. Its
  input is the feature vector entering the bottleneck, which the attack recovers exactly at batch
  size 1 (PPP paper §3.1). Those features are returned in :attr:`AnalyticResult.features`; images are
  only reconstructed when the layer acts on the input itself, so here every image slot holds the
  dataset-mean image (zeros in normalised space).
* any other module-name prefix (``"body.fc2"``, ``"imprint.linear0"``): the first linear layer whose
  name is that prefix or starts with it.

Limits, stated plainly:

* Batches. With ``B > 1`` a row yields an exact example only when one example alone reaches it. After
  a ReLU that happens for some rows of an untrained network; without a nonlinearity right after the
  layer (PRECODE's encoder) every row mixes the whole batch and nothing is certified. A layer followed
  by a BatchNorm in train mode has a zero bias gradient at ``B > 1`` (BN removes the batch mean, so
  ``sum_j dL/dy_ij = 0``): the MLP's first layer is then out of reach except at batch size 1, where
  clients run BN in eval mode (:func:`leakgym.models.bn_eval_if_single`).
* FedAvg. For a model delta after one local step, ``w_0 - w_1 = lr * grad``; the ratio is unchanged
  and the recovery stays exact up to the delta's float32 rounding, which the agreement test allows for
  (:func:`agreement_tolerance`: at lr 0.01 and below it once left no two rows agreeing). After several
  steps the delta is a sum of gradients at different weights, and the recovered vectors are
  approximations.

The attack is deterministic: one "iteration", one "restart".
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from leakgym.attacks.base import (
    Attack,
    AttackCost,
    AttackerKnowledge,
    AttackResult,
    check_option_types,
    check_tolerance,
)
from leakgym.attacks.labels import infer_labels
from leakgym.data import DatasetSpec
from leakgym.fl.update import SharedUpdate
from leakgym.optim.randomness import seeded_generator

__all__ = [
    "MATCH_TOL_MAX",
    "AnalyticAttack",
    "AnalyticConfig",
    "AnalyticResult",
    "CandidateSelection",
    "LinearLayerInfo",
    "agreement_tolerance",
    "assemble_result",
    "attack_labels",
    "delta_rounding",
    "find_linear_layer",
    "image_box",
    "layer_gradients",
    "layer_rounding",
    "recover_linear_input",
    "relative_rounding",
    "select_candidates",
]


# -- the maths ---------------------------------------------------------------------------------
def recover_linear_input(
    weight_grad: Tensor, bias_grad: Tensor, *, rel_tol: float = 1e-6, bias_rounding: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Per-row input candidates ``dL/dW_i / dL/db_i`` of a linear layer (DCS² Eq. 3).

    Args:
        weight_grad: ``(m, n)`` gradient (or one-step model delta) of the layer's weight.
        bias_grad: ``(m,)`` gradient of its bias.
        rel_tol: rows with ``|dL/db_i| <= rel_tol * max_i |dL/db_i|`` are treated as inactive (their
            bias gradient is zero up to rounding); must lie in ``[0, 1)``.
        bias_rounding: optional ``(m,)`` bound of the rounding in each bias entry (a model delta's,
            :func:`delta_rounding`): rows whose ``|dL/db_i|`` does not exceed it are inactive too.

    Returns:
        ``(candidates, rows)``: ``candidates`` is ``(K, n)`` float64, one recovered input per active
        row, and ``rows`` the ``(K,)`` indices of those rows. ``K = 0`` when every bias gradient is zero.
    """
    if weight_grad.dim() != 2:
        raise ValueError(f"weight_grad must be (out_features, in_features), got shape {tuple(weight_grad.shape)}")
    if bias_grad.shape != (weight_grad.shape[0],):
        raise ValueError(
            f"bias_grad must have shape ({weight_grad.shape[0]},) to match weight_grad "
            f"{tuple(weight_grad.shape)}, got {tuple(bias_grad.shape)}"
        )
    if not 0.0 <= rel_tol < 1.0:
        raise ValueError(f"rel_tol={rel_tol}; allowed range [0, 1)")
    w = weight_grad.detach().to(torch.float64)
    b = bias_grad.detach().to(torch.float64)
    scale = b.abs().max() if b.numel() else b.new_zeros(())
    if not torch.isfinite(scale) or scale == 0:
        return w.new_zeros((0, w.shape[1])), torch.zeros(0, dtype=torch.long, device=w.device)
    active = b.abs() > rel_tol * scale
    if bias_rounding is not None:
        active &= b.abs() > bias_rounding.to(b)
    rows = torch.nonzero(active).flatten()
    return w[rows] / b[rows, None], rows


def delta_rounding(update: SharedUpdate, sent: Tensor, delta: Tensor) -> Tensor | None:
    """A bound of the float rounding in each entry of ``delta``, a model delta's tensor (FedAvg: the
    client sends ``w_before - w_after``) of the parameter the server sent as ``sent``; float64, or None
    for a gradient, whose rounding is relative to itself and within the attacks' tolerances.

    ``w_after`` is rounded to the delta's precision and the difference once more: each entry is off by at
    most ``eps * (|w| + |delta|)`` (half an ulp of each), doubled here for safety. Relative to the delta
    that is ``eps * |w| / (lr * |g|)``: on the digits LeNet (one step of lr 0.1, batch 8) about 1e-4, a
    thousand times a gradient's -- beyond trap weights' default ``match_tol`` (no two neurons agreed:
    0 of 80 images recovered, against 72 from the gradient) and imprint's ``rel_tol`` (rounding noise
    passed as non-empty bins: 68 against 74), and the analytic attack's at lr 0.01 and below. The attacks
    widen their tests by this bound (``tests/test_attacks_malicious.py``, ``tests/test_attacks_analytic.py``)."""
    if update.kind != "model_delta":
        return None
    eps = torch.finfo(delta.dtype).eps if delta.is_floating_point() else 0.0
    return 2 * eps * (sent.detach().to(device=delta.device, dtype=torch.float64).abs()
                      + delta.detach().to(torch.float64).abs())


def layer_rounding(update: SharedUpdate, model: nn.Module, weight_name: str, bias_name: str,
                   weight_grad: Tensor, bias_grad: Tensor) -> tuple[Tensor, Tensor] | None:
    """:func:`delta_rounding` of a linear layer's weight and bias (``model``'s parameters as the server sent
    them), or None for a gradient."""
    if update.kind != "model_delta":
        return None
    params = dict(model.named_parameters())
    if weight_name not in params or bias_name not in params:
        raise ValueError(f"the attacker's model has no parameter {weight_name!r} or {bias_name!r}; pass the model "
                         "returned by prepare_model")
    return (delta_rounding(update, params[weight_name], weight_grad),
            delta_rounding(update, params[bias_name], bias_grad))


def relative_rounding(weight_rounding: Tensor, bias_rounding: Tensor, weight_grad: Tensor,
                      bias_grad: Tensor) -> Tensor:
    """``(m,)`` bound of the relative error of each row's candidate ``dW_i / db_i`` given bounds of the
    rounding in its entries (to first order: the relative errors of the numerator and of the divisor
    add)."""
    w, b = weight_grad.detach().to(torch.float64), bias_grad.detach().to(torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    return weight_rounding.norm(dim=1) / w.norm(dim=1).clamp_min(tiny) + bias_rounding / b.abs().clamp_min(tiny)


#: On a model delta the agreement tolerance is at least the candidates' median relative rounding bound
#: (:func:`relative_rounding`). Recovered images (>= 60 dB) of 20 batches of 8 digits (10 test, 10 train),
#: one FedAvg step, trap weights, by the share of that median taken: LeNet at lr 0.1 / 0.01
#: 14 / 12 of 160 at 0.01, 104 / 101 at 0.1, 142 / 103 at 1 (taken), 144 / 88 at 2; ConvNet 103 / 22,
#: 110 / 119, 146 / 144, 146 / 147. Without it (``match_tol`` 1e-5) the LeNet recovered none at lr 0.1 (an
#: audit: 0 of 80 against 72 from the gradient). A tolerance per candidate (each row's own bound) let the
#: weak rows' wide bounds join mixtures.
#: ... widened to at most this: vectors half their norm apart are not one example's
MATCH_TOL_MAX = 0.5


def agreement_tolerance(match_tol: float, rounding: tuple[Tensor, Tensor] | None, weight_grad: Tensor,
                        bias_grad: Tensor, rows: Tensor) -> float:
    """``match_tol`` of :func:`select_candidates` for the candidates of ``rows``: as given for a gradient
    (``rounding`` None); for a model delta (``rounding``: :func:`delta_rounding` of the weight and the bias)
    widened to the candidates' median :func:`relative_rounding`, at most :data:`MATCH_TOL_MAX` (a wider
    ``match_tol`` of the caller's is kept)."""
    if rounding is None or not rows.numel():
        return match_tol
    bound = relative_rounding(rounding[0][rows], rounding[1][rows], weight_grad[rows], bias_grad[rows])
    return max(match_tol, min(float(bound.median()), MATCH_TOL_MAX))


@dataclass
class CandidateSelection:
    """Which recovered vectors :func:`select_candidates` keeps, and why.

    Attributes:
        vectors: ``(k, n)`` the chosen vectors, best first (``k <= `` the number requested).
        agreeing: ``(k,)`` bool, True where at least two rows gave this vector (a certified
            single-example recovery).
        in_box: ``(k,)`` bool, True where the vector lies inside the box of valid inputs (always True
            when no box was given).
        num_candidates: number of candidate vectors before grouping.
        num_groups: number of distinct vectors after grouping agreeing candidates.
    """

    vectors: Tensor
    agreeing: Tensor
    in_box: Tensor
    num_candidates: int
    num_groups: int


def select_candidates(
    candidates: Tensor,
    strength: Tensor,
    k: int,
    *,
    match_tol: float = 1e-5,
    lower: Tensor | None = None,
    upper: Tensor | None = None,
    box_tol: float = 0.05,
    require_agreement: bool = False,
) -> CandidateSelection:
    """Group candidates that agree and return the ``k`` most credible distinct ones.

    Two candidates agree when ``||c_a - c_b|| <= match_tol * max(||c_a||, ||c_b||)``. Groups are formed
    around leaders: candidates are visited by decreasing number of agreeing candidates (then
    ``strength``), and each unassigned one becomes a leader that takes its unassigned agreeing
    candidates; the leader represents the group. (Connected components would chain: mixtures of the
    same examples with slowly varying weights lie densely along a segment.) Groups are ranked by

    1. agreement (two or more rows): a single example alone in several rows gives the same vector in
       each, while mixtures weighted by row-specific coefficients differ;
    2. lying inside the box ``[lower - box_tol * (upper - lower), upper + box_tol * (upper - lower)]``
       of valid inputs (when given): a single example always does, a mixture with coefficients of
       both signs usually does not;
    3. ``strength`` (largest first).

    Cost is ``O(K^2 n)`` for ``K`` candidates of size ``n`` (a few hundred to a few thousand rows).

    Args:
        candidates: ``(K, n)`` recovered vectors.
        strength: ``(K,)`` nonnegative conditioning of each (e.g. ``|dL/db_i|``).
        k: how many vectors to return at most (``>= 0``).
        match_tol: relative distance under which two candidates count as the same vector, in (0, 1).
        lower, upper: optional ``(n,)`` bounds of valid inputs (normalised-space image box).
        box_tol: slack of the box test as a fraction of ``upper - lower``, ``>= 0``.
        require_agreement: keep only groups of two or more agreeing candidates (certified
            single-example recoveries).
    """
    if candidates.dim() != 2:
        raise ValueError(f"candidates must be (K, n), got shape {tuple(candidates.shape)}")
    if strength.shape != (candidates.shape[0],):
        raise ValueError(f"strength must have shape ({candidates.shape[0]},), got {tuple(strength.shape)}")
    if k < 0:
        raise ValueError(f"k={k}; must be >= 0")
    if not 0.0 < match_tol < 1.0:
        raise ValueError(f"match_tol={match_tol}; allowed range (0, 1)")
    if box_tol < 0:
        raise ValueError(f"box_tol={box_tol}; must be >= 0")
    if (lower is None) != (upper is None):
        raise ValueError("give both lower and upper bounds, or neither")

    num, dim = candidates.shape
    c = candidates.detach().to(torch.float64)
    empty = CandidateSelection(
        vectors=c.new_zeros((0, dim)),
        agreeing=torch.zeros(0, dtype=torch.bool),
        in_box=torch.zeros(0, dtype=torch.bool),
        num_candidates=num,
        num_groups=0,
    )
    finite = torch.isfinite(c).all(dim=1)
    c, s = c[finite], strength.detach().to(torch.float64)[finite]
    if c.shape[0] == 0 or k == 0:
        return empty

    # Group agreeing candidates around leaders (no chaining: mixtures of the same examples with
    # slowly varying weights lie densely along a segment and would chain into one component).
    norms = c.norm(dim=1)
    dist = torch.cdist(c, c)
    scale = torch.maximum(norms[:, None], norms[None, :]).clamp_min(torch.finfo(torch.float64).tiny)
    adjacency = dist <= match_tol * scale
    degree = adjacency.sum(dim=1)
    # Leaders in order of agreement, then strength: a leader takes all its unassigned neighbours.
    order = torch.argsort(s, descending=True, stable=True)
    order = order[torch.argsort(degree[order], descending=True, stable=True)]
    assigned = torch.zeros(c.shape[0], dtype=torch.bool, device=c.device)
    leaders, sizes_list = [], []
    for idx in order.tolist():
        if assigned[idx]:
            continue
        members = adjacency[idx] & ~assigned
        assigned |= members
        leaders.append(idx)
        sizes_list.append(int(members.sum()))
    rep = torch.tensor(leaders, dtype=torch.long, device=c.device)
    sizes = torch.tensor(sizes_list, dtype=torch.long, device=c.device)
    num_groups = len(leaders)
    vectors = c[rep]
    agreeing = sizes >= 2

    if lower is not None:
        lo = lower.detach().to(torch.float64).reshape(1, -1).to(c.device)
        hi = upper.detach().to(torch.float64).reshape(1, -1).to(c.device)
        if lo.shape[1] != dim:
            raise ValueError(f"bounds have {lo.shape[1]} entries; candidates have {dim}")
        slack = box_tol * (hi - lo)
        in_box = ((vectors >= lo - slack) & (vectors <= hi + slack)).all(dim=1)
    else:
        in_box = torch.ones(num_groups, dtype=torch.bool, device=c.device)

    # Lexicographic rank: agreement, then box, then strength (stable sorts, least significant first).
    rank = torch.argsort(s[rep], descending=True, stable=True)
    rank = rank[torch.argsort(in_box[rank].to(torch.int8), descending=True, stable=True)]
    rank = rank[torch.argsort(agreeing[rank].to(torch.int8), descending=True, stable=True)]
    if require_agreement:
        rank = rank[agreeing[rank]]
    keep = rank[:k]
    return CandidateSelection(
        vectors=vectors[keep],
        agreeing=agreeing[keep].cpu(),
        in_box=in_box[keep].cpu(),
        num_candidates=num,
        num_groups=num_groups,
    )


# -- locating a layer ----------------------------------------------------------------------------
@dataclass
class LinearLayerInfo:
    """A linear layer of a model, as found by :func:`find_linear_layer`."""

    name: str            # module name, e.g. "body.fc1"; its parameters are "<name>.weight"/"<name>.bias"
    module: nn.Linear
    on_input: bool       # True when the layer's input is the flattened model input itself

    @property
    def weight_name(self) -> str:
        return f"{self.name}.weight"

    @property
    def bias_name(self) -> str:
        return f"{self.name}.bias"


def matching_linears(model: nn.Module, prefix: str | None) -> dict[str, nn.Linear]:
    """``model``'s ``nn.Linear`` layers with bias whose name is ``prefix`` or starts with ``prefix + "."``
    (``None``: every one); ``ValueError`` naming the linear layers where none matches."""
    linears = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and m.bias is not None
        and (prefix is None or name == prefix or name.startswith(prefix + "."))
    }
    if not linears:
        available = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        raise ValueError(
            f"layer={prefix!r} matches no nn.Linear with bias in {type(model).__name__}; "
            f"linear layers: {available}"
        )
    return linears


def find_linear_layer(
    model: nn.Module, spec: DatasetSpec, prefix: str | None = None, *, seed: int = 0
) -> LinearLayerInfo:
    """The first ``nn.Linear`` with bias executed in ``model``'s forward pass whose name matches.

    ``prefix=None`` matches every linear layer; otherwise a module matches when its name equals
    ``prefix`` or starts with ``prefix + "."``. The execution order and the input each layer sees come
    from one forward pass of a random probe image drawn with ``seed`` on the model's device (eval mode,
    no gradients, the global RNG untouched); ``on_input`` tells whether that input equals the flattened
    probe.
    """
    linears = matching_linears(model, prefix)
    ref = next(iter(linears.values())).weight
    probe = torch.randn((1, *spec.shape), generator=seeded_generator(seed, ref.device), device=ref.device,
                        dtype=ref.dtype)

    seen: list[tuple[str, Tensor]] = []

    def recorder(name: str):
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            if all(name != n for n, _ in seen):
                seen.append((name, args[0].detach()))
        return hook

    handles = [m.register_forward_hook(recorder(n)) for n, m in linears.items()]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[ref.device] if ref.device.type == "cuda" else []):
            model(probe)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    if not seen:
        raise ValueError(f"no linear layer matching layer={prefix!r} runs in {type(model).__name__}'s forward pass")
    name, layer_input = seen[0]
    flat = probe.flatten(1)
    on_input = layer_input.shape == flat.shape and torch.allclose(layer_input, flat, rtol=0.0, atol=1e-6)
    return LinearLayerInfo(name=name, module=linears[name], on_input=bool(on_input))


# -- results -------------------------------------------------------------------------------------
@dataclass
class AnalyticResult(AttackResult):
    """An :class:`AttackResult` that also carries the recovered layer inputs.

    Attributes:
        features: ``(B, in_features)`` recovered inputs of the attacked layer (the flattened images
            when the layer acts on the input, the bottleneck's input features for
            ``layer="bottleneck"``); rows of unrecovered slots are zero.
        recovered: ``(B,)`` bool, True for slots holding a recovered vector (the remaining image slots
            hold the dataset-mean image, zeros in normalised space).
        layer: name of the attacked module.
    """

    features: Tensor | None = None
    recovered: Tensor | None = None
    layer: str = ""


def assemble_result(
    selection: CandidateSelection,
    knowledge: AttackerKnowledge,
    update: SharedUpdate,
    *,
    layer: str,
    on_input: bool,
    labels: Tensor,
) -> AnalyticResult:
    """Pack chosen vectors into ``knowledge.batch_size`` slots (zeros elsewhere) as an :class:`AnalyticResult`.

    The history records ``candidates`` (rows or bins with a non-zero bias gradient), ``recovered``
    (slots filled with a recovered vector), ``agreeing`` (filled slots certified by two or more
    agreeing rows) and ``in_box`` (filled slots inside the valid-image box).
    """
    batch = knowledge.batch_size
    ref = next(iter(update.tensors.values()))
    dtype = ref.dtype if ref.is_floating_point() else torch.float32
    device = ref.device
    dim = selection.vectors.shape[1]
    got = selection.vectors.shape[0]
    features = torch.zeros((batch, dim), dtype=dtype, device=device)
    features[:got] = selection.vectors.to(device=device, dtype=dtype)
    recovered = torch.zeros(batch, dtype=torch.bool, device=device)
    recovered[:got] = True
    images = torch.zeros((batch, *knowledge.spec.shape), dtype=dtype, device=device)
    if on_input:
        if dim != math.prod(knowledge.spec.shape):
            raise ValueError(f"layer {layer!r} takes {dim} inputs; images have shape {knowledge.spec.shape}")
        images = features.reshape(batch, *knowledge.spec.shape).clone()
    history = {
        "candidates": [float(selection.num_candidates)],
        "recovered": [float(got)],
        "agreeing": [float(selection.agreeing.sum())],
        "in_box": [float(selection.in_box.sum())],
    }
    return AnalyticResult(
        images=images,
        labels=labels,
        cost=AttackCost(iterations=1, restarts=1, wall_time_s=0.0),
        history=history,
        features=features,
        recovered=recovered,
        layer=layer,
    )


def image_box(spec: DatasetSpec, *, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Flattened ``(C*H*W,)`` lower and upper bounds of valid normalised images."""
    like = torch.zeros((1, *spec.shape), dtype=torch.float64, device=device)
    lo, hi = spec.unit_bounds(like)
    return lo.expand_as(like).flatten(), hi.expand_as(like).flatten()


def attack_labels(update: SharedUpdate, knowledge: AttackerKnowledge) -> Tensor:
    """Known labels when the attacker has them, else labels inferred from the last layer (int64, CPU)."""
    if knowledge.labels is not None:
        return knowledge.labels.detach().to("cpu", torch.int64, copy=True)
    return infer_labels(update, knowledge)


# -- the attack ----------------------------------------------------------------------------------
@dataclass
class AnalyticConfig:
    """Options of :class:`AnalyticAttack`."""

    layer: str | None = None
    """Module-name prefix of the attacked linear layer; None: the first one run; "bottleneck": PRECODE's encoder."""
    rel_tol: float = 1e-6
    """Rows with |dL/db_i| <= rel_tol * max |dL/db| count as inactive, in [0, 1)."""
    match_tol: float = 1e-5
    """Relative distance under which two rows' recovered vectors count as the same, in (0, 1).

    Single-example rows agree to ~1e-7 in float32; mixtures agree only by chance."""
    box_tol: float = 0.05
    """Slack of the valid-image box test, as a fraction of the box width, >= 0."""
    certified_only: bool = True
    """Return only vectors that two or more rows agree on (certified single examples); else fill every slot."""

    def __post_init__(self) -> None:
        check_option_types(self)
        if self.layer is not None and (not isinstance(self.layer, str) or not self.layer):
            raise ValueError(f"layer={self.layer!r}; must be None or a non-empty module-name prefix")
        if not 0.0 <= self.rel_tol < 1.0:
            raise ValueError(f"rel_tol={self.rel_tol}; allowed range [0, 1)")
        if not 0.0 < self.match_tol < 1.0:
            raise ValueError(f"match_tol={self.match_tol}; allowed range (0, 1)")
        self.box_tol = check_tolerance(self.box_tol, "box_tol")


class AnalyticAttack(Attack):
    """Closed-form recovery of a linear layer's input, ``x = dL/dW_i / dL/db_i`` (DCS² Eq. 3).

    An honest-but-curious attack: the model is used as it is. See the module docstring for which layer
    is attacked, what is returned, and the limits at batch sizes above one.
    """

    name: ClassVar[str] = "analytic"
    public_split = False
    Config: ClassVar[type] = AnalyticConfig

    @classmethod
    def check_scenario(cls, config: AnalyticConfig, model, spec: DatasetSpec) -> None:
        if config.layer is not None:  # the layer it names must be one of the model's
            matching_linears(model(), config.layer)

    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int]
    ) -> list[AnalyticResult]:
        cfg: AnalyticConfig = self.config
        results = []
        for update, knowledge, seed in zip(updates, knowledges, seeds):
            layer = find_linear_layer(knowledge.model, knowledge.spec, cfg.layer, seed=seed)
            weight_grad, bias_grad = layer_gradients(update, layer.weight_name, layer.bias_name)
            # a model delta's float32 rounding (found in an audit: at lr 0.01 no two rows agreed within
            # match_tol, and certified_only returned nothing)
            rounding = layer_rounding(update, knowledge.model, layer.weight_name, layer.bias_name, weight_grad,
                                      bias_grad)
            candidates, rows = recover_linear_input(weight_grad, bias_grad, rel_tol=cfg.rel_tol,
                                                    bias_rounding=None if rounding is None else rounding[1])
            box = image_box(knowledge.spec, device=candidates.device) if layer.on_input else (None, None)
            selection = select_candidates(
                candidates,
                bias_grad.detach().to(torch.float64)[rows].abs(),
                knowledge.batch_size,
                match_tol=agreement_tolerance(cfg.match_tol, rounding, weight_grad, bias_grad, rows),
                lower=box[0],
                upper=box[1],
                box_tol=cfg.box_tol,
                require_agreement=cfg.certified_only,
            )
            results.append(
                assemble_result(
                    selection,
                    knowledge,
                    update,
                    layer=layer.name,
                    on_input=layer.on_input,
                    labels=attack_labels(update, knowledge),
                )
            )
        return results


def layer_gradients(update: SharedUpdate, weight_name: str, bias_name: str) -> tuple[Tensor, Tensor]:
    """The ``(weight, bias)`` tensors of one layer in ``update``, with a clear error when absent."""
    missing = [n for n in (weight_name, bias_name) if n not in update.tensors]
    if missing:
        raise ValueError(
            f"the update has no tensor(s) {missing}; it holds {len(update.tensors)} tensors, e.g. "
            f"{list(update.tensors)[:6]} (was the model prepared by this attack's prepare_model?)"
        )
    return update.tensors[weight_name], update.tensors[bias_name]


class InputBlockAttack(Attack):
    """Shared recovery loop of the malicious attacks that insert a linear block after the input.

    Subclasses (imprint, trap weights) build the block in ``prepare_model`` under ``block_name`` and
    implement :meth:`_candidates`, their own maths: per-row input candidates from the block's
    weight and bias gradients, and a strength per candidate. Selecting B images, the valid-image
    box, labels and the result are the same for both.
    """

    malicious: ClassVar[bool] = True
    block_name: ClassVar[str] = "block"

    @property
    def layer(self) -> str:
        return f"{self.block_name}.linear0"

    @abstractmethod
    def _candidates(
        self, update: SharedUpdate, knowledge: AttackerKnowledge, weight_grad: Tensor, bias_grad: Tensor,
        rounding: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, Tensor, dict]:
        """``(candidates (R, d), strength (R,), extra select_candidates options)`` of one update;
        ``rounding``: bounds of the rounding in ``weight_grad`` and ``bias_grad`` entries where the update
        is a model delta (:func:`layer_rounding`), else None."""

    def _reconstruct_batch(
        self, updates: list[SharedUpdate], knowledges: list[AttackerKnowledge], *, seeds: list[int]
    ) -> list[AnalyticResult]:
        # Deterministic: the seeds are not used (the block's randomness is fixed in prepare_model).
        results = []
        for update, knowledge in zip(updates, knowledges):
            weight_grad, bias_grad = layer_gradients(update, f"{self.layer}.weight", f"{self.layer}.bias")
            rounding = layer_rounding(update, knowledge.model, f"{self.layer}.weight", f"{self.layer}.bias",
                                      weight_grad, bias_grad)
            candidates, strength, options = self._candidates(update, knowledge, weight_grad, bias_grad, rounding)
            lower, upper = image_box(knowledge.spec, device=candidates.device)
            selection = select_candidates(
                candidates, strength, knowledge.batch_size, lower=lower, upper=upper,
                box_tol=self.config.box_tol, **options,
            )
            results.append(
                assemble_result(
                    selection, knowledge, update, layer=self.layer, on_input=True,
                    labels=attack_labels(update, knowledge),
                )
            )
        return results

"""Label inference from the classifier head's update.

For a softmax cross-entropy loss, the gradient of the head ``z = W h + b`` on one example is
``dL/db = p - y`` and ``dL/dW = (p - y) h^T``: only the true class has a negative entry of ``p - y``.

* Batch of one -- iDLG (Zhao et al. 2020, "iDLG: Improved Deep Leakage from Gradients", Sec. 3.1):
  the row of ``dL/dW`` (or the entry of ``dL/db``) of the true class is the only negative one when the
  features ``h`` are non-negative. We take the class with the smallest per-class *signal*
  ``s_n`` (row sum of ``dL/dW``, or ``dL/db_n``), which is that class.
* Larger batches -- LLG (Wainakh et al. 2022, "User-Level Label Leakage from Gradients in Federated
  Learning", PETS, Sec. 4.1, the "LLG" variant): every class with ``s_n < 0`` occurs in the batch and
  is emitted once; the impact of one example is estimated as ``m = sum_{s_n < 0} s_n / B``; each
  emitted class has ``m`` subtracted from its signal, and the remaining ``B - |S|`` labels go
  greedily to the class with the most negative signal, subtracting ``m`` each time. LLG handles
  repeated labels, unlike the rule of Yin et al. 2021 (GradInversion Eq. 4: the ``B`` classes with the
  most negative minimum over the row of ``dL/dW``), which is offered as ``method="yin"``.

Which signal: LeakGym models have ``head.bias``; its update ``sum_i (p_i - y_i)`` is negative on the
true classes whatever the sign of the features (PRECODE's decoder output can be negative, which breaks
the weight-based rule), so ``signal="auto"`` uses the bias when the update contains it and the weight
row sums otherwise. Both are valid for FedAvg model differences too: ``w_before - w_after`` is
``local_lr`` times the sum of the local gradients, which keeps the sign pattern for small step counts.

Measured (``tests/test_attacks_optim.py``): 100% at batch size 1 (LeNet with and without PRECODE,
30 images); LLG at batch size 8 on untrained LeNet, 16x16 digits, 20 random batches with repeated
labels: 83.1% of labels recovered (multiset overlap).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

from leakgym.attacks.base import AttackerKnowledge
from leakgym.fl.update import SharedUpdate

LABEL_METHODS = ("auto", "idlg", "llg", "yin")
LABEL_SIGNALS = ("auto", "bias", "weight")


def head_parameter_names(model: nn.Module) -> tuple[str, str | None]:
    """Names of the classifier head's weight and bias in ``model.named_parameters()``."""
    return _head_names(model, model.named_parameters())


def _head_names(model: nn.Module, named: Iterable[tuple[str, Tensor]]) -> tuple[str, str | None]:
    """:func:`head_parameter_names` with ``model.named_parameters()`` given (one walk of the model may
    serve several readers)."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(  # noqa: TRY004 -- LeakGym reports every bad input as ValueError
            f"label inference needs model.head to be an nn.Linear classifier; got {type(head).__name__}"
        )
    weight_name = bias_name = None
    weight, bias = head.weight, head.bias
    for name, p in named:
        if p is weight:
            weight_name = name
        elif bias is not None and p is bias:
            bias_name = name
    if weight_name is None:
        raise ValueError("model.head.weight is not among model.named_parameters()")
    return weight_name, bias_name


_HeadNames = Callable[[nn.Module], tuple[str, str | None]]
"""``model -> (weight name, bias name)`` of its classifier head: :func:`head_parameter_names`, or a reader
that remembers the answer for the models of one call."""


def class_signal(update: SharedUpdate, model: nn.Module, signal: str = "auto") -> Tensor:
    """Per-class signal ``s_n`` (``(num_classes,)``, float64): negative for classes in the batch."""
    return _class_signal(update, model, signal, head_parameter_names)


def _class_signal(update: SharedUpdate, model: nn.Module, signal: str, heads: _HeadNames) -> Tensor:
    """:func:`class_signal`, the head's parameter names read by ``heads``."""
    raw, computed = _signal_source(update, model, signal, heads)
    return computed if raw is None else raw.detach().double().reshape(-1)


def _signal_source(update: SharedUpdate, model: nn.Module, signal: str,
                   heads: _HeadNames) -> tuple[Tensor | None, Tensor | None]:
    """:func:`class_signal`'s checks, and its source: ``(bias update, None)`` when the signal is the head
    bias's update (:func:`class_signal` is then that tensor as float64, flattened), else ``(None, signal)``
    from the head weight's row sums."""
    if signal not in LABEL_SIGNALS:
        raise ValueError(f"signal={signal!r}; allowed: {LABEL_SIGNALS}")
    weight_name, bias_name = heads(model)
    use_bias = bias_name is not None and bias_name in update.tensors and signal in ("auto", "bias")
    if signal == "bias" and not use_bias:
        raise ValueError("signal='bias' but the update has no head bias; use signal='weight'")
    if use_bias:
        return update.tensors[bias_name], None
    if weight_name not in update.tensors:
        raise ValueError(f"the update has no {weight_name!r} (the classifier head); cannot infer labels")
    return None, update.tensors[weight_name].detach().double().sum(dim=1)


def _class_signal_of(update: SharedUpdate, knowledge: AttackerKnowledge, signal: str = "auto",
                     heads: _HeadNames = head_parameter_names) -> Tensor:
    """:func:`class_signal`, checked against ``knowledge.spec.num_classes``."""
    s = _class_signal(update, knowledge.model, signal, heads)
    if s.numel() != knowledge.spec.num_classes:
        raise ValueError(f"head has {s.numel()} outputs but spec.num_classes={knowledge.spec.num_classes}")
    return s


def infer_labels_many(updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge],
                      methods: Sequence[str]) -> list[Tensor]:
    """``infer_labels(updates[i], knowledges[i], method=methods[i])`` for every ``i``. The one-example
    problems of iDLG (``"idlg"``, or ``"auto"`` at batch size 1) whose class signals share a device, shape
    and dtype are decided by one ``argmin`` and one transfer to the CPU (on a GPU one synchronisation for all
    the games of a vector step, not one per game); the same labels (``argmin`` returns the first minimum
    in both). The others go through :func:`infer_labels`."""
    return _infer_labels_many(updates, knowledges, methods, head_parameter_names,
                              lambda u, k, method: infer_labels(u, k, method=method))


def _infer_labels_many(updates: Sequence[SharedUpdate], knowledges: Sequence[AttackerKnowledge],
                       methods: Sequence[str], heads: _HeadNames,
                       alone: Callable[[SharedUpdate, AttackerKnowledge, str], Tensor]) -> list[Tensor]:
    """:func:`infer_labels_many`, the head's parameter names read by ``heads`` and the problems that are
    not decided together by ``alone(update, knowledge, method)``. The head-bias signals of a group are
    stacked as they are and converted to float64 once (the same values as converting each: the conversion
    is exact), not one conversion per problem."""
    if not len(updates) == len(knowledges) == len(methods):
        raise ValueError(f"got {len(updates)} updates, {len(knowledges)} knowledges and {len(methods)} methods")
    out: list[Tensor | None] = [None] * len(updates)
    signals: dict[tuple, list[tuple[int, Tensor]]] = {}
    for i, (u, k, method) in enumerate(zip(updates, knowledges, methods)):
        if k.batch_size != 1 or method not in ("auto", "idlg"):
            out[i] = alone(u, k, method)
            continue
        raw, s = _signal_source(u, k.model, "auto", heads)
        if raw is not None:
            s = raw
        if s.numel() != k.spec.num_classes:
            raise ValueError(f"head has {s.numel()} outputs but spec.num_classes={k.spec.num_classes}")
        signals.setdefault((s.device, s.shape, s.dtype), []).append((i, s))
    with torch.no_grad():  # (the signals are read detached)
        for members in signals.values():
            stacked = torch.stack([s for _, s in members])
            picks = stacked.reshape(len(members), -1).double().argmin(dim=1).to(torch.int64).cpu()
            for (i, _), label in zip(members, picks.reshape(-1, 1).unbind(0)):
                out[i] = label
    return out  # type: ignore[return-value]


def llg_labels(signal: Tensor, batch_size: int) -> Tensor:
    """LLG (Wainakh et al. 2022, Sec. 4.1) from a per-class signal; sorted ``int64 (batch_size,)``."""
    s = signal.clone()
    negative = torch.nonzero(s < 0).reshape(-1)
    # Most negative first, so that if more classes are negative than the batch size we keep the
    # strongest ones.
    negative = negative[torch.argsort(s[negative])][:batch_size]
    labels = negative.tolist()
    neg_sum = s[s < 0].sum()
    impact = neg_sum / batch_size if neg_sum < 0 else -s.abs().max().clamp_min(1e-12)
    s[negative] -= impact
    while len(labels) < batch_size:
        n = int(torch.argmin(s))
        labels.append(n)
        s[n] -= impact
    return torch.tensor(sorted(labels), dtype=torch.int64)


def infer_labels(
    update: SharedUpdate,
    knowledge: AttackerKnowledge,
    *,
    method: str = "auto",
    signal: str = "auto",
) -> Tensor:
    """Infer the ``knowledge.batch_size`` labels of the victim batch from its shared update.

    Args:
        update: the victim's gradient or model difference (must contain the classifier head).
        knowledge: the attacker's knowledge (``model`` for the head's names, ``batch_size``).
        method: ``"idlg"`` (batch size 1 only), ``"llg"``, ``"yin"`` (requires distinct labels), or
            ``"auto"`` (iDLG for one example, LLG otherwise).
        signal: ``"bias"``, ``"weight"`` (row sums of the head weight) or ``"auto"`` (bias when
            present); ``"yin"`` always uses the weight.

    Returns:
        ``int64 (batch_size,)`` labels on the CPU, sorted (the order of a batch cannot be recovered
        from its mean gradient; metrics match reconstructions to originals by optimal assignment).
        The signal is read on the update's device; only the ``B`` labels move to the CPU.
    """
    return _infer_labels(update, knowledge, method, signal, head_parameter_names)


def _infer_labels(update: SharedUpdate, knowledge: AttackerKnowledge, method: str, signal: str,
                  heads: _HeadNames) -> Tensor:
    """:func:`infer_labels`, the head's parameter names read by ``heads``."""
    if method not in LABEL_METHODS:
        raise ValueError(f"method={method!r}; allowed: {LABEL_METHODS}")
    b = knowledge.batch_size
    num_classes = knowledge.spec.num_classes
    if method == "idlg" and b != 1:
        raise ValueError(f"method='idlg' recovers one label; batch_size={b} (use 'llg' or 'auto')")
    if method == "yin":
        if b > num_classes:
            raise ValueError(f"method='yin' needs distinct labels; batch_size={b} > num_classes={num_classes}")
        weight_name, _ = heads(knowledge.model)
        if weight_name not in update.tensors:
            raise ValueError(f"the update has no {weight_name!r}; cannot infer labels")
        row_min = update.tensors[weight_name].detach().double().amin(dim=1)
        return torch.sort(torch.argsort(row_min)[:b]).values.to(torch.int64).cpu()
    s = _class_signal_of(update, knowledge, signal, heads)
    if b == 1:
        return torch.argmin(s).reshape(1).to(torch.int64).cpu()
    return llg_labels(s, b)

"""The server side of one federated round for G games of one architecture, as stacked computations.

:func:`aggregate_round` takes the games' global models as stacked tensors (``name -> (G, ...)``, e.g. the
rows of a :class:`~leakgym.fl.bank.ModelBank`), each game's victim update and its benign clients'
batches ``(G, K, B, ...)``, and returns every game's next global state: the benign updates
(:func:`leakgym.fl.batched.benign_updates`, one vmapped computation for all games and clients) and the
example-weighted aggregation (:func:`leakgym.fl.batched.aggregate_many`; BatchNorm running statistics by
:func:`leakgym.fl.batched.average_buffers_many`) are one computation each. The result equals
:meth:`leakgym.fl.server.Server.aggregate` of ``[victim] + benign`` game by game to floating-point
rounding (the aggregation exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from leakgym.devices import in_library_modes
from leakgym.fl import batched as fl_batched
from leakgym.fl.update import SharedUpdate


@dataclass
class RoundResult:
    """What :func:`aggregate_round` computed."""

    #: ``name -> (len(kept), ...)``: the next parameters (and floating BN buffers) of the games ``kept``
    state: dict[str, Tensor]
    #: indices (into the round's games) whose next state is in :attr:`state`
    kept: list[int]
    #: index -> the updates to aggregate one game at a time (``[victim] + benign``), for a game whose victim
    #: update lacks some global parameter: the per-name mean then leaves the victim out (Server.aggregate's rule)
    alone: dict[int, list[SharedUpdate]]


@in_library_modes
def aggregate_round(
    model: nn.Module,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor] | None,
    victims: Sequence[SharedUpdate],
    x: Tensor,
    y: Tensor,
    *,
    kind: str,
    local_steps: int,
    local_lr: float,
    optimizer=None,
    server_lr: float,
    models: Sequence[nn.Module] | None = None,
) -> RoundResult:
    """One round's benign clients and aggregation for G games of ``model``'s architecture.

    ``params``/``buffers``: the games' global parameters and buffers stacked, ``name -> (G, ...)``;
    ``victims``: each game's victim update (weight 0 when it sent nothing, ``metadata["skipped"]``);
    ``x``/``y``: the benign clients' batches, ``(G, K, B, ...)``; ``models``: the games' modules (only to
    unpack the benign updates of a game aggregated alone)."""
    benign = fl_batched.benign_updates(model, params, x, y, kind=kind, local_steps=local_steps, local_lr=local_lr,
                                       buffers=buffers, optimizer=optimizer)
    k, b = x.shape[1], x.shape[2]
    # Slot 0: the victim's update (weight 0 when it sent nothing, or for names it lacks); 1..K: benign.
    victim = {name: torch.stack([v.tensors[name] if name in v.tensors else torch.zeros_like(p)
                                 for v, p in zip(victims, params[name].unbind(0))])
              for name in params if any(name in v.tensors for v in victims)}
    sent = [0.0 if v.metadata.get("skipped", False) else float(v.batch_size) for v in victims]
    weights = torch.tensor([[w] + [float(b)] * k for w in sent], dtype=torch.float64)
    slots = [victim] + [{name: t[:, j] for name, t in benign.tensors.items()} for j in range(k)]
    alone = {i: [v] + [fl_batched.unpack(benign, i, j, kind=kind, batch_size=b, local_steps=local_steps,
                                         local_lr=local_lr, optimizer=optimizer,
                                         model=None if models is None else models[i]) for j in range(k)]
             for i, v in enumerate(victims) if any(name not in v.tensors for name in params)}
    kept = [i for i in range(len(victims)) if i not in alone]
    if not kept:
        return RoundResult(state={}, kept=[], alone=alone)
    index = torch.tensor(kept)
    step = server_lr if kind == "gradient" else 1.0
    if len(kept) == len(victims):  # every game (the usual round): the stacks as they are, no gathers
        def rows(stacks: dict[str, Tensor]) -> dict[str, Tensor]:
            return stacks
    else:
        def rows(stacks: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: t[index.to(t.device)] for n, t in stacks.items()}
    new = fl_batched.aggregate_many(rows(params), [rows(slot) for slot in slots], weights[index], step=step)
    if buffers is not None:
        # BN statistics: Server.aggregate averages, name by name, those of the updates that carry the name (a
        # victim may carry some layers' statistics only): the victim's weight for a name is 0 in a game whose
        # victim lacks it. Names with the same victim weights in every game are averaged together.
        carried = [victims[i].buffers or {} for i in kept]
        sent_weights = weights[index, 0].tolist()
        if all(c.keys() >= buffers.keys() or not c for c in carried):  # every victim all statistics, or none
            columns = {tuple(w if c else 0.0 for w, c in zip(sent_weights, carried)): list(buffers)}
        else:
            columns = {}
            for name in buffers:
                columns.setdefault(tuple(w if name in c else 0.0 for w, c in zip(sent_weights, carried)), []).append(name)
        victim_buffers = {name: torch.stack([c[name] if name in c else buffers[name][i] for c, i in zip(carried, kept)])
                          for name in buffers}
        current = rows(buffers)
        benign_buffers = [rows({n: t[:, j] for n, t in benign.buffers.items()}) for j in range(k)]
        for column, names in columns.items():
            buffer_weights = weights[index].clone()
            buffer_weights[:, 0] = torch.tensor(column, dtype=torch.float64)
            new.update(fl_batched.average_buffers_many({n: current[n] for n in names}, [victim_buffers] + benign_buffers,
                                                       buffer_weights))
    return RoundResult(state=new, kept=kept, alone=alone)


__all__ = ["RoundResult", "aggregate_round"]

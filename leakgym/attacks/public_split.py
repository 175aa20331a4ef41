"""What an attack derives from a public split, computed once per split.

A game's public split (``AttackerKnowledge.public_x`` and ``public_y``, the ``public_x`` of
``Attack.prepare_model``) is fixed for its episode, but the attack sees it anew every round, and what it
derives from it was recomputed every round: prior-init's class-mean images (69 ms with CIFAR-10's 5,000
public images, one thread) and the imprint attack's bin thresholds (1.3 s with TinyImageNet's 10,000).
:func:`derived` keeps such a value while the tensors it came from live unchanged, and a game's split
gathered again (:func:`gathered_from`) finds the values derived from an earlier gather.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import TypeVar

from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

T = TypeVar("T")

#: ``public_x`` (or its source, :func:`gathered_from`) ``-> {key: (version counters, weak references to the
#: other tensors, value)}``; an entry goes with its ``public_x`` or source
_DERIVED: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: ``gathered tensor -> (source, part, the tensor's version counter when gathered)`` (:func:`gathered_from`)
_SOURCES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def gathered_from(tensor: Tensor, source: Tensor, part: str) -> None:
    """Declare ``tensor`` a gather of read-only data that ``source`` names (``part`` tells apart the tensors
    gathered from one source, e.g. a split's images and labels): every gather of ``source`` and ``part`` holds
    the same values, so what :func:`derived` computed from one of them serves the others while ``source``
    lives unchanged. A game's public split is such a gather (:meth:`leakgym.game.batch.GameBatch.public_splits`:
    ``source`` is the split's index tensor, which lives for the episode), so that a split gathered again after
    the batch dropped it keeps its derived values. A gathered tensor written in place after this call is
    followed by itself again."""
    if not tensor.is_inference() and not source.is_inference():
        _SOURCES[tensor] = (source, part, tensor._version)


def _followed(t: Tensor) -> tuple[Tensor, str]:
    """What a derived value of ``t`` is kept under: its source while it holds what was gathered, else ``t``."""
    found = _SOURCES.get(t)
    if found is not None and found[2] == t._version:
        return found[0], found[1]
    return t, ""


def derived(public_x: Tensor, key: Hashable, compute: Callable[[], T], *, also: tuple[Tensor, ...] = ()) -> T:
    """``compute()``, kept under ``key`` while ``public_x`` and the tensors ``also`` (e.g. ``public_y``) live
    and are not written to in place; the key names everything else the value depends on (settings,
    device). Tensors are followed by object and version counter: an in-place write through torch is seen, a
    write through ``.data`` or a NumPy view is not. The value is shared: callers read it, never write to it.
    Inference tensors (made under ``torch.inference_mode``) keep no version counter: for them the value is
    computed every call.
    """
    if public_x.is_inference() or any(t.is_inference() for t in also):
        return compute()
    owner, part = _followed(public_x)
    others = [_followed(t) for t in also]
    entries = _DERIVED.get(owner)
    if entries is None:
        entries = _DERIVED[owner] = {}
    key = (part, tuple(p for _, p in others), key)
    stamp = (owner._version, *(t._version for t, _ in others))
    kept = entries.get(key)
    if kept is not None and kept[0] == stamp and all(ref() is t for ref, (t, _) in zip(kept[1], others)):
        return kept[2]
    value = compute()
    entries[key] = (stamp, tuple(weakref.ref(t) for t, _ in others), value)
    return value


__all__ = ["derived", "gathered_from"]

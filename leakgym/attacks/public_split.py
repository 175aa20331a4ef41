"""What an attack derives from a public split, computed once per split.

A game's public split (``AttackerKnowledge.public_x`` and ``public_y``, the ``public_x`` of
``Attack.prepare_model``) is fixed for its episode, but the attack sees it anew every round, and what it
derives from it was recomputed every round: prior-init's class-mean images (69 ms with CIFAR-10's 5,000
public images, one thread) and the imprint attack's bin thresholds (1.3 s with TinyImageNet's 10,000).
:func:`derived` keeps such a value while the tensors it came from live unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import TypeVar

from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

T = TypeVar("T")

#: ``public_x -> {key: (version counters, weak references to the other tensors, value)}``; an entry goes
#: with its ``public_x``
_DERIVED: WeakIdKeyDictionary = WeakIdKeyDictionary()


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
    entries = _DERIVED.get(public_x)
    if entries is None:
        entries = _DERIVED[public_x] = {}
    stamp = (public_x._version, *(t._version for t in also))
    kept = entries.get(key)
    if kept is not None and kept[0] == stamp and all(ref() is t for ref, t in zip(kept[1], also)):
        return kept[2]
    value = compute()
    entries[key] = (stamp, tuple(weakref.ref(t) for t in also), value)
    return value


__all__ = ["derived"]

"""The LeakGym game: the state of N games (:class:`~leakgym.game.batch.GameBatch`) and one round over
them as phase functions (:func:`~leakgym.game.round.play_round`: plan -> defend -> attack -> score ->
aggregate -> reward). The environments in ``leakgym.envs`` are views of it.

Modules: :mod:`leakgym.game.batch` (the state), :mod:`leakgym.game.round` (the phases),
:mod:`leakgym.game.records` (the plain records passed between phases). Imported lazily: ``import
leakgym.game`` alone pulls in nothing heavy.
"""

from __future__ import annotations

_EXPORTS = {
    "GameBatch": "batch",
    "play_round": "round",
    "RoundError": "round",
    "RoundOutcome": "records",
    "RoundRecord": "records",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GameBatch", "RoundError", "RoundOutcome", "RoundRecord", "play_round"]

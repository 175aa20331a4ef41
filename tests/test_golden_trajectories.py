"""Golden trajectories: every recorded case (tests/golden/) replays as it was recorded on main.

Recorded by ``python tests/golden/record.py`` (the cases, what is stored and why: ``docs/architecture.md`` ("Golden trajectories")).
The replay plays the recorded actions through the public APIs and compares every step: the text
(strategy names, defense lists) and every integer/bool array (actions, end flags, round counters,
info masks) exactly; float arrays (observations, rewards, numeric infos) exactly when this machine's
fingerprint (CPU model, torch instruction set, torch version) is the recording's, else within :data:`TOLERANCE`;
the ``batch_clients=True`` cases within :data:`TOLERANCE` everywhere (:func:`batched_clients`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("leakgym_golden_record", GOLDEN / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)

#: float tolerance on another CPU or torch (np.isclose: |a - b| <= atol + rtol * |b|); measured and
#: justified in docs/architecture.md ("Golden trajectories")
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

RECORDED = json.loads((GOLDEN / "machine.json").read_text())


def exact_here() -> bool:
    return record.fingerprint(record.machine()) == record.fingerprint(RECORDED)


def batched_clients(name: str) -> bool:
    """Cases played with ``batch_clients=True``: that path is stated equal to the game-by-game phases to
    floating-point rounding, not bit for bit (``play_round``'s docstring, docs/limits.md), so its kernels
    may change their summation order; these cases replay within :data:`TOLERANCE` on every machine."""
    return record.CASES[name][4].get("batch_clients", False)


def differences(expected: dict[str, np.ndarray], got: dict[str, np.ndarray], exact: bool,
                tolerance: dict[str, float] = TOLERANCE) -> list[str]:
    """What differs between two packed cases (empty when they agree)."""
    problems = []
    if expected.keys() != got.keys():
        problems.append(f"keys: missing {sorted(expected.keys() - got.keys())}, new {sorted(got.keys() - expected.keys())}")
    for key in sorted(expected.keys() & got.keys()):
        a, b = np.asarray(expected[key]), np.asarray(got[key])
        if key == "text":
            if str(a) != str(b):
                problems.append("text (strategies, defense lists, settings) differs")
            continue
        if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
            problems.append(f"{key}: {a.dtype}{a.shape} recorded, {b.dtype}{b.shape} now")
        elif a.dtype.kind != "f" or exact:
            if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                problems.append(f"{key}: not {'bit-' if a.dtype.kind == 'f' else ''}identical")
        elif not np.allclose(b, a, equal_nan=True, **tolerance):
            worst = np.nanmax(np.abs(a.astype(np.float64) - b))
            problems.append(f"{key}: max |difference| {worst:.3g} beyond {tolerance}")
    return problems


def test_the_recording_covers_every_case_and_is_small():
    assert sorted(RECORDED["cases"]) == sorted(record.CASES)
    for name in record.CASES:
        assert (GOLDEN / f"{name}.npz").is_file(), name
    assert sum(p.stat().st_size for p in GOLDEN.iterdir()) < 2 * 2**20


@pytest.mark.parametrize("name", sorted(record.CASES))
def test_the_case_replays_as_recorded(name, one_torch_thread):
    with np.load(GOLDEN / f"{name}.npz", allow_pickle=False) as data:
        expected = {k: data[k] for k in data.files}
    got = record.pack(record.play(name, recorded=expected))
    exact = exact_here() and not batched_clients(name)
    problems = differences(expected, got, exact)
    where = "this machine (exact)" if exact else f"tolerance {TOLERANCE}"
    assert not problems, f"{name} on {where}, recorded on {RECORDED['cpu']} / torch {RECORDED['torch']}:\n" + \
        "\n".join(problems)

"""Golden trajectories of the offline scenarios, recorded through the public APIs only.

``python tests/golden/record.py`` plays every case in :data:`CASES` and writes ``tests/golden/<case>.npz``
plus ``tests/golden/machine.json`` (CPU model, torch/NumPy versions, the commit it was recorded on).
``tests/test_golden_trajectories.py`` replays the recorded actions and compares (see ``docs/architecture.md``, "Golden trajectories").
Re-record only when a change is *meant* to alter trajectories, and say so in the commit.

Only ``gym.make``, ``gym.make_vec`` and ``leakgym.envs.parallel_env`` are used (no env internals), so
the cases survive a redesign of the game core. Each case is a sequence of steps; a step's record is
flattened to ``path -> value``: numeric values (observations, rewards, end flags, every info, and the
round's full record from ``round_details()`` with nested dicts such as ``attack_settings`` by their leaves)
become arrays stacked over the steps, the rest (strategy names, defense lists, OASIS bit lists) one JSON
document per case, compared exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent

#: cheap overrides (few rounds, one benign client, a tiny test set, small attack budgets); everything
#: else (rewards, menus' other entries, defense defaults, server_lr, batch size) stays the TOML's
DIGITS = {"rounds": 3, "num_clients": 1, "eval_size": 32, "iterations": [2, 5]}
MALICIOUS = {"rounds": 3, "num_clients": 1, "eval_size": 32, "attack_defaults": {"num_neurons": 64}}
SCENARIOS = {"digits": ("LeakGym-Digits-v0", DIGITS), "digits-malicious": ("LeakGym-Digits-Malicious-v0", MALICIOUS)}

#: name -> (scenario, view, role, actions, options). view: "single" (gym.make), "vec8" (gym.make_vec,
#: num_envs=8), "parallel" (PettingZoo, both agents act). actions: "fixed" (the last entry of every
#: menu: the largest budget / the strongest defense) or "random" (a seeded generator).
CASES: dict[str, tuple[str, str, str, str, dict[str, Any]]] = {}
for _sc in SCENARIOS:
    for _role in ("attacker", "defender"):
        for _actions in ("fixed", "random"):
            CASES[f"{_sc}-single-{_role}-{_actions}"] = (_sc, "single", _role, _actions, {})
    for _bc in (False, True):
        CASES[f"{_sc}-vec8-attacker-random-bc{int(_bc)}"] = (_sc, "vec8", "attacker", "random", {"batch_clients": _bc})
    CASES[f"{_sc}-vec8-defender-random-bc1"] = (_sc, "vec8", "defender", "random", {"batch_clients": True})
    CASES[f"{_sc}-parallel-random"] = (_sc, "parallel", "both", "random", {})
CASES["digits-vec8-attacker-fixed-bc0"] = ("digits", "vec8", "attacker", "fixed", {"batch_clients": False})
CASES["digits-vec8-defender-fixed-bc0"] = ("digits", "vec8", "defender", "fixed", {"batch_clients": False})

SEED = 1234
VEC_SEEDS = [SEED + i for i in range(8)]


def machine() -> dict[str, str]:
    """What the exact comparison depends on (``fingerprint``) and, for the record, a little more."""
    import torch

    cpu = platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):  # not Linux: no /proc/cpuinfo
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    if "model name" in fields:  # a VM may say only "AMD EPYC": family and model tell the generations apart
        cpu = f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    return {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""), "torch_threads": str(torch.get_num_threads())}


def fingerprint(info: dict[str, str]) -> tuple[str, str, str]:
    """The CPU model (with torch's instruction set on it) and the torch version: bit-identity is
    expected only where all three are the recording's."""
    return info["cpu"], info["cpu_capability"], info["torch"]


def _flatten(prefix: str, value: Any, numeric: dict[str, Any], text: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            if not k.startswith("_"):  # Gymnasium's vector-info masks: recorded once as "<key>/mask"
                _flatten(f"{prefix}/{k}", value[k], numeric, text)
        for k in sorted(value):
            if k.startswith("_") and k[1:] in value:
                numeric[f"{prefix}/{k[1:]}/mask"] = np.asarray(value[k])
        return
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        numeric[prefix] = np.asarray(value)
        return
    if isinstance(value, np.ndarray) and value.dtype != object:
        numeric[prefix] = value
        return
    text[prefix] = np.asarray(value, dtype=object).tolist() if isinstance(value, np.ndarray) else value


def _step_record(kind: str, out: tuple, actions: Any, details: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    numeric: dict[str, Any] = {}
    text: dict[str, Any] = {}
    names = ("obs", "info") if kind == "reset" else ("obs", "reward", "terminated", "truncated", "info")
    if actions is not None:
        _flatten("action", actions, numeric, text)
    for name, value in zip(names, out):
        _flatten(name, value, numeric, text)
    if details is not None:  # what round_details() adds to the infos: strategy names, settings, defense lists
        _flatten("details", _records(details), numeric, text)
    return numeric, text


def _records(details: dict[str, Any]) -> dict[str, Any]:
    """The entries of round_details() that the infos do not carry (leakgym.game.feedback.DETAILS), per key of
    ``details`` (an agent or a game), or of ``details`` itself when it is one record."""
    keys = ("strategy", "attack_settings", "defense_settings", "defenses")
    if any(k in details for k in keys) or "round" in details:
        return {k: details[k] for k in keys if k in details}
    return {name: _records(d) for name, d in details.items()}


def _actions(rng: np.random.Generator, space, n: int | None, fixed: bool) -> np.ndarray:
    nvec = np.asarray(space.nvec)
    if fixed:
        row = nvec - 1
        return np.stack([row] * n) if n else row.copy()
    return rng.integers(0, nvec, size=(n, len(nvec)) if n else len(nvec)).astype(np.int64)


def play(name: str, recorded: dict[str, np.ndarray] | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The steps of case ``name``: ``[(numeric, text), ...]``. With ``recorded`` (a replay) the actions
    are the recorded ones, not drawn again, so a changed generator cannot move the trajectory."""
    import gymnasium as gym

    import leakgym  # noqa: F401  (registers the ids)
    from leakgym.envs import parallel_env

    scenario, view, role, how, options = CASES[name]
    gym_id, overrides = SCENARIOS[scenario]
    rng = np.random.default_rng(SEED)
    fixed = how == "fixed"
    steps: list[tuple[dict[str, Any], dict[str, Any]]] = []
    rounds = overrides["rounds"]

    def act(i: int, key: str, draw):
        if recorded is not None:
            return recorded[key][i]
        return draw()

    if view == "single":
        env = gym.make(gym_id, role=role, **overrides)
        steps.append(_step_record("reset", env.reset(seed=SEED), None))
        for i in range(rounds + 1):
            if i == rounds:  # a second episode from an unseeded reset (the env's own generator goes on)
                steps.append(_step_record("reset", env.reset(), None))
            a = act(i, "action", lambda: _actions(rng, env.action_space, None, fixed))
            out = env.step(np.asarray(a))
            steps.append(_step_record("step", out, a, env.get_wrapper_attr("round_details")()))
        env.close()
    elif view == "vec8":
        env = gym.make_vec(gym_id, num_envs=8, role=role, **options, **overrides)
        steps.append(_step_record("reset", env.reset(seed=VEC_SEEDS), None))
        for i in range(rounds + 2):  # across the autoreset step
            a = act(i, "action", lambda: _actions(rng, env.single_action_space, 8, fixed))
            out = env.step(np.asarray(a))
            # a game reset in this step (NEXT_STEP) played no round: its details are its last round's
            steps.append(_step_record("step", out, a, {str(g): d for g, d in enumerate(env.round_details())}))
        env.close()
    else:
        env = parallel_env(scenario, **overrides)
        steps.append(_step_record("reset", env.reset(seed=SEED), None))
        for i in range(rounds):
            a = {agent: act(i, f"action/{agent}", lambda agent=agent: _actions(rng, env.action_space(agent), None,
                                                                                 fixed))
                 for agent in env.agents}
            out = env.step({k: np.asarray(v) for k, v in a.items()})
            steps.append(_step_record("step", out, a, {agent: env.round_details(agent) for agent in a}))
        env.close()
    return steps


def pack(steps: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, np.ndarray]:
    """One array per numeric path, stacked over the steps that have it (``<path>@steps`` says which,
    when not every step does); the text of every step as one JSON string under ``text``."""
    arrays: dict[str, np.ndarray] = {}
    paths = sorted({p for numeric, _ in steps for p in numeric})
    for p in paths:
        which = [i for i, (numeric, _) in enumerate(steps) if p in numeric]
        arrays[p] = np.stack([np.asarray(steps[i][0][p]) for i in which])
        if len(which) != len(steps):
            arrays[f"{p}@steps"] = np.asarray(which, dtype=np.int16)
    arrays["text"] = np.asarray(json.dumps([t for _, t in steps], sort_keys=True, default=_json_default))
    return arrays


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON: {type(value)}")


def commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--", "../../leakgym",
                                "../../envs", "../../agents"], capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):  # pragma: no cover
        return "unknown"


def main(argv: list[str]) -> None:
    import torch

    import leakgym  # noqa: F401  (sets MKL_CBWR before any matrix product)

    torch.set_num_threads(1)  # as tests/conftest.py: the replay runs with one intra-op thread
    out = Path(argv[0]) if argv else HERE
    out.mkdir(parents=True, exist_ok=True)
    for name in CASES:
        np.savez_compressed(out / f"{name}.npz", **pack(play(name)))
        print(name, (out / f"{name}.npz").stat().st_size, "bytes", flush=True)
    meta = dict(machine(), commit=commit(), cases=sorted(CASES))
    (out / "machine.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

"""``leakgym bench operators``: the tensor operators one vector step dispatches, by phase of the round.

On a GPU a step of many small games is bound by launches, not arithmetic (``docs/results/bench_env_gpu.md``):
its time follows the number of operators the host dispatches, whatever N. This benchmark counts them, on
any device: every aten operator that reaches the dispatcher during one vector step
(:class:`~torch.utils._python_dispatch.TorchDispatchMode`, backward passes included), split into views (no
kernel: ``OpOverload.is_view``) and the rest, and attributed to the round's phase that dispatched it
(plan, defend, attack, score, aggregate, reward; ``other``: the vector env around the round). Unlike a
timing, the count is the same on every machine of one device type. On a CPU it includes the CPU-only forms
(the flat distance's victim blocks, the clients one after another, ...), so for what a GPU dispatches count
with ``--device cuda``. On CUDA each row also counts the host's waits for the device, by phase
(``torch.cuda.set_sync_debug_mode("warn")``: a result read to the host, a data-dependent shape, ...):
each one stops the host from queueing work ahead of the device, so a launch-bound loop should have none.
On CUDA the attack engine replays an iteration's evaluation as a CUDA graph (:mod:`leakgym.attacks.engine.replay`):
a replay launches its kernels without dispatching them, so the count is what the host dispatches, which is
what such a step's time follows; the replays' kernels are not in it.

Each row plays the vector env (``gym.make_vec``, ``batch_clients`` on, game ``i`` seeded ``i``) for two
steps of its plan (lazy imports, caches, the first decode of each action), then counts the third. The
plan is the first menu entry of every game (``fixed``) or uniform actions (``random``, drawn from
``numpy.random.default_rng(0)`` as ``leakgym bench env`` draws them).
"""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from pathlib import Path

from leakgym.bench import (
    check_output,
    interrupted,
    machine_label,
    markdown_table,
    progress_bar,
    write_results,
)
from leakgym.devices import device_argument

#: the phases of :func:`leakgym.game.round.play_round`, in order
PHASES = ("plan", "defend", "attack", "score", "aggregate", "reward")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="runs/bench/bench_operators.json",
                        help="output JSON path, a .md table is written beside it (default: %(default)s)")
    parser.add_argument("--envs", default="LeakGym-Digits-v0",
                        help="comma-separated Gymnasium ids or scenario names (default: %(default)s)")
    parser.add_argument("--num-envs", default="64", help="comma-separated vector sizes N (default: %(default)s)")
    parser.add_argument("--actions", choices=("fixed", "random"), default="random",
                        help="attacker actions: the first menu entry, or uniform over the menu (default: random)")
    parser.add_argument("--defender", choices=("none", "random"), default="none",
                        help="the defender: no defense, or a uniformly random menu action each round (default: none)")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device (default: cpu)")
    parser.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="scenario overrides for every game, e.g. iterations=[1] num_clients=1")
    from leakgym.agents.experiments.cli_common import add_allow_large_argument

    add_allow_large_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar (rows done / total)")


@contextlib.contextmanager
def _phases_named(current: list[str]):
    """While open, ``current[0]`` names the round's phase running (``"other"`` outside the round's phases).
    A plain list, not a thread-local: backward passes on a device's autograd threads count for the phase
    that waits on them."""
    from leakgym.game import round as game_round

    saved = {name: getattr(game_round, name) for name in PHASES}

    def named(name: str, phase):
        def run(*args, **kwargs):
            outer, current[0] = current[0], name
            try:
                return phase(*args, **kwargs)
            finally:
                current[0] = outer
        return run

    for name, phase in saved.items():
        setattr(game_round, name, named(name, phase))
    try:
        yield
    finally:
        for name, phase in saved.items():
            setattr(game_round, name, phase)


def count_step(vec, action, *, waits: bool = False) -> dict:
    """The operators of one ``vec.step(action)``: ``{"total", "views", "phases": {phase: {"operators",
    "views"}}}`` (``views`` of each: the view operators among them). ``waits`` (CUDA): also ``"host_waits"``,
    the times the host waited for the device, by phase (``torch.cuda.set_sync_debug_mode``'s warnings),
    else ``None``."""
    import warnings

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    current = ["other"]
    ops: Counter = Counter()
    views: Counter = Counter()
    waited: Counter = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops[current[0]] += 1
            if func.is_view:
                views[current[0]] += 1
            return func(*args, **(kwargs or {}))

    def note(message, category, *args, **kwargs):  # every warning while counting (filter "always")
        if "synchroniz" in str(message):
            waited[current[0]] += 1

    with contextlib.ExitStack() as stack:
        if waits:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("always")
            warnings.showwarning = note
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, "default")
        stack.enter_context(_phases_named(current))
        stack.enter_context(Count())
        vec.step(action)
    phases = {p: {"operators": ops[p], "views": views[p]} for p in (*PHASES, "other") if ops[p]}
    host_waits = {"total": sum(waited.values()), "phases": dict(waited)} if waits else None
    return {"total": sum(ops.values()), "views": sum(views.values()), "phases": phases, "host_waits": host_waits}


def measure(gym_id: str, num_envs: int, actions: str, defender: str, device: str,
            overrides: dict | None = None) -> dict:
    """One row: the operators of the third step of ``num_envs`` games (see the module docstring), or of the
    fourth where the third only reset games at the end of their episodes (``rounds=2``: found in an audit, the row
    counted a step that played no round, as ``leakgym bench env`` already avoids)."""
    import gymnasium as gym
    import numpy as np
    import torch

    import leakgym  # noqa: F401  (registers the ids)

    vec = gym.make_vec(gym_id, num_envs=num_envs, device=device, opponent=defender, batch_clients=True,
                       **(overrides or {}))
    try:
        nvec = np.asarray(vec.single_action_space.nvec)
        rng = np.random.default_rng(0)
        plan = [rng.integers(0, nvec, size=(num_envs, len(nvec))) if actions == "random"
                else np.zeros((num_envs, len(nvec)), dtype=np.int64) for _ in range(4)]
        vec.reset(seed=0)
        vec.step(plan[0])
        vec.step(plan[1])
        for action in plan[2:]:
            before = np.array(vec.games.round, copy=True)
            counted = count_step(vec, action, waits=torch.device(device).type == "cuda")
            if (np.asarray(vec.games.round) == before + 1).any():  # a round was played
                break
    finally:
        vec.close()
    return {"env": gym_id, "num_envs": num_envs, "actions": actions, "defender": defender,
            "overrides": dict(overrides or {}), "device": device, **counted,
            "per_game": counted["total"] / num_envs}


def to_markdown(rows: list[dict], machine: str) -> str:
    def phase(name: str):
        return lambda r: f"{r['phases'].get(name, {}).get('operators', 0):,}"

    return markdown_table(
        f"Operators dispatched in one vector step, by phase of the round ({machine})",
        [("env", lambda r: r["env"] + ("" if r.get("defender", "none") == "none" else f", {r['defender']} defender")
          + "".join(f", {k}={v}" for k, v in r.get("overrides", {}).items())),
         ("N", lambda r: str(r["num_envs"])), ("actions", lambda r: r["actions"]),
         ("operators", lambda r: f"{r['total']:,}"), ("of them views", lambda r: f"{r['views']:,}"),
         ("per game", lambda r: f"{r['per_game']:,.1f}"),
         ("host waits", lambda r: f"{r['host_waits']['total']:,}"),  # ("-" on a CPU: markdown_table's rule)
         *[(p, phase(p)) for p in (*PHASES, "other")]],
        rows, key=["env", "num_envs"],
    )


def main(args: argparse.Namespace) -> int:
    import gymnasium as gym
    import torch

    from leakgym.agents.experiments.cli_common import scenario_overrides
    from leakgym.bench.env import parse_ids, parse_sizes
    from leakgym.game.scenario import load_scenario

    sizes = parse_sizes(args.num_envs)
    ids = parse_ids(args.envs)
    overrides = scenario_overrides(args)
    for gym_id in ids:  # a bad id or override fails here, before anything is played
        load_scenario(gym.spec(gym_id).kwargs["scenario"], **overrides)
    out = check_output(args.json)
    machine = machine_label(torch.get_num_threads(), args.device)
    rows: list[dict] = []
    try:
        with progress_bar(len(ids) * len(sizes), "bench operators", not args.no_progress) as bar:
            for gym_id in ids:
                for n in sizes:
                    bar.set_postfix_str(f"{gym_id} N={n}")
                    rows.append(measure(gym_id, n, args.actions, args.defender, args.device, overrides))
                    write_results(out, machine, rows, to_markdown(rows, machine), echo=False)
                    bar.update()
    except KeyboardInterrupt:
        return interrupted(len(rows), len(ids) * len(sizes), out, Path(out).with_suffix(".md"),
                           save=lambda: write_results(out, machine, rows, to_markdown(rows, machine), echo=False))
    write_results(out, machine, rows, to_markdown(rows, machine), echo=True)
    return 0

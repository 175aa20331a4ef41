"""``leakgym bench env``: environment steps per second, peak memory and the per-phase cost split.

For each environment id, a single environment and a vector of N environments (``gym.make_vec``)
play a fixed number of steps with a fixed attack budget (the attacker's action is fixed to its
first strategy at the first budget level; the defender plays no defense) so rows are comparable.
Each configuration runs in its own spawned process, so its peak resident memory is its own.
The cost split (defense / attack / scoring / FL round) comes from the game's phase timers and shows
where the next optimisation should go. Results go to a JSON file and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import time
from pathlib import Path

from leakgym.bench import device_label

DEFAULT_IDS = "LeakGym-Digits-v0,LeakGym-CIFAR-v0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", required=True, help="output JSON path (a .md table is written beside it)")
    parser.add_argument("--envs", default=DEFAULT_IDS, help=f"comma-separated Gymnasium ids (default: {DEFAULT_IDS})")
    parser.add_argument("--steps", type=int, default=16, help="environment steps per configuration (default: 16)")
    parser.add_argument("--num-envs", type=int, default=16, help="N of the vectorised configuration (default: 16)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")


def _measure(gym_id: str, num_envs: int, steps: int, device: str, queue) -> None:
    import gymnasium as gym
    import numpy as np

    import leakgym  # noqa: F401  (registers the ids)

    try:
        kwargs = {"device": device, "opponent": "none"}  # the defender plays no defense
        env = gym.make_vec(gym_id, num_envs=num_envs, **kwargs) if num_envs > 1 else gym.make(gym_id, **kwargs)
    except Exception as exc:  # noqa: BLE001 - dataset missing offline, etc.: recorded in the table, not hidden
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        queue.put({"env": gym_id, "num_envs": num_envs, "error": f"{type(exc).__name__}: {first_line}"})
        return
    games = [e.parallel.game for e in env.envs] if num_envs > 1 else [env.unwrapped.parallel.game]
    action = np.zeros(env.action_space.shape, dtype=np.int64)
    env.reset(seed=0)
    split = {"defense_s": 0.0, "attack_s": 0.0, "score_s": 0.0, "fl_s": 0.0}
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(action)
        if num_envs == 1 and (terminated or truncated):
            env.reset()  # the vector env resets its games itself
        for g in games:
            for k in split:
                split[k] += g.timings.get(k, 0.0)
    elapsed = time.perf_counter() - start
    env.close()
    total = sum(split.values()) or 1.0
    queue.put(
        {
            "env": gym_id,
            "num_envs": num_envs,
            "steps": steps,
            "env_steps_per_s": steps * num_envs / elapsed,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **{f"share_{k[:-2]}": v / total for k, v in split.items()},
            "device": device_label(device),
        }
    )


def run(ids: list[str], steps: int, num_envs: int, device: str) -> list[dict]:
    ctx = mp.get_context("spawn")
    rows = []
    for gym_id in ids:
        for n in (1, num_envs):
            queue = ctx.Queue()
            proc = ctx.Process(target=_measure, args=(gym_id, n, steps, device, queue))
            proc.start()
            try:
                rows.append(queue.get(timeout=3600))
            except Exception:  # noqa: BLE001 - the worker died without reporting (e.g. killed for memory)
                rows.append({"env": gym_id, "num_envs": n, "error": f"worker exited with code {proc.exitcode}"})
            proc.join()
    return rows


def to_markdown(rows: list[dict], machine: str) -> str:
    lines = [
        f"Environment throughput ({machine})",
        "",
        "| env | N | env steps/s | peak RSS (MB) | defense | attack | scoring | FL round |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['env']} | {r['num_envs']} | unavailable: {r['error'][:100]} | | | | | |")
            continue
        lines.append(
            f"| {r['env']} | {r['num_envs']} | {r['env_steps_per_s']:.2f} | {r['peak_rss_mb']:.0f} | "
            f"{r['share_defense']:.0%} | {r['share_attack']:.0%} | {r['share_score']:.0%} | {r['share_fl']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.num_envs < 1:
        raise ValueError(f"--steps={args.steps} and --num-envs={args.num_envs} must be >= 1")
    ids = [s.strip() for s in args.envs.split(",") if s.strip()]
    rows = run(ids, args.steps, args.num_envs, args.device)
    machine = f"{platform.processor() or platform.machine()}, {mp.cpu_count()} cores, device {device_label(args.device)}"
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    table = to_markdown(rows, machine)
    out.with_suffix(".md").write_text(table)
    print(table)
    return 0

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
import multiprocessing as mp
import platform
import resource
import time

from leakgym.bench import device_label, markdown_table, write_results

DEFAULT_IDS = "LeakGym-Digits-v0,LeakGym-CIFAR-v0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", required=True, help="output JSON path (a .md table is written beside it)")
    parser.add_argument("--envs", default=DEFAULT_IDS, help=f"comma-separated Gymnasium ids (default: {DEFAULT_IDS})")
    parser.add_argument("--steps", type=int, default=16, help="environment steps per configuration (default: 16)")
    parser.add_argument("--num-envs", type=int, default=16, help="N of the vectorised configuration (default: 16)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")


def _measure(gym_id: str, num_envs: int, steps: int, device: str, queue) -> None:
    try:
        queue.put(_measure_row(gym_id, num_envs, steps, device))
    except Exception as exc:  # noqa: BLE001 - dataset missing offline, a failed round, ...: recorded, not hidden
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        queue.put({"env": gym_id, "num_envs": num_envs, "error": f"{type(exc).__name__}: {first_line}"})


def _measure_row(gym_id: str, num_envs: int, steps: int, device: str) -> dict:
    import gymnasium as gym
    import numpy as np

    import leakgym  # noqa: F401  (registers the ids)

    kwargs = {"device": device, "opponent": "none"}  # the defender plays no defense
    env = gym.make_vec(gym_id, num_envs=num_envs, **kwargs) if num_envs > 1 else gym.make(gym_id, **kwargs)
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
    return {
        "env": gym_id,
        "num_envs": num_envs,
        "steps": steps,
        "env_steps_per_s": steps * num_envs / elapsed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **{f"share_{k[:-2]}": v / total for k, v in split.items()},
        "device": device_label(device),
    }


def run(ids: list[str], steps: int, num_envs: int, device: str) -> list[dict]:
    ctx = mp.get_context("spawn")
    rows = []
    for gym_id in ids:
        for n in (1, num_envs):
            queue = ctx.Queue()
            proc = ctx.Process(target=_measure, args=(gym_id, n, steps, device, queue))
            proc.start()
            row = None
            while row is None:
                try:
                    row = queue.get(timeout=5)
                except Exception:  # noqa: BLE001 - queue.Empty: is the worker still alive?
                    if not proc.is_alive() and queue.empty():  # died without reporting (e.g. killed for memory)
                        row = {"env": gym_id, "num_envs": n, "error": f"worker exited with code {proc.exitcode}"}
            rows.append(row)
            proc.join()
    return rows


def to_markdown(rows: list[dict], machine: str) -> str:
    return markdown_table(
        f"Environment throughput ({machine})",
        [("env", lambda r: r["env"]), ("N", lambda r: str(r["num_envs"])),
         ("env steps/s", lambda r: f"{r['env_steps_per_s']:.2f}"), ("peak RSS (MB)", lambda r: f"{r['peak_rss_mb']:.0f}"),
         ("defense", lambda r: f"{r['share_defense']:.0%}"), ("attack", lambda r: f"{r['share_attack']:.0%}"),
         ("scoring", lambda r: f"{r['share_score']:.0%}"), ("FL round", lambda r: f"{r['share_fl']:.0%}")],
        rows, key=["env", "num_envs"],
    )


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.num_envs < 1:
        raise ValueError(f"--steps={args.steps} and --num-envs={args.num_envs} must be >= 1")
    ids = [s.strip() for s in args.envs.split(",") if s.strip()]
    rows = run(ids, args.steps, args.num_envs, args.device)
    machine = f"{platform.processor() or platform.machine()}, {mp.cpu_count()} cores, device {device_label(args.device)}"
    write_results(args.json, machine, rows, to_markdown(rows, machine))
    return 0

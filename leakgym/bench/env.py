"""``leakgym bench env``: batched environment steps per second beside the sequential baseline.

For each environment id and each vector size N (``--num-envs 1,16,256,1024``), one spawned worker
process builds

* the **batched** vector env (``gym.make_vec``, N games, one :func:`~leakgym.game.round.play_round` per
  step with batched attacks and batched benign clients), and
* the **sequential baseline**: the same games (same seeds, same actions) as single-agent envs
  (``gym.make``) stepped one at a time, on ``min(N, --baseline-games)`` of them,

and steps them alternately (one baseline step of every baseline game, then one vector step), so both
see the same machine load, after ``--warmup-steps`` untimed steps of both (on CUDA the first step pays
lazy initialisation and kernel selection); every row carries the ratio of the two rates. ``--steps`` counts
timed vector steps that play a round: where the games' episodes end (``rounds`` fewer than the steps, e.g. the
``rounds=1`` override) the vector env's next step only resets them (Gymnasium's ``NEXT_STEP`` autoreset) and
plays none; such a step is timed too (the baseline's resets are, inside its steps) but not counted, and the
timing goes on until ``--steps`` steps have played a round (``vector_steps`` in the row: all the timed steps;
``rounds_played``: the rounds the rate counts). The baseline plays a round in every timed step. The
attacker's actions are ``fixed`` (the first strategy at the first budget level) or ``random`` (uniform
over the menu, drawn from a seeded generator, the same for both paths); the defender plays no defense, or
(``--defender random``) a uniformly random menu action every round, drawn from each game's seeded
opponent generator (the same in both paths) -- DCS², CENSOR, OASIS, noise and pruning in play. Rows report env
steps per second (vector steps x N / wall time), the peak resident memory of the worker process
(both paths), the peak device memory of each path on CUDA, and the cost split: the game's phase
timers (defense / attack / FL round / scoring / reward: the update summaries, rewards, records and
observations) and the rest of the wall time as Python overhead (planning, snapshots, the vector env's
bookkeeping; rows measured before the reward timer, 7b75bdd and earlier, count the reward phase there too).
Two more columns say how far the batched path is from its arithmetic floor (:mod:`leakgym.bench.arithmetic`):
the matrix-product and convolution GFLOP of one env step, counted in one more vector step after the timed ones
(untimed: every operator goes through Python while it counts), and ``floor/wall``, the share of the measured
time per env step that this arithmetic takes at the device's measured float32 GEMM rate (``gemm_gflops`` in
the JSON). Near 100%, only less arithmetic makes a row faster; far below, the time goes to elementwise work,
small badly shaped products and the host.

``--overrides KEY=VALUE ...`` changes the scenario of every game of both paths (named in each row):
``iterations=[1] num_clients=1 eval_size=16`` leaves little but the per-game host work, which is what
bounds a large N on a GPU.

A scenario whose dataset is not on disk is timed on synthetic images of the dataset's shape (uniform
noise, random labels) inside the worker only, and its row says ``synthetic data (timing only)``; the
environment itself never substitutes data. The synthetic training set has 600 images per client plus
1,200 unless ``--synthetic-images`` sets its size: every game holds a public split of ``public_fraction``
of it, which the attacks and defenses that read the public split process (CIFAR-10's real 50,000 images
give 5,000 public images a game; the row then names the size). Results go to ``--json`` and a markdown
table beside it, rewritten after every finished row; Ctrl-C stops the worker and keeps the finished rows
(exit status 130).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import resource
import signal
import time
from pathlib import Path

from leakgym.bench import (
    check_distinct,
    check_output,
    device_label,
    interrupted,
    machine_label,
    markdown_table,
    parse_counts,
    progress_bar,
    write_results,
)
from leakgym.bench.arithmetic import count_matrix_flops, gemm_rate
from leakgym.devices import device_argument, synchronize

DEFAULT_IDS = "LeakGym-Digits-v0,LeakGym-CIFAR-v0"
DEFAULT_NUM_ENVS = "1,16"
PHASES = ("defense", "attack", "fl", "score", "reward")
SYNTHETIC = "synthetic data (timing only)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="runs/bench/bench_env.json",
                        help="output JSON path, a .md table is written beside it (default: %(default)s; the "
                        "committed docs/results/bench_env.json is rewritten only when named here)")
    parser.add_argument("--envs", default=DEFAULT_IDS, help=f"comma-separated Gymnasium ids (default: {DEFAULT_IDS})")
    parser.add_argument("--steps", type=int, default=4,
                        help="timed vector steps that play a round, per configuration; a step that only resets "
                        "finished games (rounds=1: every other one) is timed too and not counted (default: 4)")
    parser.add_argument("--num-envs", default=DEFAULT_NUM_ENVS,
                        help=f"comma-separated vector sizes N, e.g. 1,16,256,1024 (default: {DEFAULT_NUM_ENVS})")
    parser.add_argument("--actions", choices=("fixed", "random"), default="random",
                        help="attacker actions: the first menu entry, or uniform over the menu (default: random)")
    parser.add_argument("--defender", choices=("none", "random"), default="none",
                        help="the defender: no defense, or a uniformly random menu action each round (default: none)")
    parser.add_argument("--warmup-steps", type=int, default=1,
                        help="untimed steps of both paths first (CUDA's lazy initialisation, kernel selection and the "
                             "allocator's first blocks are paid there, not in the rate; default: %(default)s)")
    parser.add_argument("--baseline-games", type=int, default=16,
                        help="games of the sequential baseline: min(N, this) (default: 16)")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device (default: cpu)")
    parser.add_argument("--batch-clients", choices=("on", "off"), default="on",
                        help="the vector env's batch_clients: victims' clean updates, benign clients, aggregation and "
                             "evaluation batched over games (default: on; on a CPU it pays off for small models "
                             "only, see docs/results/bench_env.md)")
    parser.add_argument("--cuda-graphs", choices=("on", "off"), default="on",
                        help="the attack engine's CUDA-graph replays of its iterations (leakgym.attacks.engine.replay), "
                             "both paths; off for an A/B in one run (default: on; no effect on a CPU)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads of the worker, both paths (default: 1: LeakGym's models are "
                             "tiny, and more threads than free cores make every small op wait)")
    parser.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="scenario overrides for every game of both paths, e.g. iterations=[1] num_clients=1 "
                             "(one attack iteration: the per-game host cost); named in each row")
    from leakgym.agents.experiments.cli_common import add_allow_large_argument

    add_allow_large_argument(parser)
    parser.add_argument("--synthetic-images", type=int, default=None, metavar="N",
                        help="training images of the synthetic set a scenario without its dataset on disk is timed "
                             "on (default: 600 per client + 1,200); the real size (e.g. 50000 for CIFAR-10) gives "
                             "every game a public split of the real size")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar (rows done / total)")


def check_synthetic_images(n: int, scenario) -> None:
    """``--synthetic-images`` must split like the scenario's dataset (:func:`leakgym.game.scenario.split_counts`):
    at least one public image and a private one per client and the victim; ValueError naming the bound."""
    from leakgym.game.scenario import split_counts

    public, private, fits = split_counts(scenario, n)
    if not fits:
        raise ValueError(f"--synthetic-images={n} gives scenario {scenario.name!r} {public} public and {private} "
                         f"private images; allowed: sizes N with floor(public_fraction * N) >= 1 (public_fraction="
                         f"{scenario.public_fraction}) and at least {scenario.num_clients + 1} private images "
                         f"({scenario.num_clients} clients and the victim)")


def parse_sizes(text: str) -> list[int]:
    """``"1,16,256"`` -> ``[1, 16, 256]``; ValueError naming ``--num-envs`` and the bad entry."""
    return parse_counts(text, "--num-envs", "1,16,256")


# --------------------------------------------------------------------------------------------------
# Worker (one spawned process per configuration)
# --------------------------------------------------------------------------------------------------
def _measure(gym_id: str, num_envs: int, steps: int, actions: str, baseline_games: int, device: str, threads: int,
             queue, batch_clients: bool = True, defender: str = "none", overrides: dict | None = None,
             warmup: int = 0, synthetic_images: int | None = None, cuda_graphs: bool = True) -> None:
    # Ctrl-C reaches the whole process group: the parent stops this worker, which prints no traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import torch

        from leakgym.attacks.engine import replay

        torch.set_num_threads(threads)
        replay.CUDA_GRAPHS = cuda_graphs  # (this worker's process only)
        row = _measure_row(gym_id, num_envs, steps, actions, baseline_games, device, batch_clients, defender,
                           overrides, warmup, synthetic_images)
        queue.put({**row, "threads": threads, "cuda_graphs": replay.CUDA_GRAPHS})  # (as the worker ran)
    except Exception as exc:  # noqa: BLE001 - a failed round, a bad id, ...: recorded, not hidden
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        queue.put({"env": gym_id, "num_envs": num_envs, "error": f"{type(exc).__name__}: {first_line}"})


def _use_synthetic_data_if_missing(gym_id: str, train_images: int | None = None) -> str:
    """``"real"``, or (dataset not on disk) make this worker's games use synthetic images of its shape:
    ``train_images`` training images (default: 600 per client + 1,200); returns the row's data label."""
    import gymnasium as gym
    import torch

    from leakgym.data import load_dataset
    from leakgym.data.catalog import dataset_spec
    from leakgym.data.loading import Dataset, DatasetUnavailableError
    from leakgym.game import batch as game_module
    from leakgym.game.scenario import load_scenario

    sc = load_scenario(gym.spec(gym_id).kwargs["scenario"])
    with contextlib.suppress(DatasetUnavailableError):
        load_dataset(sc.dataset, image_size=sc.image_size, download=False)
        return "real"
    spec = dataset_spec(sc.dataset, sc.image_size)
    g = torch.Generator().manual_seed(0)
    n_train, n_test = train_images or 600 * (sc.num_clients + 2), max(sc.eval_size, 100)

    def images(n: int):
        return torch.rand(n, *spec.shape, generator=g), torch.randint(0, spec.num_classes, (n,), generator=g)

    data = Dataset(spec, *images(n_train), *images(n_test))
    game_module._dataset = lambda name, image_size: data  # this worker process only
    return SYNTHETIC if train_images is None else f"{SYNTHETIC}, {n_train:,} training images"


class _GameView:
    """One parallel env's game as the measurement reads it: its round count and last round's phase timings."""

    def __init__(self, env) -> None:
        self.env = env

    @property
    def round(self) -> int:
        return self.env.round

    @property
    def timings(self) -> dict[str, float]:
        return self.env.games.timings[self.env.row]


def _measure_row(gym_id: str, num_envs: int, steps: int, actions: str, baseline_games: int, device: str,
                 batch_clients: bool = True, defender: str = "none", overrides: dict | None = None,
                 warmup: int = 0, synthetic_images: int | None = None) -> dict:
    import gymnasium as gym
    import numpy as np
    import torch

    import leakgym  # noqa: F401  (registers the ids)

    data = _use_synthetic_data_if_missing(gym_id, synthetic_images)
    cuda = torch.device(device).type == "cuda"
    # "none": no defense; "random": a random menu action per round
    kwargs = {"device": device, "opponent": defender, **(overrides or {})}
    vec = gym.make_vec(gym_id, num_envs=num_envs, **kwargs, batch_clients=batch_clients)
    m = min(num_envs, baseline_games)
    singles = [gym.make(gym_id, **kwargs) for _ in range(m)]
    nvec = np.asarray(vec.single_action_space.nvec)
    rng = np.random.default_rng(0)
    # At most 2 x steps timed steps (an autoreset step after each one that ends the episodes, rounds=1), and
    # two more: for the counted step after them, see below.
    plan = [rng.integers(0, nvec, size=(num_envs, len(nvec))) if actions == "random"
            else np.zeros((num_envs, len(nvec)), dtype=np.int64) for _ in range(warmup + 2 * steps + 2)]

    vec.reset(seed=0)  # game i: seed i, in the vector and in the baseline
    for i, env in enumerate(singles):
        env.reset(seed=i)
    vec_games = [_GameView(e.parallel) for e in vec.envs]
    seq_games = [_GameView(env.unwrapped.parallel) for env in singles]

    def zeroed():
        """Phase costs, wall times, device peaks (each per path) and the vector env's rounds played (an
        autoreset step resets a finished game and plays none)."""
        per_path = ("batched", "sequential")
        return ({p: dict.fromkeys(PHASES, 0.0) for p in per_path}, dict.fromkeys(per_path, 0.0),
                dict.fromkeys(per_path, 0.0), 0)

    cost, wall, device_peak, played = zeroed()

    def add_timings(games, path):
        for g in games:
            for k in PHASES:
                cost[path][k] += g.timings.get(f"{k}_s", 0.0)

    # The timed steps: until `steps` of them have played a round. An autoreset step (every game's episode had
    # ended: it resets them and plays none) is timed too, as the baseline's resets are, but does not count
    # (found in an audit: with rounds=1 and one warm-up step the only timed step was one, a row of zeros).
    t, timed, rounds_steps = 0, 0, 0
    while t < warmup or (rounds_steps < steps and timed < 2 * steps):
        if t == warmup:  # the warm-up steps (same plan in both paths) are not timed
            cost, wall, device_peak, played = zeroed()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        synchronize(device)
        t0 = time.perf_counter()
        for i, env in enumerate(singles):
            _, _, terminated, truncated, _ = env.step(plan[t][i])
            add_timings([seq_games[i]], "sequential")
            if terminated or truncated:
                env.reset()
        synchronize(device)
        wall["sequential"] += time.perf_counter() - t0
        if cuda:
            device_peak["sequential"] = max(device_peak["sequential"], torch.cuda.max_memory_allocated(device) / 2**20)
            torch.cuda.reset_peak_memory_stats(device)
        before = [g.round for g in vec_games]
        t0 = time.perf_counter()
        vec.step(plan[t])  # the vector env resets finished games itself (that step plays no round for them)
        synchronize(device)
        wall["batched"] += time.perf_counter() - t0
        stepped = [g for g, r in zip(vec_games, before) if g.round == r + 1]  # the games that played a round
        played += len(stepped)
        add_timings(stepped, "batched")
        if cuda:
            device_peak["batched"] = max(device_peak["batched"], torch.cuda.max_memory_allocated(device) / 2**20)
        if t >= warmup:
            timed += 1
            rounds_steps += bool(stepped)
        t += 1
    # The arithmetic floor: one more vector step, untimed, with its matrix products counted (every operator
    # goes through Python while it counts), over this device's GEMM rate; a second one where the first only
    # reset finished games.
    flop_per_env_step = None
    for action in plan[t:t + 2]:
        before = [g.round for g in vec_games]
        with count_matrix_flops() as flops:
            vec.step(action)
        counted = sum(g.round == r + 1 for g, r in zip(vec_games, before))
        if counted:
            flop_per_env_step = flops.total / counted
            break
    rate_gemm = gemm_rate(device)
    vec.close()
    for env in singles:
        env.close()

    def split(path):
        phases = dict(cost[path])
        phases["overhead"] = max(wall[path] - sum(phases.values()), 0.0)
        total = sum(phases.values()) or 1.0
        return {k: v / total for k, v in phases.items()}

    rate = played / wall["batched"]
    baseline = timed * m / wall["sequential"]  # (the baseline plays a round every step, resetting in it)
    shares = split("batched")
    return {
        "env": gym_id,
        "num_envs": num_envs,
        "actions": actions,
        "batch_clients": batch_clients,
        "defender": defender,
        "overrides": dict(overrides or {}),
        "steps": steps,
        "warmup_steps": warmup,
        "vector_steps": timed,  # the timed vector steps: steps, and the autoreset steps between them
        "rounds_played": played,  # the rate's numerator (steps x N: the autoreset steps play none)
        "data": data,
        "env_steps_per_s": rate,
        "baseline_games": m,
        "baseline_env_steps_per_s": baseline,
        "speedup": rate / baseline,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_device_mb": device_peak["batched"] if cuda else None,
        "baseline_peak_device_mb": device_peak["sequential"] if cuda else None,
        **{f"share_{k}": v for k, v in shares.items()},
        # matrix-product GFLOP of one env step, the device's GEMM rate, and the share of the measured step
        # time that this arithmetic takes at that rate (leakgym.bench.arithmetic)
        "gflop_per_env_step": None if flop_per_env_step is None else flop_per_env_step / 1e9,
        "gemm_gflops": rate_gemm / 1e9,
        "floor_share": None if flop_per_env_step is None else flop_per_env_step / rate_gemm * rate,
        "baseline_split": split("sequential"),
        "seconds": {"batched": wall["batched"], "sequential": wall["sequential"],
                    "batched_phases": cost["batched"], "sequential_phases": cost["sequential"]},
        "device": device_label(device),
    }


def run(ids: list[str], steps: int, sizes: list[int], actions: str, baseline_games: int, device: str,
        threads: int = 1, batch_clients: bool = True, defender: str = "none",
        overrides: dict | None = None, warmup: int = 0, *, rows: list[dict] | None = None, on_row=None,
        progress: bool = False, synthetic_images: int | None = None, cuda_graphs: bool = True) -> list[dict]:
    """One spawned worker per (id, N); each finished row is appended to ``rows`` (returned) and passed to
    ``on_row(rows)``. On KeyboardInterrupt the running worker is stopped and the interrupt re-raised."""
    ctx = mp.get_context("spawn")
    rows = [] if rows is None else rows
    with progress_bar(len(ids) * len(sizes), "bench env", progress) as bar:
        for gym_id in ids:
            for n in sizes:
                bar.set_postfix_str(f"{gym_id} N={n}")
                queue = ctx.Queue()
                proc = ctx.Process(target=_measure, args=(gym_id, n, steps, actions, baseline_games, device, threads,
                                                          queue, batch_clients, defender, overrides, warmup,
                                                          synthetic_images, cuda_graphs))
                proc.start()
                row = None
                try:
                    while row is None:
                        try:
                            row = queue.get(timeout=5)
                        except Exception:  # noqa: BLE001 - queue.Empty: is the worker still alive?
                            if not proc.is_alive() and queue.empty():  # died without reporting (e.g. out of memory)
                                row = {"env": gym_id, "num_envs": n, "error": f"worker exited with code {proc.exitcode}"}
                except KeyboardInterrupt:
                    proc.terminate()
                    proc.join()
                    raise
                rows.append(row)
                if on_row is not None:  # saved before the worker's exit is awaited (a second or more)
                    on_row(rows)
                try:
                    proc.join()
                except KeyboardInterrupt:
                    proc.terminate()
                    proc.join()
                    raise
                bar.update()
    return rows


def to_markdown(rows: list[dict], machine: str) -> str:
    def mb(value):
        return "-" if value is None else f"{value:.0f}"

    return markdown_table(
        f"Environment throughput, batched vector env vs sequential single-agent envs ({machine})",
        [("env", lambda r: r["env"] + ("" if r["data"] == "real" else f" ({r['data']})")
          + ("" if r.get("batch_clients", True) else ", batch_clients off")
          + ("" if r.get("cuda_graphs", True) else ", CUDA graphs off")
          + ("" if r.get("defender", "none") == "none" else f", {r['defender']} defender")
          + "".join(f", {k}={v}" for k, v in r.get("overrides", {}).items())),
         ("N", lambda r: str(r["num_envs"])), ("actions", lambda r: r["actions"]),
         ("env steps/s", lambda r: f"{r['env_steps_per_s']:.2f}"),
         ("sequential steps/s (games)", lambda r: f"{r['baseline_env_steps_per_s']:.2f} ({r['baseline_games']})"),
         ("ratio", lambda r: f"{r['speedup']:.2f}x"),
         ("peak RSS (MB)", lambda r: mb(r["peak_rss_mb"])), ("peak device (MB)", lambda r: mb(r["peak_device_mb"])),
         ("defense", lambda r: f"{r['share_defense']:.0%}"), ("attack", lambda r: f"{r['share_attack']:.0%}"),
         ("FL round", lambda r: f"{r['share_fl']:.0%}"), ("scoring", lambda r: f"{r['share_score']:.0%}"),
         ("reward", lambda r: f"{r.get('share_reward'):.0%}"),  # (markdown_table: "-" where a row lacks it)
         ("Python overhead", lambda r: f"{r['share_overhead']:.0%}"),
         ("GFLOP/env step", lambda r: f"{r.get('gflop_per_env_step'):.3g}"),
         ("floor/wall", lambda r: f"{r.get('floor_share'):.0%}")],
        rows, key=["env", "num_envs"],
    )


def parse_ids(text: str) -> list[str]:
    """``"LeakGym-Digits-v0,cifar"`` -> Gymnasium ids (ids or scenario names, as ``leakgym eval --env``);
    ValueError naming ``--envs`` and the bad entry, an empty list, or an environment named twice."""
    from leakgym.agents.experiments.cli_common import resolve_env

    names = [s.strip() for s in str(text).split(",") if s.strip()]
    if not names:
        raise ValueError(f"--envs={text!r} names no environment; allowed: comma-separated Gymnasium ids or "
                         f"scenario names, e.g. {DEFAULT_IDS}")
    ids = []
    for name in names:
        try:
            ids.append(resolve_env(name)[0])
        except ValueError as exc:
            raise ValueError(f"--envs entry {name!r}: {exc}") from None
    # (an id and its scenario name are the same environment: "digits,LeakGym-Digits-v0" measured it twice)
    check_distinct(ids, "--envs", text, lambda gym_id: " = ".join(repr(n) for n, i in zip(names, ids) if i == gym_id))
    return ids


def main(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.num_envs)
    for flag, value in (("--steps", args.steps), ("--baseline-games", args.baseline_games),
                        ("--threads", args.threads)):
        if value < 1:
            raise ValueError(f"{flag}={value}; allowed: integers >= 1")
    if args.warmup_steps < 0:
        raise ValueError(f"--warmup-steps={args.warmup_steps}; allowed: integers >= 0")
    import gymnasium as gym

    import leakgym  # noqa: F401  (registers the ids)
    from leakgym.agents.experiments.cli_common import scenario_overrides
    from leakgym.game.scenario import load_scenario

    ids = parse_ids(args.envs)
    overrides = scenario_overrides(args)
    synthetic = getattr(args, "synthetic_images", None)
    for gym_id in ids:  # a bad id, override or synthetic size fails here, before any worker starts
        sc = load_scenario(gym.spec(gym_id).kwargs["scenario"], **overrides)
        if synthetic is not None:
            check_synthetic_images(synthetic, sc)
    out = check_output(args.json)
    machine = machine_label(args.threads, args.device)

    def save(rows: list[dict], echo: bool = False) -> None:
        write_results(out, machine, rows, to_markdown(rows, machine), echo=echo)

    rows: list[dict] = []
    try:
        run(ids, args.steps, sizes, args.actions, args.baseline_games, args.device, args.threads,
            args.batch_clients == "on", args.defender, overrides, args.warmup_steps, rows=rows, on_row=save,
            progress=not getattr(args, "no_progress", False), synthetic_images=synthetic,
            cuda_graphs=getattr(args, "cuda_graphs", "on") == "on")
    except KeyboardInterrupt:
        return interrupted(len(rows), len(ids) * len(sizes), out, Path(out).with_suffix(".md"), save=lambda: save(rows))
    save(rows, echo=True)
    return 0

"""The ``leakgym`` command line.

    leakgym list                      datasets, models, attacks, defenses, environments, agents
    leakgym demo                      a small attacker x defender tournament on LeakGym-Digits-v0
    leakgym eval ...                  play every attacker against every defender, write payoff files
    leakgym train ...                 train a learned attacker or defender with Stable-Baselines3
    leakgym selfplay ...              alternating best responses
    leakgym reproduce dcs2|ppp|oasis|censor|loda|all   re-run each paper's main table (docs/results/)
    leakgym bench attacks|defenses|env --json PATH
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with add_arguments(parser) and main(args), one-line help)
COMMANDS = {
    "eval": ("leakgym.agents.evaluation", "play attackers against defenders and write payoff tables"),
    "train": ("leakgym.agents.training", "train a learned agent with Stable-Baselines3"),
    "selfplay": ("leakgym.agents.selfplay", "alternating best responses between learned agents"),
    "reproduce": ("leakgym.reproduce", "scaled-down re-runs of each paper's main table"),
}
BENCHMARKS = {
    "attacks": ("leakgym.bench.attacks", "batched attack engine vs a sequential loop"),
    "defenses": ("leakgym.bench.defenses", "accuracy, leakage and overhead of each defense"),
    "env": ("leakgym.bench.env", "environment steps per second and the cost split"),
}

DEMO_ATTACKERS = "random,ig-paper,prior-init-dcs2"
DEMO_DEFENDERS = "none,noise-0.1,prune-0.9,dcs2-paper"


def _list(_: argparse.Namespace) -> int:
    from leakgym.agents import agent_names
    from leakgym.attacks import ATTACKS
    from leakgym.data import DATASET_NAMES
    from leakgym.defenses import PIPELINE_ORDER
    from leakgym.envs import registered_ids
    from leakgym.models import MODEL_NAMES

    print("datasets:     " + ", ".join(DATASET_NAMES))
    print("models:       " + ", ".join(MODEL_NAMES) + " (each optionally with a PRECODE bottleneck)")
    print("attacks:      " + ", ".join(sorted(ATTACKS)))
    print("defenses:     " + ", ".join(PIPELINE_ORDER) + " (pipeline order)")
    print("environments: " + ", ".join(f"{gid} ({name})" for gid, name in sorted(registered_ids().items())))
    print("agents:       " + ", ".join(agent_names()))
    return 0


def _demo(args: argparse.Namespace) -> int:
    evaluation = importlib.import_module("leakgym.agents.evaluation")
    parser = argparse.ArgumentParser()
    evaluation.add_arguments(parser)
    eval_args = parser.parse_args(
        [
            "--env", "LeakGym-Digits-v0",
            "--attackers", DEMO_ATTACKERS,
            "--defenders", DEMO_DEFENDERS,
            "--episodes", str(args.episodes),
            "--out", args.out,
            "--overrides", f"rounds={args.rounds}",
        ]
    )  # fmt: skip
    return evaluation.main(eval_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leakgym", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list datasets, models, attacks, defenses, environments").set_defaults(func=_list)
    demo = sub.add_parser("demo", help="small tournament on LeakGym-Digits-v0 (writes payoff + gallery)")
    demo.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    demo.add_argument("--episodes", type=int, default=2, help="episodes per pair (default: 2)")
    demo.add_argument("--rounds", type=int, default=4, help="FL rounds per episode (default: 4)")
    demo.set_defaults(func=_demo)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=importlib.import_module(module).main)
    bench = sub.add_parser("bench", help="benchmarks (results written to a JSON file and a markdown table)")
    bench_sub = bench.add_subparsers(dest="benchmark", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        p = bench_sub.add_parser(name, help=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=importlib.import_module(module).main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

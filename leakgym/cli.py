"""The ``leakgym`` command line.

    leakgym list [presets [--env ID]] datasets, models, attacks, defenses, environments, agents; or presets
    leakgym describe ENV              observation layout and action dimensions of an environment (both roles)
    leakgym demo                      a small attacker x defender tournament on LeakGym-Digits-v0
    leakgym eval ...                  play every attacker against every defender, write payoff files
    leakgym train ...                 train a learned attacker or defender with Stable-Baselines3
    leakgym selfplay ...              alternating best responses
    leakgym reproduce dcs2|ppp|oasis|censor|loda|all [--resume|--rerender]   re-run each paper's main table (docs/results/)
    leakgym bench attacks|defenses|env|eval --json PATH
"""

from __future__ import annotations

import argparse
import importlib
import sys

from leakgym.suggest import did_you_mean

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
    "eval": ("leakgym.bench.eval", "leakgym eval with games in lockstep vs one game at a time"),
}

DEMO_ATTACKERS = "random,ig-paper,prior-init-dcs2"
DEMO_DEFENDERS = "none,noise-0.1,prune-0.9,dcs2-paper"


def _list(args: argparse.Namespace) -> int:
    from leakgym.agents import agent_names
    from leakgym.attacks import ATTACKS
    from leakgym.data import DATASET_NAMES
    from leakgym.defenses import PIPELINE_ORDER
    from leakgym.envs import registered_ids
    from leakgym.models import MODEL_NAMES

    if args.topic == "presets":
        return _list_presets(args.env)
    if args.env is not None:
        raise ValueError("--env goes with `leakgym list presets`")

    print("datasets:     " + ", ".join(DATASET_NAMES))
    print("models:       " + ", ".join(MODEL_NAMES) + " (each optionally with a PRECODE bottleneck)")
    print("attacks:      " + ", ".join(sorted(ATTACKS)))
    print("defenses:     " + ", ".join(PIPELINE_ORDER) + " (pipeline order)")
    print("environments: " + ", ".join(f"{gid} ({name})" for gid, name in sorted(registered_ids().items())))
    print("agents:       " + ", ".join(agent_names()))
    return 0


def _list_presets(env: str | None) -> int:
    """Every preset: role, settings, source paper, and whether ``env`` (if given) allows it."""
    from leakgym.agents.presets import PRESETS, preset_action
    from leakgym.envs.describe import describe
    from leakgym.envs.scenario import load_scenario

    scenario = load_scenario(describe(env)["scenario"]) if env is not None else None
    for role in ("defender", "attacker"):
        print(f"{role} presets" + (f" (allowed in {env}?)" if env else "") + ":")
        for name, p in PRESETS.items():
            if p.role != role:
                continue
            allowed = ""
            if scenario is not None:
                try:
                    preset_action(name, scenario, role)
                    allowed = "yes  "
                except ValueError as exc:
                    allowed = f"no ({str(exc).split(': ', 1)[-1][:70]})  "
            settings = ", ".join(f"{k}={v}" for k, v in p.settings.items()) or "no defense"
            print(f"  {name:<22} {allowed}{settings}  [{p.source}]")
    return 0


def _describe(args: argparse.Namespace) -> int:
    from leakgym.envs.describe import describe, format_description

    if args.write_docs:
        from leakgym.docgen import write_env_pages

        for path in write_env_pages(args.write_docs):
            print(path)
        return 0
    if args.env is None:
        raise ValueError("describe needs an environment id (e.g. LeakGym-Digits-v0) or --write-docs FOLDER")
    print(format_description(describe(args.env)))
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


class Parser(argparse.ArgumentParser):
    """``argparse`` with one-line errors: a mistyped choice gets a suggestion, and no usage block is printed.

    ``leakgym train --algo pp0`` -> ``leakgym train: error: argument --algo: invalid choice: 'pp0' (did you
    mean 'ppo'?) ... (see leakgym train --help)``, exit status 2 as argparse's own.
    """

    def _check_value(self, action: argparse.Action, value) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            hint = did_you_mean(value, [str(c) for c in action.choices or ()])
            if not hint or "did you mean" in exc.message:
                raise
            raise argparse.ArgumentError(action, exc.message.replace(f"{value!r}", f"{value!r}{hint}", 1)) from None

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.nargs == 0:  # a flag: say what it is when not given
            return text + (" (default: off)" if action.default in (False, None) else " (default: on)")
        return text + " (default: %(default)s)"


class LazyParser(Parser):
    """A subcommand's parser whose arguments come from ``module.add_arguments`` when it is first used.

    ``leakgym --help`` lists the subcommands without importing them (the heavy ones pull in torch); the
    module is imported, and its arguments added, only when this subcommand is parsed or its help printed.
    The module's ``main(args)`` becomes the ``func`` default.
    """

    def __init__(self, *args, module: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self._module = module

    def load(self) -> argparse.ArgumentParser:
        if self._module is not None:
            module, self._module = importlib.import_module(self._module), None
            module.add_arguments(self)
            self.set_defaults(func=module.main)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.load()
        return super().format_help()

    def format_usage(self) -> str:
        self.load()
        return super().format_usage()


def _add_lazy(sub, commands: dict[str, tuple[str, str]]) -> None:
    for name, (module, help_text) in commands.items():
        sub.add_parser(name, help=help_text, description=help_text, module=module)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; a subcommand's module is imported only when that subcommand is parsed."""
    parser = Parser(prog="leakgym", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=LazyParser)
    lst = sub.add_parser("list", help="list datasets, models, attacks, defenses, environments; or presets")
    lst.add_argument("topic", nargs="?", choices=["presets"], help="presets: role, settings, source, allowed")
    lst.add_argument("--env", default=None,
                     help="with presets: say which presets this environment allows (default: none)")
    lst.set_defaults(func=_list)
    desc = sub.add_parser("describe", help="observation layout and action dimensions of an environment")
    desc.add_argument("env", nargs="?", help="Gymnasium id or scenario name (e.g. LeakGym-Digits-v0)")
    desc.add_argument("--write-docs", default=None, metavar="FOLDER",
                      help="write the markdown page (and, for offline data, a rendered frame) of every "
                      "environment and an index into FOLDER, e.g. docs/envs (default: print ENV's description)")
    desc.set_defaults(func=_describe)
    demo = sub.add_parser("demo", help="small tournament on LeakGym-Digits-v0 (writes payoff + gallery)")
    demo.add_argument("--out", default="runs/demo", help="output folder")
    demo.add_argument("--episodes", type=int, default=2, help="episodes per pair")
    demo.add_argument("--rounds", type=int, default=4, help="FL rounds per episode")
    demo.set_defaults(func=_demo)
    _add_lazy(sub, COMMANDS)
    bench = sub.add_parser("bench", help="benchmarks (results written to a JSON file and a markdown table)")
    _add_lazy(bench.add_subparsers(dest="benchmark", required=True, parser_class=LazyParser), BENCHMARKS)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """What the CLI reports as a user error: its whole message, exit status 2, no traceback.

    OSError: an --out that is a file, ...; MemoryError: a setting too large to allocate, e.g. DQN's
    buffer_size=10**11, refused before an earlier run's files are touched; a missing dataset. The dataset
    error's module imports torch, so it is looked up only once something has imported it (nothing else can
    have raised it): ``leakgym --help`` stays free of torch.
    """
    loading = sys.modules.get("leakgym.data.loading")
    missing_data = (loading.DatasetUnavailableError,) if loading is not None else ()
    return (ValueError, OSError, MemoryError, *missing_data)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        # the whole message: a missing dataset's says where it looked and how to provide the files
        message = str(exc) or type(exc).__name__
        if isinstance(exc, MemoryError):
            message = f"not enough memory: {message}"
        print(f"leakgym: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Commands that save their progress on Ctrl-C say what they kept and return 130 themselves; an
        # interrupt anywhere else (building the games, loading data) ends the same way, without a traceback.
        print(f"leakgym {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

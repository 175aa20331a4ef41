"""The ``leakgym`` command line.

    leakgym list [presets [--env ID]] datasets, models, attacks, defenses, environments, agents; or presets
    leakgym describe ENV              observation layout and action dimensions of an environment (both roles)
    leakgym demo                      a small attacker x defender tournament on LeakGym-Digits-v0
    leakgym eval ...                  play every attacker against every defender, write payoff files
    leakgym train ...                 train a learned attacker or defender with Stable-Baselines3
    leakgym selfplay ...              alternating best responses
    leakgym metagame ...              PSRO: populations of attackers and defenders, equilibria, exploitability
    leakgym reproduce dcs2|ppp|oasis|censor|loda|all [--resume|--rerender]   re-run each paper's main table (docs/results/)
    leakgym bench attacks|defenses|env|eval|trace|operators --json PATH
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from leakgym.files import folder_argument
from leakgym.suggest import did_you_mean

# subcommand -> (module with add_arguments(parser) and main(args), one-line help)
COMMANDS = {
    "eval": ("leakgym.agents.experiments.evaluation.cli", "play attackers against defenders and write payoff tables"),
    "train": ("leakgym.agents.experiments.training.cli", "train a learned agent with Stable-Baselines3"),
    "selfplay": ("leakgym.agents.experiments.selfplay", "alternating best responses between learned agents"),
    "reproduce": ("leakgym.reproduce", "scaled-down re-runs of each paper's main table"),
    "metagame": ("leakgym.agents.experiments.metagame.cli", "PSRO: populations, mixed equilibria and exploitability"),
}
BENCHMARKS = {
    "attacks": ("leakgym.bench.attacks", "batched attack engine vs a sequential loop"),
    "defenses": ("leakgym.bench.defenses", "accuracy, leakage and overhead of each defense"),
    "env": ("leakgym.bench.env", "environment steps per second and the cost split"),
    "eval": ("leakgym.bench.eval", "leakgym eval with games in lockstep vs one game at a time"),
    "trace": ("leakgym.bench.trace", "the project files one round enters (docs/architecture.md)"),
    "operators": ("leakgym.bench.operators", "the tensor operators one vector step dispatches, by phase"),
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

    print("datasets:     " + ", ".join(DATASET_NAMES) + "; or a path: an image folder (one sub-folder per "
          "class) or an .npz (images, labels)")
    print("models:       " + ", ".join(MODEL_NAMES) + " (each optionally with a PRECODE bottleneck)")
    print("attacks:      " + ", ".join(sorted(ATTACKS)))
    print("defenses:     " + ", ".join(PIPELINE_ORDER) + " (pipeline order)")
    print("environments: " + ", ".join(f"{gid} ({name})" for gid, name in sorted(registered_ids().items())))
    print("agents:       " + ", ".join(agent_names()))
    return 0


def _list_presets(env: str | None) -> int:
    """Every preset: role, settings, source paper, and whether ``env`` (if given) allows it."""
    from leakgym.agents.policies.presets import PRESETS, preset_action
    from leakgym.envs.describe import describe
    from leakgym.game.scenario import load_scenario

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
                except ValueError as exc:  # (the reason: what follows "in scenario 'NAME': ")
                    reason = str(exc).split(f"in scenario {scenario.name!r}: ", 1)[-1]
                    allowed = f"no ({reason if len(reason) <= 90 else reason[:87] + '...'})  "
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
    from leakgym.agents.experiments.cli_common import parse_overrides

    print(format_description(describe(args.env, parse_overrides(args.overrides))))
    return 0


def _demo(args: argparse.Namespace) -> int:
    evaluation = importlib.import_module("leakgym.agents.experiments.evaluation.cli")
    parser = argparse.ArgumentParser()
    evaluation.add_arguments(parser)
    eval_args = parser.parse_args(
        [
            "--env", "LeakGym-Digits-v0",
            "--attackers", DEMO_ATTACKERS,
            "--defenders", DEMO_DEFENDERS,
            "--episodes", str(args.episodes),
            "--out", str(args.out),
            "--overrides", f"rounds={args.rounds}",
        ] + (["--resume"] if args.resume else [])
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
    desc.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                      help="scenario overrides, e.g. dataset=path/to/folder image_size=32 (the dataset line "
                           "shows its channels, classes and statistics; default: none)")
    desc.set_defaults(func=_describe)
    demo = sub.add_parser("demo", help="small tournament on LeakGym-Digits-v0 (writes payoff + gallery)")
    demo.add_argument("--out", default="runs/demo", type=folder_argument, help="output folder")
    demo.add_argument("--episodes", type=int, default=2, help="episodes per pair")
    demo.add_argument("--rounds", type=int, default=4, help="FL rounds per episode")
    demo.add_argument("--resume", action="store_true",
                      help="continue an interrupted demo in --out (the pairs it finished are not played again)")
    demo.set_defaults(func=_demo)
    _add_lazy(sub, COMMANDS)
    bench = sub.add_parser("bench", help="benchmarks (results written to a JSON file and a markdown table)")
    _add_lazy(bench.add_subparsers(dest="benchmark", required=True, parser_class=LazyParser), BENCHMARKS)
    return parser


def run_folder(args: argparse.Namespace) -> Path | None:
    """The folder a command writes its run into, held by one writer at a time (:func:`leakgym.files.run_folder_lock`):
    ``--out`` (eval, train, selfplay, reproduce, demo and any command with ``--out``), or for ``bench`` the
    folder of ``--json``; None for commands that write no run (list, describe)."""
    if getattr(args, "command", None) == "bench":
        return Path(args.json).parent
    out = getattr(args, "out", None)
    return None if out is None or args.command in ("list", "describe") else Path(out)


def _folder_flag(args: argparse.Namespace) -> tuple[str, object]:
    """The flag that names the run folder (:func:`run_folder`) and its value: ``("--json", path)`` for bench."""
    return ("--json", args.json) if getattr(args, "command", None) == "bench" else ("--out", args.out)


def check_run_folder(folder: Path, flag: str, value: object) -> bool:
    """Whether the run-folder lock can be taken in ``folder``: False where a file is in its path (the command
    then writes nothing and says so in its own words, e.g. bench's "--json=... is a file"); else make
    ``folder`` and a file in it (:func:`leakgym.files.writable_folder`), remove what was made (the lock makes
    it again, and removes it where the command writes nothing) and return True, or raise ValueError naming
    ``flag``.
    The lock made the folder before the command's own checks, so a folder that cannot be made or written
    was a bare ``[Errno 2] No such file or directory: '/proc/x'`` or a lock-file message naming no flag
    (found in an audit)."""
    from leakgym.files import remove_made, writable_folder

    try:
        at = folder
        while not at.exists() and at.parent != at:  # (exists() raises for a name too long)
            if at.is_symlink():  # (found in a review: "cannot write there (File exists)")
                raise ValueError(f"{flag}={str(value)!r}: {str(at)!r} is a broken link; allowed: a folder you can "
                                 "create and write")
            at = at.parent
        if not at.is_dir():
            return False
        remove_made(writable_folder(folder))
    except OSError as exc:
        what = "a path in a folder" if flag == "--json" else "a folder"
        raise ValueError(f"{flag}={str(value)!r}: cannot write there ({exc.strerror or exc}); allowed: {what} you "
                         "can create and write") from None
    return True


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``args.func(args)``, holding its run folder (:func:`run_folder`) for the whole command."""
    from leakgym.files import command_line, run_folder_lock

    folder = run_folder(args)
    if folder is None or not check_run_folder(folder, *_folder_flag(args)):
        return int(args.func(args) or 0)
    with run_folder_lock(folder, command_line(argv)):
        return int(args.func(args) or 0)


#: what torch's allocators say when an allocation fails (CPU: "DefaultCPUAllocator: can't allocate memory" or
#: "not enough memory"; CUDA: torch.OutOfMemoryError, "CUDA out of memory"; MPS: "MPS backend out of memory")
_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "out of memory", "failed to allocate")


def allocation_failure(exc: BaseException) -> BaseException | None:
    """The allocation failure behind ``exc`` (itself or a cause, e.g. the :class:`~leakgym.game.round.RoundError`
    of a round that ran out of memory): a ``MemoryError`` or torch's out-of-memory ``RuntimeError`` (CPU or
    CUDA); None when ``exc`` is not one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            return exc
        oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
        if oom is not None and isinstance(exc, oom):
            return exc
        if isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _OUT_OF_MEMORY):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def memory_message(failure: BaseException, args: argparse.Namespace) -> str:
    """One line for an allocation failure: what failed, this run's estimate of a round's memory when the
    command plays a scenario, and the knobs that lower it."""
    first = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
    estimate = ""
    if hasattr(args, "env") and hasattr(args, "overrides"):
        try:
            from leakgym.agents.experiments.cli_common import resolve_env, scenario_overrides
            from leakgym.game.scenario import MEMORY_LIMIT_BYTES, estimated_round_bytes, load_scenario

            scenario = load_scenario(resolve_env(args.env)[1], **scenario_overrides(args))
            estimate = (f"; LeakGym estimates one round of this scenario at {estimated_round_bytes(scenario) / 2**30:.2f} GiB "
                        f"per game (limit {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB"
                        + (", lifted by --allow-large" if scenario.allow_large else "") + ")")
        except Exception:  # noqa: BLE001 - the estimate is a hint; the failure is what is reported
            estimate = ""
    return (f"not enough memory: {first}{estimate}; lower batch_size, restarts, image_size or num_clients "
            "(--overrides), or play fewer games at once (--lockstep, --n-envs)")


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
    """Run the command line; user errors (:func:`_user_errors`) and allocation failures (a MemoryError or
    torch's out-of-memory RuntimeError, CPU or CUDA, also as the cause of a RoundError: one line with the
    run's memory estimate and the knobs that lower it, :func:`memory_message`) print one line and exit 2."""
    try:
        # (parsing imports the subcommand's module, torch among them: seconds in which a Ctrl-C printed a
        # traceback through importlib; found in an audit)
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
        print(f"leakgym{' ' + words[0] if words else ''}: interrupted", file=sys.stderr)
        return 130
    try:
        return _run(args, argv)
    except Exception as exc:
        failure = allocation_failure(exc)
        if failure is not None:
            message = memory_message(failure, args)
        elif isinstance(exc, _user_errors()):
            # the whole message: a missing dataset's says where it looked and how to provide the files
            message = str(exc) or type(exc).__name__
        else:
            raise
        print(f"leakgym: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Commands that save their progress on Ctrl-C say what they kept and return 130 themselves; an
        # interrupt anywhere else (building the games, loading data) ends the same way, without a traceback.
        print(f"leakgym {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

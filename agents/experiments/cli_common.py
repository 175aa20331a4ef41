"""Argument helpers shared by ``leakgym train``, ``leakgym selfplay`` and ``leakgym eval``."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from leakgym.suggest import did_you_mean

#: exit status of ``leakgym eval`` / ``train`` / ``selfplay`` after Ctrl-C (128 + SIGINT, as shells report it)
INTERRUPTED = 130


class OverrideLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-4`` as a number as YAML 1.2 (and TOML, and Python) do.

    PyYAML follows YAML 1.1, whose floats need a ``.`` in the mantissa: ``tv=[0,1e-4]`` gave the string
    ``'1e-4'`` inside a menu, which no menu coerces (a scalar field's string is converted), so the CLI
    refused what ``gym.make(..., tv=[0, 1e-4])`` takes."""


OverrideLoader.add_implicit_resolver(  # YAML 1.2's exponent forms (the core schema), beside YAML 1.1's floats
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_overrides(pairs: list[str] | None, what: str = "override") -> dict[str, Any]:
    """``["rounds=2", "iterations=[1,2]"]`` -> ``{"rounds": 2, "iterations": [1, 2]}``.

    Values are parsed as YAML scalars or flow sequences (numbers, booleans, lists, strings), a number in
    exponent form without a ``.`` (``1e-4``) as a number (:class:`OverrideLoader`). A key given twice is
    refused (found in an audit: ``rounds=1 rounds=2`` ran with the last one, silently).
    """
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {pair!r} must look like key=value (e.g. rounds=2 or iterations=[1,2])")
        if key.strip() in given:
            raise ValueError(f"{what} {pair!r}: {key.strip()} is already given ({given[key.strip()]!r}); allowed: "
                             "each key once")
        given[key.strip()] = pair
        if what == "override" and key.strip() == "allow_large":
            from leakgym.game.scenario import ALLOW_LARGE_FROM_CALLER

            raise ValueError(f"{what} {pair!r}: {ALLOW_LARGE_FROM_CALLER}")
        try:
            out[key.strip()] = yaml.load(text, Loader=OverrideLoader)  # (a SafeLoader: nothing is constructed)
        except yaml.YAMLError as exc:
            raise ValueError(f"{what} {pair!r}: cannot parse the value as YAML ({yaml_problem(exc)}); quote "
                             "a list or string, e.g. 'iterations=[1,2]'") from None
        except RecursionError:  # PyYAML composes nested sequences recursively
            raise ValueError(f"{what} {key.strip()}=...: the value nests deeper than the parser can read") from None
    return out


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parse error in one line: what is wrong and at which column (PyYAML's own text spans 5-8 lines)."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def split_hyperparams(tokens: list[str] | None) -> tuple[Path | None, dict[str, Any]]:
    """``["my.yml", "n_steps=16"]`` -> ``(Path("my.yml"), {"n_steps": 16})``.

    At most one token may be a hyperparameter file (a name ending in ``.yml`` or ``.yaml``, no
    ``=``); the others are ``KEY=VALUE`` overrides (see :func:`parse_overrides`).
    """
    files = [t for t in tokens or [] if "=" not in t and t.endswith((".yml", ".yaml"))]
    if len(files) > 1:
        raise ValueError(f"--hyperparams names {len(files)} files {files}; allowed: one .yml file")
    pairs = [t for t in tokens or [] if t not in files]
    return (Path(files[0]) if files else None), parse_overrides(pairs, "hyperparameter (or a .yml file)")


def add_hyperparams_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hyperparams",
        nargs="*",
        default=[],
        metavar="PATH.yml|KEY=VALUE",
        help="an rl-zoo hyperparameter file (default: agents/experiments/hyperparams/<algo>.yml) and/or "
        "overrides of its values, e.g. --hyperparams my.yml n_steps=16",
    )


def split_agent_list(text: str) -> list[str]:
    """Split a comma-separated agent list, keeping ``fixed:1,0,2`` together.

    A token made only of digits continues the preceding ``fixed:`` spec: ``"random,fixed:1,0,dlg-paper"``
    -> ``["random", "fixed:1,0", "dlg-paper"]``.
    """
    specs: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token.isdigit() and specs and specs[-1].startswith("fixed:"):
            specs[-1] += "," + token
        else:
            specs.append(token)
    if not specs:
        raise ValueError(f"agent list {text!r} is empty")
    return specs


def resolve_env(env: str) -> tuple[str, str]:
    """A Gymnasium id or a scenario name -> ``(gym_id, scenario_name)``."""
    from leakgym.envs.registration import registered_ids

    ids = registered_ids()
    if env in ids:
        return env, ids[env]
    by_name = {name: gym_id for gym_id, name in ids.items()}
    if env in by_name:
        return by_name[env], env
    raise ValueError(f"unknown environment {env!r}{did_you_mean(env, [*ids, *by_name])}; "
                     f"allowed ids: {sorted(ids)} (or scenario names {sorted(by_name)})")


def seed_argument(text: str) -> int:
    """``argparse`` type of ``--seed``: an integer >= 0 (what numpy's and Gymnasium's seeding accept)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; allowed: integers >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}; allowed: integers >= 0")
    return value


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env", default="LeakGym-Digits-v0", help="Gymnasium id (or scenario name), e.g. LeakGym-Digits-v0"
    )
    parser.add_argument(
        "--overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="scenario overrides, e.g. rounds=2 'iterations=[5,10]' (values parsed as YAML)",
    )
    add_allow_large_argument(parser)
    parser.add_argument("--seed", type=seed_argument, default=0, help="base random seed (>= 0)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: LeakGym's per-round models are tiny and extra threads "
        "mostly spin; 0 = torch's default)",
    )


def add_allow_large_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-large", action="store_true",
                        help="lift the scenario's documented limits and its 8 GiB memory estimate (the only way to: "
                        "scenario files and --overrides cannot)")


def scenario_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario overrides of a command: its ``--overrides`` (:func:`parse_overrides`, which refuses
    ``allow_large``), with ``allow_large=True`` when the command was given ``--allow-large``."""
    overrides = parse_overrides(args.overrides)
    if getattr(args, "allow_large", False):
        overrides["allow_large"] = True
    return overrides


def apply_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` unless ``threads`` is 0 (keep torch's default)."""
    if threads < 0:
        raise ValueError(f"threads={threads}; must be >= 0 (0 = torch's default)")
    if threads:
        import torch

        torch.set_num_threads(threads)


@contextlib.contextmanager
def readable_warnings() -> Iterator[None]:
    """Within the block, every warning is printed to stderr as one ``warning: <message>`` line."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield

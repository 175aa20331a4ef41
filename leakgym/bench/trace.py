"""``leakgym bench trace``: the project files one round enters, counted (``docs/architecture.md``).

Plays one round of the PettingZoo env (default: LeakGym-Digits-v0 with the defender's noise σ = 0.01 and
DCS² λ_g = 0.5 against Inverting Gradients with 20 iterations, the configuration issue 35 traced) under
:func:`sys.setprofile` and lists every file of the project (``leakgym/``, ``envs/``, ``agents/``) in which
a Python function ran, in order of first entry, with the number of times the round came back to a file
it had left. A warm-up round with other actions is played first (no defense; the attacker's action changed
in the first menu dimension that has a second value: :func:`warm_up_actions`), so one-time work (lazy
imports) is not counted, while the traced round still decodes its own actions; where the menus have no other
pair, the warm-up plays the traced one (the JSON's ``warm_up_is_traced_pair`` and the list say so).
Functions generated at run time (dataclass ``__init__``, ``<string>``) belong to no file and are not
counted. The result goes to ``--json`` and a markdown list beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from leakgym.bench import check_output, machine_label, write_results

#: the game/env layer: the views and the game itself
LAYER = ("envs", "leakgym/game")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="runs/bench/trace_round.json",
                        help="output JSON path, a .md list is written beside it (default: %(default)s)")
    parser.add_argument("--scenario", default="digits", help="scenario name (default: %(default)s)")
    parser.add_argument("--defender", default="1,0,1,0,0,0",
                        help="defender action, comma-separated (default: %(default)s = noise 0.01, DCS² 0.5 on digits)")
    parser.add_argument("--attacker", default="0,0,0,0",
                        help="attacker action, comma-separated (default: %(default)s = Inverting Gradients, 20 "
                             "iterations on digits)")


def project_roots() -> dict[str, Path]:
    """The project's source folders by their names in the repository (the installed packages' folders)."""
    import leakgym
    import leakgym.agents
    import leakgym.envs

    return {"leakgym": Path(leakgym.__file__).parent.resolve(), "envs": Path(leakgym.envs.__file__).parent.resolve(),
            "agents": Path(leakgym.agents.__file__).parent.resolve()}


def other_action(action, nvec):
    """``action`` with the first menu dimension that has a second value changed (to 1, or to 0 where it is
    already not 0), zeros elsewhere; None when every dimension has one value (a menu of one action)."""
    import numpy as np

    other = np.zeros_like(action)
    for i, n in enumerate(nvec):
        if n > 1:
            other[i] = 1 if action[i] == 0 else 0
            return other
    return None


def warm_up_actions(actions: dict, nvec: dict) -> dict:
    """The warm-up round's actions (lazy imports and caches): no defense, and the attacker's action changed
    in its first dimension with a second value (:func:`other_action`), so that the traced round still
    decodes its own pair (a batch decodes each pair once). An attacker menu of one action keeps it, and the
    defender's changes instead where "no defense" is the traced one; where neither can change, the warm-up
    plays the traced pair itself (found in an audit: the attacker's strategy was always changed, to 1 of a
    menu of one strategy, and the user's valid action was refused)."""
    import numpy as np

    defender = np.zeros_like(actions["defender"])
    attacker = other_action(actions["attacker"], nvec["attacker"])
    if attacker is None:
        attacker = actions["attacker"].copy()
        if np.array_equal(defender, actions["defender"]):
            changed = other_action(actions["defender"], nvec["defender"])
            defender = defender if changed is None else changed
    return {"defender": defender, "attacker": attacker}


def trace_round(scenario: str = "digits", defender: list[int] | None = None,
                attacker: list[int] | None = None, **overrides) -> dict:
    """Play a warm-up round, then trace one round; returns the files entered, in order, and the counts.
    ``overrides``: scenario overrides (a cheaper round for tests)."""
    import numpy as np

    from leakgym.envs import parallel_env

    env = parallel_env(scenario, **overrides)
    env.reset(seed=0)
    actions = {"defender": np.array(defender if defender is not None else [1, 0, 1, 0, 0, 0]),
               "attacker": np.array(attacker if attacker is not None else [0, 0, 0, 0])}
    warm = warm_up_actions(actions, {role: env.action_space(role).nvec for role in actions})
    env.step(warm)
    roots = {str(path): name for name, path in project_roots().items()}
    names: dict[str, str | None] = {}
    order: list[str] = []
    returns = 0
    current: list[str | None] = [None]

    def name_of(filename: str) -> str | None:
        if filename not in names:
            resolved, found = str(Path(filename).resolve()), None
            for root, name in roots.items():
                if resolved.startswith(root + "/"):
                    found = name + resolved[len(root):]
            names[filename] = found
        return names[filename]

    def profile(frame, event, _arg):
        nonlocal returns
        if event != "call":
            return
        name = name_of(frame.f_code.co_filename)
        if name is None or name == current[0]:
            return
        if name in order:
            returns += 1
        else:
            order.append(name)
        current[0] = name

    sys.setprofile(profile)
    try:
        env.step(actions)
    finally:
        sys.setprofile(None)
    layer = [f for f in order if f.startswith(LAYER)]
    return {"scenario": scenario, "defender_action": actions["defender"].tolist(),
            "attacker_action": actions["attacker"].tolist(), "warm_up_actions": {role: a.tolist() for role, a in warm.items()},
            "warm_up_is_traced_pair": all(np.array_equal(warm[role], actions[role]) for role in actions),
            "files": order, "file_count": len(order),
            "layer_files": layer, "layer_count": len(layer), "returns_to_a_file_left": returns}


def main(args: argparse.Namespace) -> int:
    out = check_output(args.json)
    try:
        defender = [int(v) for v in args.defender.split(",")]
        attacker = [int(v) for v in args.attacker.split(",")]
    except ValueError:
        print(f"leakgym bench trace: --defender {args.defender!r} / --attacker {args.attacker!r}; allowed: "
              "comma-separated integers (menu indices)", file=sys.stderr)
        return 2
    result = trace_round(args.scenario, defender, attacker)
    lines = [f"# One round of `{args.scenario}`: the project files it enters",
             "",
             (f"Defender action {result['defender_action']}, attacker action {result['attacker_action']} "
              f"(`leakgym bench trace`); {result['file_count']} project files, {result['layer_count']} of them in "
              f"the game/env layer (`envs/`, `leakgym/game/`); the round came back "
              f"{result['returns_to_a_file_left']} times to a file it had left."
              + (" The menus have no other pair of actions: the warm-up round played the traced one, whose "
                 "decoding is then not counted." if result["warm_up_is_traced_pair"] else "")),
             ""]
    lines += [f"{i}. `{f}`" + (" (game/env layer)" if f in result["layer_files"] else "")
              for i, f in enumerate(result["files"], 1)]
    import torch

    write_results(out, machine_label(torch.get_num_threads(), "cpu"), [result], "\n".join(lines) + "\n")
    return 0

"""What an environment is, generated from its scenario file: ``leakgym describe`` and ``docs/envs/``.

:func:`describe` returns the observation layout (index, name, range) and every action dimension with
its values for both roles; :func:`env_page` renders a Gymnasium-style markdown page (description,
action space, observation space, rewards, episode end, arguments, version history). The pages in
``docs/envs/`` are written by ``leakgym describe --write-docs docs/envs`` and a test checks they
match, so they cannot drift from the scenario files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.game.feedback import attacker_obs_names, defender_obs_names
from leakgym.game.scenario import LIMITS, Scenario, load_scenario, scenario_options

from .registration import registered_ids

#: per environment id: the versions and what changed
VERSION_HISTORY = {
    "v0": "initial release: MultiDiscrete (or flat Discrete) menus, Box(0, 1) observations, "
          "rewards of leakgym/game/feedback.py; the malicious scenario's attacker menu is strategy x num_bins",
}


def dataset_summary(sc: Scenario) -> dict[str, Any]:
    """What the scenario's dataset is: channels, image size, classes, normalisation statistics, source.

    Named datasets come from the catalog without loading; a path (an image folder or an ``.npz``) is
    read (once per process) and its statistics computed from its training split."""
    from leakgym.data import dataset_info, dataset_spec

    info, spec = dataset_info(sc.dataset), dataset_spec(sc.dataset, sc.image_size)
    return {"name": spec.name, "channels": spec.channels, "image_size": spec.image_size,
            "num_classes": spec.num_classes, "mean": [round(m, 4) for m in spec.mean],
            "std": [round(s, 4) for s in spec.std], "train_size": info.train_size, "source": info.source}


def _dataset_line(d: dict[str, Any]) -> str:
    return (f"{d['name']}: {d['channels']} channel(s), {d['image_size']}x{d['image_size']} px, {d['num_classes']} "
            f"classes, {d['train_size']} training images, normalised with mean {d['mean']} and std {d['std']} "
            f"({d['source']})")


def describe(env: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Observation and action layout of a Gymnasium id or scenario name, for both roles, and its dataset.

    ``overrides``: scenario fields to change first (``{"dataset": "path/to/folder"}``)."""
    ids = registered_ids()
    by_name = {name: gym_id for gym_id, name in ids.items()}
    if env in ids:
        gym_id, name = env, ids[env]
    elif env in by_name:
        gym_id, name = by_name[env], env
    else:
        from leakgym.suggest import did_you_mean

        raise ValueError(f"unknown environment {env!r}{did_you_mean(env, [*ids, *by_name])}; "
                         f"allowed: {sorted(ids)} (or scenario names {sorted(by_name)})")
    sc = load_scenario(name, **(overrides or {}))
    out: dict[str, Any] = {"id": gym_id, "scenario": name, "dataset": dataset_summary(sc), "roles": {}}
    for role, names in (("attacker", attacker_obs_names), ("defender", defender_obs_names)):
        menu = sc.menu(role)
        out["roles"][role] = {
            "action_space": f"MultiDiscrete({menu.nvec.tolist()}) or Discrete({int(np.prod(menu.nvec))}) "
                            "with flat_actions=True",
            "actions": menu.describe(),
            "observation": [{"index": i, "name": n, "low": 0.0, "high": 1.0} for i, n in enumerate(names(menu))],
        }
    return out


def format_description(info: dict[str, Any]) -> str:
    """Plain-text form of :func:`describe` (what ``leakgym describe ENV`` prints)."""
    from leakgym.metrics import lpips_status

    lines = [f"{info['id']} (scenario {info['scenario']!r})", "", "dataset: " + _dataset_line(info["dataset"]),
             "metrics: SSIM, PSNR; " + lpips_status()]
    for role, r in info["roles"].items():
        lines += ["", f"{role}: action {r['action_space']}"]
        for d in r["actions"]:
            lines.append(f"  action[{d['index']}] {d['name']:<24} " + ", ".join(f"{i}={v}" for i, v in enumerate(d["values"])))
        lines.append(f"{role}: observation Box(0, 1, ({len(r['observation'])},), float32)")
        for o in r["observation"]:
            lines.append(f"  obs[{o['index']}] {o['name']}")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]


def env_page(gym_id: str) -> str:
    """A Gymnasium-style markdown page for one environment, from its scenario file."""
    info = describe(gym_id)
    sc: Scenario = load_scenario(info["scenario"])
    w = sc.rewards
    lines = [
        f"# {gym_id}",
        "",
        (f"Scenario file: `leakgym/game/scenarios/{sc.name}.toml` (this page is generated from it by "
         f"`leakgym describe --write-docs docs/envs`)."),
        "",
        "## Description",
        "",
        (
            f"Each step is one federated-learning round ({'FedSGD' if sc.update_kind == 'gradient' else 'FedAvg'}) "
            f"on **{sc.dataset}** ({sc.image_size or 'native'} px) with a **{sc.model}** model"
            f"{' with a PRECODE bottleneck' if sc.precode else ''}: the victim client shares an update computed "
            f"on a private batch of **{sc.batch_size}** image(s) under the defender's chosen defense, "
            f"**{sc.num_clients}** benign clients share clean updates, and the "
            f"{'malicious' if sc.threat_model == 'malicious' else 'honest-but-curious'} server (the attacker) runs "
            f"its chosen inversion on the victim's update. Leakage is scored with `{sc.leakage_metric}`"
            f"{'; the attacker knows the labels' if sc.known_labels else ''}."
        ),
        "",
        "Dataset: " + _dataset_line(info["dataset"]) + ".",
        "",
        '`gym.make("' + gym_id + '", role="attacker" | "defender", opponent=...)` is one role against a fixed '
        "opponent; `leakgym.envs.leakgym_v0.parallel_env(\"" + sc.name + "\")` is the two-player PettingZoo game.",
        "",
        "## Action space",
        "",
    ]
    for role, r in info["roles"].items():
        lines += [f"**{role}**: {r['action_space']}", ""]
        lines += _table(["index", "dimension", "config field", "values (index = value)"],
                        [[d["index"], d["name"], d["field"], ", ".join(f"{i}: {v}" for i, v in enumerate(d["values"]))]
                         for d in r["actions"]])
        lines.append("")
    lines += ["## Observation space", ""]
    for role, r in info["roles"].items():
        lines += [f"**{role}**: `Box(0, 1, ({len(r['observation'])},), float32)`", ""]
        lines += _table(["index", "name", "range"], [[o["index"], o["name"], "[0, 1]"] for o in r["observation"]])
        lines.append("")
    lines += [
        "Meaning of each entry: `leakgym/game/feedback.py`. Neither role sees the private images or ground-truth metrics.",
        "",
        "## Rewards",
        "",
        (f"* attacker: `L - {w.attack_cost:g} * iterations * restarts / 1000` (iterations: the steps the attack "
         "ran; two-stage attacks add their second stage's steps, see `leakgym/game/feedback.py`)"),
        f"* defender: `-L + {w.fidelity:g} * fidelity + {w.accuracy:g} * accuracy - {w.defense_overhead:g} * defense_units`",
        "",
        f"`L` in [0, 1] is the leakage score (`{sc.leakage_metric}`); see `leakgym/game/feedback.py`.",
        "",
        "## Episode end",
        "",
        (f"Terminated after `rounds = {sc.rounds}` rounds, never earlier (docs/game.md: the last round is a "
         "terminal state). The id registers no "
         "`max_episode_steps`: the horizon is `rounds`, so `gym.make(id, rounds=R)` plays R rounds, and "
         "`max_episode_steps=K` (gym.make or gym.make_vec) truncates after K."),
        "",
        "## Arguments",
        "",
        "Any scenario field can be overridden (`gym.make(id, rounds=4, batch_size=8)`); defaults here:",
        "",
    ]
    rows = []
    for key, value in scenario_options(sc).items():
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        rows.append([f"`{key}`", f"`{value}`"])
    lines += _table(["field", "value"], rows)
    lines += ["", f"Documented limits (lifted by `allow_large=True`): {LIMITS}.", "", "## Version history", ""]
    lines += [f"* {v}: {text}" for v, text in VERSION_HISTORY.items()]
    return "\n".join(lines) + "\n"


def write_env_pages(folder: str | Path) -> list[Path]:
    """Write one page per registered id into ``folder``; returns the paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for gym_id in sorted(registered_ids()):
        path = out / f"{gym_id}.md"
        path.write_text(env_page(gym_id))
        paths.append(path)
    return paths


__all__ = ["dataset_summary", "describe", "env_page", "format_description", "write_env_pages"]

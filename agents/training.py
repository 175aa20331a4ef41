"""``leakgym train``: a Stable-Baselines3 PPO, A2C or DQN policy for one role against a fixed opponent.

The learner plays the Gymnasium single-agent view ``gym.make(env_id, role=..., opponent=...)``
(see :mod:`leakgym.envs.single_agent`); the opponent is anything :func:`leakgym.agents.make_agent`
accepts (a scripted name, a preset, or a saved policy — which is how self-play freezes a player).

**Hyperparameters** come from ``agents/hyperparams/<algo>.yml`` in rl-baselines3-zoo's layout, so
``python -m rl_zoo3.train --gym-packages leakgym -conf agents/hyperparams/ppo.yml`` reads the same
file: one entry per Gymnasium id holding ``env_kwargs`` (``role``, ``opponent``, ``flat_actions``
and scenario overrides, passed to ``gym.make``), ``n_timesteps``, ``n_envs``, ``policy``,
``policy_kwargs`` (a YAML mapping; rl-zoo's ``"dict(...)"`` strings are not evaluated) and the
algorithm's constructor arguments (``lin_<x>`` schedules as in rl-zoo). ``--hyperparams PATH.yml``
reads another file; ``--hyperparams KEY=VALUE`` overrides single values; ``--role``,
``--opponent``, ``--overrides`` and ``--timesteps`` override the file's ``env_kwargs`` and
``n_timesteps``. DQN needs a ``Discrete`` action space: ``--algo dqn`` always plays with
``flat_actions=True``.

**Steps.** On-policy algorithms (PPO, A2C) collect whole rollouts of ``n_steps x n_envs`` steps. A
budget smaller than one rollout shrinks ``n_steps`` (and PPO's ``batch_size``) to fit; a budget that
is not a whole number of rollouts is rounded up, with a warning naming both numbers. DQN collects
``train_freq x n_envs`` steps between updates and is rounded up the same way. The progress
bar, the checkpoints and ``policy.json`` count the steps really played.

A run writes, under ``OUT``::

    policy.zip          the final policy (SB3 format; load with make_agent("OUT/policy.zip", ...))
    policy.json         spaces and network architecture (what loading it needs, see
                        :mod:`leakgym.agents.learned`), algorithm, env id, role, opponent, overrides,
                        hyperparameters, requested and played steps, wall time, ``interrupted``
    checkpoints/        policy_<steps>_steps.zip (+ .json) every ``checkpoint_freq`` steps
                        (default: a quarter of the run; 0: none)
    tb/                 TensorBoard logs (``tensorboard --logdir OUT/tb``): SB3's own scalars and,
                        per rollout, LeakGym's (:class:`LeakGymMetricsCallback`): ``leakgym/leakage``,
                        ``leakgym/leakage_ssim``, ``leakgym/leakage_psnr``, ``leakgym/accuracy``,
                        ``leakgym/label_accuracy``, the share of rounds each attack strategy was
                        played (``leakgym/attack/<strategy>``) and each defense applied
                        (``leakgym/defense/<name>``, ``leakgym/defense/none``), and histograms of
                        the numeric attack and defense settings; with ``eval_freq``, ``eval/...``
    eval.csv            with ``eval_freq``: one row per evaluation (:class:`LeakGymEvalCallback`),
                        appended as it ends

An earlier run's ``checkpoints/policy_*_steps.*`` and ``eval.csv`` in ``OUT`` are removed when a run
starts (they would pass for its own); its ``policy.zip``/``policy.json`` are replaced when the run saves.

Ctrl-C (``KeyboardInterrupt``) during learning saves the policy as it is then to ``policy.zip`` /
``policy.json`` (with ``"interrupted": true`` and the steps done) and raises
:class:`TrainingInterrupted`, itself a ``KeyboardInterrupt`` carrying the :class:`TrainResult`;
``leakgym train`` then says where the policy went and exits with status 130.
"""

from __future__ import annotations

import argparse
import copy
import csv
import inspect
import math
import sys
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from leakgym.checks import is_integer
from leakgym.devices import device_argument, device_name
from leakgym.suggest import did_you_mean

from .base import Agent
from .cli_common import (
    INTERRUPTED,
    add_env_arguments,
    add_hyperparams_argument,
    apply_threads,
    readable_warnings,
    resolve_env,
    scenario_overrides,
    split_hyperparams,
    yaml_problem,
)
from .factory import make_agent
from .learned import ACTIVATIONS, ALGORITHMS, algorithm_class, metadata_path, savable_payload, save_policy
from .payoff import METRIC_RANGES, t_interval
from .scripted import ROLES, check_role

HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
#: keys of a hyperparameter entry that are not algorithm constructor arguments
RUN_KEYS = ("n_timesteps", "n_envs", "policy", "env_kwargs")
#: ``env_kwargs`` keys that are not scenario overrides
ENV_KEYS = ("role", "opponent", "flat_actions", "render_mode", "device", "max_episode_steps", "batch_attacks")
#: largest seed of a run: Stable-Baselines3 seeds numpy's legacy generator, which takes [0, 2**32 - 1]
MAX_TRAIN_SEED = 2**32 - 1
#: the policies LeakGym can save and load back (policy_spec): SB3's MLP policy
POLICIES = ("MlpPolicy",)
#: constructor arguments rl-zoo writes as ``lin_<initial value>`` (a linear schedule to 0)
SCHEDULE_KEYS = ("learning_rate", "clip_range", "clip_range_vf")
#: the on-policy algorithms, which collect whole rollouts of n_steps x n_envs steps
ON_POLICY = ("ppo", "a2c")
#: per-episode quantities an evaluation reports (means over the episode's rounds, final accuracy)
EVAL_METRICS = ("return", "leakage", "leakage_ssim", "leakage_psnr", "accuracy")
#: their ranges (the leakage score lies in [0, 1]); intervals are clipped to them
EVAL_RANGES = {"return": (-math.inf, math.inf), "leakage": (0.0, 1.0),
               **{m: METRIC_RANGES[m] for m in ("leakage_ssim", "leakage_psnr", "accuracy")}}


class TrainingBudgetWarning(UserWarning):
    """The steps played differ from the steps requested (whole rollouts), or ``n_steps`` was shrunk."""


def hyperparams_file(algo: str) -> Path:
    """The rl-zoo hyperparameter file of ``algo`` shipped with LeakGym (``agents/hyperparams/<algo>.yml``)."""
    if algo not in ALGORITHMS:
        raise ValueError(f"algo={algo!r}; allowed: {ALGORITHMS}")
    return HYPERPARAMS_DIR / f"{algo}.yml"


def read_hyperparams_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The whole file: Gymnasium id -> entry (``ValueError`` naming the file when unreadable)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"hyperparameter file {str(path)!r}: not valid YAML ({yaml_problem(exc)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"hyperparameter file {str(path)!r}: cannot read it ({exc})") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ValueError(f"hyperparameter file {str(path)!r}: nested deeper than the parser can read") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"hyperparameter file {str(path)!r} must map Gymnasium ids to mappings (rl-zoo layout)")
    return data


def _linear(initial: float) -> Callable[[float], float]:
    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


#: constructor arguments ``train()`` passes itself: not hyperparameters, and what sets them instead
TRAIN_SETS = {
    "seed": "--seed (TrainConfig.seed)",
    "device": "--device (TrainConfig.device)",
    "tensorboard_log": "--out (the logs go to OUT/tb)",
    "verbose": "--no-progress (leakgym train shows a progress bar instead of SB3's log)",
    "_init_setup_model": "nothing (the model is always set up)",
}
#: integer hyperparameters and their smallest value (PPO's batch_size: SB3 needs at least 2)
INT_MINIMUM = {"n_timesteps": 1, "n_envs": 1, "n_steps": 1, "n_epochs": 1, "buffer_size": 1,
               "learning_starts": 0, "target_update_interval": 1, "stats_window_size": 1}
#: number hyperparameters in [0, 1] (tau in (0, 1])
UNIT_KEYS = ("gamma", "gae_lambda", "exploration_fraction", "exploration_initial_eps", "exploration_final_eps")
#: number hyperparameters that must be > 0 (schedules: their initial value); ``None`` allowed for the last two
POSITIVE_KEYS = ("clip_range", "max_grad_norm", "rms_prop_eps", "clip_range_vf", "target_kl")
#: number hyperparameters that must be >= 0 (a learning rate of 0 keeps the policy as it is)
NON_NEGATIVE_KEYS = ("learning_rate", "ent_coef", "vf_coef")
#: true/false hyperparameters (a typo such as ``normalize_advantage: nope`` was accepted and acted as true)
BOOL_KEYS = ("normalize_advantage", "use_sde", "use_rms_prop", "optimize_memory_usage",
             "ortho_init", "squash_output", "share_features_extractor", "normalize_images", "full_std", "use_expln")
#: ``policy_kwargs`` naming a class: only ``activation_fn`` may be given (by name, from :data:`ACTIVATIONS`)
CLASS_KEYS = ("features_extractor_class", "optimizer_class", "rollout_buffer_class", "replay_buffer_class")


def _source(key: str, value: Any, path: Path, overrides: dict[str, Any]) -> str:
    """Where ``key``'s value came from: the command line (``--hyperparams KEY=VALUE``) or the file."""
    if key in overrides:
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        return f"command line (--hyperparams {key}={text})"
    return f"hyperparameter file {str(path)!r}"


_is_int = is_integer


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, (float, np.floating))) and math.isfinite(value)


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """``(dotted key, value)`` of the first NaN or infinite number in ``value`` (mappings and lists
    searched), or None."""
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return path, float(value)
    if isinstance(value, dict):
        items = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for p, v in items if (found := _non_finite(v, p)) is not None), None)


def _number_hint(value: Any) -> str:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return " (YAML reads a number without a '.' in its mantissa, like 1e-3, as a string: write 1.0e-3)"
    return ""


def _check_policy_kwargs(value: dict[str, Any], algo: str, policy: Any, bad: Callable[..., ValueError]) -> None:
    cls = algorithm_class(algo)
    policy_cls = cls.policy_aliases.get(policy) if isinstance(policy, str) else policy
    if inspect.isclass(policy_cls):
        allowed = set(inspect.signature(policy_cls.__init__).parameters) - {
            "self", "observation_space", "action_space", "lr_schedule"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise bad(f"policy_kwargs={value!r}", f"keys of {policy_cls.__name__}: {sorted(allowed)} "
                      f"(not {unknown})")
    act = value.get("activation_fn")
    if act is not None and not (act in ACTIVATIONS if isinstance(act, str) else
                                inspect.isclass(act) and act.__name__ in ACTIVATIONS):
        raise bad(f"policy_kwargs.activation_fn={act!r}", f"one of {list(ACTIVATIONS)} (torch.nn activations)")
    for key in CLASS_KEYS:
        if isinstance(value.get(key), str):
            raise bad(f"policy_kwargs.{key}={value[key]!r}",
                      "not settable from a hyperparameter file or the command line (a class, not a name)")
    for key in BOOL_KEYS:
        if key in value and not isinstance(value[key], bool):
            raise bad(f"policy_kwargs.{key}={value[key]!r}", "true or false")
    arch = value.get("net_arch")
    if arch is not None:
        def layers(x: Any) -> bool:
            return isinstance(x, list) and all(_is_int(n) and n >= 1 for n in x)

        ok = layers(arch) or (algo in ON_POLICY and isinstance(arch, dict) and set(arch) <= {"pi", "vf"}
                               and all(layers(v) for v in arch.values()))
        if not ok:
            shapes = "a list of layer sizes >= 1" + (", or {pi: [...], vf: [...]}" if algo in ON_POLICY else "")
            raise bad(f"policy_kwargs.net_arch={arch!r}", shapes)


def _check_value(key: str, value: Any, source: str | Path, algo: str = "ppo", policy: Any = "MlpPolicy") -> None:
    """``ValueError`` naming ``source`` (the file or the command line), the key, the value and what is allowed."""

    def bad(what: str, allowed: str) -> ValueError:
        return ValueError(f"{source}: {what}; allowed: {allowed}")

    if key == "policy_kwargs":
        if not isinstance(value, dict):
            raise ValueError(
                f"{source}: policy_kwargs must be a YAML mapping such as {{net_arch: [64, 64]}}; got {value!r} "
                "(LeakGym does not evaluate rl-zoo's \"dict(...)\" strings)"
            )
        _check_policy_kwargs(value, algo, policy, bad)
    if key == "policy" and value not in POLICIES:
        raise bad(f"policy={value!r}", f"{list(POLICIES)} (the policies LeakGym saves and loads back)")
    if key in BOOL_KEYS and not isinstance(value, bool):
        raise bad(f"{key}={value!r}", "true or false")
    if key == "env_kwargs" and not isinstance(value, dict):
        raise ValueError(f"{source}: env_kwargs must be a mapping (role, opponent, scenario overrides); got {value!r}")
    if key in CLASS_KEYS and value is not None:
        raise bad(f"{key}={value!r}", "not settable from a hyperparameter file or the command line (a class)")
    if key in SCHEDULE_KEYS and isinstance(value, str):
        kind, _, number = value.partition("_")
        try:
            low = 0.0 if key in NON_NEGATIVE_KEYS else math.ulp(0.0)
            ok = kind == "lin" and low <= float(number) < math.inf
        except ValueError:
            ok = False
        if not ok:
            sign = ">= 0" if key in NON_NEGATIVE_KEYS else "> 0"
            raise bad(f"{key}={value!r}", f"a number or 'lin_<initial value>' ({sign}){_number_hint(value)}")
        return
    if key in INT_MINIMUM or key == "batch_size":
        low = 2 if key == "batch_size" and algo == "ppo" else INT_MINIMUM.get(key, 1)
        if not (_is_int(value) and value >= low):
            why = " (PPO normalises advantages over a minibatch)" if key == "batch_size" and low == 2 else ""
            raise bad(f"{key}={value!r}", f"integers >= {low}{why}")
    elif key == "gradient_steps":
        if not (_is_int(value) and (value >= 1 or value == -1)):
            raise bad(f"{key}={value!r}", "integers >= 1, or -1 (as many as steps collected)")
    elif key == "sde_sample_freq":
        if not (_is_int(value) and (value >= 1 or value == -1)):
            raise bad(f"{key}={value!r}", "integers >= 1, or -1 (only at the start of a rollout)")
    elif key == "train_freq":
        every, unit = value if isinstance(value, (list, tuple)) and len(value) == 2 else (value, "step")
        if not (_is_int(every) and every >= 1 and unit in ("step", "episode")):
            raise bad(f"{key}={value!r}", "integers >= 1, or [N, 'step'] / [N, 'episode'] with N >= 1")
    elif key in UNIT_KEYS or key == "tau":
        low_ok = (lambda v: v > 0) if key == "tau" else (lambda v: v >= 0)
        if not (_is_number(value) and low_ok(value) and value <= 1):
            interval = "(0, 1]" if key == "tau" else "[0, 1]"
            raise bad(f"{key}={value!r}", f"numbers in {interval}{_number_hint(value)}")
    elif key in POSITIVE_KEYS:
        if not ((value is None and key in ("clip_range_vf", "target_kl")) or (_is_number(value) and value > 0)):
            extra = ", null" if key in ("clip_range_vf", "target_kl") else ""
            extra += " or 'lin_<initial value>'" if key in SCHEDULE_KEYS else ""
            raise bad(f"{key}={value!r}", f"numbers > 0{extra}{_number_hint(value)}")
    elif key in NON_NEGATIVE_KEYS and not (_is_number(value) and value >= 0):
        extra = " or 'lin_<initial value>'" if key in SCHEDULE_KEYS else ""
        raise bad(f"{key}={value!r}", f"numbers >= 0{extra}{_number_hint(value)}")


def load_hyperparams(
    env_id: str, algo: str, overrides: dict[str, Any] | None = None, path: str | Path | None = None
) -> dict[str, Any]:
    """The entry of ``env_id`` in the rl-zoo file ``path`` (default :func:`hyperparams_file`), with
    ``overrides`` applied and every key checked; values as in the file (schedules still strings).

    As in rl-zoo, a file without an entry for ``env_id`` may hold a ``default`` entry. A bad key or
    value is a ``ValueError`` naming where it came from (the file, or the command line for
    ``overrides``), the key, the value and what is allowed.
    """
    cls = algorithm_class(algo)
    path = Path(path) if path is not None else hyperparams_file(algo)
    data = read_hyperparams_file(path)
    if env_id in data:
        params = copy.deepcopy(data[env_id])
    elif "default" in data:
        params = copy.deepcopy(data["default"])
    else:
        raise ValueError(f"{path} has no entry for {env_id!r} (and no 'default'); it has {sorted(data)}")
    overrides = copy.deepcopy(overrides or {})
    params.update(overrides)

    def source(key: str) -> str:
        return _source(key, params[key], path, overrides)

    for key in params:
        if key in TRAIN_SETS:
            raise ValueError(f"{source(key)}: {key} is set by leakgym train itself, not a hyperparameter; "
                             f"use {TRAIN_SETS[key]}")
    allowed = (set(inspect.signature(cls.__init__).parameters) - {"self", "policy", "env"} - set(TRAIN_SETS)
               | set(RUN_KEYS))
    for where, keys in (("command line (--hyperparams)", set(overrides)), (f"{path}", set(params) - set(overrides))):
        unknown = sorted(keys - allowed)
        if unknown:
            raise ValueError(
                f"{where}: hyperparameter(s) {unknown} are not {cls.__name__} arguments or run settings"
                f"{did_you_mean(unknown[0], allowed)}; allowed: {sorted(allowed)}"
            )
    for key, value in params.items():
        _check_value(key, value, source(key), algo, params.get("policy", "MlpPolicy"))
        bad = _non_finite(value, key)
        if bad is not None:  # nested ones too (optimizer_kwargs.eps=nan reached the optimiser)
            raise ValueError(f"{source(key)}: {bad[0]}={bad[1]!r}; allowed: finite numbers")
    if algo == "ppo":
        n_steps = params.get("n_steps", inspect.signature(cls.__init__).parameters["n_steps"].default)
        n_envs = params.get("n_envs", 1)
        if n_steps * n_envs < 2:
            where = source("n_steps") if "n_steps" in params else source("n_envs")
            raise ValueError(f"{where}: n_steps={n_steps} with n_envs={n_envs}; allowed: n_steps x n_envs >= 2 "
                             "(PPO normalises advantages over a rollout)")
    return params


def constructor_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The algorithm's constructor arguments of an entry: run settings dropped, ``lin_<x>`` strings
    turned into linear schedules, ``train_freq`` lists into tuples (as rl-zoo does) and a
    ``policy_kwargs`` ``activation_fn`` name (one of :data:`ACTIVATIONS`) into its ``torch.nn`` class."""
    kwargs = {k: v for k, v in params.items() if k not in RUN_KEYS}
    for key in SCHEDULE_KEYS:
        if isinstance(kwargs.get(key), str):
            kwargs[key] = _linear(float(kwargs[key].partition("_")[2]))
    if isinstance(kwargs.get("train_freq"), list):
        kwargs["train_freq"] = tuple(kwargs["train_freq"])
    policy_kwargs = kwargs.get("policy_kwargs")
    if isinstance(policy_kwargs, dict) and isinstance(policy_kwargs.get("activation_fn"), str):
        import torch

        name = policy_kwargs["activation_fn"]
        if name not in ACTIVATIONS:
            raise ValueError(f"policy_kwargs.activation_fn={name!r}; allowed: one of {list(ACTIVATIONS)}")
        kwargs["policy_kwargs"] = {**policy_kwargs, "activation_fn": getattr(torch.nn, name)}
    return kwargs


@dataclass
class StepPlan:
    """How many steps a run really plays (see the module docstring, "Steps")."""

    requested: int
    actual: int
    rollout: int
    """Steps per rollout (on-policy: n_steps x n_envs; off-policy: train_freq x n_envs when train_freq
    counts steps, else 1)."""
    kwargs: dict[str, Any]
    """The constructor arguments, with ``n_steps`` / ``batch_size`` shrunk where needed."""
    notes: list[str]


def plan_steps(algo: str, requested: int, n_envs: int, kwargs: dict[str, Any]) -> StepPlan:
    """Fit an on-policy rollout to ``requested`` steps; say how many steps an off-policy algorithm plays
    (it collects ``train_freq`` vector steps of ``n_envs`` games between updates, and SB3 checks the
    budget only between collections; a ``train_freq`` counted in episodes plays whole episodes)."""
    if requested < 1:
        raise ValueError(f"timesteps={requested}; must be >= 1")
    if not (_is_int(n_envs) and n_envs >= 1):
        raise ValueError(f"n_envs={n_envs!r}; allowed: integers >= 1")
    kwargs = dict(kwargs)
    defaults = inspect.signature(algorithm_class(algo).__init__).parameters
    for key in ("n_steps", "batch_size", "train_freq"):
        if key in kwargs and key in defaults:
            _check_value(key, kwargs[key], "hyperparameters", algo)
    if algo not in ON_POLICY:
        freq = kwargs.get("train_freq", defaults["train_freq"].default)
        every, unit = (freq if isinstance(freq, (list, tuple)) else (freq, "step"))
        starts = int(kwargs.get("learning_starts", defaults["learning_starts"].default))
        if unit != "step":
            if n_envs > 1:  # SB3 asserts this once learning starts, after the run's folder and games were made
                raise ValueError(f"train_freq={list(freq)!r} counts episodes, which Stable-Baselines3 trains on one "
                                 f"env only; got n_envs={n_envs}: count train_freq in steps or set n_envs=1")
            notes = [(f"{algo.upper()} with train_freq counted in episodes plays whole episodes: it may train for "
                      f"more than the {requested} steps requested")]
            actual, rollout = requested, 1
        else:
            rollout = int(every) * n_envs
            actual = math.ceil(requested / rollout) * rollout
            note = (f"{algo.upper()} collects train_freq x n_envs = {int(every)} x {n_envs} steps between updates: "
                    f"training for {actual} steps, not the {requested} requested")
            notes = [] if actual == requested else [note]
        if actual <= starts:
            notes.append(f"{algo.upper()} makes no gradient update in {actual} steps (learning_starts={starts}): the "
                         "saved policy is the untrained network; train for more steps or lower learning_starts")
        return StepPlan(requested, actual, rollout, kwargs, notes)
    n_steps = int(kwargs.get("n_steps", defaults["n_steps"].default))
    notes = []
    if requested < n_steps * n_envs:
        # PPO normalises advantages over a rollout, which needs at least 2 steps.
        shrunk = max(math.ceil(requested / n_envs), 2 if algo == "ppo" else 1)
        notes.append(f"n_steps {n_steps} -> {shrunk}: one rollout of {n_steps} x {n_envs} env(s) would play "
                     f"{n_steps * n_envs} steps, more than the {requested} requested")
        n_steps = kwargs["n_steps"] = shrunk
    rollout = n_steps * n_envs
    if algo == "ppo" and rollout < 2:
        raise ValueError(f"n_steps={n_steps} with n_envs={n_envs}; allowed: n_steps x n_envs >= 2 "
                         "(PPO normalises advantages over a rollout)")
    if algo == "ppo":
        batch_size = int(kwargs.get("batch_size", defaults["batch_size"].default))
        if batch_size > rollout:
            notes.append(f"batch_size {batch_size} -> {rollout} (one rollout)")
            kwargs["batch_size"] = rollout
    actual = math.ceil(requested / rollout) * rollout
    if actual != requested:
        notes.append(f"{algo.upper()} plays whole rollouts of n_steps x n_envs = {rollout} steps: training for "
                     f"{actual} steps, not the {requested} requested")
    return StepPlan(requested, actual, rollout, kwargs, notes)


@dataclass
class TrainConfig:
    """One training run."""

    env_id: str = "LeakGym-Digits-v0"
    """Gymnasium id (or scenario name) of the environment."""
    role: str | None = None
    """Which side learns: attacker or defender; None = the file's env_kwargs (attacker)."""
    algo: str = "ppo"
    """ppo, a2c or dqn."""
    timesteps: int | None = None
    """Environment steps (rounds) to train for; None = the file's n_timesteps."""
    opponent: Any = None
    """The frozen opponent: a make_agent spec (name, preset, policy path) or an Agent; None = the file's."""
    out: Path = Path("runs/train")
    """Output folder (policy.zip, policy.json, checkpoints/, tb/, eval.csv)."""
    seed: int = 0
    """Seed of SB3 (network init, sampling) and of the environments."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Scenario overrides passed to the environment (e.g. rounds=2), over the file's env_kwargs."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Overrides of the hyperparameter file's values."""
    hyperparams_file: Path | None = None
    """The rl-zoo hyperparameter file; None = agents/hyperparams/<algo>.yml."""
    checkpoint_freq: int | None = None
    """Save a checkpoint every this many steps; None = a quarter of the run; 0 = no checkpoints."""
    eval_freq: int = 0
    """Evaluate the policy against the opponent every this many steps (0 = never)."""
    eval_episodes: int = 2
    """Episodes per evaluation (the same seeds every time)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    device: str = "cpu"
    """Torch device of the policy network and of the games it plays."""
    batch_clients: bool | None = None
    """With ``n_envs > 1``: the vector env's ``batch_clients`` (the victims' clean updates and defenses,
    benign clients, aggregation and evaluation batched over the games; equal to the game-by-game
    rounds to float32 rounding). None: on whenever ``n_envs > 1``; True with one env is refused."""
    callback: Any = None
    """Extra Stable-Baselines3 callback (or list of callbacks) run during learning."""


@dataclass
class TrainResult:
    policy_path: Path
    out: Path
    metadata: dict[str, Any]
    interrupted: bool = False
    """True when learning was stopped by Ctrl-C (the policy is the one reached by then)."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during learning, after the current policy was saved; ``result`` says where."""

    def __init__(self, result: TrainResult) -> None:
        super().__init__(f"training interrupted after {result.metadata['timesteps']} steps; saved {result.policy_path}")
        self.result = result


# ---------------------------------------------------------------------------------------- callbacks
def _progress_callback(total: int):
    from stable_baselines3.common.callbacks import BaseCallback
    from tqdm.auto import tqdm

    class TqdmCallback(BaseCallback):
        """A tqdm bar over the steps really played (total and ETA), with the recent mean leakage SSIM."""

        def _on_training_start(self) -> None:
            self.bar = tqdm(total=total, desc="train", unit="step")
            self.recent: deque[float] = deque(maxlen=64)

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "leakage_ssim" in info:
                    self.recent.append(float(info["leakage_ssim"]))
            if self.recent:
                self.bar.set_postfix(ssim=f"{np.mean(self.recent):.3f}", refresh=False)
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return TqdmCallback()


def _checkpoint_callback(save_freq: int, folder: Path, metadata: dict[str, Any], flat_nvec: Any):
    from stable_baselines3.common.callbacks import BaseCallback

    class PolicyCheckpoints(BaseCallback):
        """``folder/policy_<steps>_steps.zip`` and its JSON file each time the steps pass a multiple
        of ``save_freq``."""

        def _init_callback(self) -> None:
            folder.mkdir(parents=True, exist_ok=True)
            self.next_save = (self.num_timesteps // save_freq + 1) * save_freq

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_save:
                path = folder / f"policy_{self.num_timesteps}_steps.zip"
                save_policy(self.model, path, {**metadata, "timesteps": int(self.num_timesteps)}, flat_nvec=flat_nvec)
                self.next_save = (self.num_timesteps // save_freq + 1) * save_freq
            return True

    return PolicyCheckpoints()


def _clear_previous_run(out: Path) -> None:
    """Remove what an earlier run in ``out`` left that this run writes as it goes (its checkpoints and
    ``eval.csv``): they would pass for this run's beside its policy (an attacker's checkpoints beside a
    defender's policy). ``policy.zip``/``policy.json`` are replaced when this run saves."""
    folder = out / "checkpoints"
    if folder.is_dir():
        for path in folder.glob("policy_*_steps.*"):
            if path.suffix in (".zip", ".json") and path.is_file():
                path.unlink()
    if (out / "eval.csv").is_file():
        (out / "eval.csv").unlink()


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def leakgym_metrics_callback(window: int):
    """An SB3 callback that logs LeakGym's quantities from the step infos to TensorBoard.

    After each rollout holding at least ``window`` steps (PPO/A2C: every rollout; DQN, whose
    rollouts are ``train_freq`` steps: every ``window`` steps) it records the mean of the numeric
    infos in :data:`LeakGymMetricsCallback.MEANS` under ``leakgym/``, the share of steps that played
    each attack strategy (``leakgym/attack/<strategy>``) and applied each defense
    (``leakgym/defense/<name>``; ``leakgym/defense/none``: no defense), and histograms of the
    numeric attack and defense settings (``leakgym/attack_settings/<field>``, TensorBoard only). A
    choice seen once is logged in every later record (0 when not played), so its curve is continuous.
    """
    from stable_baselines3.common.callbacks import BaseCallback

    class LeakGymMetricsCallback(BaseCallback):
        MEANS = ("leakage", "leakage_ssim", "leakage_psnr", "leakage_lpips", "accuracy", "label_accuracy")

        def _init_callback(self) -> None:
            self.infos: list[dict[str, Any]] = []
            self.strategies: set[str] = set()
            self.defenses: set[str] = set()

        def _on_step(self) -> bool:
            self.infos.extend(i for i in self.locals.get("infos", []) if "leakage" in i)
            return True

        def _on_rollout_end(self) -> None:
            if len(self.infos) >= window:
                self.record_infos(self.infos)
                self.infos = []

        def record_infos(self, infos: list[dict[str, Any]]) -> None:
            for key in self.MEANS:
                values = [float(i[key]) for i in infos if _numeric(i.get(key))]
                if values:
                    self.logger.record(f"leakgym/{key}", float(np.mean(values)))
            strategies = Counter(i["strategy"] for i in infos if "strategy" in i)
            with_defenses = [i["defenses"] for i in infos if "defenses" in i]
            defenses = Counter(name for applied in with_defenses for name in applied)
            defenses["none"] = sum(1 for applied in with_defenses if not applied)
            self.strategies |= set(strategies)
            self.defenses |= {name for name, count in defenses.items() if count}
            if strategies:
                for name in sorted(self.strategies):
                    self.logger.record(f"leakgym/attack/{name}", strategies[name] / sum(strategies.values()))
            if with_defenses:
                for name in sorted(self.defenses):
                    self.logger.record(f"leakgym/defense/{name}", defenses[name] / len(with_defenses))
            for group in ("attack_settings", "defense_settings"):
                settings = [i[group] for i in infos if isinstance(i.get(group), dict)]
                for key in sorted({k for s in settings for k, v in s.items() if _numeric(v)}):
                    values = np.array([float(s[key]) for s in settings if _numeric(s.get(key))])
                    self.logger.record(f"leakgym/{group}/{key}", values, exclude=("stdout", "log", "json", "csv"))

    return LeakGymMetricsCallback()


def _eval_row(total: float, per_round: dict[str, list[float]], accuracy: float) -> dict[str, float]:
    row = {"return": total, **{m: float(np.mean(v)) for m, v in per_round.items()}}
    row["accuracy"] = accuracy
    return row


PER_ROUND_METRICS = ("leakage", "leakage_ssim", "leakage_psnr")


def run_eval_episodes(env, predict: Callable[[Any], Any], episodes: int, seed: int) -> list[dict[str, float]]:
    """Play ``episodes`` episodes (reset seeds ``seed + e``) of a single-agent view with ``predict``, one
    after another.

    Returns per episode: the learner's ``return``, the mean over rounds of ``leakage``,
    ``leakage_ssim`` and ``leakage_psnr``, and the test ``accuracy`` after the last round.
    """
    rows = []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        total, per_round, info, done = 0.0, {m: [] for m in PER_ROUND_METRICS}, {}, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(predict(obs))
            total += float(reward)
            for m, values in per_round.items():
                values.append(float(info.get(m, float("nan"))))
            done = terminated or truncated
        rows.append(_eval_row(total, per_round, float(info.get("accuracy", float("nan")))))
    return rows


def run_eval_episodes_together(venv, predict: Callable[[Any], Any], seed: int) -> list[dict[str, float]]:
    """:func:`run_eval_episodes` with its episodes played at once: episode ``e`` is game ``e`` of the
    vector env ``venv`` (``gym.make_vec``, reset seed ``seed + e``), all rounds of all games one
    :class:`~leakgym.envs.round.Round` per step; ``predict`` gets the games' observations as a batch.

    Each game starts from the state :func:`run_eval_episodes`' episode ``e`` starts from (the same
    reset seed, its own copy of the opponent), so the rows are that function's to the rounding of the
    batched attacks (:func:`leakgym.envs.round.reconstruct_all`). A game whose episode ended is not
    recorded further while the others finish.
    """
    n = venv.num_envs
    obs, _ = venv.reset(seed=[seed + e for e in range(n)])
    totals = [0.0] * n
    per_round = [{m: [] for m in PER_ROUND_METRICS} for _ in range(n)]
    accuracy = [float("nan")] * n
    done = np.zeros(n, dtype=bool)
    while not done.all():
        obs, rewards, terminated, truncated, infos = venv.step(predict(obs))
        for i in np.flatnonzero(~done):
            totals[i] += float(rewards[i])
            for m, values in per_round[i].items():
                present = m in infos and infos[f"_{m}"][i]
                values.append(float(infos[m][i]) if present else float("nan"))
            if terminated[i] or truncated[i]:
                done[i] = True
                if "accuracy" in infos and infos["_accuracy"][i]:
                    accuracy[i] = float(infos["accuracy"][i])
    return [_eval_row(totals[i], per_round[i], accuracy[i]) for i in range(n)]


def evaluate_policy(make_env: Callable[[int], Any], predict: Callable[[Any], Any], episodes: int, seed: int, *,
                    together: bool) -> list[dict[str, float]]:
    """One evaluation: ``episodes`` episodes on environments built for it (``make_env(num_envs)``: a
    single-agent view for 1, a vector env otherwise), closed after.

    Fresh environments mean a fresh opponent, so an evaluation does not depend on the ones before it
    (an opponent that learns across episodes, the bandit, would otherwise carry what it learned into
    the next evaluation). ``together``: the episodes in lockstep (:func:`run_eval_episodes_together`)
    -- for opponents that do not learn across episodes (:attr:`leakgym.agents.Agent.episodic`), where
    each episode's own copy of the opponent plays what the shared one would; otherwise one after
    another on one env (:func:`run_eval_episodes`), the opponent learning across them as in training.
    """
    env = make_env(episodes if together else 1)
    try:
        if together:
            return run_eval_episodes_together(env, predict, seed)
        return run_eval_episodes(env, predict, episodes, seed)
    finally:
        env.close()


EVAL_COLUMNS = ["timesteps", "wall_time_s", "episodes"] + [
    f"{m}_{s}" for m in EVAL_METRICS for s in ("mean", "ci95_low", "ci95_high")
]


def eval_callback(make_env: Callable[[int], Any], freq: int, episodes: int, seed: int, csv_path: Path, *,
                  together: bool = False):
    """An SB3 callback that evaluates the policy against the opponent every ``freq`` steps.

    Each evaluation is one :func:`evaluate_policy`: ``episodes`` episodes on environments built for it
    (``make_env(num_envs)``, so every evaluation meets the opponent in the same starting state), the
    learner acting deterministically, with the same reset seeds ``seed, seed + 1, ...`` every time
    (so evaluations differ only by the policy); ``together`` plays them in lockstep. It logs
    ``eval/<metric>`` (mean over episodes) to TensorBoard and appends a row to ``csv_path``:
    ``timesteps, wall_time_s, episodes`` and, for each metric in :data:`EVAL_METRICS`, the mean and its
    95% t-interval (clipped to :data:`EVAL_RANGES`).
    """
    from stable_baselines3.common.callbacks import BaseCallback

    class LeakGymEvalCallback(BaseCallback):
        def _init_callback(self) -> None:
            self.t0 = time.perf_counter()
            self.next_eval = (self.num_timesteps // freq + 1) * freq
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            with open(csv_path, "w", newline="") as fh:
                csv.writer(fh).writerow(EVAL_COLUMNS)

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.evaluate()
                self.next_eval = (self.num_timesteps // freq + 1) * freq
            return True

        def evaluate(self) -> dict[str, Any]:
            rows = evaluate_policy(make_env, lambda obs: self.model.predict(obs, deterministic=True)[0],
                                   episodes, seed, together=together)
            record: dict[str, Any] = {"timesteps": int(self.num_timesteps),
                                      "wall_time_s": round(time.perf_counter() - self.t0, 3), "episodes": episodes}
            for m in EVAL_METRICS:
                mean, low, high = t_interval([r[m] for r in rows], bounds=EVAL_RANGES[m])
                record.update({f"{m}_mean": mean, f"{m}_ci95_low": low, f"{m}_ci95_high": high})
                self.logger.record(f"eval/{m}", mean)
            self.logger.dump(self.num_timesteps)
            with open(csv_path, "a", newline="") as fh:
                csv.writer(fh).writerow(["" if isinstance(v, float) and math.isnan(v) else v
                                         for v in (record[c] for c in EVAL_COLUMNS)])
            return record

    return LeakGymEvalCallback()


# ---------------------------------------------------------------------------------------- training
def make_training_env(gym_id: str, env_kwargs: dict[str, Any], n_envs: int, seed: int, batch_clients: bool = False):
    """The SB3 training env: one game a ``DummyVecEnv`` of a monitored single-agent view; ``n_envs > 1``
    games the batched vector env (``gym.make_vec``: one Round per step for all games, ``batch_clients``
    as given) through :class:`~leakgym.envs.sb3_vec.LeakGymSB3VecEnv`, monitored."""
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecMonitor

    if n_envs == 1:
        if batch_clients:
            raise ValueError("batch_clients=True needs n_envs > 1 (it batches the games of a vector env)")
        return make_vec_env(gym_id, n_envs=1, seed=seed, env_kwargs=env_kwargs)
    from leakgym.envs.sb3_vec import LeakGymSB3VecEnv

    venv = VecMonitor(LeakGymSB3VecEnv(gym.make_vec(gym_id, num_envs=n_envs, batch_clients=batch_clients,
                                                    **env_kwargs)))
    venv.seed(seed)
    return venv


def _env_kwargs(config: TrainConfig, file_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(gym.make kwargs, scenario overrides)`` from the file's env_kwargs and the config."""
    kwargs = {**file_kwargs, **config.overrides}
    kwargs["role"] = config.role if config.role is not None else kwargs.get("role", "attacker")
    check_role(kwargs["role"])
    kwargs["opponent"] = config.opponent if config.opponent is not None else kwargs.get("opponent", "random")
    if config.algo == "dqn":
        kwargs["flat_actions"] = True  # DQN needs a Discrete action space
    if not kwargs.get("flat_actions", False):
        kwargs.pop("flat_actions", None)
    if "device" in file_kwargs and device_name(file_kwargs["device"]) != device_name(config.device):
        raise ValueError(f"env_kwargs device={file_kwargs['device']!r} in the hyperparameter file differs from the run's "
                         f"device {config.device!r} (--device): the games run where the policy does; set --device")
    if "allow_large" in file_kwargs:
        from leakgym.envs.scenario import ALLOW_LARGE_FROM_CALLER

        raise ValueError(f"env_kwargs allow_large={file_kwargs['allow_large']!r} in the hyperparameter file: "
                         f"{ALLOW_LARGE_FROM_CALLER}")
    if "batch_clients" in kwargs:
        raise ValueError("batch_clients is a setting of the run, not a scenario override; use --batch-clients "
                         "(TrainConfig.batch_clients)")
    if "device" in config.overrides:  # it was replaced by the run's device silently
        raise ValueError(f"device={config.overrides['device']!r} is a setting of the run, not a scenario override; "
                         "use --device (TrainConfig.device)")
    kwargs["device"] = config.device  # the games run where the policy does
    overrides = {k: v for k, v in kwargs.items() if k not in ENV_KEYS}
    return kwargs, overrides


@dataclass
class CheckedConfig:
    """What :func:`check_config` derived from a :class:`TrainConfig`; nothing was written or built."""

    gym_id: str
    scenario_name: str
    params: dict[str, Any]
    env_kwargs: dict[str, Any]
    overrides: dict[str, Any]
    role: str
    n_envs: int
    batch_clients: bool
    policy: Any
    plan: StepPlan


def check_config(config: TrainConfig) -> CheckedConfig:
    """Every check of a training run that needs no environment: the algorithm, seed and frequencies, the
    hyperparameters (file and overrides), the scenario with its overrides, the opponent spec (built once
    against the scenario) and the step plan. ``ValueError`` for anything wrong; writes nothing, so
    :func:`train` and self-play refuse a bad run before they touch an output folder."""
    from leakgym.envs.scenario import load_scenario

    if config.algo not in ALGORITHMS:
        raise ValueError(f"algo={config.algo!r}; allowed: {ALGORITHMS}")
    if not _is_int(config.seed) or not 0 <= config.seed <= MAX_TRAIN_SEED:
        raise ValueError(f"seed={config.seed!r}; allowed: integers in [0, 2**32 - 1] (Stable-Baselines3 seeds "
                         "numpy's legacy generator with it)")
    for name in ("eval_freq", "eval_episodes"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name}={getattr(config, name)}; must be >= 0")
    if config.checkpoint_freq is not None and config.checkpoint_freq < 0:
        raise ValueError(f"checkpoint_freq={config.checkpoint_freq}; allowed: >= 1, 0 (no checkpoints) or None")
    if config.eval_freq and config.eval_episodes < 1:
        raise ValueError(f"eval_episodes={config.eval_episodes}; must be >= 1 when eval_freq is set")
    gym_id, scenario_name = resolve_env(config.env_id)
    params = load_hyperparams(gym_id, config.algo, config.hyperparams, config.hyperparams_file)
    env_kwargs, overrides = _env_kwargs(config, params.get("env_kwargs") or {})
    role = env_kwargs["role"]
    n_envs = int(params.get("n_envs", 1))
    if config.batch_clients and n_envs < 2:
        raise ValueError(f"batch_clients=True needs n_envs > 1 (got n_envs={n_envs}): it batches the games of a "
                         "vector env; pass --n-envs N")
    batch_clients = n_envs > 1 if config.batch_clients is None else config.batch_clients
    opponent = env_kwargs["opponent"]
    if not isinstance(opponent, Agent):  # a name, preset or policy path: resolved now, not after the folder is made
        make_agent(opponent, role="defender" if role == "attacker" else "attacker",
                   scenario=load_scenario(scenario_name, **overrides))
    requested = int(config.timesteps if config.timesteps is not None else params.get("n_timesteps", 10_000))
    plan = plan_steps(config.algo, requested, n_envs, constructor_kwargs(params))
    return CheckedConfig(gym_id, scenario_name, params, env_kwargs, overrides, role, n_envs, batch_clients,
                         params.get("policy", "MlpPolicy"), plan)


def train(config: TrainConfig) -> TrainResult:
    """Train one policy; see the module docstring for what is written to ``config.out``.

    Emits :class:`TrainingBudgetWarning` when the steps played differ from those requested. Raises
    :class:`TrainingInterrupted` (a ``KeyboardInterrupt``) after saving the current policy when
    learning is interrupted.
    """
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.callbacks import CallbackList

    checked = check_config(config)
    gym_id, scenario_name, params = checked.gym_id, checked.scenario_name, checked.params
    env_kwargs, overrides, role = checked.env_kwargs, checked.overrides, checked.role
    n_envs, batch_clients, policy, plan = checked.n_envs, checked.batch_clients, checked.policy, checked.plan
    for note in plan.notes:
        warnings.warn(note, TrainingBudgetWarning, stacklevel=2)
    freq = max(plan.actual // 4, 1) if config.checkpoint_freq is None else config.checkpoint_freq
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    env = make_training_env(gym_id, env_kwargs, n_envs, config.seed, batch_clients)
    try:
        scenario = env.get_attr("scenario")[0]
        flat_nvec = np.asarray(scenario.menu(role).nvec).tolist() if env_kwargs.get("flat_actions") else None
        model = algorithm_class(config.algo)(
            policy, env, seed=config.seed, tensorboard_log=str(out / "tb"), device=config.device, verbose=0,
            **plan.kwargs,
        )
        # fails now, not after training, if the policy could not be saved and loaded back
        savable_payload(model, {"algo": config.algo, "role": role}, metadata_path(out / "policy.zip"),
                        flat_nvec=flat_nvec)
    except BaseException:
        env.close()
        raise
    _clear_previous_run(out)  # only now: a run refused above leaves an earlier run's files as they were
    file_values = {k: v for k, v in params.items() if k not in ("env_kwargs", "n_timesteps")}
    metadata: dict[str, Any] = {
        "algo": config.algo,
        "env_id": gym_id,
        "scenario": scenario_name,
        "role": role,
        "opponent": env_kwargs["opponent"] if isinstance(env_kwargs["opponent"], str) else repr(env_kwargs["opponent"]),
        "seed": config.seed,
        "overrides": overrides,
        "flat_actions": bool(env_kwargs.get("flat_actions", False)),
        "batch_clients": batch_clients,
        "hyperparams": {**file_values, "policy": policy, "n_envs": n_envs,
                        **{k: v for k, v in plan.kwargs.items() if k in ("n_steps", "batch_size")}},
        "hyperparams_file": str(config.hyperparams_file or hyperparams_file(config.algo)),
        "requested_timesteps": plan.requested,
        "stable_baselines3": stable_baselines3.__version__,
    }
    callbacks = [leakgym_metrics_callback(plan.rollout if config.algo in ON_POLICY else 64)]
    if freq:
        callbacks.append(_checkpoint_callback(freq, out / "checkpoints", metadata, flat_nvec))
    evaluator = None
    if config.eval_freq:
        # The opponent as it is now: every evaluation starts from it (an Agent object keeps changing in
        # training; a name builds a fresh agent each time).
        opponent = env_kwargs["opponent"]
        template = copy.deepcopy(opponent) if isinstance(opponent, Agent) else opponent
        other = "defender" if role == "attacker" else "attacker"
        episodic = (template if isinstance(template, Agent) else make_agent(template, role=other, scenario=scenario)).episodic

        def make_eval_env(num_envs: int):
            kwargs = {**env_kwargs, "opponent": copy.deepcopy(template) if isinstance(template, Agent) else template}
            return gym.make(gym_id, **kwargs) if num_envs == 1 else gym.make_vec(gym_id, num_envs=num_envs, **kwargs)

        evaluator = eval_callback(make_eval_env, config.eval_freq, config.eval_episodes, config.seed + 10_000,
                                  out / "eval.csv", together=episodic and config.eval_episodes > 1)
        callbacks.append(evaluator)
    if config.progress:
        callbacks.append(_progress_callback(plan.actual))
    if isinstance(config.callback, list):
        callbacks += config.callback
    elif config.callback is not None:
        callbacks.append(config.callback)
    t0 = time.perf_counter()
    interrupted = False
    try:
        model.learn(total_timesteps=plan.actual, callback=CallbackList(callbacks), tb_log_name=f"{config.algo}_{role}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for callback in callbacks:
            if hasattr(callback, "bar"):
                callback.bar.close()
        if getattr(evaluator, "env", None) is not None:
            evaluator.env.close()
        env.close()
    metadata.update(timesteps=int(model.num_timesteps), wall_time_s=round(time.perf_counter() - t0, 3),
                    interrupted=interrupted)
    policy_path = out / "policy.zip"
    save_policy(model, policy_path, metadata, flat_nvec=flat_nvec)
    result = TrainResult(policy_path=policy_path, out=out, metadata=metadata, interrupted=interrupted)
    if interrupted:
        raise TrainingInterrupted(result)
    return result


# ---------------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``leakgym train``."""
    add_env_arguments(parser)
    parser.add_argument("--role", choices=ROLES, default=None,
                        help="which side learns (default: the hyperparameter file's env_kwargs role, attacker)")
    parser.add_argument("--algo", choices=ALGORITHMS, default="ppo",
                        help="Stable-Baselines3 algorithm (dqn plays with flat_actions=True)")
    parser.add_argument("--timesteps", type=int, default=None,
                        help="environment steps (default: the file's n_timesteps; PPO/A2C round up to whole rollouts)")
    parser.add_argument(
        "--opponent", default=None,
        help="frozen opponent: random, round-robin, bandit, a preset, fixed:..., or a policy .zip "
        "(default: the file's env_kwargs opponent, random)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/train"), help="output folder")
    add_hyperparams_argument(parser)
    parser.add_argument("--checkpoint-freq", type=int, default=None,
                        help="checkpoint every N steps (default: a quarter of the run; 0: no checkpoints)")
    parser.add_argument("--eval-freq", type=int, default=0,
                        help="evaluate against the opponent every N steps, to TensorBoard and OUT/eval.csv (0: never)")
    parser.add_argument("--eval-episodes", type=int, default=2, help="episodes per evaluation (default: 2)")
    parser.add_argument("--device", default="cpu", type=device_argument, help="torch device of the policy and of the games")
    parser.add_argument("--n-envs", type=int, default=None,
                        help="games per step (default: the file's n_envs); N > 1 trains on the batched vector env "
                        "(one Round per step for all N games)")
    parser.add_argument("--batch-clients", action=argparse.BooleanOptionalAction, default=None,
                        help="with N > 1 games: batch the victims' clean updates and defenses, benign clients, "
                        "aggregation and evaluation over the games (equal to rounding; default: on whenever "
                        "N > 1; pays off on GPUs and, on a CPU, for the digits LeNet: pass --no-batch-clients "
                        "for the CIFAR ConvNet on a CPU)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    path, hyperparams = split_hyperparams(args.hyperparams)
    if args.n_envs is not None:
        if args.n_envs < 1:
            raise ValueError(f"--n-envs={args.n_envs}; allowed: integers >= 1")
        hyperparams["n_envs"] = args.n_envs
    return TrainConfig(
        env_id=args.env,
        role=args.role,
        algo=args.algo,
        timesteps=args.timesteps,
        opponent=args.opponent,
        out=args.out,
        seed=args.seed,
        overrides=scenario_overrides(args),
        hyperparams=hyperparams,
        hyperparams_file=path,
        checkpoint_freq=args.checkpoint_freq,
        eval_freq=args.eval_freq,
        eval_episodes=args.eval_episodes,
        progress=not args.no_progress,
        device=args.device,
        batch_clients=args.batch_clients,
    )


def main(args: argparse.Namespace) -> int:
    """Run ``leakgym train``; prints where the policy went."""
    apply_threads(args.threads)
    config = config_from_args(args)
    try:
        with readable_warnings():
            result = train(config)
    except TrainingInterrupted as stop:
        meta = stop.result.metadata
        print(f"interrupted after {meta['timesteps']} steps; saved the policy reached so far to "
              f"{stop.result.policy_path} (policy.json says \"interrupted\": true)", file=sys.stderr)
        return INTERRUPTED
    print(f"saved {result.policy_path} ({result.metadata['timesteps']} steps, {result.metadata['wall_time_s']:.1f} s)")
    print(f"TensorBoard: tensorboard --logdir {result.out / 'tb'}")
    if config.eval_freq:
        print(f"evaluations: {result.out / 'eval.csv'}")
    return 0


__all__ = [
    "EVAL_COLUMNS",
    "EVAL_METRICS",
    "StepPlan",
    "TrainConfig",
    "TrainResult",
    "TrainingBudgetWarning",
    "TrainingInterrupted",
    "add_arguments",
    "constructor_kwargs",
    "eval_callback",
    "hyperparams_file",
    "leakgym_metrics_callback",
    "load_hyperparams",
    "main",
    "plan_steps",
    "read_hyperparams_file",
    "run_eval_episodes",
    "train",
]

"""Hyperparameter files in rl-baselines3-zoo's layout: read, checked key by key, and turned into an
algorithm's constructor arguments. LeakGym ships ``agents/experiments/hyperparams/<algo>.yml``; see
:mod:`leakgym.agents.experiments.training`, "Hyperparameters"."""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from leakgym.agents.policies.learned import ACTIVATIONS, ALGORITHMS, algorithm_class
from leakgym.checks import is_integer
from leakgym.suggest import did_you_mean

from ..cli_common import yaml_problem

HYPERPARAMS_DIR = Path(__file__).resolve().parents[1] / "hyperparams"
#: keys of a hyperparameter entry that are not algorithm constructor arguments
RUN_KEYS = ("n_timesteps", "n_envs", "policy", "env_kwargs")
#: the policies LeakGym can save and load back (policy_spec): SB3's MLP policy
POLICIES = ("MlpPolicy",)
#: constructor arguments rl-zoo writes as ``lin_<initial value>`` (a linear schedule to 0)
SCHEDULE_KEYS = ("learning_rate", "clip_range", "clip_range_vf")
#: the on-policy algorithms, which collect whole rollouts of n_steps x n_envs steps
ON_POLICY = ("ppo", "a2c")
#: most values (mappings, lists and scalars, each YAML alias expanded where it is used) a hyperparameter file,
#: or the overrides of a run, may hold: every later reader (the checks, the scenario, policy.json) walks them
#: as a tree, and a "billion laughs" file of nine aliases nine times over is 9**9 values in a few lines.
#: LeakGym's own files hold about 200.
MAX_HYPERPARAMS_VALUES = 100_000
#: deepest nesting of mappings and lists in a hyperparameter file or override (a valid one nests 4 deep)
MAX_HYPERPARAMS_DEPTH = 32


def hyperparams_file(algo: str) -> Path:
    """The rl-zoo hyperparameter file of ``algo`` shipped with LeakGym
    (``agents/experiments/hyperparams/<algo>.yml``)."""
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
    _check_size(data, f"hyperparameter file {str(path)!r}")
    return data


def _check_size(value: Any, where: str) -> None:
    """``ValueError`` naming ``where`` when ``value``, walked as a tree (a value reached twice through YAML
    aliases counted twice, as every later reader walks it), holds more than :data:`MAX_HYPERPARAMS_VALUES`
    values or nests deeper than :data:`MAX_HYPERPARAMS_DEPTH`. The walk stops at the limit, so it costs at
    most that many steps whatever the file expands to."""
    stack = [(value, 0)]
    count = 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_HYPERPARAMS_VALUES:
            raise ValueError(f"{where}: more than {MAX_HYPERPARAMS_VALUES} values with its YAML aliases expanded; "
                             f"allowed: at most {MAX_HYPERPARAMS_VALUES} (MAX_HYPERPARAMS_VALUES)")
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        if depth >= MAX_HYPERPARAMS_DEPTH:
            raise ValueError(f"{where}: mappings and lists nested more than {MAX_HYPERPARAMS_DEPTH} deep; "
                             f"allowed: at most {MAX_HYPERPARAMS_DEPTH} (MAX_HYPERPARAMS_DEPTH)")
        stack.extend((child, depth + 1) for child in children)


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
    if "activation_fn" in value and not (act in ACTIVATIONS if isinstance(act, str) else
                                         inspect.isclass(act) and act.__name__ in ACTIVATIONS):
        raise bad(f"policy_kwargs.activation_fn={act!r}", f"one of {list(ACTIVATIONS)} (torch.nn activations)")
    optimizer = value.get("optimizer_kwargs")
    if isinstance(optimizer, dict) and "lr" in optimizer:  # SB3 passes learning_rate as lr too
        raise bad(f"policy_kwargs.optimizer_kwargs.lr={optimizer['lr']!r}",
                  "no 'lr' key (learning_rate sets the optimiser's learning rate)")
    defaults = ({name: p.default for name, p in inspect.signature(policy_cls.__init__).parameters.items()}
                if inspect.isclass(policy_cls) else {})
    # SB3 passes these mappings on as keyword arguments: an unknown key was a TypeError traceback from
    # deep inside the model's construction
    for key, cls_key, sets in (("optimizer_kwargs", "optimizer_class", ("params", "lr")),
                               ("features_extractor_kwargs", "features_extractor_class", ("observation_space",))):
        target = value.get(cls_key, defaults.get(cls_key))
        if key in value and inspect.isclass(target):
            _check_kwargs(f"policy_kwargs.{key}", value[key], target, sets, bad)
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


def _check_kwargs(what: str, value: Any, cls: type, sets: tuple[str, ...], bad: Callable[..., ValueError]) -> None:
    """``value`` must be null or a mapping of ``cls``'s keyword arguments other than ``sets`` (those SB3 passes
    itself, named in the message)."""
    allowed = sorted(set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs", *sets})
    shape = (f"null or a mapping of {cls.__name__}'s arguments {allowed} (SB3 sets {list(sets)} itself)" if allowed
             else f"null or {{}} (SB3 sets every argument of {cls.__name__} itself: {list(sets)})")
    if value is None:
        return
    if not isinstance(value, dict):
        raise bad(f"{what}={value!r}", shape)
    unknown = sorted(str(k) for k in set(value) - set(allowed))
    if unknown:
        raise bad(f"{what}={value!r}", f"{shape}, not {unknown}")


def _buffer_kwargs(key: str, value: Any, algo: str, bad: Callable[..., ValueError]) -> None:
    """``rollout_buffer_kwargs`` / ``replay_buffer_kwargs``: keys of the buffer SB3 builds (LeakGym refuses
    a buffer class of one's own), less those SB3 passes itself."""
    from stable_baselines3.common.buffers import ReplayBuffer, RolloutBuffer

    if key == "rollout_buffer_kwargs" and algo in ON_POLICY:
        _check_kwargs(key, value, RolloutBuffer, ("buffer_size", "observation_space", "action_space", "device",
                                                   "gamma", "gae_lambda", "n_envs"), bad)
    elif key == "replay_buffer_kwargs" and algo not in ON_POLICY:
        _check_kwargs(key, value, ReplayBuffer, ("buffer_size", "observation_space", "action_space", "device",
                                                  "n_envs", "optimize_memory_usage"), bad)


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
    if key in ("rollout_buffer_kwargs", "replay_buffer_kwargs"):
        _buffer_kwargs(key, value, algo, bad)
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
    _check_size(overrides or {}, "command line (--hyperparams)")  # before deepcopy and the checks walk them
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
    policy_kwargs = params.get("policy_kwargs") or {}
    if (algo == "a2c" and params.get("use_rms_prop", True) and isinstance(policy_kwargs, dict)
            and "optimizer_kwargs" in policy_kwargs and "optimizer_class" not in policy_kwargs):
        # SB3's A2C then sets RMSprop and its own optimizer_kwargs: the given ones were dropped without a word,
        # and checked against Adam's arguments (found in a review)
        raise ValueError(f"{source('policy_kwargs')}: policy_kwargs.optimizer_kwargs="
                         f"{policy_kwargs['optimizer_kwargs']!r} with A2C's use_rms_prop (true by default), which "
                         "replaces them with RMSprop's (alpha=0.99, eps=rms_prop_eps, weight_decay=0); allowed: "
                         "use_rms_prop: false (Adam, with these arguments), or rms_prop_eps without optimizer_kwargs")
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

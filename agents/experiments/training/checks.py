"""Every check of a training run that needs no environment (:func:`check_config`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leakgym.agents.policies.base import Agent
from leakgym.agents.policies.factory import make_agent
from leakgym.agents.policies.learned import ALGORITHMS
from leakgym.agents.policies.scripted import check_role
from leakgym.devices import device_name
from leakgym.suggest import did_you_mean

from ..cli_common import resolve_env
from .config import MAX_TRAIN_SEED, TrainConfig
from .hyperparams import _is_int, constructor_kwargs, load_hyperparams
from .steps import StepPlan, plan_steps

#: ``env_kwargs`` keys that are not scenario overrides
ENV_KEYS = ("role", "opponent", "flat_actions", "render_mode", "device", "max_episode_steps", "batch_attacks")


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
        from leakgym.game.scenario import ALLOW_LARGE_FROM_CALLER

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


def check_outside(spec: Any, out: str | os.PathLike[str], what: str) -> None:
    """``ValueError`` when ``spec`` (an opponent spec: a name, a preset or a policy file) is a policy file in the
    folder ``out`` that a run writes: the run replaces or removes what lies there (its policy, its
    checkpoints; self-play's ``iter_*`` folders), the opponent it reads included."""
    if not isinstance(spec, (str, os.PathLike)):
        return
    path = Path(spec)
    if path.suffix != ".zip" and not path.is_file():
        return  # a name or a preset
    try:
        inside = path.resolve().is_relative_to(Path(out).resolve())
    except (OSError, RuntimeError):  # an unresolvable path: make_agent names it
        return
    if inside:
        raise ValueError(f"{what}={str(spec)!r} lies in --out {str(out)!r}, which this run writes into (and may "
                         "replace it there): copy the policy elsewhere or give another --out")


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
    from leakgym.game.scenario import load_scenario

    if config.algo not in ALGORITHMS:
        raise ValueError(f"algo={config.algo!r}{did_you_mean(config.algo, ALGORITHMS)}; allowed: {ALGORITHMS}")
    if not _is_int(config.seed) or not 0 <= config.seed <= MAX_TRAIN_SEED:
        raise ValueError(f"seed={config.seed!r}; allowed: integers in [0, 2**32 - 1] (Stable-Baselines3 seeds "
                         "numpy's legacy generator with it)")
    # integers, as the seed (bools are not): timesteps=16.7 trained 16 steps and True one, eval_episodes=1.5
    # failed at the final evaluation after the whole run, with no policy saved
    if config.timesteps is not None and not (_is_int(config.timesteps) and config.timesteps >= 1):
        raise ValueError(f"timesteps={config.timesteps!r}; allowed: integers >= 1, or None (the hyperparameter "
                         "file's n_timesteps)")
    for name, what in (("eval_freq", " (0: no evaluations)"), ("eval_episodes", "")):
        if not (_is_int(getattr(config, name)) and getattr(config, name) >= 0):
            raise ValueError(f"{name}={getattr(config, name)!r}; allowed: integers >= 0{what}")
    if config.checkpoint_freq is not None and not (_is_int(config.checkpoint_freq) and config.checkpoint_freq >= 0):
        raise ValueError(f"checkpoint_freq={config.checkpoint_freq!r}; allowed: integers >= 1, 0 (no checkpoints) or "
                         "None (a quarter of the run)")
    if config.batch_clients is not None and not isinstance(config.batch_clients, bool):
        raise ValueError(f"batch_clients={config.batch_clients!r}; allowed: True, False or None (on whenever n_envs > 1)")
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
    check_outside(opponent, config.out, "opponent")
    if not isinstance(opponent, Agent):  # a name, preset or policy path: resolved now, not after the folder is made
        make_agent(opponent, role="defender" if role == "attacker" else "attacker",
                   scenario=load_scenario(scenario_name, **overrides))
    requested = int(config.timesteps if config.timesteps is not None else params.get("n_timesteps", 10_000))
    plan = plan_steps(config.algo, requested, n_envs, constructor_kwargs(params))
    return CheckedConfig(gym_id, scenario_name, params, env_kwargs, overrides, role, n_envs, batch_clients,
                         params.get("policy", "MlpPolicy"), plan)

"""The training loop: :func:`train` builds the env and the model, learns, and saves the policy
(see :mod:`leakgym.agents.experiments.training` for what a run writes)."""

from __future__ import annotations

import contextlib
import copy
import random
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leakgym.agents.policies.base import Agent
from leakgym.agents.policies.factory import make_agent
from leakgym.agents.policies.learned import algorithm_class, metadata_path, savable_payload, save_policy
from leakgym.devices import in_library_modes

from .callbacks import _checkpoint_callback, _progress_callback, eval_callback, leakgym_metrics_callback
from .checks import check_config
from .config import TrainConfig, TrainingInterrupted, TrainResult
from .environment import make_training_env
from .hyperparams import ON_POLICY, hyperparams_file
from .steps import TrainingBudgetWarning


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


def _model_error(config: TrainConfig, exc: BaseException) -> ValueError:
    """One line naming the hyperparameters for an error Stable-Baselines3 (or torch) raised while building the
    model from them: a value the checks of :mod:`.hyperparams` cannot foresee (an optimiser argument of the
    wrong type, say) ended in a traceback from deep inside SB3."""
    where = f"hyperparameter file {str(config.hyperparams_file or hyperparams_file(config.algo))!r}"
    if config.hyperparams:
        where += f" with --hyperparams {config.hyperparams!r}"
    why = " ".join(str(exc).split()) or "(no message)"
    return ValueError(f"{where}: Stable-Baselines3 could not build {config.algo.upper()} from these hyperparameters: "
                      f"{type(exc).__name__}: {why}")


@contextlib.contextmanager
def _callers_random_streams_kept():
    """The global random streams (Python's, NumPy's, torch's CPU and CUDA ones) as they were, afterwards:
    Stable-Baselines3 seeds all of them from the run's seed (``set_random_seed``), so a caller's own
    streams were reset to the same values by every ``train()`` (found in an audit)."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


@in_library_modes
def train(config: TrainConfig) -> TrainResult:
    """Train one policy; see :mod:`leakgym.agents.experiments.training` for what is written to ``config.out``.

    It runs in the library's torch modes (:func:`leakgym.devices.library_modes`) and leaves the caller's
    global random streams as they were (the run draws from its own seed).

    Emits :class:`TrainingBudgetWarning` when the steps played differ from those requested. Raises
    :class:`TrainingInterrupted` (a ``KeyboardInterrupt``) after saving the current policy when
    learning is interrupted.
    """
    with _callers_random_streams_kept():
        return _train(config)


def _train(config: TrainConfig) -> TrainResult:
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.callbacks import CallbackList

    checked = check_config(config)
    gym_id, scenario_name, params = checked.gym_id, checked.scenario_name, checked.params
    env_kwargs, overrides, role = checked.env_kwargs, checked.overrides, checked.role
    n_envs, batch_clients, policy, plan = checked.n_envs, checked.batch_clients, checked.policy, checked.plan
    for note in plan.notes:
        warnings.warn(note, TrainingBudgetWarning, stacklevel=4)  # (the caller of train())
    freq = max(plan.actual // 4, 1) if config.checkpoint_freq is None else config.checkpoint_freq
    out = Path(config.out)

    env = make_training_env(gym_id, env_kwargs, n_envs, config.seed, batch_clients)
    try:
        scenario = env.get_attr("scenario")[0]
        flat_nvec = np.asarray(scenario.menu(role).nvec).tolist() if env_kwargs.get("flat_actions") else None
        try:
            model = algorithm_class(config.algo)(
                policy, env, seed=config.seed, tensorboard_log=str(out / "tb"), device=config.device, verbose=0,
                **plan.kwargs,
            )
        except (TypeError, ValueError, AssertionError) as exc:
            raise _model_error(config, exc) from None
        # fails now, not after training, if the policy could not be saved and loaded back
        savable_payload(model, {"algo": config.algo, "role": role}, metadata_path(out / "policy.zip"),
                        flat_nvec=flat_nvec)
    except BaseException:
        env.close()
        raise
    out.mkdir(parents=True, exist_ok=True)  # only now: a run refused above leaves no folder behind
    _clear_previous_run(out)  # ... and an earlier run's files as they were
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
        if getattr(model, "_logger", None) is not None:  # its TensorBoard writer's thread (one per run before)
            model.logger.close()
    metadata.update(timesteps=int(model.num_timesteps), wall_time_s=round(time.perf_counter() - t0, 3),
                    interrupted=interrupted)
    policy_path = out / "policy.zip"
    save_policy(model, policy_path, metadata, flat_nvec=flat_nvec)
    result = TrainResult(policy_path=policy_path, out=out, metadata=metadata, interrupted=interrupted)
    if interrupted:
        raise TrainingInterrupted(result)
    return result

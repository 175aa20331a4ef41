"""``leakgym train``: a Stable-Baselines3 PPO, A2C or DQN policy for one role against a fixed opponent.

The learner plays the Gymnasium single-agent view ``gym.make(env_id, role=..., opponent=...)``
(see :mod:`leakgym.envs.single_agent`); the opponent is anything :func:`leakgym.agents.make_agent`
accepts (a scripted name, a preset, or a saved policy — which is how self-play freezes a player).

**Hyperparameters** come from ``agents/experiments/hyperparams/<algo>.yml`` in rl-baselines3-zoo's
layout, so ``python -m rl_zoo3.train --gym-packages leakgym -conf agents/experiments/hyperparams/ppo.yml``
reads the same file: one entry per Gymnasium id holding ``env_kwargs`` (``role``, ``opponent``,
``flat_actions`` and scenario overrides, passed to ``gym.make``), ``n_timesteps``, ``n_envs``, ``policy``,
``policy_kwargs`` (a YAML mapping; rl-zoo's ``"dict(...)"`` strings are not evaluated) and the
algorithm's constructor arguments (``lin_<x>`` schedules as in rl-zoo). ``--hyperparams PATH.yml``
reads another file; ``--hyperparams KEY=VALUE`` overrides single values; ``--role``,
``--opponent``, ``--overrides`` and ``--timesteps`` override the file's ``env_kwargs`` and
``n_timesteps``. DQN needs a ``Discrete`` action space: ``--algo dqn`` always plays with
``flat_actions=True``. Every value is checked before the games are built, nested ones too (the keys
of ``optimizer_kwargs``, ``features_extractor_kwargs`` and the buffers' kwargs against what SB3 passes
them to; ``lr`` is ``learning_rate``'s; A2C takes ``optimizer_kwargs`` only with ``use_rms_prop: false``, since
its RMSprop default replaces them); what SB3 still refuses while it builds the model is one
``ValueError`` naming the hyperparameters, and ``OUT`` is made only after that. A file, and the
overrides, may hold at most ``MAX_HYPERPARAMS_VALUES`` values with their YAML aliases expanded, nested
at most ``MAX_HYPERPARAMS_DEPTH`` deep (in :mod:`.hyperparams`).

**Steps.** On-policy algorithms (PPO, A2C) collect whole rollouts of ``n_steps x n_envs`` steps. A
budget smaller than one rollout shrinks ``n_steps`` (and PPO's ``batch_size``) to fit; a budget that
is not a whole number of rollouts is rounded up, with a warning naming both numbers. DQN collects
``train_freq x n_envs`` steps between updates and is rounded up the same way. The progress
bar, the checkpoints and ``policy.json`` count the steps really played.

A run writes, under ``OUT``::

    policy.zip          the final policy (SB3 format; load with make_agent("OUT/policy.zip", ...))
    policy.json         spaces and network architecture (what loading it needs, see
                        :mod:`leakgym.agents.policies.learned`), algorithm, env id, role, opponent, overrides,
                        hyperparameters, requested and played steps, wall time, ``interrupted``
    checkpoints/        policy_<steps>_steps.zip (+ .json) every ``checkpoint_freq`` steps (default: a quarter
                        of the run; 0: none), each saved at the end of the update after the steps passed a
                        multiple of it and labelled with the steps played then (so the last is the final
                        policy; multiples passed within one rollout give one checkpoint)
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

The package, one concept per module (everything above is importable from the package itself):

* :mod:`.hyperparams` — the rl-zoo hyperparameter files: read, checked key by key, constructor arguments;
* :mod:`.steps` — step planning (:func:`plan_steps`, :class:`TrainingBudgetWarning`);
* :mod:`.config` — :class:`TrainConfig`, :class:`TrainResult`, :class:`TrainingInterrupted`;
* :mod:`.checks` — :func:`check_config`, every check that needs no environment;
* :mod:`.environment` — :func:`make_training_env`, the SB3 training env;
* :mod:`.episodes` — evaluation episodes (:func:`evaluate_policy`);
* :mod:`.callbacks` — progress bar, checkpoints, TensorBoard metrics, periodic evaluations;
* :mod:`.loop` — :func:`train`;
* :mod:`.cli` — ``leakgym train``'s arguments and ``main``.
"""

from .callbacks import EVAL_COLUMNS, eval_callback, leakgym_metrics_callback
from .checks import CheckedConfig, check_config
from .config import MAX_TRAIN_SEED, TrainConfig, TrainingInterrupted, TrainResult
from .environment import make_training_env
from .episodes import EVAL_METRICS, evaluate_policy, run_eval_episodes, run_eval_episodes_together
from .hyperparams import constructor_kwargs, hyperparams_file, load_hyperparams, read_hyperparams_file
from .loop import train
from .steps import StepPlan, TrainingBudgetWarning, plan_steps

__all__ = [
    "EVAL_COLUMNS",
    "EVAL_METRICS",
    "MAX_TRAIN_SEED",
    "CheckedConfig",
    "StepPlan",
    "TrainConfig",
    "TrainResult",
    "TrainingBudgetWarning",
    "TrainingInterrupted",
    "check_config",
    "constructor_kwargs",
    "eval_callback",
    "evaluate_policy",
    "hyperparams_file",
    "leakgym_metrics_callback",
    "load_hyperparams",
    "make_training_env",
    "plan_steps",
    "read_hyperparams_file",
    "run_eval_episodes",
    "run_eval_episodes_together",
    "train",
]

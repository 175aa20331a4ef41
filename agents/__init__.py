"""LeakGym agents (installed as ``leakgym.agents``): scripted, adaptive and learned players, and the
experiments that train and evaluate them.

* :mod:`.policies` — the players and how a name becomes one:

  * :mod:`.policies.base` — the :class:`Agent` interface (``reset`` / ``act`` / ``observe``);
  * :mod:`.policies.scripted` — :class:`FixedAgent`, :class:`UniformRandomAgent`, :class:`RoundRobinAgent`;
  * :mod:`.policies.presets` — each paper's recommended setting as a named preset (:data:`PRESETS`);
  * :mod:`.policies.bandit` — :class:`EpsilonGreedyBandit`, which adapts to its opponent;
  * :mod:`.policies.learned` — :class:`LearnedAgent`, a saved Stable-Baselines3 policy (safe policy files);
  * :mod:`.policies.factory` — :func:`make_agent`, which turns a name, preset or policy path into an agent;
  * :mod:`.policies.gym_entry_points` — the Gymnasium entry points: resolve ``opponent`` specs, build
    the views;

* :mod:`.experiments` — the commands that play them (each command module exposes
  ``add_arguments(parser)`` and ``main(args)``):

  * :mod:`.experiments.training` — ``leakgym train`` (:mod:`.experiments.training.cli`): hyperparameter
    files, step planning, run settings and checks, callbacks, evaluation episodes, the training env and
    the loop, one module each;
  * :mod:`.experiments.selfplay` — ``leakgym selfplay``;
  * :mod:`.experiments.evaluation` — ``leakgym eval`` (:mod:`.experiments.evaluation.cli`), split into
    :mod:`~.experiments.evaluation.play` (episodes of a pair), :mod:`~.experiments.evaluation.payoff`
    (per-pair statistics), :mod:`~.experiments.evaluation.analysis` (best responses, equilibria),
    :mod:`~.experiments.evaluation.reporting` (payoff files, gallery) and
    :mod:`~.experiments.evaluation.episode_log` (per-episode rows written as pairs finish; ``--resume``);
  * :mod:`.experiments.metagame` — ``leakgym metagame`` (PSRO);
  * :mod:`.experiments.cli_common` — the arguments and helpers the commands share;
  * ``experiments/hyperparams/<algo>.yml`` — the rl-zoo hyperparameter files ``leakgym train`` reads.
"""

from . import policies
from .policies import *  # leakgym.agents re-exports the players (leakgym.agents.policies)

__all__ = policies.__all__

"""LeakGym agents (installed as ``leakgym.agents``): scripted, adaptive and learned players.

* :mod:`.base` — the :class:`Agent` interface (``reset`` / ``act`` / ``observe``);
* :mod:`.scripted` — :class:`FixedAgent`, :class:`UniformRandomAgent`, :class:`RoundRobinAgent`;
* :mod:`.presets` — each paper's recommended setting as a named preset (:data:`PRESETS`);
* :mod:`.bandit` — :class:`EpsilonGreedyBandit`, which adapts to its opponent;
* :mod:`.learned` — :class:`LearnedAgent`, a saved Stable-Baselines3 policy;
* :mod:`.factory` — :func:`make_agent`, which turns a name, preset or policy path into an agent;
* :mod:`.gym_entry_points` — the Gymnasium entry points: resolve ``opponent`` specs, build the views;
* :mod:`.training` / :mod:`.selfplay` / :mod:`.evaluation` — ``leakgym train``, ``leakgym selfplay``
  and ``leakgym eval`` (each exposes ``add_arguments(parser)`` and ``main(args)``); evaluation is
  split into :mod:`.play` (episodes of a pair), :mod:`.payoff` (per-pair statistics),
  :mod:`.analysis` (best responses, equilibria), :mod:`.reporting` (payoff files, gallery) and
  :mod:`.episode_log` (per-episode rows written as pairs finish; ``--resume``).
"""

from .bandit import EpsilonGreedyBandit, default_arms
from .base import Agent, UniformRandomAgent
from .factory import agent_names, make_agent
from .learned import LearnedAgent, load_policy, save_policy
from .presets import PRESETS, Preset, get_preset, preset_action, preset_names, valid_presets
from .scripted import FixedAgent, RoundRobinAgent, fixed_from_settings

__all__ = [
    "PRESETS",
    "Agent",
    "EpsilonGreedyBandit",
    "FixedAgent",
    "LearnedAgent",
    "Preset",
    "RoundRobinAgent",
    "UniformRandomAgent",
    "agent_names",
    "default_arms",
    "fixed_from_settings",
    "get_preset",
    "load_policy",
    "make_agent",
    "preset_action",
    "preset_names",
    "save_policy",
    "valid_presets",
]

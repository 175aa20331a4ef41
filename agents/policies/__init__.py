"""The players (``leakgym.agents.policies``): the :class:`Agent` interface, scripted agents, paper presets,
the ε-greedy bandit, learned policies (safe policy files), and the resolution of a name, preset or policy
path into an agent (:func:`make_agent`; the Gymnasium entry points' ``opponent`` specs).

Everything here is re-exported by :mod:`leakgym.agents`.
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

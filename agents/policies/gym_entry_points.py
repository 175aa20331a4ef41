"""Gymnasium entry points of the LeakGym ids: resolve the ``opponent`` spec, then build the view.

``gym.make("LeakGym-Digits-v0", role="attacker", opponent="random")`` and
``gym.make_vec(..., num_envs=N)`` land here (see :mod:`leakgym.envs.registration`). Turning a name,
preset or policy path into an agent is the agents package's job (:func:`leakgym.agents.make_agent`);
the environments themselves only take agent objects, so ``leakgym.envs`` never imports
``leakgym.agents``.
"""

from __future__ import annotations

import copy
from typing import Any

from leakgym.checks import is_integer
from leakgym.envs.single_agent import ROLES, LeakGymSingleAgentEnv
from leakgym.envs.vector import LeakGymVectorEnv
from leakgym.game.scenario import Scenario, load_scenario

from .base import Agent
from .factory import make_agent

#: the opponent each role meets when ``opponent`` is not given
DEFAULT_OPPONENT = {"attacker": "random", "defender": "random"}


def _opponent(spec: Any, role: str, scenario: Scenario):
    if role not in ROLES:
        raise ValueError(f"role={role!r}; allowed: {ROLES}")
    other = "defender" if role == "attacker" else "attacker"
    return make_agent(DEFAULT_OPPONENT[role] if spec is None else spec, role=other, scenario=scenario)


def make_single_agent_env(
    scenario: str | Scenario = "digits", role: str = "attacker", opponent: Any = None, **kwargs: Any
) -> LeakGymSingleAgentEnv:
    """The single-agent view, with ``opponent`` resolved by :func:`leakgym.agents.make_agent`."""
    sc, rest = _scenario(scenario, kwargs)
    return LeakGymSingleAgentEnv(sc, role=role, opponent=_opponent(opponent, role, sc), **rest)


#: keyword arguments of the views that are not scenario fields
VIEW_ARGUMENTS = ("render_mode", "render_dir", "device", "flat_actions")


def _scenario(scenario: str | Scenario, kwargs: dict[str, Any]) -> tuple[Scenario, dict[str, Any]]:
    overrides = {k: v for k, v in kwargs.items() if k not in VIEW_ARGUMENTS}
    return load_scenario(scenario, **overrides), {k: v for k, v in kwargs.items() if k in VIEW_ARGUMENTS}


def make_vector_env(
    num_envs: int = 1, scenario: str | Scenario = "digits", role: str = "attacker", opponent: Any = None,
    **kwargs: Any,
) -> LeakGymVectorEnv:
    """The vector env; every game gets its own opponent agent (agents keep per-episode state).

    ``opponent`` given as an :class:`~leakgym.agents.Agent` object is a template: each game plays a
    deep copy of it (the object itself is not stepped), so game ``i`` meets the opponent it would meet
    alone -- a shared instance would carry one game's per-episode state (a round-robin position, a
    bandit's pending arm) into its neighbours' rounds.
    ``max_episode_steps`` (from ``gym.make_vec(..., max_episode_steps=K)``; the ids register none,
    the horizon is ``rounds``) truncates every game after ``K`` steps, as Gymnasium's ``TimeLimit``
    does for the single-agent view (``-1``: no limit, as in ``gym.make``). ``autoreset_mode``
    (``gym.make_vec(..., autoreset_mode=AutoresetMode.SAME_STEP)``; Gymnasium refuses ``vector_kwargs`` for a
    vector entry point) picks when finished games reset (:class:`~leakgym.envs.vector.LeakGymVectorEnv`).
    """
    max_steps = kwargs.pop("max_episode_steps", None)
    batch_attacks = kwargs.pop("batch_attacks", True)
    batch_clients = kwargs.pop("batch_clients", False)
    autoreset = {"autoreset_mode": kwargs.pop("autoreset_mode")} if "autoreset_mode" in kwargs else {}
    sc, rest = _scenario(scenario, kwargs)
    if not is_integer(num_envs) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r}; allowed: integers >= 1")
    opponents = [_opponent(copy.deepcopy(opponent) if isinstance(opponent, Agent) else opponent, role, sc)
                 for _ in range(num_envs)]
    return LeakGymVectorEnv(num_envs=num_envs, opponents=opponents, scenario=sc, role=role,
                            batch_attacks=batch_attacks, batch_clients=batch_clients,
                            max_episode_steps=max_steps, **autoreset, **rest)


__all__ = ["DEFAULT_OPPONENT", "make_single_agent_env", "make_vector_env"]

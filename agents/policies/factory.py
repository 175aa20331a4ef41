"""``make_agent``: one string (or object) names any LeakGym agent.

Accepted specs:

==============================  ===============================================================
spec                            agent
==============================  ===============================================================
an :class:`Agent` instance      itself
``"random"``                    :class:`UniformRandomAgent`
``"round-robin"``               :class:`RoundRobinAgent` sweeping every value of each dimension
``"bandit"``                    :class:`EpsilonGreedyBandit` over the role's default arms
``"fixed:<a0>,<a1>,..."``       :class:`FixedAgent` playing that raw action
a preset name (``"dcs2-paper"``)  :class:`FixedAgent` playing the preset (see :mod:`.presets`)
a path to a ``.zip``            :class:`LearnedAgent`: a policy saved by ``leakgym train`` (``.zip`` + ``.json``)
==============================  ===============================================================

Used by the Gymnasium single-agent view for its ``opponent`` argument, by ``leakgym eval`` and by
self-play.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leakgym.suggest import did_you_mean

from .bandit import EpsilonGreedyBandit
from .base import Agent, UniformRandomAgent
from .learned import LearnedAgent
from .presets import PRESETS, preset_action, preset_names
from .scripted import FixedAgent, RoundRobinAgent, check_role

SCRIPTED_NAMES = ("random", "round-robin", "bandit")


def agent_names() -> list[str]:
    """Every name :func:`make_agent` understands (besides policy paths and ``fixed:...``)."""
    return [*SCRIPTED_NAMES, "fixed:<comma-separated action>", *preset_names(), "<path to policy .zip>"]


def _resolve_scenario(scenario: Any):
    from leakgym.game.scenario import Scenario, load_scenario

    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, str):
        return load_scenario(scenario)
    raise ValueError(f"scenario={scenario!r}; expected a Scenario or a scenario name")


def make_agent(spec: Any, *, role: str, scenario: Any) -> Agent:
    """The agent that ``spec`` names, for ``role`` in ``scenario`` (a Scenario or its name).

    Raises ``ValueError`` for unknown names (listing the allowed ones), for a preset of the other
    role or one the scenario's menu cannot express, and for ``fixed:`` actions outside the role's
    action space.
    """
    check_role(role)
    if isinstance(spec, Agent):
        return spec
    if isinstance(spec, Path):
        spec = str(spec)
    if not isinstance(spec, str):
        raise ValueError(  # noqa: TRY004 - the project reports every bad input as ValueError
            f"agent spec {spec!r} must be an Agent or a string; allowed names: {agent_names()}"
        )
    sc = _resolve_scenario(scenario)
    nvec = sc.attacker_nvec if role == "attacker" else sc.defender_nvec
    if spec == "random":
        return UniformRandomAgent()
    if spec == "round-robin":
        return RoundRobinAgent()
    if spec == "bandit":
        return EpsilonGreedyBandit(scenario=sc, role=role)
    if spec.startswith("fixed:"):
        body = spec[len("fixed:"):]
        try:
            action = [int(tok) for tok in body.split(",")]
        except ValueError:
            raise ValueError(f"agent spec {spec!r}: expected fixed:<comma-separated integers>") from None
        if len(action) != len(nvec) or any(not 0 <= a < n for a, n in zip(action, nvec)):
            raise ValueError(
                f"agent spec {spec!r}: the {role} action needs {len(nvec)} entries with entry i in "
                f"0..nvec[i]-1, nvec = {nvec.tolist()}"
            )
        return FixedAgent(action)
    if spec in PRESETS:
        return FixedAgent(preset_action(spec, sc, role), name=spec)
    if spec.endswith(".zip") or Path(spec).is_file():
        return LearnedAgent(spec, role=role, scenario=sc)
    raise ValueError(f"unknown agent {spec!r}{did_you_mean(spec, [*SCRIPTED_NAMES, *preset_names()])}; "
                     f"allowed: {agent_names()}")


__all__ = ["SCRIPTED_NAMES", "agent_names", "make_agent"]

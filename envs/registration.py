"""Gymnasium registration: one id per scenario TOML file (``gym_id`` key), done on ``import leakgym``."""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from .scenario import SCENARIO_DIR, scenario_gym_id, scenario_names, tomllib


def _rounds(name: str) -> int:
    """The scenario's episode length, read from its TOML file (the id's ``max_episode_steps``)."""
    with open(SCENARIO_DIR / f"{name}.toml", "rb") as fh:
        return int(tomllib.load(fh).get("rounds", 8))


def registered_ids() -> dict[str, str]:
    """Gymnasium id -> scenario name."""
    return {scenario_gym_id(name): name for name in scenario_names()}


def register_envs() -> None:
    for gym_id, name in registered_ids().items():
        if gym_id in registry:
            continue
        register(
            id=gym_id,
            entry_point="leakgym.agents.gym_entry_points:make_single_agent_env",
            vector_entry_point="leakgym.agents.gym_entry_points:make_vector_env",
            kwargs={"scenario": name},
            # The horizon is the scenario's ``rounds``; gym.make(id, rounds=R, max_episode_steps=R)
            # for a longer override (the entry point warns when only ``rounds`` grows).
            max_episode_steps=_rounds(name),
        )

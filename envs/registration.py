"""Gymnasium registration: one id per scenario TOML file (``gym_id`` key), done on ``import leakgym``."""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from leakgym.game.scenario import scenario_gym_id, scenario_names


def registered_ids() -> dict[str, str]:
    """Gymnasium id -> scenario name."""
    return {scenario_gym_id(name): name for name in scenario_names()}


def register_envs() -> None:
    for gym_id, name in registered_ids().items():
        if gym_id in registry:
            continue
        register(
            id=gym_id,
            entry_point="leakgym.agents.policies.gym_entry_points:make_single_agent_env",
            vector_entry_point="leakgym.agents.policies.gym_entry_points:make_vector_env",
            kwargs={"scenario": name},
            # No max_episode_steps: the horizon is the scenario's ``rounds`` alone -- the game ends
            # (terminates) after its last round, so gym.make(id, rounds=12) plays 12 rounds (a registered
            # TimeLimit would cut an overridden horizon short). An explicit max_episode_steps=K still
            # truncates after K steps: Gymnasium's TimeLimit for gym.make, the vector env's own count
            # for gym.make_vec, with the same observations (tests/test_env_gym.py).
        )

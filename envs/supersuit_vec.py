"""The parallel env through SuperSuit's vector wrappers in one call: :func:`supersuit_vec_env`.

SuperSuit turns a PettingZoo ``ParallelEnv`` into an SB3 (or Gymnasium) vector env in which every
agent of every game is one slot, so one shared policy plays both roles::

    from stable_baselines3 import PPO
    from leakgym.envs import supersuit_vec_env

    venv = supersuit_vec_env("digits", num_envs=4, invalid_action="raise", **overrides)  # 8 slots
    PPO("MlpPolicy", venv).learn(10_000)

It needs four wrappers in order (flat ``Discrete`` actions, padded observations, an agent indicator,
``pettingzoo_env_to_vec_env_v1`` and ``concat_vec_envs_v1``), and every agent's action space must be
the same. The roles' flat menus differ in size (72 attacker and 144 defender actions in ``digits``),
and SuperSuit's own ``pad_action_space_v0`` turns an out-of-menu action into action 0 without a word,
so a shared policy's attacker action 100 would silently play attacker action 0. This recipe never
remaps: with ``invalid_action="refuse"`` (the default) it refuses unequal menus with a ``ValueError``
naming both sizes; with ``invalid_action="raise"`` it pads the smaller menu (:class:`PaddedFlatActions`)
and a padded action raises ``ValueError`` at ``step``, naming the agent, the action and its range (use
it with a policy that masks or never samples those actions). Menus of equal size (``attacker_menu`` /
``defender_menu`` overrides) need neither.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseParallelWrapper

from leakgym.game.scenario import Scenario

from .leakgym_env import LeakGymParallelEnv, parallel_env

#: what :func:`supersuit_vec_env` does when the roles' flat menus differ in size
INVALID_ACTION_MODES = ("refuse", "raise")


class PaddedFlatActions(BaseParallelWrapper):
    """Every agent gets ``Discrete(n)``, ``n`` the largest flat menu; an action past the agent's own menu
    raises ``ValueError`` (never a remap). The env must have been made with ``flat_actions=True``."""

    def __init__(self, env: LeakGymParallelEnv) -> None:
        super().__init__(env)
        if not getattr(env.unwrapped, "flat_actions", False):
            raise ValueError("PaddedFlatActions needs parallel_env(..., flat_actions=True)")
        self.possible_agents = list(env.possible_agents)
        self.menu_sizes = {a: int(env.action_space(a).n) for a in self.possible_agents}
        self._space = spaces.Discrete(max(self.menu_sizes.values()))

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._space

    def step(self, actions: dict[str, Any]):
        # Only a known agent's action can be a padding action; anything else (not a dict, an unknown agent, an
        # action numpy cannot read) is left to the env's own check, which names what is allowed.
        for agent, action in (actions.items() if isinstance(actions, dict) else ()):
            n = self.menu_sizes.get(agent)
            if n is None:
                continue
            try:
                arr = np.asarray(action)
            except (TypeError, ValueError, RuntimeError):
                continue
            if arr.size == 1 and arr.dtype.kind in "iuf" and np.isfinite(arr).all() and int(arr.reshape(-1)[0]) >= n:
                raise ValueError(
                    f"{agent} flat action {int(arr.reshape(-1)[0])} is a padding action: the {agent}'s menu has "
                    f"{n} actions (0..{n - 1}); the padded space Discrete({self._space.n}) is shared with "
                    f"{', '.join(f'{a} ({m})' for a, m in self.menu_sizes.items() if a != agent)}")
        return self.env.step(actions)


def supersuit_vec_env(scenario: str | Scenario = "digits", num_envs: int = 1, *, invalid_action: str = "refuse",
                      agent_indicator: bool = True, num_cpus: int = 0, base_class: str = "stable_baselines3",
                      **overrides: Any):
    """``num_envs`` parallel LeakGym games as one SuperSuit vector env of ``2 * num_envs`` slots
    (slot ``2 * i`` is game ``i``'s attacker, ``2 * i + 1`` its defender).

    Args:
        scenario: scenario name (``"digits"``, ...) or :class:`~leakgym.game.scenario.Scenario`.
        num_envs: games (each contributes one slot per agent).
        invalid_action: ``"refuse"``: unequal flat menu sizes are a ``ValueError`` here;
            ``"raise"``: pad the smaller menu, and a padded action raises ``ValueError`` at ``step``.
        agent_indicator: append a one-hot of the role to each observation (``agent_indicator_v0``), so a
            shared policy knows which role it plays.
        num_cpus: SuperSuit's worker processes (0: all games in this process).
        base_class: ``"stable_baselines3"`` (an SB3 ``VecEnv``) or ``"gymnasium"``.
        **overrides: :func:`~leakgym.envs.parallel_env` arguments (scenario fields, ``max_cycles``, ...).
    """
    try:
        import supersuit as ss
    except ImportError as exc:  # pragma: no cover - SuperSuit is in the dev extra
        raise ImportError("supersuit_vec_env needs SuperSuit: pip install 'supersuit>=3.9'") from exc
    if invalid_action not in INVALID_ACTION_MODES:
        raise ValueError(f"invalid_action={invalid_action!r}; allowed: {INVALID_ACTION_MODES}")
    if overrides.get("flat_actions", True) is not True:
        raise ValueError("supersuit_vec_env always uses flat actions (SuperSuit pads Discrete spaces only); "
                         "do not pass flat_actions=False")
    overrides.pop("flat_actions", None)
    env = parallel_env(scenario, flat_actions=True, **overrides)
    sizes = {a: int(env.action_space(a).n) for a in env.possible_agents}
    if len(set(sizes.values())) > 1:
        if invalid_action == "refuse":
            env.close()
            raise ValueError(
                f"the roles' flat menus differ in size ({', '.join(f'{a} {n}' for a, n in sizes.items())}) and "
                "SuperSuit needs one action space for all agents; its pad_action_space_v0 would silently play "
                "action 0 for any action past the smaller menu. Pass invalid_action='raise' (pad; a padded action "
                "raises at step), give the menus equal sizes (attacker_menu/defender_menu overrides), or train "
                "one role on gym.make / make_sb3_vec")
        env = PaddedFlatActions(env)
    env = ss.pad_observations_v0(env)
    if agent_indicator:
        env = ss.agent_indicator_v0(env)
    venv = ss.pettingzoo_env_to_vec_env_v1(env)
    return ss.concat_vec_envs_v1(venv, num_envs, num_cpus=num_cpus, base_class=base_class)


__all__ = ["INVALID_ACTION_MODES", "PaddedFlatActions", "supersuit_vec_env"]

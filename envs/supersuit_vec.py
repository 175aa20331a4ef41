"""The parallel env through SuperSuit's vector wrappers in one call: :func:`supersuit_vec_env`.

SuperSuit turns a PettingZoo ``ParallelEnv`` into an SB3 (or Gymnasium) vector env in which every
agent of every game is one slot, so one shared policy plays both roles::

    from stable_baselines3 import PPO
    from leakgym.envs import supersuit_vec_env

    # an attacker menu as large as the defender's 144 flat actions: one shared Discrete(144), no padding
    menu = {"strategy": ["inverting-gradients", "dlg", "prior-init", "gradinversion"],
            "iterations": [20, 60, 150], "restarts": [1, 2, 4, 8], "tv": [0.0, 1e-4, 1e-2]}
    venv = supersuit_vec_env("digits", num_envs=4, attacker_menu=menu)  # 8 slots
    PPO("MlpPolicy", venv, seed=0).learn(10_000)

It needs four wrappers in order (flat ``Discrete`` actions, padded observations, an agent indicator,
``pettingzoo_env_to_vec_env_v1`` and ``concat_vec_envs_v1``), and every agent's action space must be
the same. The roles' flat menus differ in size (72 attacker and 144 defender actions in ``digits``),
and SuperSuit's own ``pad_action_space_v0`` turns an out-of-menu action into action 0 without a word,
so a shared policy's attacker action 100 would silently play attacker action 0. This recipe never
remaps: with ``invalid_action="refuse"`` (the default) it refuses unequal menus with a ``ValueError``
naming both sizes; with ``invalid_action="raise"`` it pads the smaller menu (:class:`PaddedFlatActions`)
and a padded action raises ``ValueError`` at ``step``, naming the agent, the action and its range (use
it with a policy that masks or never samples those actions: an unmasked PPO samples the padding). Menus
of equal size (``attacker_menu`` / ``defender_menu`` overrides, as above) need neither.

A vector step checks every slot's action before any game plays (:class:`SlotActions`), so a refused step
leaves every game as it was; SuperSuit steps the games one after another, and a bad action in game 1
used to be refused after game 0 had played its round. With ``base_class="stable_baselines3"`` the env
takes SB3's seeding (``PPO(..., seed=s)`` or ``venv.seed(s)``, then
``reset()``; game ``i`` gets ``s + i``), which SuperSuit's own SB3 wrapper lacks (its ``seed`` calls a
method ``ConcatVecEnv`` does not have).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseParallelWrapper

from leakgym.checks import is_integer
from leakgym.game.menus import FlatActions
from leakgym.game.scenario import Scenario

from .checks import check_seed
from .leakgym_env import LeakGymParallelEnv, parallel_env

#: what :func:`supersuit_vec_env` does when the roles' flat menus differ in size
INVALID_ACTION_MODES = ("refuse", "raise")
#: the vector env :func:`supersuit_vec_env` returns
BASE_CLASSES = ("stable_baselines3", "gymnasium")


def padding_refusal(menu_sizes: dict[str, int], agent: str, action: Any) -> str | None:
    """Why ``agent``'s ``action`` is a padding action of the shared ``Discrete(max(menu_sizes))`` (in it, but
    past the agent's own menu), or None. Anything else wrong with it is left to the env's own check."""
    n = menu_sizes.get(agent)
    if n is None:
        return None
    try:
        arr = np.asarray(action)
    except (TypeError, ValueError, RuntimeError):
        return None
    if (arr.size == 1 and arr.dtype.kind in "iuf" and np.isfinite(arr).all()
            and float(arr.reshape(-1)[0]).is_integer()  # (2.5 was "flat action 2 is a padding action")
            and n <= int(arr.reshape(-1)[0]) < max(menu_sizes.values())):
        others = ", ".join(f"{a} ({m})" for a, m in menu_sizes.items() if a != agent)
        return (f"{agent} flat action {int(arr.reshape(-1)[0])} is a padding action: the {agent}'s menu has {n} "
                f"actions (0..{n - 1}); the padded space Discrete({max(menu_sizes.values())}) is shared with {others}")
    return None


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
            refusal = padding_refusal(self.menu_sizes, agent, action)
            if refusal is not None:
                raise ValueError(refusal)
        return self.env.step(actions)


class SlotActions:
    """The check of one vector step's actions, slot ``k`` being agent ``agents[k % len(agents)]`` of game
    ``k // len(agents)``: one action per slot, none a padding action, each one its agent's menu accepts.
    ``ValueError`` naming the slot before any game plays (SuperSuit steps the games one after another)."""

    def __init__(self, env: LeakGymParallelEnv, num_slots: int) -> None:
        self.agents = list(env.possible_agents)
        self.num_slots = num_slots
        self.menus = {a: FlatActions(env.scenario.menu(a)) for a in self.agents}
        self.menu_sizes = {a: m.n for a, m in self.menus.items()}

    def check(self, actions: Any) -> None:
        # SuperSuit concatenates the slots' actions into an integer array: anything else (floats, a 2-d
        # array) passed a looser check here and failed inside SuperSuit with numpy's own error (found in review)
        allowed = f"allowed: a 1-d integer array of {self.num_slots} flat actions, one per slot"
        try:
            arr = np.asarray(actions)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"actions={actions!r}; {allowed}") from None
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"actions of shape {arr.shape} and dtype {arr.dtype}; {allowed}")
        if len(arr) != self.num_slots:
            raise ValueError(f"{len(arr)} actions for {self.num_slots} slots ({self.num_slots // len(self.agents)} "
                             f"games x {self.agents}); {allowed}")
        for k, action in enumerate(arr):
            agent = self.agents[k % len(self.agents)]
            try:
                refusal = padding_refusal(self.menu_sizes, agent, action)
                if refusal is not None:
                    raise ValueError(refusal)
                self.menus[agent].to_multi(action)
            except ValueError as err:
                raise ValueError(f"slot {k} (game {k // len(self.agents)}'s {agent}): {err}") from None


class CheckedSlotsVecEnv(gymnasium.vector.VectorWrapper):
    """SuperSuit's Gymnasium vector env whose ``step`` checks every slot's action first (:class:`SlotActions`)."""

    def __init__(self, env: gymnasium.vector.VectorEnv, slots: SlotActions) -> None:
        super().__init__(env)
        self.slots = slots

    def step(self, actions: Any):
        self.slots.check(actions)
        return self.env.step(actions)

    def __getattr__(self, name: str) -> Any:
        """SuperSuit's own attributes (``vec_envs``, ``env_is_wrapped``, ...), as without this wrapper."""
        if name.startswith("_") or name in ("env", "slots"):  # (not set yet: while a copy is being built)
            raise AttributeError(name)
        return getattr(self.env, name)


def _sb3_vec_env(venv: gymnasium.vector.VectorEnv, slots: SlotActions):
    """SuperSuit's SB3 wrapper of ``venv`` with SB3's seeding and the slot check (:class:`SeededSB3VecEnv`)."""
    from supersuit.vector.sb3_vector_wrapper import SB3VecEnvWrapper

    class SeededSB3VecEnv(SB3VecEnvWrapper):
        """SuperSuit's ``SB3VecEnvWrapper`` with SB3's seeding: ``seed(s)`` takes effect at the next ``reset()``
        (game ``i`` gets ``s + i``), as SB3's own vector envs do; ``step_async`` checks every slot's action
        before any game plays."""

        def __init__(self, venv: gymnasium.vector.VectorEnv) -> None:
            super().__init__(venv)
            self.slots = slots
            self._next_seed: int | None = None

        def seed(self, seed: int | None = None) -> Sequence[int | None]:
            self._next_seed = check_seed(seed)
            return [None if seed is None else self._next_seed + k // len(slots.agents) for k in range(self.num_envs)]

        def reset(self, seed: int | None = None, options: dict | None = None):
            if seed is not None:
                self.seed(seed)
            seed, self._next_seed = self._next_seed, None
            observations, self.reset_infos = self.venv.reset(seed=seed, options=options)
            return observations

        def step_async(self, actions: Any) -> None:
            self.slots.check(actions)
            self.venv.step_async(actions)

    return SeededSB3VecEnv(venv)


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
        num_cpus: 0, every game in this process (the only value taken). SuperSuit's worker processes
            (``num_cpus > 0``) seed game ``i`` of worker ``w`` with ``s + w + i``, so two games share a
            seed whenever a worker holds several; they return their reset infos per worker, not per slot;
            and forked after torch's OpenMP threads have run (building the env runs them), they hang at
            their first computation (found in an audit). :func:`~leakgym.envs.make_sb3_vec` plays every
            game in one batched computation instead.
        base_class: ``"stable_baselines3"`` (an SB3 ``VecEnv``) or ``"gymnasium"``.
        **overrides: :func:`~leakgym.envs.parallel_env` arguments (scenario fields, ``max_cycles``, ...).
    """
    try:
        import supersuit as ss
    except ImportError as exc:  # pragma: no cover - SuperSuit is in the dev extra
        raise ImportError("supersuit_vec_env needs SuperSuit: pip install 'supersuit>=3.9'") from exc
    if invalid_action not in INVALID_ACTION_MODES:
        raise ValueError(f"invalid_action={invalid_action!r}; allowed: {INVALID_ACTION_MODES}")
    if not is_integer(num_envs) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r}; allowed: integers >= 1")
    if not is_integer(num_cpus) or num_cpus != 0:
        raise ValueError(f"num_cpus={num_cpus!r}; allowed: 0 (every game in this process: SuperSuit's worker "
                         "processes give two games one seed, return their reset infos per worker, and hang when "
                         "forked after torch's threads have run; make_sb3_vec batches the games in one process)")
    if base_class not in BASE_CLASSES:
        raise ValueError(f"base_class={base_class!r}; allowed: {BASE_CLASSES}")
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
    slots = SlotActions(env.unwrapped, 2 * int(num_envs))
    env = ss.pad_observations_v0(env)
    if agent_indicator:
        env = ss.agent_indicator_v0(env)
    venv = ss.pettingzoo_env_to_vec_env_v1(env)
    venv = ss.concat_vec_envs_v1(venv, int(num_envs), num_cpus=0, base_class="gymnasium")
    return _sb3_vec_env(venv, slots) if base_class == "stable_baselines3" else CheckedSlotsVecEnv(venv, slots)


__all__ = ["BASE_CLASSES", "INVALID_ACTION_MODES", "CheckedSlotsVecEnv", "PaddedFlatActions", "SlotActions",
           "padding_refusal", "supersuit_vec_env"]

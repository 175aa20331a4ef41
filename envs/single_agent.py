"""Gymnasium single-agent views of the LeakGym game: play one role against a fixed opponent.

``gym.make("LeakGym-Digits-v0", role="attacker", opponent="random")`` returns the attacker's view
against a uniformly randomised scripted defender (the default). The Gymnasium entry point
(:mod:`leakgym.agents.policies.gym_entry_points`) turns ``opponent`` names, presets and policy paths into
agents; this class itself takes the opponent *object*: anything with
``act(observation, action_space, rng) -> action`` (optionally ``reset(seed)`` and
``observe(reward, info)``, as :class:`leakgym.agents.Agent` has), or a plain callable
``f(observation, action_space, rng) -> action``. The opponent's randomness is drawn from a generator
seeded by ``reset(seed=...)``, so the view is deterministic for SB3's and Gymnasium's ``check_env``
with an opponent that does not learn across episodes (a bandit opponent updates its estimates from
every episode, by design: the same seed later plays against a wiser opponent).

A step first validates the learner's action, then lets the opponent act, then plays the round
(:func:`leakgym.game.round.play_round`); a rejected action or a failed round leaves the view, its
opponent generator and its game exactly as they were.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from leakgym.game.menus import FlatActions
from leakgym.game.records import RoundOutcome
from leakgym.game.round import play_round
from leakgym.game.scenario import Scenario

from .checks import check_seed
from .leakgym_env import LeakGymParallelEnv

ROLES = ("attacker", "defender")


class CallableOpponent:
    """Adapts ``f(observation, action_space, rng) -> action`` to the opponent protocol (``act`` only:
    the view calls ``reset``/``observe`` only on opponents that have them). A plain callable is not
    snapshotted before a step (:meth:`get_state` is None): the view cannot see state hidden inside it,
    and a copy would cut it off from objects the caller shares with it (a policy trained elsewhere)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", "callable")

    def act(self, observation, action_space, rng):
        return self.fn(observation, action_space, rng)

    def get_state(self) -> None:
        return None

    def set_state(self, state: None) -> None:
        """Nothing to restore (see the class docstring)."""


def as_opponent(opponent: Any) -> Any:
    """An opponent object from an agent-like object or a callable; ``ValueError`` otherwise."""
    if hasattr(opponent, "act"):
        return opponent
    if callable(opponent):
        return CallableOpponent(opponent)
    raise ValueError(
        f"opponent={opponent!r}: expected an object with act(observation, action_space, rng) or such a "
        "callable; names, presets and policy files are resolved by gym.make(...) or "
        "leakgym.agents.make_agent"
    )


def agent_state(agent: Any) -> Any:
    """A copy of what ``agent.act``/``observe`` may change, so that a failed step can be undone: the
    agent's ``get_state()`` where it has one (:meth:`leakgym.agents.Agent.get_state`), else a deep copy
    of its attributes."""
    if hasattr(agent, "get_state"):
        return agent.get_state()
    return copy.deepcopy(vars(agent)) if hasattr(agent, "__dict__") else None


def restore_agent_state(agent: Any, state: Any) -> None:
    """Put back what :func:`agent_state` copied."""
    if hasattr(agent, "set_state"):
        agent.set_state(state)
    elif state is not None:
        vars(agent).clear()
        vars(agent).update(state)


class LeakGymSingleAgentEnv(gym.Env):
    """One role of the LeakGym game (attacker or defender) against a fixed opponent.

    Args:
        scenario: a scenario name or :class:`~leakgym.game.scenario.Scenario`.
        role: ``"attacker"`` or ``"defender"``: the role the learner plays.
        opponent: the other role's agent object or callable (see the module docstring).
        render_mode: ``None``, ``"human"``, ``"rgb_array"`` or ``"png"``.
        **overrides: scenario overrides (``rounds=4``, ...), ``device="cuda"``, ``flat_actions=True``
            (a ``Discrete`` action space for the learner; the opponent keeps ``MultiDiscrete``).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["human", "rgb_array", "png"], "render_fps": 2}

    def __init__(
        self,
        scenario: str | Scenario = "digits",
        role: str = "attacker",
        opponent: Any = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role={role!r}; allowed: {ROLES}")
        if opponent is None:
            raise ValueError("opponent is required: an agent object or callable (gym.make resolves names)")
        self.opponent = as_opponent(opponent)
        # The inner game speaks MultiDiscrete; this view flattens the learner's actions itself.
        self.flat_actions = overrides.pop("flat_actions", False)
        if not isinstance(self.flat_actions, bool):
            raise ValueError(f"flat_actions={self.flat_actions!r}; allowed: True or False")  # noqa: TRY004
        self.parallel = LeakGymParallelEnv(scenario, render_mode=render_mode, **overrides)
        self.scenario = self.parallel.scenario
        self.role = role
        self.other = "defender" if role == "attacker" else "attacker"
        self.render_mode = render_mode
        self.observation_space = self.parallel.observation_space(role)
        self._opponent_space = self.parallel.action_space(self.other)
        if hasattr(self.opponent, "check_spaces"):  # a misfit opponent fails here, not rounds into a rollout
            self.opponent.check_spaces(self.parallel.observation_space(self.other), self._opponent_space)
        self._menu = self.parallel.games.menus[role]
        self._flat = FlatActions(self._menu)
        self.action_space = spaces.Discrete(self._flat.n) if self.flat_actions else self.parallel.action_space(role)
        self._other_obs: np.ndarray | None = None
        self._opponent_rng = np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        # The views share one seed contract (envs/checks.py): Gymnasium's own check took seed=True as 1
        # and refused numpy integers.
        super().reset(seed=check_seed(seed))
        # ``options`` is accepted for API compatibility (PettingZoo's checker passes some); LeakGym
        # has no reset options: a game is configured by its scenario.
        episode_seed, opponent_seed = (int(s) for s in self.np_random.integers(2**31 - 1, size=2))
        obs, infos = self.parallel.reset(seed=episode_seed)
        self._opponent_rng = np.random.default_rng(opponent_seed)
        if hasattr(self.opponent, "reset"):
            self.opponent.reset(opponent_seed)
        self._other_obs = obs[self.other]
        return obs[self.role], infos[self.role]

    # The three parts of a step let LeakGymVectorEnv play the rounds of many views as one round (play_round).
    def to_multi(self, action: Any) -> np.ndarray:
        """The learner's action (flat or MultiDiscrete) -> the validated MultiDiscrete action."""
        if self.flat_actions:
            return self._flat.to_multi(action)
        return self._menu.check(action)

    def prepare_step(self, mine: np.ndarray) -> tuple[Any, Any]:
        """Let the opponent act against the learner's action ``mine``, already validated by :meth:`to_multi`
        (before the opponent draws anything); returns (defender, attacker) actions.

        The caller validates, then takes :meth:`opponent_state` and gives it to :meth:`undo_prepare` if this
        or the round fails (:meth:`step`, the vector env's step), so a rejected step changes nothing.
        """
        if self._other_obs is None:
            raise RuntimeError("step() called before reset()")
        other_action = self.opponent.act(self._other_obs, self._opponent_space, self._opponent_rng)
        return self.parallel.check_actions({self.role: mine, self.other: other_action})

    def opponent_state(self) -> tuple[dict, Any]:
        """What a step may change on the opponent's side: its generator and the agent's own state
        (:func:`agent_state`), restored by :meth:`undo_prepare` when the step fails."""
        # (numpy builds a new state dict on every read of bit_generator.state: it needs no copy)
        return self._opponent_rng.bit_generator.state, agent_state(self.opponent)

    def undo_prepare(self, state: tuple[dict, Any]) -> None:
        rng_state, own = state
        self._opponent_rng.bit_generator.state = rng_state
        restore_agent_state(self.opponent, own)

    def finish_step(self, outcome: RoundOutcome):
        obs, rewards, terms, truncs, infos = self.parallel.record(outcome)
        if hasattr(self.opponent, "observe"):
            self.opponent.observe(rewards[self.other], infos[self.other])
        self._other_obs = obs[self.other]
        return obs[self.role], rewards[self.role], terms[self.role], truncs[self.role], infos[self.role]

    def step(self, action: Any):
        # A rejected learner action touches nothing, the opponent included: its state is taken (and, if the
        # opponent's action or the round then fails, restored from copies) only once the learner's is valid.
        mine = self.to_multi(action)
        saved = self.opponent_state()
        try:
            defender, attacker = self.prepare_step(mine)
            (outcome,) = play_round(self.parallel.games, [self.parallel.row], [(defender, attacker)])
        except BaseException:  # Ctrl-C too: the opponent's draws and state are put back with the game
            self.undo_prepare(saved)
            raise
        return self.finish_step(outcome)

    def round_details(self, agent: str | None = None) -> dict[str, Any]:
        """The full record of the last round for ``agent`` (default: the learner's role), non-numbers
        included (:meth:`~leakgym.envs.leakgym_env.LeakGymParallelEnv.round_details`)."""
        return self.parallel.round_details(self.role if agent is None else agent)

    def render(self):
        return self.parallel.render()

    def close(self) -> None:
        self.parallel.close()

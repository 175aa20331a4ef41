"""The LeakGym multi-agent environment (PettingZoo ``ParallelEnv``).

Agents ``"attacker"`` (the federated-learning server) and ``"defender"`` (the victim client) act
at once; one step is one federated-learning round, played by :func:`leakgym.game.round.play_round`
over the env's row of a :class:`~leakgym.game.batch.GameBatch` (a batch of its own, or one that several
envs share for :func:`step_together`)::

    from leakgym.envs import parallel_env
    env = parallel_env(scenario="digits", rounds=4)
    obs, infos = env.reset(seed=0)
    while env.agents:
        actions = {a: env.action_space(a).sample() for a in env.agents}
        obs, rewards, terminations, truncations, infos = env.step(actions)

Spaces, observations and rewards are documented in :mod:`leakgym.game.scenario`,
:mod:`leakgym.game.feedback` and :mod:`leakgym.game.feedback`. An episode lasts
``scenario.rounds`` rounds and ends by termination after the last one (docs/game.md, "Episodes"). An invalid action
raises ``ValueError`` naming the entry and its allowed range before any state changes; any other
failure inside a round is raised as :class:`RoundError` (the env's one documented error type for
failed rounds) naming the round and the actions; the game is left exactly as it was before the
round, and the completed rounds are kept in :attr:`history`.

Infos have the same keys from ``reset`` on, numbers only (:mod:`leakgym.game.feedback`: RL clients stack
them); an agent's full record of the last round, with the strategy's name, the decoded settings and the
defenses applied, is :meth:`LeakGymParallelEnv.round_details`.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from gymnasium.utils import EzPickle
from pettingzoo import ParallelEnv
from pettingzoo.utils import parallel_to_aec, wrappers

from leakgym.checks import is_integer
from leakgym.game.batch import GameBatch
from leakgym.game.feedback import info_template
from leakgym.game.menus import FlatActions
from leakgym.game.records import RoundOutcome, RoundRecord
from leakgym.game.round import RoundError, observe, plan_one, play_round
from leakgym.game.scenario import Scenario, load_scenario

from .checks import check_seed
from .rendering import WINDOW_TITLE, figure_to_rgb, placeholder_figure, round_figure, show_figure


class LeakGymParallelEnv(ParallelEnv, EzPickle):
    """The two-player LeakGym game (agents ``"attacker"`` and ``"defender"``, simultaneous moves).

    Args:
        scenario: a scenario name (``leakgym/game/scenarios/<name>.toml``), a path to a ``.toml`` file, or a
            :class:`~leakgym.game.scenario.Scenario`.
        render_mode: ``None``, ``"human"`` (a matplotlib window; a no-op without a display),
            ``"rgb_array"`` (fixed-size frames: originals above their reconstructions) or ``"png"``
            (one file per round in ``render_dir``, ``episode_<e>_round_<r>.png``: episodes counted from
            1 by ``reset``, so a later episode does not overwrite an earlier one's frames).
        render_dir: folder of the ``"png"`` frames (created on the first frame; an existing file is refused).
        device: torch device of every model, update and attack.
        flat_actions: ``Discrete(prod(nvec))`` action spaces instead of ``MultiDiscrete(nvec)``
            (for SuperSuit and value-based algorithms); index = C-order flattening of the menus.
        max_cycles: PettingZoo's name for the episode length; sets ``rounds`` (give one of the two).
        **overrides: any :class:`~leakgym.game.scenario.Scenario` field (``rounds=4``, ...).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["human", "rgb_array", "png"],
        "name": "leakgym_v0",
        "render_fps": 2,
        "is_parallelizable": True,
    }
    possible_agents: ClassVar[list[str]] = ["attacker", "defender"]

    def __init__(
        self,
        scenario: str | Scenario = "digits",
        render_mode: str | None = None,
        render_dir: str | Path = "leakgym-renders",
        device: str = "cpu",
        flat_actions: bool = False,
        max_cycles: int | None = None,
        **overrides: Any,
    ) -> None:
        EzPickle.__init__(self, scenario, render_mode, render_dir, device, flat_actions, max_cycles, **overrides)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}; allowed: {self.metadata['render_modes']} or None")
        if max_cycles is not None:
            if "rounds" in overrides:
                raise ValueError(f"max_cycles={max_cycles!r} and rounds={overrides['rounds']!r} both set the episode "
                                 "length; give one of them")
            if not is_integer(max_cycles) or max_cycles < 1:
                raise ValueError(f"max_cycles={max_cycles!r}; allowed: an integer >= 1 (the episode's rounds)")
            overrides["rounds"] = int(max_cycles)
        if not isinstance(render_dir, (str, os.PathLike)):
            raise ValueError(f"render_dir={render_dir!r}; allowed: a folder path (str or os.PathLike)")  # noqa: TRY004
        if Path(render_dir).exists() and not Path(render_dir).is_dir():
            raise ValueError(f"render_dir={str(render_dir)!r} is a file; allowed: a folder (created on the first frame)")
        self.scenario = load_scenario(scenario, **overrides)
        if not isinstance(flat_actions, bool):
            raise ValueError(f"flat_actions={flat_actions!r}; allowed: True or False")  # noqa: TRY004
        self.flat_actions = flat_actions
        self._flat = {a: FlatActions(self.scenario.menu(a)) for a in self.possible_agents}
        self.render_mode = render_mode
        self.render_dir = Path(render_dir)
        #: the game state: this env is row :attr:`row` of :attr:`games` (its own batch of one, or a batch that
        #: several envs share, :func:`share_batch`)
        self.games = GameBatch(self.scenario, 1, device=device)
        self.row = 0
        sizes = {a: len(o) for a, o in _empty_observations(self.games).items()}
        self._observation_spaces = {
            a: spaces.Box(low=0.0, high=1.0, shape=(sizes[a],), dtype=np.float32) for a in self.possible_agents
        }
        self._action_spaces = {
            a: spaces.Discrete(self._flat[a].n) if flat_actions else spaces.MultiDiscrete(self.scenario.menu(a).nvec)
            for a in self.possible_agents
        }
        self.state_space = spaces.Box(low=0.0, high=1.0, shape=(sum(sizes.values()),), dtype=np.float32)
        self.agents: list[str] = []
        self.history: list[dict[str, Any]] = []
        self._details: dict[str, dict[str, Any]] = {a: {"round": 0} for a in self.possible_agents}
        self._seed_rng = np.random.default_rng()
        self._episode = 0  # episodes started by reset (names the png frames)

    # -- copies --------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickle) carries the whole state and plays on from where this env is,
        mid-episode included (its game batch copies itself: :meth:`GameBatch.__getstate__`). EzPickle's
        default carried the constructor's arguments only: a fresh env that had not been reset."""
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # PettingZoo wants the same object on every call.
    def observation_space(self, agent: str) -> spaces.Box:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.MultiDiscrete | spaces.Discrete:
        return self._action_spaces[agent]

    def to_multi(self, agent: str, action: Any) -> np.ndarray:
        """An action of ``agent`` in this env's action space -> the validated MultiDiscrete action."""
        if agent not in self.possible_agents:
            raise ValueError(f"agent={agent!r}; allowed: {self.possible_agents}")
        if self.flat_actions:
            return self._flat[agent].to_multi(action)
        return self.games.menus[agent].check(action)

    @property
    def round(self) -> int:
        """Rounds played in the current episode."""
        return int(self.games.round[self.row])

    @property
    def last_round(self) -> RoundRecord | None:
        """The record of the last round played (originals, reconstructions, scores, actions); None before."""
        return self.games.last[self.row]

    def join(self, games: GameBatch, row: int) -> None:
        """Make this env row ``row`` of ``games`` (a batch of its scenario and device that other envs share, so
        that :func:`step_together` plays their rounds as one), before its first reset: ``ValueError``
        otherwise, naming what differs."""
        row = self._check_join(games, row)
        self.games, self.row = games, row

    def _check_join(self, games: GameBatch, row: int) -> int:
        """What :meth:`join` checks, changing nothing; returns the checked row."""
        if self.games.started(self.row):
            raise ValueError("join() moves an env before its first reset(); this env has started an episode")
        if games.scenario != self.scenario or games.device != self.games.device:
            raise ValueError(f"cannot join {games!r}: its scenario or device differs from this env's "
                             f"({self.scenario.name!r} on {self.games.device})")
        return games.check_row(row)

    # ------------------------------------------------------------------ reset / step
    def reset(self, seed: int | None = None, options: dict | None = None):
        # ``options`` is accepted for API compatibility (PettingZoo's checker passes some); LeakGym
        # has no reset options: a game is configured by its scenario.
        seed = check_seed(seed)
        if seed is not None:
            self._seed_rng = np.random.default_rng(seed)
        episode_seed = int(self._seed_rng.integers(2**31 - 1))
        self.games.reset(self.row, episode_seed)
        obs = observe(self.games, self.row)
        self._episode += 1
        self.agents = list(self.possible_agents)
        self.history = []
        start = {"lpips": self.games.reports_lpips, "accuracy": float(self.games.accuracy[self.row]),
                 "test_loss": _finite(self.games.test_loss[self.row], np.finfo(np.float32).max)}
        infos = {a: info_template(a, **start) for a in self.agents}
        if self.render_mode == "human":  # Gymnasium's convention: a human window shows the reset state too
            self.render()
        return {a: obs[a].copy() for a in self.agents}, infos

    def check_actions(self, actions: dict[str, Any]) -> tuple[Any, Any]:
        """Validate a step's actions (agents, shape, dtype, range); returns (defender, attacker).

        Raises ``ValueError`` (``RuntimeError`` on a finished episode) and changes nothing.
        """
        if not self.agents:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict {{agent: action}}, got {type(actions).__name__}")  # noqa: TRY004
        missing = [a for a in self.agents if a not in actions]
        extra = [a for a in actions if a not in self.possible_agents]
        if missing or extra:
            raise ValueError(f"actions need exactly the agents {self.agents}; missing {missing}, unknown {extra}")
        defender, attacker = self.to_multi("defender", actions["defender"]), self.to_multi("attacker", actions["attacker"])
        plan_one(self.games, self.row, defender, attacker)  # decoded once per action pair: the round finds it
        return defender, attacker

    def record(self, outcome: RoundOutcome) -> tuple:
        """Bookkeeping after a played round; returns the PettingZoo step tuple."""
        agents = list(self.agents)
        infos = {a: outcome.infos[a] for a in agents}
        self._details = outcome.details
        self.history.append(
            {
                "round": self.round,
                "strategy": outcome.record.strategy,
                "defenses": list(outcome.record.applied),
                "rewards": dict(outcome.rewards),
                **{f"{a}_{k}": v for a in outcome.details for k, v in outcome.details[a].items()},
            }
        )
        terminations = {a: outcome.terminated for a in agents}
        truncations = {a: False for a in agents}
        if outcome.terminated:
            self.agents = []
        obs = {a: outcome.observations[a].copy() for a in agents}
        if self.render_mode in ("png", "human"):
            try:
                self.render()
            except OSError as exc:  # the round is played and recorded: a lost frame must not lose the step
                warnings.warn(f"LeakGym: the frame of round {self.round} was not written ({exc})", stacklevel=3)
        return obs, dict(outcome.rewards), terminations, truncations, infos

    def round_details(self, agent: str) -> dict[str, Any]:
        """``agent``'s full record of the last round played: its infos' numbers (``matching_loss`` and
        ``leakage_lpips`` only where measured) and what is not a number -- the attacker's ``strategy``
        and ``attack_settings``, the defender's ``defense_settings`` and ``defenses`` (names applied).

        Kept across ``reset`` until the next round, so a client that resets a finished episode at once
        (SB3's vector envs) still reads its last round; ``{"round": 0}`` before the env's first round.
        A copy: changing it changes nothing."""
        if agent not in self.possible_agents:
            raise ValueError(f"agent={agent!r}; allowed: {self.possible_agents}")
        return copy.deepcopy(self._details[agent])

    def step(self, actions: dict[str, Any]):
        defender, attacker = self.check_actions(actions)  # ValueError before any state changes
        (outcome,) = play_round(self.games, [self.row], [(defender, attacker)])  # RoundError: game left unchanged
        return self.record(outcome)  # (several envs in one round: step_together)

    # ------------------------------------------------------------------ render / close
    def render(self):
        if self.render_mode is None:
            return None
        last = self.last_round
        if last is None:  # before the first round: an empty, labelled frame
            fig = placeholder_figure(f"{self.scenario.name}: no round played yet")
            if self.render_mode == "human":
                show_figure(fig)
            return figure_to_rgb(fig) if self.render_mode == "rgb_array" else None
        title = (
            f"round {last.round}: {last.strategy} vs "
            f"{', '.join(last.applied) or 'no defense'} | SSIM {last.scores.mean['ssim']:.3f}"
        )
        fig = round_figure(last.originals, last.reconstructions, last.scores, title=title)
        if self.render_mode == "png":
            self.render_dir.mkdir(parents=True, exist_ok=True)
            path = self.render_dir / f"episode_{self._episode:04d}_round_{self.round:04d}.png"
            fig.savefig(path)
            return str(path)
        if self.render_mode == "human":
            show_figure(fig)
            return None
        return figure_to_rgb(fig)

    def close(self) -> None:
        """Close the ``"human"`` window (the other modes close their figures after each render)."""
        if self.render_mode == "human":
            import matplotlib.pyplot as plt

            if WINDOW_TITLE in plt.get_figlabels():
                plt.close(WINDOW_TITLE)

    def state(self) -> np.ndarray:
        obs = observe(self.games, self.row) if self.games.started(self.row) else _empty_observations(self.games)
        return np.concatenate([obs[a] for a in self.possible_agents])


def step_together(envs: Sequence[LeakGymParallelEnv], actions: Sequence[dict[str, Any]], *,
                  batch_attacks: bool = True, batch_clients: bool = False) -> list[tuple]:
    """``[env.step(a) for env, a in zip(envs, actions)]``, played as one round per shared game batch.

    Envs that are rows of one :class:`~leakgym.game.batch.GameBatch` (:func:`share_batch`) play one
    :func:`~leakgym.game.round.play_round`: their rounds share their batched computations (with
    ``batch_attacks`` the attacks of all games make one engine call per architecture, with
    ``batch_clients`` the clients' updates, aggregation and evaluation are vectorised too). Envs of
    different batches play one round per batch. Each game keeps its own draws; its numbers equal its own
    ``env.step`` to the floating-point rounding of those batched kernels (exactly with both off, or for one
    env). Every env's actions are validated before anything changes (``ValueError`` naming the env); a
    failed round raises :class:`RoundError` and leaves every game of every env as it was.
    Returns each env's PettingZoo step tuple.
    """
    if len(envs) != len(actions):
        raise ValueError(f"got {len(actions)} action dicts for {len(envs)} environments")
    if len({(id(env.games), env.row) for env in envs}) != len(envs):
        raise ValueError("each environment may appear once in step_together")
    checked = []
    for i, (env, action) in enumerate(zip(envs, actions)):
        try:
            checked.append(env.check_actions(action))
        except ValueError as exc:
            raise ValueError(f"environment {i}: {exc}") from None
    groups: dict[int, list[int]] = {}
    for i, env in enumerate(envs):
        groups.setdefault(id(env.games), []).append(i)
    outcomes: list = [None] * len(envs)
    done: list[tuple[GameBatch, Any]] = []  # the batches already played, with their state before the round
    try:
        for members in groups.values():
            games = envs[members[0]].games
            rows = [envs[i].row for i in members]
            if len(groups) > 1:
                done.append((games, games.snapshot(rows)))
            played = play_round(games, rows, [checked[i] for i in members], batch_attacks=batch_attacks,
                                batch_clients=batch_clients)
            for i, outcome in zip(members, played):
                outcomes[i] = outcome
    except BaseException:  # a later batch failed (and restored itself): undo the batches played before it
        for games, snap in done[:-1]:
            games.restore(snap)
        raise
    return [env.record(outcome) for env, outcome in zip(envs, outcomes)]


def share_batch(envs: Sequence[LeakGymParallelEnv]) -> GameBatch:
    """Make ``envs`` (parallel envs of one scenario and device, before their first reset) the rows of one
    :class:`~leakgym.game.batch.GameBatch`, so that :func:`step_together` plays their rounds as one batched
    round. Returns the batch. Every env is checked before any of them moves: a refused call changes none."""
    if not envs:
        raise ValueError("share_batch needs at least one environment")
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("share_batch got the same environment twice; give each env once")
    games = GameBatch(envs[0].scenario, len(envs), device=envs[0].games.device)
    for i, env in enumerate(envs):
        try:
            env._check_join(games, i)
        except ValueError as exc:
            raise ValueError(f"share_batch: environment {i}: {exc}") from None
    for i, env in enumerate(envs):
        env.join(games, i)
    return games


def _finite(value: float, default: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else float(default)


def _empty_observations(games: GameBatch) -> dict[str, np.ndarray]:
    """All-zero observations of ``games``' sizes (the spaces' shapes; :meth:`LeakGymParallelEnv.state`
    before the first reset)."""
    from leakgym.game.feedback import attacker_obs_size, defender_obs_size

    sc = games.scenario
    return {"attacker": np.zeros(attacker_obs_size(sc.attacker_nvec), np.float32),
            "defender": np.zeros(defender_obs_size(sc.defender_nvec), np.float32)}


def parallel_env(scenario: str | Scenario = "digits", **overrides: Any) -> LeakGymParallelEnv:
    """The parallel (simultaneous-move) LeakGym environment."""
    return LeakGymParallelEnv(scenario=scenario, **overrides)


class ActionChecking(wrappers.BaseWrapper):
    """Validates each agent's action as the AEC form receives it, with the parallel env's own check
    (:meth:`LeakGymParallelEnv.to_multi`: a ``ValueError`` naming the value and the allowed range),
    before PettingZoo's adapter stores it. Without it a bad action was stored and only the round at the
    last agent's turn failed, with the turn already passed on: the agent could not act again until a
    reset. PettingZoo's ``AssertOutOfBoundsWrapper`` does not help: an ``AssertionError`` without the
    range, and no check at all under ``python -O``."""

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if not (self.terminations.get(agent, False) or self.truncations.get(agent, False)):
            self.unwrapped.to_multi(agent, action)
        super().step(action)


def raw_env(scenario: str | Scenario = "digits", **overrides: Any):
    """The AEC form, through PettingZoo's standard conversion; each action is validated as it is given
    (:class:`ActionChecking`)."""
    return ActionChecking(parallel_to_aec(parallel_env(scenario, **overrides)))


class OrderEnforcing(wrappers.OrderEnforcingWrapper):
    """PettingZoo's order-enforcing wrapper, whose ``reset`` counts only once it succeeded. PettingZoo's marks
    the env reset before it resets the env inside, so a refused reset (a bad seed: ``ValueError``, nothing
    changed) left a wrapper that took the env for reset: the next ``step`` failed with an ``AttributeError``
    from inside the adapter instead of PettingZoo's "reset() needs to be called before step"."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        flags = self._has_reset, self._has_updated
        try:
            super().reset(seed=seed, options=options)
        except BaseException:
            self._has_reset, self._has_updated = flags
            raise


def env(scenario: str | Scenario = "digits", **overrides: Any):
    """The AEC form (:func:`raw_env`) wrapped in PettingZoo's order-enforcing wrapper (:class:`OrderEnforcing`)."""
    return OrderEnforcing(raw_env(scenario, **overrides))


__all__ = [
    "ActionChecking", "LeakGymParallelEnv", "OrderEnforcing", "RoundError", "env", "parallel_env", "raw_env", "share_batch",
    "step_together",
]

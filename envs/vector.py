"""N LeakGym games in lockstep: one :class:`~leakgym.game.batch.GameBatch`, each vector step one round.

``gym.make_vec("LeakGym-Digits-v0", num_envs=16)`` builds this (it is the ids' vector entry point).
A step validates every learner action first (a bad one raises ``ValueError`` and changes nothing in
any sub-environment), lets every opponent act, then plays one round (play_round) over all active games: the
attacks of one strategy become one batched ``Attack.reconstruct_batch`` call whatever their budgets
(per-problem iterations, restarts, TV weight and learning rate), and every game
keeps its own seed, so game ``i`` plays the same trajectory alone or beside any neighbours. The games
are the rows of one batch (:func:`leakgym.game.round.play_round` plays the active rows); their global
models are the rows of its :class:`~leakgym.fl.bank.ModelBank` (their parameters stacked per name; each
game's module holds views of its row).
A finished game resets as Gymnasium 1.x's ``autoreset_mode`` says (``gym.make_vec(id, num_envs=N,
autoreset_mode=...)``; the attribute and ``metadata["autoreset_mode"]`` name it): ``NEXT_STEP`` (the
default) on the step after its episode ends, that step's action ignored; ``SAME_STEP`` in the step that
ends it, the final observation and infos under ``infos["final_obs"]`` / ``infos["final_info"]``;
``DISABLED`` never by itself: ``reset(options={"reset_mask": mask})`` resets the games ``mask`` selects
(TorchRL's ``GymWrapper`` needs ``SAME_STEP`` or ``DISABLED``, and prefers the latter).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from leakgym.checks import is_integer
from leakgym.game.batch import GameBatch
from leakgym.game.round import collector_paused, play_round

from .checks import is_seed
from .single_agent import LeakGymSingleAgentEnv


class LeakGymVectorEnv(VectorEnv):
    """``num_envs`` single-agent views whose rounds are played together.

    Args:
        num_envs: number of games.
        opponents: one opponent object per game (agents keep per-episode state); ``gym.make_vec``
            builds them from ``opponent=`` (:func:`leakgym.agents.policies.gym_entry_points.make_vector_env`).
        batch_attacks: True (default) runs the attacks that share a configuration as one batched
            call; False runs each game's attack alone, so that every game's trajectory is
            bit-identical to the single-agent view's (batching may change attack results by
            floating-point rounding, see :func:`leakgym.game.round.reconstruct_all`).
        max_episode_steps: truncate a game after this many steps of its episode, as Gymnasium's
            ``TimeLimit`` does for ``gym.make(id, max_episode_steps=K)`` (the scenario's ``rounds`` is
            untouched, so observations equal the single-agent view's); None or -1: no limit, the game
            ends (terminates) after its last round.
        batch_clients: True computes all games' victims' clean updates, benign clients, aggregation
            and evaluation as one vmapped computation each (:mod:`leakgym.fl.batched`; BatchNorm
            included; PRECODE and dropout models run the loop), and runs the step defenses batched
            over the games (DCS²'s synthesis, :func:`leakgym.defenses.dcs2.dcs2_gradients`); equal to the game-by-game loop to
            float32 rounding per computation (a defense's choice on values that tie to rounding, such as
            CENSOR's, can still go the other way, and FedAvg's Adam magnifies the rounding: ``docs/limits.md``),
            so off by default. Meant for GPUs: on a CPU it pays off for the digits
            LeNet but slows the CIFAR ConvNet down (measured, ``docs/results/bench_env.md``).
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (or its value,
            ``"SameStep"``, ...): when a finished game resets (the module docstring).
        **kwargs: passed to every :class:`~leakgym.envs.single_agent.LeakGymSingleAgentEnv`.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 2,  # as the single-agent view
                                          "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, opponents: list[Any] | None = None, render_mode: str | None = None,
                 batch_attacks: bool = True, batch_clients: bool = False, max_episode_steps: int | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, **kwargs: Any) -> None:
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(f"autoreset_mode={autoreset_mode!r}; allowed: "
                             f"{[m.value for m in AutoresetMode]} (gymnasium.vector.AutoresetMode)") from None
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        for name, flag in (("batch_attacks", batch_attacks), ("batch_clients", batch_clients)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}={flag!r}; allowed: True or False")  # noqa: TRY004
        self.batch_attacks = batch_attacks
        self.batch_clients = batch_clients
        if not is_integer(num_envs) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r}; allowed: integers >= 1")
        if max_episode_steps is None or is_integer(max_episode_steps) and max_episode_steps == -1:
            self.max_episode_steps = None
        elif is_integer(max_episode_steps) and max_episode_steps >= 1:
            self.max_episode_steps = int(max_episode_steps)
        else:
            raise ValueError(f"max_episode_steps={max_episode_steps!r}; allowed: an integer >= 1, or None or -1 "
                             "(no limit: the episode ends after the scenario's rounds)")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode={render_mode!r}; allowed: None or {self.metadata['render_modes']}")
        if opponents is None or len(opponents) != num_envs:
            raise ValueError(f"need one opponent per game: got {None if opponents is None else len(opponents)} "
                             f"for num_envs={num_envs}")
        self.envs = [LeakGymSingleAgentEnv(render_mode=render_mode, opponent=o, **kwargs) for o in opponents]
        # All games as the rows of one batch (their global models stacked per parameter name): the batched
        # phases and the round's snapshot read and write all games with one operation per name.
        self._join_games()
        self.num_envs = int(num_envs)
        self.render_mode = render_mode
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._obs = create_empty_array(self.single_observation_space, self.num_envs)

    def _join_games(self) -> None:
        self.games = GameBatch(self.envs[0].scenario, len(self.envs), device=self.envs[0].parallel.games.device)
        for i, env in enumerate(self.envs):
            env.parallel.join(self.games, i)

    # Copies (copy.deepcopy, pickle) need nothing of their own: each sub-environment carries its game batch,
    # which is this vector's (one object, copied once), so a copy plays on mid-episode as the original does.

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        # Every seed is checked before any game resets: a rejected reset changes nothing.
        if seed is None or is_seed(seed):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            if isinstance(seed, (str, bytes)) or not hasattr(seed, "__len__"):
                raise ValueError(f"seed={seed!r}; allowed: None, an integer >= 0, or a list of {self.num_envs} "
                                 "such seeds (one per environment)")
            if len(seed) != self.num_envs:
                raise ValueError(f"got {len(seed)} seeds for {self.num_envs} environments")
            for i, s in enumerate(seed):
                if s is not None and not is_seed(s):
                    raise ValueError(f"seed[{i}]={s!r}; allowed: None or an integer >= 0")
            seeds = [None if s is None else int(s) for s in seed]
        options = dict(options or {})
        mask = self._reset_mask(options.pop("reset_mask", None))
        obs, entries = list(self._obs), []
        for i, (env, s) in enumerate(zip(self.envs, seeds)):
            if mask[i]:
                obs[i], info = env.reset(seed=s, options=options or None)
                entries.append((i, info))
        infos = self._vector_infos(entries)
        self._autoreset[mask] = False
        self._obs = concatenate(self.single_observation_space, obs, self._obs)
        return self._obs.copy(), infos

    def _reset_mask(self, mask: Any) -> np.ndarray:
        """``options["reset_mask"]`` (Gymnasium 1.x): the games to reset, a bool array of ``num_envs``
        entries with at least one True; None: all of them."""
        if mask is None:
            return np.ones(self.num_envs, dtype=bool)
        arr = np.asarray(mask)
        if arr.shape != (self.num_envs,) or arr.dtype != np.bool_ or not arr.any():
            raise ValueError(f"options['reset_mask']={mask!r}; allowed: a bool array of shape ({self.num_envs},) "
                             "with at least one True (the games to reset)")
        return arr

    def step(self, actions):
        with collector_paused():  # the round and the observations and infos of every game around it
            return self._step(actions)

    def _step(self, actions):
        given = actions
        try:
            actions = np.asarray(actions)
        except Exception:  # noqa: BLE001 - e.g. ragged rows, a tensor that requires grad
            raise ValueError(f"actions {given!r} are not an array of shape {self.action_space.shape}") from None
        if actions.shape != self.action_space.shape:
            raise ValueError(f"actions have shape {actions.shape}; expected {self.action_space.shape}")
        # Each game's action is checked as given: a list row keeps its Python bools (np.asarray turned them into
        # integers the single-agent view would have refused), a masked array's row its mask (np.asarray dropped
        # it, and the hidden values would have been played).
        rows = given if isinstance(given, (list, tuple, np.ma.MaskedArray)) else actions
        if self.autoreset_mode == AutoresetMode.DISABLED and self._autoreset.any():
            raise RuntimeError(f"sub-environment(s) {np.flatnonzero(self._autoreset).tolist()} finished their "
                               "episode and autoreset_mode is DISABLED: reset them first, "
                               "reset(options={'reset_mask': mask})")
        active = [i for i in range(self.num_envs) if not self._autoreset[i]]
        mine = {}
        for i in active:  # validate every learner action before anything draws or changes
            try:
                mine[i] = self.envs[i].to_multi(rows[i])
            except ValueError as exc:
                raise ValueError(f"sub-environment {i}: {exc}") from None
        saved = {i: self.envs[i].opponent_state() for i in active}
        try:
            pairs = [self.envs[i].prepare_step(mine[i]) for i in active]
            outcomes = play_round(self.games, active, pairs, batch_attacks=self.batch_attacks,
                                  batch_clients=self.batch_clients) if active else []
        except BaseException:  # Ctrl-C too: the opponents are put back with their games
            for i, state in saved.items():
                self.envs[i].undo_prepare(state)
            raise
        rewards = np.zeros(self.num_envs)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        obs: list[np.ndarray] = [None] * self.num_envs  # type: ignore[list-item]
        entries: list[tuple[int, dict]] = []  # (game, its info), in the order Gymnasium's _add_info takes them
        for i in range(self.num_envs):
            if self._autoreset[i]:
                obs[i], info = self.envs[i].reset()
                entries.append((i, info))
        for i, outcome in zip(active, outcomes):
            obs[i], rewards[i], terminations[i], truncations[i], info = self.envs[i].finish_step(outcome)
            entries.append((i, info))
            # A step is a round: the game's round count is the episode's step count that TimeLimit keeps.
            if self.max_episode_steps is not None and self.games.round[i] >= self.max_episode_steps:
                truncations[i] = True
            if self.autoreset_mode == AutoresetMode.SAME_STEP and (terminations[i] or truncations[i]):
                entries.append((i, {"final_obs": obs[i], "final_info": info}))
                obs[i], info = self.envs[i].reset()
                entries.append((i, info))
        infos = self._vector_infos(entries)
        if self.autoreset_mode != AutoresetMode.SAME_STEP:
            self._autoreset = np.logical_or(terminations, truncations)
        self._obs = concatenate(self.single_observation_space, obs, self._obs)
        return self._obs.copy(), rewards, terminations, truncations, infos

    def _vector_infos(self, entries: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """Gymnasium's vector infos of ``entries`` (game, its info): equal to ``_add_info`` entry by entry
        (each key's values in an array of ``num_envs`` and its ``_key`` mask). When every info has the same
        keys in the same order and each key one plain number type (the games' infos, from
        :func:`leakgym.game.feedback.numeric_info`), one array per key; anything else (``final_obs``,
        ``final_info``) entry by entry."""
        infos: dict[str, Any] = {}
        if not entries:
            return infos
        keys = tuple(entries[0][1])
        columns = {k: [info.get(k) for _, info in entries] for k in keys}
        if all(tuple(info) == keys for _, info in entries) and all(
                type(values[0]) in (bool, int, float) and all(type(v) is type(values[0]) for v in values)
                for values in columns.values()):
            games = np.array([i for i, _ in entries])
            mask = np.zeros(self.num_envs, dtype=np.bool_)
            mask[games] = True
            for key, values in columns.items():
                array = np.zeros(self.num_envs, dtype=type(values[0]))
                array[games] = values
                infos[key], infos[f"_{key}"] = array, mask.copy()
            return infos
        for i, info in entries:
            infos = self._add_info(infos, info, i)
        return infos

    def round_details(self, agent: str | None = None) -> list[dict[str, Any]]:
        """Each game's full record of its last round for ``agent`` (default: the learner's role), non-numbers
        included (:meth:`~leakgym.envs.leakgym_env.LeakGymParallelEnv.round_details`)."""
        return [env.round_details(agent) for env in self.envs]

    def render(self):
        """Each game's frame, as a tuple (as Gymnasium's ``SyncVectorEnv.render``)."""
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

"""PSRO's simulator and oracle on LeakGym's environments.

* :class:`LeakGymSimulator` fills payoff cells with ``leakgym eval``'s machinery
  (:func:`leakgym.agents.experiments.evaluation.play.evaluate`): the pairs of a block play in lockstep,
  ``lockstep`` games as one batched round; every cell plays episode ``e`` with seed ``seed + e`` (common random numbers); each
  block writes its ``episodes.csv`` as pairs finish, so an interrupted block resumes from its finished
  pairs. With ``use_ray`` every cell is a Ray task (Ray core, ``pip install leakgym[ray]``) that plays it
  alone with the same seeds.
* :class:`SB3Oracle` trains a best response with Stable-Baselines3 (``leakgym train``'s
  :func:`~leakgym.agents.experiments.training.train`: the batched vector env when the hyperparameter
  file's ``n_envs`` is above 1) against a :class:`~.mixture.MixtureAgent` of the other population.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.agents.policies.base import Agent
from leakgym.agents.policies.factory import make_agent

from .mixture import MixtureAgent
from .psro import CELL_METRICS, CellSamples, Member, policy_sha256


def member_agent(member: Member, role: str, scenario: Any) -> Agent:
    """The agent ``member`` names, labelled with the member's name; a policy file whose hash differs from
    the one recorded when it joined the population is refused."""
    if member.sha256 is not None:
        actual = policy_sha256(member.spec)
        if actual != member.sha256:
            raise ValueError(f"population member {member.name!r}: {member.spec} changed since it joined the "
                             f"population (sha256 {actual[:12]}..., recorded {member.sha256[:12]}...)")
    agent = make_agent(member.spec, role=role, scenario=scenario)
    agent.name = member.name
    return agent


def _block_folder(root: Path, tag: str, attackers: Sequence[Member], defenders: Sequence[Member]) -> Path:
    """A folder per block, named by its members: a resumed run finds the same block in the same folder."""
    names = "|".join(m.name for m in attackers) + "||" + "|".join(m.name for m in defenders)
    return root / f"{tag}_{hashlib.sha1(names.encode()).hexdigest()[:8]}"


def _cells_of(table: Any) -> dict[tuple[str, str], CellSamples]:
    out = {}
    for pair in table.pairs:
        values = {m: [float(e.metrics[m]) for e in pair.episodes] for m in CELL_METRICS}
        out[(pair.attacker, pair.defender)] = CellSamples(values, int(sum(e.rounds for e in pair.episodes)))
    return out


def _play_cell(env_id: str, attacker: Member, defender: Member, episodes: int, seed: int, overrides: dict,
               device: str, out: str, threads: int) -> dict[tuple[str, str], CellSamples]:
    """One cell alone (a Ray task's body)."""
    from leakgym.game.scenario import load_scenario

    from ..cli_common import apply_threads, resolve_env
    from ..evaluation.play import evaluate

    apply_threads(threads)
    scenario = load_scenario(resolve_env(env_id)[1], **overrides)
    a = member_agent(attacker, "attacker", scenario)
    d = member_agent(defender, "defender", scenario)
    folder = Path(out)
    table = evaluate(env_id, [a], [d], episodes=episodes, seed=seed, overrides=overrides, progress=False, out=folder,
                     resume=(folder / "episodes.csv").is_file(), device=device, lockstep=max(1, episodes))
    return _cells_of(table)


class LeakGymSimulator:
    """Fills payoff cells on ``env_id`` (see the module docstring); files go to ``out/cells/<block>/``."""

    def __init__(self, env_id: str, *, episodes: int, seed: int, overrides: dict[str, Any], out: Path,
                 device: str = "cpu", lockstep: int = 16, progress: bool = False, use_ray: bool = False,
                 threads: int = 1) -> None:
        from leakgym.envs.leakgym_env import parallel_env
        from leakgym.game.scenario import load_scenario

        from ..cli_common import resolve_env

        if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 2:
            raise ValueError(f"episodes={episodes!r}; allowed: integers >= 2 (a cell's 95% interval needs two)")
        self.env_id = env_id
        self.scenario = load_scenario(resolve_env(env_id)[1], **overrides)
        # An environment built and closed: data not on disk, LPIPS weights missing, a bad device are refused
        # here, before a run writes its state file (found in an audit: metagame.json was left "running" with
        # no cells, and the same command then asked for --resume)
        parallel_env(self.scenario, device=device).close()
        self.episodes, self.seed, self.overrides = episodes, seed, dict(overrides)
        self.root = Path(out) / "cells"
        self.device, self.lockstep, self.progress, self.threads = device, lockstep, progress, threads
        self.use_ray = use_ray
        if use_ray:
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ValueError("--ray needs Ray core: pip install 'leakgym[ray]' (or run without --ray: one process)"
                                 ) from None

    def play(self, attackers: Sequence[Member], defenders: Sequence[Member], tag: str
             ) -> dict[tuple[str, str], CellSamples]:
        folder = _block_folder(self.root, tag, attackers, defenders)
        if self.use_ray:
            return self._play_ray(attackers, defenders, folder)
        from ..evaluation.play import evaluate

        atts = [member_agent(m, "attacker", self.scenario) for m in attackers]
        dfns = [member_agent(m, "defender", self.scenario) for m in defenders]
        table = evaluate(self.env_id, atts, dfns, episodes=self.episodes, seed=self.seed, overrides=self.overrides,
                         progress=self.progress, out=folder, resume=(folder / "episodes.csv").is_file(),
                         device=self.device, lockstep=self.lockstep)
        return _cells_of(table)

    def _play_ray(self, attackers: Sequence[Member], defenders: Sequence[Member], folder: Path
                  ) -> dict[tuple[str, str], CellSamples]:
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        task = ray.remote(_play_cell)
        refs = [task.remote(self.env_id, a, d, self.episodes, self.seed, self.overrides, self.device,
                            str(folder / f"cell_{i}_{j}"), self.threads)
                for i, a in enumerate(attackers) for j, d in enumerate(defenders)]
        out: dict[tuple[str, str], CellSamples] = {}
        for cells in ray.get(refs):
            out.update(cells)
        return out


class SB3Oracle:
    """Best responses trained with Stable-Baselines3 (``leakgym train``) against the other side's mixture;
    policies go to ``out/policies/<member name>/policy.zip``."""

    def __init__(self, env_id: str, *, timesteps: int, seed: int, overrides: dict[str, Any], out: Path,
                 algo: str = "ppo", hyperparams: dict[str, Any] | None = None, hyperparams_file: Path | None = None,
                 device: str = "cpu", progress: bool = False) -> None:
        from leakgym.game.scenario import load_scenario

        from ..cli_common import resolve_env
        from ..training import TrainConfig, check_config

        self.env_id = env_id
        self.scenario = load_scenario(resolve_env(env_id)[1], **overrides)
        self.timesteps, self.seed, self.overrides = timesteps, seed, dict(overrides)
        self.root = Path(out) / "policies"
        self.algo, self.hyperparams, self.hyperparams_file = algo, dict(hyperparams or {}), hyperparams_file
        self.device, self.progress = device, progress
        for role in ("attacker", "defender"):  # every setting checked before the run writes anything
            check_config(TrainConfig(env_id=env_id, role=role, algo=algo, timesteps=timesteps, opponent="random",
                                     out=self.root, seed=seed, overrides=self.overrides,
                                     hyperparams=self.hyperparams, hyperparams_file=hyperparams_file, device=device))

    def best_response(self, role: str, opponents: Sequence[Member], mixture: np.ndarray, *, iteration: int,
                      name: str) -> tuple[Member, int]:
        from ..training import TrainConfig, train

        other = "defender" if role == "attacker" else "attacker"
        members = [member_agent(m, other, self.scenario) for m, p in zip(opponents, mixture) if p > 0]
        weights = [float(p) for p in mixture if p > 0]
        opponent = MixtureAgent(members, np.asarray(weights) / sum(weights), name=f"meta-{other}-{iteration}")
        config = TrainConfig(env_id=self.env_id, role=role, algo=self.algo, timesteps=self.timesteps, opponent=opponent,
                             out=self.root / name, seed=self.seed + 2 * iteration + (role == "defender"),
                             overrides=self.overrides, hyperparams=self.hyperparams,
                             hyperparams_file=self.hyperparams_file, checkpoint_freq=0, progress=self.progress,
                             device=self.device)
        result = train(config)
        path = result.policy_path
        return Member(name, str(path), iteration, policy_sha256(path)), int(result.metadata["timesteps"])


__all__ = ["LeakGymSimulator", "SB3Oracle", "member_agent", "policy_sha256"]

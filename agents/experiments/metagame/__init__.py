"""The meta-game: populations of attackers and defenders, mixed equilibria and exploitability.

* :mod:`.solvers` -- :func:`nash_equilibria` (every equilibrium of a payoff table), projected replicator
  dynamics, uniform; the meta-solvers of ``--meta-solver``;
* :mod:`.mixture` -- :class:`MixtureAgent`, a meta-strategy as an opponent (one member per episode);
* :mod:`.psro` -- Policy-Space Response Oracles: the empirical game, the loop, exploitability, resume;
* :mod:`.simulation` -- PSRO's simulator (``leakgym eval``'s lockstep games, or Ray tasks) and its
  Stable-Baselines3 oracle on LeakGym's environments;
* :mod:`.report` -- the defense report card and the figures;
* :mod:`.cli` -- ``leakgym metagame``.
"""

from .mixture import MixtureAgent
from .psro import CellSamples, EmpiricalGame, Member, MetagameInterrupted, MetagameState, run_psro
from .solvers import (
    META_SOLVERS,
    DegenerateGameWarning,
    IncompleteEnumerationWarning,
    analyse_game,
    meta_solver,
    nash_equilibria,
    projected_replicator_dynamics,
)

__all__ = [
    "META_SOLVERS",
    "CellSamples",
    "DegenerateGameWarning",
    "EmpiricalGame",
    "IncompleteEnumerationWarning",
    "Member",
    "MetagameInterrupted",
    "MetagameState",
    "MixtureAgent",
    "analyse_game",
    "meta_solver",
    "nash_equilibria",
    "projected_replicator_dynamics",
    "run_psro",
]

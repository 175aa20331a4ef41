"""Batched optimisers and per-problem randomness: P independent problems as one computation.

Shared by the attacks (the gradient-matching engine, :mod:`leakgym.attacks.engine`) and the defenses that
optimise per row (DCS², :mod:`leakgym.defenses.dcs2`); it imports neither, so both can import it. One concept
per module:

* :mod:`~leakgym.optim.adam` -- :class:`BatchedAdam`, Adam with a step size and decay milestones per row;
* :mod:`~leakgym.optim.lbfgs` -- :class:`BatchedLBFGS`, L-BFGS per problem;
* :mod:`~leakgym.optim.randomness` -- :class:`BatchedGenerator`, one ``torch.Generator`` per problem
  (counter-based: problem ``i`` draws the same numbers alone or beside any others), and
  :func:`seeded_generator`.
"""

from leakgym.optim.adam import BatchedAdam
from leakgym.optim.lbfgs import BatchedLBFGS
from leakgym.optim.randomness import BatchedGenerator, seeded_generator

__all__ = ["BatchedAdam", "BatchedGenerator", "BatchedLBFGS", "seeded_generator"]

"""The batched gradient-matching engine: N reconstruction problems as one vectorised computation.

Optimisation-based attacks (DLG, Inverting Gradients, GradInversion and their adaptive variants)
all solve, for every victim update ``t`` (Geiping et al. 2020, Eq. 4; Yin et al. 2021, Eq. 3),

    x* = argmin_x  D(U(theta, x, y), t) + sum_k alpha_k R_k(x)

where ``U`` simulates what the victim shared (a FedSGD gradient or a FedAvg model difference). The
engine runs ``P = N x R`` such problems -- N victims (or environments, possibly with different
parameters of the same architecture), each with R restarts folded into the batch dimension -- as
*one* computation per iteration. One concept per module:

* :mod:`~leakgym.attacks.engine.objective` -- :class:`MatchingObjective` (distance, priors, EOT),
  :class:`Schedule` (optimiser and budget) and :class:`PerProblem` (budgets, restarts, step sizes and
  TV weights that differ between the problems of one call);
* :mod:`~leakgym.attacks.engine.problems` -- :class:`ProblemSet` (N stacked problems) and the
  simulator of the victims' updates (``vmap`` over ``torch.func.grad``, BatchNorm, PRECODE noise);
  the simulator computes convolutions as unfold + matrix product (:mod:`leakgym.models.parameter_sets`),
  whose double backward stays one computation for all rows, and a plain layer stack (DLG's LeNet)
  without vmap (:mod:`leakgym.models.rowwise`);
* the optimisers and the per-problem randomness, shared with the defenses that optimise per row, are
  :mod:`leakgym.optim` (:class:`~leakgym.optim.adam.BatchedAdam`, :class:`~leakgym.optim.lbfgs.BatchedLBFGS`,
  :class:`~leakgym.optim.randomness.BatchedGenerator`);
* :mod:`~leakgym.attacks.engine.matching` -- :func:`run_gradient_matching`, the optimisation loop, and
  :func:`run_joint_matching`, the same loop over several :class:`Part` s (strategies with their own
  objective, optimiser and label handling) whose rows are simulated together;
* :mod:`~leakgym.attacks.engine.optimization` -- :class:`OptimizationAttack`, the base class of the
  attacks, which turns ``reconstruct_batch`` calls into engine calls, and :func:`reconstruct_jointly`,
  which runs problems of different attacks (a vector step's random attacker actions) as one call.

Seeds: problem ``i`` of ``reconstruct_batch(..., seeds=seeds)`` draws every random number from its
own generator seeded with ``seeds[i]``, so its result does not depend on its neighbours -- exactly
in the random numbers, and up to floating-point rounding in the vectorised arithmetic (batched BLAS
and oneDNN kernels pick their algorithm by the batch size).
"""

from leakgym.attacks.engine.matching import MatchingOutput, Part, run_gradient_matching, run_joint_matching
from leakgym.attacks.engine.objective import DefenseSimulator, MatchingObjective, PerProblem, Schedule
from leakgym.attacks.engine.optimization import (
    OptimizationAttack,
    OptimizationConfig,
    config_fields,
    invert_jointly,
    reconstruct_jointly,
)
from leakgym.attacks.engine.problems import ProblemSet

__all__ = [
    "DefenseSimulator",
    "MatchingObjective",
    "MatchingOutput",
    "OptimizationAttack",
    "OptimizationConfig",
    "Part",
    "PerProblem",
    "ProblemSet",
    "Schedule",
    "config_fields",
    "invert_jointly",
    "reconstruct_jointly",
    "run_gradient_matching",
    "run_joint_matching",
]

"""The experiments (``leakgym.agents.experiments``): ``leakgym train`` (:mod:`.training`), ``leakgym selfplay``
(:mod:`.selfplay`), ``leakgym eval`` (:mod:`.evaluation`) and ``leakgym metagame`` (:mod:`.metagame`), with the
command-line helpers they share (:mod:`.cli_common`) and the rl-zoo hyperparameter files
(``hyperparams/<algo>.yml``).

Nothing is imported here: each command loads only what it runs.
"""

"""``leakgym_v0``: the versioned PettingZoo module of the LeakGym game, as PettingZoo's own envs are.

    from leakgym.envs import leakgym_v0
    env = leakgym_v0.parallel_env(scenario="digits", max_cycles=4)   # ParallelEnv
    aec = leakgym_v0.env(scenario="digits")                          # AEC (order enforced, actions checked)

``metadata["name"]`` of the environment is ``"leakgym_v0"``. The version changes whenever the
observation, action or reward definitions change (see ``docs/envs/``).
"""

from .leakgym_env import LeakGymParallelEnv, env, parallel_env, raw_env

__all__ = ["LeakGymParallelEnv", "env", "parallel_env", "raw_env"]

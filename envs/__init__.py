"""LeakGym environments (folder ``envs/``, installed as ``leakgym.envs``).

* :func:`parallel_env` — the PettingZoo ``ParallelEnv`` (agents ``attacker`` and ``defender``);
* :func:`env` — its AEC form through PettingZoo's standard conversion and wrappers;
* :func:`step_together` — several parallel envs' steps played as one batched round (:func:`share_batch`);
* :func:`make_sb3_vec` — a Stable-Baselines3 ``VecEnv`` over the batched vector env;
* :func:`supersuit_vec_env` — the parallel env through SuperSuit's vector wrappers, in one call;
* Gymnasium ids (``LeakGym-Digits-v0``, ``LeakGym-CIFAR-v0``, ...) registered on ``import leakgym``,
  one per scenario TOML file in ``leakgym/game/scenarios/``.
"""

from leakgym.game.scenario import Scenario, load_scenario, scenario_names

from .registration import register_envs, registered_ids

register_envs()

#: lazily imported names -> their module
_LAZY = {
    **dict.fromkeys(("parallel_env", "env", "raw_env", "share_batch", "step_together", "LeakGymParallelEnv",
                     "RoundError"), "leakgym_env"),
    "make_sb3_vec": "sb3_vec",
    "supersuit_vec_env": "supersuit_vec",
}


def __getattr__(name: str):
    # The environment pulls in torch and the attack/defense libraries (and sb3_vec SB3, supersuit
    # SuperSuit); import it on first use so that `import leakgym` (which registers the Gymnasium ids)
    # stays light.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'leakgym.envs' has no attribute {name!r}")


__all__ = [
    "LeakGymParallelEnv",
    "RoundError",
    "Scenario",
    "env",
    "load_scenario",
    "make_sb3_vec",
    "parallel_env",
    "raw_env",
    "register_envs",
    "registered_ids",
    "scenario_names",
    "share_batch",
    "step_together",
    "supersuit_vec_env",
]

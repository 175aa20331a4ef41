"""200-step soak on LeakGym-Digits-v0: no exceptions, bounded memory, invalid actions stay clear errors."""

import gymnasium as gym
import numpy as np
import pytest

import leakgym  # noqa: F401

#: RSS growth allowed between step 20 (everything warmed up) and step 200. Measured: a few MB.
MEMORY_BOUND_MB = 150


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_200_step_soak(cheap_overrides):
    overrides = dict(cheap_overrides, rounds=25, iterations=[2, 3], restarts=[1, 2])
    env = gym.make("LeakGym-Digits-v0", role="attacker", **overrides)
    env.reset(seed=0)
    env.action_space.seed(0)
    rss_warm = None
    leakages = []
    for step in range(200):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert np.isfinite(reward) and env.observation_space.contains(obs)
        leakages.append(info["leakage"])
        if terminated or truncated:
            env.reset()
        if step == 20:
            rss_warm = _rss_mb()
    growth = _rss_mb() - rss_warm
    assert growth < MEMORY_BOUND_MB, f"RSS grew {growth:.0f} MB over 180 steps (bound {MEMORY_BOUND_MB} MB)"
    assert len(leakages) == 200
    with pytest.raises(ValueError, match=r"allowed range 0\.\.1"):
        env.step(np.array([5, 0, 0, 0]))

"""Train a PPO attacker on LeakGym-Digits-v0 against a fixed defender with Stable-Baselines3.

    python examples/train_ppo_attacker.py   # (the CLI does the same: leakgym train --env ... --role attacker)
"""

import gymnasium as gym
from stable_baselines3 import PPO

import leakgym  # noqa: F401

env = gym.make("LeakGym-Digits-v0", role="attacker", opponent="noise-0.1", rounds=4)
model = PPO("MlpPolicy", env, n_steps=64, batch_size=32, seed=0, verbose=1)
model.learn(total_timesteps=256)
model.save("runs/ppo_attacker_example")

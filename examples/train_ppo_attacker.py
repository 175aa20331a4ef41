"""Train a PPO attacker on LeakGym-Digits-v0 against a fixed defender with Stable-Baselines3 directly.

    python examples/train_ppo_attacker.py
    leakgym eval --attackers runs/ppo_attacker_example/policy.zip,random --defenders noise-0.1 \\
        --overrides rounds=4

``leakgym train --role attacker --opponent noise-0.1`` does the same with the settings of
agents/hyperparams/ppo.yml, TensorBoard logs, checkpoints and evaluations. ``save_policy`` writes
the JSON file beside the zip that LeakGym needs to load the policy without un-pickling anything.
"""

import gymnasium as gym
from stable_baselines3 import PPO

from leakgym.agents import save_policy

env = gym.make("LeakGym-Digits-v0", role="attacker", opponent="noise-0.1", rounds=4)
model = PPO("MlpPolicy", env, n_steps=64, batch_size=32, seed=0, verbose=1)
model.learn(total_timesteps=256, progress_bar=True)
save_policy(model, "runs/ppo_attacker_example/policy.zip",
            {"algo": "ppo", "role": "attacker", "env_id": "LeakGym-Digits-v0", "overrides": {"rounds": 4}})
print("saved runs/ppo_attacker_example/policy.zip (+ policy.json)")

"""Train a PPO attacker on LeakGym-Digits-v0 against a fixed defender with Stable-Baselines3 directly,
8 games per step on the batched vector env (one Round per step for all 8 games).

    python examples/train_ppo_attacker.py
    leakgym eval --attackers runs/ppo_attacker_example/policy.zip,random --defenders noise-0.1 \\
        --overrides rounds=4

``leakgym train --role attacker --opponent noise-0.1`` does the same with the settings of
agents/experiments/hyperparams/ppo.yml, TensorBoard logs, checkpoints and evaluations. ``save_policy`` writes
the JSON file beside the zip that LeakGym needs to load the policy without un-pickling anything.
``PPO("MlpPolicy", gym.make("LeakGym-Digits-v0", ...))`` trains on one game per step instead.
"""

import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecMonitor

from leakgym.agents import save_policy
from leakgym.envs.sb3_vec import LeakGymSB3VecEnv

games = gym.make_vec("LeakGym-Digits-v0", num_envs=8, batch_clients=True, role="attacker", opponent="noise-0.1",
                     rounds=4)
env = VecMonitor(LeakGymSB3VecEnv(games))
env.seed(0)
model = PPO("MlpPolicy", env, n_steps=8, batch_size=32, seed=0, verbose=1)  # rollouts of 8 steps x 8 games
model.learn(total_timesteps=256, progress_bar=True)
save_policy(model, "runs/ppo_attacker_example/policy.zip",
            {"algo": "ppo", "role": "attacker", "env_id": "LeakGym-Digits-v0", "overrides": {"rounds": 4}})
print("saved runs/ppo_attacker_example/policy.zip (+ policy.json)")

"""Play a few LeakGym rounds: the PettingZoo game, then the Gymnasium attacker view.

    python examples/quickstart.py
"""

import gymnasium as gym

import leakgym  # noqa: F401  (registers the LeakGym-* ids)
from leakgym.envs import parallel_env

# The two-player game: both agents act at once, one step = one federated-learning round.
env = parallel_env("digits", rounds=3, render_mode="png", render_dir="runs/quickstart")
obs, infos = env.reset(seed=0)
while env.agents:
    actions = {agent: env.action_space(agent).sample() for agent in env.agents}
    obs, rewards, terminations, truncations, infos = env.step(actions)
    h = env.history[-1]
    print(
        f"round {h['round']}: {h['strategy']:>20} vs {', '.join(h['defenses']) or 'no defense':<30} "
        f"SSIM {infos['attacker']['leakage_ssim']:.3f}  acc {infos['defender']['accuracy']:.3f}  "
        f"rewards A {rewards['attacker']:+.3f} D {rewards['defender']:+.3f}"
    )
print("pictures of each round in runs/quickstart/")

# The attacker's single-agent view against the DCS² paper setting.
single = gym.make("LeakGym-Digits-v0", role="attacker", opponent="dcs2-paper", rounds=2)
obs, info = single.reset(seed=0)
obs, reward, terminated, truncated, info = single.step(single.action_space.sample())
print("attacker reward against dcs2-paper:", round(reward, 3))

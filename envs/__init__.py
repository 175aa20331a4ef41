"""LeakGym environments (installed as leakgym.envs)."""

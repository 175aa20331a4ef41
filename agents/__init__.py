"""LeakGym agents (installed as leakgym.agents)."""

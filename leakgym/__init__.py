"""LeakGym: a game environment for gradient-leakage attacks and defenses in federated learning."""

__version__ = "0.1.0"

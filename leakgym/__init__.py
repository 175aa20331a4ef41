"""LeakGym: a game environment for gradient-leakage attacks and defenses in federated learning.

Importing ``leakgym`` registers the Gymnasium ids (``LeakGym-Digits-v0``, ``LeakGym-CIFAR-v0``, ...).
"""

__version__ = "0.1.0"

from leakgym.envs import registration as _registration  # noqa: F401  (registers the Gymnasium ids)

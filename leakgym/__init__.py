"""LeakGym: a game environment for gradient-leakage attacks and defenses in federated learning.

Importing ``leakgym`` registers the Gymnasium ids (``LeakGym-Digits-v0``, ``LeakGym-CIFAR-v0``, ...).

It also asks Intel MKL for size-independent rounding (``MKL_CBWR=AUTO,STRICT``, MKL's conditional
numerical reproducibility, unless ``MKL_CBWR`` is set already): by default MKL picks, on some CPUs, kernels
whose rounding of one row depends on how many rows the call has (measured on an AMD EPYC with AVX-512:
a BLAS product of 1 row vs 3 rows up to 3e-5 apart), so a game's or an attack problem's trajectory
depended on its neighbours in a batch by float32 rounding, and the attacks amplify that. MKL reads the
setting at its first computation, so import ``leakgym`` before any CPU matrix product runs.
"""

import os as _os

_os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"

from leakgym.envs import registration as _registration  # noqa: F401  (registers the Gymnasium ids)

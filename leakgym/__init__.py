"""LeakGym: a game environment for gradient-leakage attacks and defenses in federated learning.

Importing ``leakgym`` registers the Gymnasium ids (``LeakGym-Digits-v0``, ``LeakGym-CIFAR-v0``, ...).

It also asks Intel MKL for size-independent rounding (``MKL_CBWR=AUTO,STRICT``, MKL's conditional
numerical reproducibility, unless ``MKL_CBWR`` is set already): by default MKL picks, on some CPUs, kernels
whose rounding of one row depends on how many rows the call has (measured on an AMD EPYC with AVX-512:
a BLAS product of 1 row vs 3 rows up to 3e-5 apart), so a game's or an attack problem's trajectory
depended on its neighbours in a batch by float32 rounding, and the attacks amplify that. MKL reads the
setting at its first computation, so import ``leakgym`` before any CPU matrix product runs.

Layout: the installed package holds ``leakgym.envs`` and ``leakgym.agents`` inside it, while the source
tree keeps them beside this folder (``envs/`` and ``agents/``; ``[tool.setuptools.package-dir]`` in
``pyproject.toml`` maps them). When this file is the source tree's -- Python started in the clone root puts
``./leakgym`` ahead of any installed copy -- :class:`_SiblingFinder` resolves the two subpackages to
those sibling folders, so ``import leakgym.envs`` works there after a plain ``pip install .`` too.
"""

import os as _os
import sys as _sys
from importlib.util import spec_from_file_location as _spec_from_file_location
from pathlib import Path as _Path

_os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"

#: subpackage -> its folder beside ``leakgym/`` in the source tree (the package-dir mapping of pyproject.toml)
_SIBLINGS = {"leakgym.envs": "envs", "leakgym.agents": "agents"}


class _SiblingFinder:
    """Meta-path finder for ``leakgym.envs``/``leakgym.agents`` in a source tree (see the module docstring).

    Installed only when this package's own folder lacks ``envs/`` (the installed layout has it), and
    consulted after the standard finders, so an installed or editable layout is never overridden.
    """

    def __init__(self, root: _Path) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        folder = _SIBLINGS.get(fullname)
        if folder is None:
            return None
        init = self.root / folder / "__init__.py"
        if not init.is_file():
            return None
        return _spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def _install_sibling_finder() -> None:
    here = _Path(__file__).resolve().parent
    if (here / "envs").is_dir() or not (here.parent / "envs" / "__init__.py").is_file():
        return  # the installed layout, or no source tree beside this package
    if not any(isinstance(f, _SiblingFinder) for f in _sys.meta_path):
        _sys.meta_path.append(_SiblingFinder(here.parent))


_install_sibling_finder()

from leakgym.envs import registration as _registration  # noqa: F401  (registers the Gymnasium ids)

"""``python -m leakgym ...``: the same command line as the ``leakgym`` script (:mod:`leakgym.cli`)."""

import sys

from leakgym.cli import main

sys.exit(main())

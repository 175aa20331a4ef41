"""``python -m leakgym ...``: the same command line as the ``leakgym`` script (:mod:`leakgym.cli`)."""

import sys

from leakgym.cli import main

if __name__ == "__main__":  # not when a documentation tool imports every module
    sys.exit(main())

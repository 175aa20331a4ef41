"""``python -m leakgym.reproduce ...`` (same as ``leakgym reproduce ...``)."""

import argparse

from leakgym.reproduce import add_arguments, main

parser = argparse.ArgumentParser(prog="leakgym reproduce", description="scaled-down re-runs of each paper's main table")
add_arguments(parser)
raise SystemExit(main(parser.parse_args()))

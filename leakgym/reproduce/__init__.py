"""``leakgym reproduce <paper>``: scaled-down, faithful re-runs of each paper's main table.

    leakgym reproduce dcs2|ppp|oasis|censor|loda|all [--out docs/results] [--size small|full]
                      [--seed S] [--images N] [--no-utility] [--no-progress]

Each paper module (:mod:`.dcs2`, :mod:`.ppp`, :mod:`.oasis`, :mod:`.censor`, :mod:`.loda`) is data --
the table's defenses and attacks, the scaled-down sizes and the paper's own numbers -- run by the one
generic harness (:mod:`.harness`, :mod:`.runner`). Each writes ``reproduce_<paper>.json`` (every
number, per image), ``.md`` (ours next to the paper, and computed verdicts on whether the paper's
ordering/trend holds) and ``.png``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

#: paper key -> module defining ``PAPER_SPEC`` (a :class:`~leakgym.reproduce.runner.Paper`).
PAPERS: dict[str, str] = {
    "dcs2": "leakgym.reproduce.dcs2",
    "ppp": "leakgym.reproduce.ppp",
    "oasis": "leakgym.reproduce.oasis",
    "censor": "leakgym.reproduce.censor",
    "loda": "leakgym.reproduce.loda",
}


def paper_spec(name: str):
    """The :class:`~leakgym.reproduce.runner.Paper` registered as ``name``."""
    if name not in PAPERS:
        raise ValueError(f"unknown paper {name!r}; allowed: {sorted(PAPERS)}")
    return importlib.import_module(PAPERS[name]).PAPER_SPEC


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``leakgym reproduce``."""
    parser.add_argument("paper", choices=[*PAPERS, "all"], help="which paper's table to reproduce ('all': every one)")
    parser.add_argument("--out", type=Path, default=Path("docs/results"),
                        help="output folder for reproduce_<paper>.{json,md,png} (default: %(default)s)")
    parser.add_argument("--size", choices=("small", "full"), default="small",
                        help="small: minutes on 2 CPU cores; full: closer to the paper's sizes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of everything (default: %(default)s)")
    parser.add_argument("--images", type=int, default=None,
                        help="victim images per cell (default: the size's; rounded up to a multiple of the batch)")
    parser.add_argument("--no-utility", action="store_true", help="skip the FedSGD accuracy runs")
    parser.add_argument("--no-progress", action="store_true", help="disable the tqdm progress bars")


def main(args: argparse.Namespace) -> int:
    """Run the chosen paper(s); returns 0, or 1 if any paper failed (the others still run)."""
    from leakgym.reproduce.runner import run_paper

    names = list(PAPERS) if args.paper == "all" else [args.paper]
    if args.images is not None and args.images < 1:
        raise ValueError(f"--images={args.images}; allowed: integers >= 1")
    failed = False
    for name in names:
        try:
            result = run_paper(paper_spec(name), size=args.size, seed=args.seed, images=args.images, out=args.out,
                               utility=not args.no_utility, progress=not args.no_progress)
        except Exception as err:  # noqa: BLE001 - report, continue with the other papers, exit 1
            failed = True
            print(f"reproduce {name}: failed: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        print(f"reproduce {name}: {result['wall_s']:.0f} s -> {args.out}/reproduce_{name}.md", file=sys.stderr)
        for v in result["verdicts"]:
            mark = {True: "holds", False: "DOES NOT HOLD", None: "not checkable"}[v["holds"]]
            print(f"  [{mark}] {v['claim']}", file=sys.stderr)
    return 1 if failed else 0


__all__ = ["PAPERS", "add_arguments", "main", "paper_spec"]


"""``leakgym reproduce <paper>``: scaled-down, faithful re-runs of each paper's main table.

    leakgym reproduce dcs2|ppp|oasis|censor|loda|all [--out runs/reproduce] [--size small|full]
                      [--seeds 0,1,2] [--images N] [--no-utility] [--no-progress] [--resume | --rerender]

Each paper module (:mod:`.dcs2`, :mod:`.ppp`, :mod:`.oasis`, :mod:`.censor`, :mod:`.loda`) is data --
the table's defenses and attacks, the scaled-down sizes and the paper's own numbers (one cited
``PAPER`` table) -- run by the one generic harness (:mod:`.harness`, :mod:`.runner`), once per seed.
Each writes ``reproduce_<paper>.json`` (every number, per image and seed), ``.md`` (ours as mean ±
standard error next to the paper, and computed verdicts: "holds" only beyond two standard errors,
:mod:`.stats`) and ``.png`` (the paper's panels and the accuracy curves of every row), to
``runs/reproduce`` unless ``--out`` names another folder (the committed results in ``docs/results``
are rewritten only with ``--out docs/results``). The JSON is written as the work goes (marked
``"complete": false`` until the end), so Ctrl-C keeps the finished seeds; ``--resume`` continues such a
run with the same options, running only what is missing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from leakgym.files import folder_argument
from leakgym.suggest import did_you_mean

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
        raise ValueError(f"unknown paper {name!r}{did_you_mean(name, PAPERS)}; allowed: {sorted(PAPERS)}")
    return importlib.import_module(PAPERS[name]).PAPER_SPEC


class _Given(argparse.Action):
    """Stores the value and adds the flag to ``namespace.given``."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = [*getattr(namespace, "given", []), option_string]


class _GivenTrue(_Given):
    """``store_true`` that adds the flag to ``namespace.given``."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``leakgym reproduce``."""
    parser.add_argument("paper", choices=[*PAPERS, "all"], help="which paper's table to reproduce ('all': every one)")
    parser.add_argument("--out", type=folder_argument, default=Path("runs/reproduce"),
                        help="output folder for reproduce_<paper>.{json,md,png}; the .json is written as the run goes "
                             "(\"complete\": false until it ends) (default: %(default)s)")
    # The run options record that they were given (args.given): --rerender refuses them.
    parser.add_argument("--size", choices=("small", "full"), default="small", action=_Given,
                        help="small: minutes on 2 CPU cores; full: closer to the paper's sizes (default: %(default)s)")
    parser.add_argument("--seeds", type=_seeds, default=(0, 1, 2), action=_Given,
                        help="comma-separated seeds, one run each; numbers are mean ± se over them (default: 0,1,2)")
    parser.add_argument("--images", type=int, default=None, action=_Given,
                        help="victim images per cell (default: the size's; rounded up to a multiple of the batch)")
    parser.add_argument("--no-utility", action=_GivenTrue, help="skip the FedSGD accuracy runs")
    parser.add_argument("--no-progress", action="store_true", help="disable the tqdm progress bars")
    parser.add_argument("--resume", action=_GivenTrue,
                        help="continue the run recorded in <out>/reproduce_<paper>.json (an interrupted one, "
                             "written as it went): only what it lacks is run; refused if it records other options; "
                             "a complete one is left as it is")
    parser.add_argument("--rerender", action="store_true",
                        help="do not run: recompute the verdicts and rewrite the .md/.png from <out>/reproduce_<paper>.json")


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}; allowed: comma-separated integers, e.g. 0,1,2") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds {text!r}; the seeds must be distinct")
    from leakgym.reproduce.runner import MAX_SEED

    if not all(0 <= s <= MAX_SEED for s in seeds):
        raise argparse.ArgumentTypeError(f"--seeds {text!r}; allowed: integers in [0, {MAX_SEED}]")
    return seeds


def main(args: argparse.Namespace) -> int:
    """Run the chosen paper(s); returns 0, or 1 if any paper failed (the others still run)."""
    from leakgym.reproduce.runner import rerender, run_paper

    names = list(PAPERS) if args.paper == "all" else [args.paper]
    if args.images is not None and args.images < 1:
        raise ValueError(f"--images={args.images}; allowed: integers >= 1")
    given = getattr(args, "given", [])
    if args.rerender and given:
        raise ValueError(f"--rerender rewrites the tables of the run recorded in <out>/reproduce_<paper>.json; "
                         f"{', '.join(dict.fromkeys(given))} cannot change it (run without --rerender to run with them)")
    resume = getattr(args, "resume", False)
    failed = False
    for done, name in enumerate(names):
        try:
            if args.rerender:
                rerender(paper_spec(name), args.out / f"reproduce_{name}.json")
                print(f"reproduce {name}: re-rendered {args.out}/reproduce_{name}.md", file=sys.stderr)
                continue
            path = args.out / f"reproduce_{name}.json"
            before = path.stat().st_mtime_ns if path.exists() else None
            result = run_paper(paper_spec(name), size=args.size, seeds=args.seeds, images=args.images, out=args.out,
                               utility=not args.no_utility, progress=not args.no_progress, resume=resume)
        except KeyboardInterrupt as err:
            finished = ", ".join(names[:done]) or "none"
            kept, at = getattr(err, "kept", ""), getattr(err, "path", None)
            what = (f"kept its finished part in {at} (incomplete: {kept}; run the same command with --resume to "
                    "finish it)" if kept and at is not None else "nothing of it was written")
            print(f"reproduce: interrupted during {name}; {what}; finished papers: {finished}, in {args.out}",
                  file=sys.stderr)
            return 130
        except Exception as err:  # report, continue with the other papers, exit 1
            if len(names) == 1 and isinstance(err, ValueError):
                raise  # one paper and a user error (a bad results file, a resume with other options): one line, exit 2
            failed = True
            print(f"reproduce {name}: failed: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        if resume and before is not None and path.stat().st_mtime_ns == before:
            print(f"reproduce {name}: already complete in {path} (--resume: nothing run)", file=sys.stderr)
            continue
        print(f"reproduce {name}: {result['wall_s']:.0f} s -> {args.out}/reproduce_{name}.md", file=sys.stderr)
        for v in result["verdicts"]:
            print(f"  [{v['status']}] {v['claim']}", file=sys.stderr)
    return 1 if failed else 0


__all__ = ["PAPERS", "add_arguments", "main", "paper_spec"]


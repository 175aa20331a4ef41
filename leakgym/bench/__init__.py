"""``leakgym bench``: measured speed and utility, written to JSON plus a markdown table.

Every benchmark checks its arguments and that its output path can be written before it measures
anything, rewrites its JSON and markdown after every finished row (:func:`write_results`), shows a
progress bar of rows done on stderr (``--no-progress`` hides it), and on Ctrl-C keeps the finished
rows, says where they are and exits with status 130 (:func:`interrupted`). Missing or non-finite
numbers are written as JSON ``null`` and ``-`` in the table.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from leakgym.agents.experiments.cli_common import (
    INTERRUPTED,  # exit status after Ctrl-C, as leakgym eval / train
)
from leakgym.files import (  # json_safe: NaN / inf -> None, numpy scalars -> Python
    json_safe,
    writable_folder,
    write_atomically,
)


def device_label(device: str | torch.device) -> str:
    """``"cpu"``, or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``: rows must say which accelerator they came from."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return str(dev)


def cpu_name() -> str:
    """The CPU model as the OS names it (``/proc/cpuinfo``'s "model name", e.g. ``"AMD EPYC"``), else the
    architecture (``"x86_64"``)."""
    fallback = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), fallback)
    except OSError:  # not Linux
        return fallback


def machine_label(threads: int, device: str | torch.device) -> str:
    """Where a run's timings come from: ``"AMD EPYC, 2 cores, 1 torch thread(s), device cpu"``."""
    return f"{cpu_name()}, {os.cpu_count()} cores, {threads} torch thread(s), device {device_label(device)}"


def dumps(obj) -> str:
    """Strict JSON (``NaN`` / ``Infinity`` written as ``null``), indented."""
    return json.dumps(json_safe(obj), indent=2, allow_nan=False)


def markdown_table(title: str, columns: list[tuple[str, object]], rows: list[dict], *, key: list[str],
                   error_width: int = 100) -> str:
    """A titled markdown table: ``columns`` are ``(header, row -> cell text)``; a row with an ``error``
    shows its ``key`` cells, then the error in the next cell and blanks after it. A cell whose value is
    missing or not finite (its formatter gets ``None`` and raises ``TypeError``) shows ``-``."""
    lines = [title, "", "| " + " | ".join(h for h, _ in columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for r in rows:
        if "error" in r:
            cells = [str(r.get(k, "")) for k in key] + [f"unavailable: {r['error'][:error_width]}"]
            cells += [""] * (len(columns) - len(cells))
        else:
            clean = json_safe(r)
            cells = []
            for _, fmt in columns:
                try:
                    cells.append(fmt(clean))  # type: ignore[operator]
                except TypeError:
                    cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_counts(text: str, flag: str, example: str) -> list[int]:
    """``"1,16,256"`` -> ``[1, 16, 256]``: a comma-separated list of integers >= 1 given as ``flag``;
    ValueError naming the flag and the bad entry (an empty list too), or the entries given twice (each
    is a row: the same row measured twice, found in an audit)."""
    counts = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{flag} entry {part!r} (in {text!r}); allowed: integers >= 1, comma-separated "
                             f"(e.g. {example})")
        counts.append(int(part))
    check_distinct(counts, flag, text)
    return counts


def check_distinct(entries: list, flag: str, text: str, same: Callable[[object], str] = str) -> None:
    """ValueError naming ``flag`` and every entry of ``entries`` given more than once (``same(entry)``: how
    the message names it, e.g. which of the user's names it came from)."""
    repeated = [e for i, e in enumerate(entries) if e in entries[:i]]
    if repeated:
        names = ", ".join(dict.fromkeys(same(e) for e in repeated))
        raise ValueError(f"{flag}={str(text)!r} names {names} more than once (each entry is a row); allowed: "
                         "distinct entries, comma-separated")


def smallest_image_side(models: list[str], floor: int = 1) -> tuple[int, list[str]]:
    """The smallest image side every model of ``models`` accepts (its class's ``min_image_size``; at least
    ``floor``) and the ``"LeNet 4"`` parts that say why: one check of a run's ``--image-size`` before it
    measures anything, not a failure at the first row of the model that cannot take it."""
    from leakgym.models import MODEL_CLASSES

    sizes = {MODEL_CLASSES[m].__name__: MODEL_CLASSES[m].min_image_size for m in models}
    return max(floor, *sizes.values()), [f"{name} {n}" for name, n in sizes.items()]


def check_output(path: str | Path, flag: str = "--json", *, table: bool = True) -> Path:
    """Create the folder of ``path`` and check a file can be written in it, before anything is measured;
    ValueError naming ``flag`` and the path otherwise. ``table``: the markdown table goes beside it
    (:func:`write_results`' ``<path>.md``), which must not be a folder either (found in an audit: a run
    measured everything, then failed to write the table)."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag}={str(path)!r} is a folder; allowed: a file path, e.g. runs/bench/result.json")
    if table and out.with_suffix(".md").is_dir():
        raise ValueError(f"{flag}={str(path)!r}: its markdown table goes to {str(out.with_suffix('.md'))!r}, which is "
                         "a folder; allowed: a path whose .md sibling is a file or missing, e.g. "
                         "runs/bench/result.json")
    if flag == "--json" and out.suffix == ".md":  # the table is written beside it as <path>.md: the same file
        raise ValueError(f"--json={str(path)!r}: its markdown table goes to the same path ({out.with_suffix('.md')}); "
                         "allowed: a path not ending in .md, e.g. runs/bench/result.json")
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"{flag}={str(path)!r}: {str(blocker)!r} is a file, not a folder; "
                         "allowed: a path in a folder you can create and write")
    try:
        writable_folder(out.parent)
    except OSError as exc:
        raise ValueError(f"{flag}={str(path)!r}: cannot write there ({exc.strerror or exc}); "
                         "allowed: a path in a folder you can create and write") from None
    return out


def write_results(json_path: str | Path, machine: str, rows: list[dict], table: str, *, echo: bool = True) -> None:
    """Write ``{"machine", "rows"}`` to ``json_path`` (strict JSON) and the table beside it (``.md``);
    print the table when ``echo``. Called after every finished row with ``echo=False``."""
    out = Path(json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, dumps({"machine": machine, "rows": rows}))  # Ctrl-C never leaves half a file
    write_atomically(out.with_suffix(".md"), table)
    if echo:
        print(table)


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar of rows done out of ``total`` on stderr (``enabled=False``: silent)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="row", file=sys.stderr, disable=not enabled, dynamic_ncols=True)


def interrupted(done: int, total: int, *paths: str | Path, save: Callable[[], None] | None = None) -> int:
    """After Ctrl-C: write the finished rows once more with ``save()`` (the interrupt may have come between a
    row's arrival and its save), say how many rows finished and where they are; return 130."""
    if done:
        if save is not None:
            save()
        where = " and ".join(str(p) for p in paths)
        print(f"interrupted: {done} of {total} rows finished; they are in {where}", file=sys.stderr)
    else:
        print(f"interrupted: none of {total} rows finished; nothing written", file=sys.stderr)
    return INTERRUPTED

"""``leakgym bench``: measured speed and utility, written to JSON plus a markdown table."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def device_label(device: str | torch.device) -> str:
    """``"cpu"``, or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``: rows must say which accelerator they came from."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return str(dev)


def markdown_table(title: str, columns: list[tuple[str, object]], rows: list[dict], *, key: list[str],
                   error_width: int = 100) -> str:
    """A titled markdown table: ``columns`` are ``(header, row -> cell text)``; a row with an ``error``
    shows its ``key`` cells, then the error in the next cell and blanks after it."""
    lines = [title, "", "| " + " | ".join(h for h, _ in columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for r in rows:
        if "error" in r:
            cells = [str(r.get(k, "")) for k in key] + [f"unavailable: {r['error'][:error_width]}"]
            cells += [""] * (len(columns) - len(cells))
        else:
            cells = [fmt(r) for _, fmt in columns]  # type: ignore[operator]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(json_path: str | Path, machine: str, rows: list[dict], table: str) -> None:
    """Write ``{"machine", "rows"}`` to ``json_path`` and the table beside it (``.md``); print the table."""
    out = Path(json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(table)
    print(table)

"""``leakgym bench``: measured speed and utility, written to JSON plus a markdown table."""

from __future__ import annotations

import torch


def device_label(device: str | torch.device) -> str:
    """``"cpu"``, or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``: rows must say which accelerator they came from."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return str(dev)

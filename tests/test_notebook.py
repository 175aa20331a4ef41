"""examples/quickstart.ipynb runs end to end on digits (its training budget made small for the test)."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def _run(tmp_path, monkeypatch, parameters: str):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    cell.source = parameters
    # the kernel is this interpreter: the kernelspec names "python", found through PATH
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def _outputs(nb) -> str:
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    """Every cell runs: make an env, play a round, render, train (64 steps here, 2,000 in the notebook),
    evaluate, draw the gallery."""
    nb = _run(tmp_path, monkeypatch, 'TIMESTEPS = 64\nEPISODES = 1\nOUT = "runs/quickstart"')
    text = _outputs(nb)
    assert "action space: MultiDiscrete([4 1 1 1])" in text  # the strategy; one budget
    assert "strategy prior-init: leakage SSIM" in text
    assert "trained 64 steps" in text and "mean leakage SSIM: learned" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the rendered round and the gallery
    assert (tmp_path / "runs" / "quickstart" / "attacker" / "policy.zip").is_file()
    assert (tmp_path / "runs" / "quickstart" / "gallery.png").is_file()


@pytest.mark.slow
def test_quickstart_notebook_runs_as_written(tmp_path, monkeypatch):
    """The notebook's own budget: 2,000 training steps (about 8 minutes on a loaded 2-core machine)."""
    nb = nbformat_read_parameters()
    nb = _run(tmp_path, monkeypatch, nb)
    assert "trained 2048 steps" in _outputs(nb)


def nbformat_read_parameters() -> str:
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return cell.source

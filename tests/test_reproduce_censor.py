"""CENSOR reproduction: every row, the non-paper variants included, trains with every seed."""

from __future__ import annotations

import pytest

from leakgym.reproduce import paper_spec
from leakgym.reproduce.runner import run_paper
from leakgym.reproduce.stats import UNCHECKED

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("size", ["small", "full"])
def test_every_row_measures_utility_with_every_seed(size):
    rows = paper_spec("censor").rows(size)
    assert {r.name for r in rows} >= {"Soteria", "Censor", "Censor zeros", "Censor skip", "Censor samples",
                                       "Censor samples skip"}
    assert all(r.utility and r.utility_seeds is None for r in rows), [r.name for r in rows]


def test_reduced_run_trains_every_variant_with_every_seed(tmp_path):
    """Two seeds, one victim image, 3 attack iterations, 2 FedSGD rounds: every row's accuracy has one value per
    seed, the variants table prints the number of seeds, and every accuracy claim is checkable."""
    tiny = {"iterations": 3, "utility_rounds": 2, "utility_eval_every": 1}
    result = run_paper(paper_spec("censor"), seeds=(0, 1), images=1, out=tmp_path, scale_overrides=tiny,
                       progress=False)
    for row in result["rows"]:
        u = result["utility"][row["name"]]
        assert len(u["accuracy_per_seed"]) == 2 and u["seeds"] == [0, 1], row["name"]
    accuracy_claims = [v for v in result["verdicts"] if "keeps the accuracy" in v["claim"]]
    assert len(accuracy_claims) == 5 and all(v["status"] != UNCHECKED for v in accuracy_claims)
    md = (tmp_path / "reproduce_censor.md").read_text()
    assert "| Censor samples skip |" in md and "utility not measured" not in md
    assert result["cpu_s"] > 0 and "s of CPU time" in md

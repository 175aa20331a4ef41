"""DCS² reproduction: every row, DCS² included, trains with every seed."""

from __future__ import annotations

import pytest

from leakgym.reproduce import paper_spec


@pytest.mark.parametrize("size", ["small", "full"])
def test_every_row_measures_utility_with_every_seed(size):
    rows = paper_spec("dcs2").rows(size)
    assert [r.name for r in rows] == ["None", "DP-Gaussian", "Prune", "Soteria", "DCS²"]
    assert all(r.utility and r.utility_seeds is None for r in rows), [r.name for r in rows]

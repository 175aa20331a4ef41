"""Quotes are data: every number a reproduction attributes to a paper comes from the paper module's
``PAPER`` table, every table section carries its citation, and the markdown prints the table.

The reproductions run on synthetic results here (no training, no attack): the check is about what
is printed, not what is measured.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from leakgym.reproduce import PAPERS, paper_spec
from leakgym.reproduce.runner import NUMBER, markdown, merge_utility, numbers_in, plateau, quote


def fake_result(paper, seeds=(0, 1, 2)) -> dict:
    """A results dict shaped like run_paper's, with random numbers in every cell and utility entry."""
    rng = np.random.default_rng(0)
    settings = paper.scales["small"]
    rows, columns = paper.rows("small"), paper.columns("small")
    cells = []
    for label in settings:
        for row in rows:
            for col in columns:
                if row.attacks is not None and col.name not in row.attacks:
                    continue
                n = 6
                cells.append({"setting": label, "defense": row.name, "attack": col.name, "n_images": n,
                              "attack_s": 1.0, "fidelity": 1.0, "overhead_ms": 0.0,
                              "sent": ["candidate", "original", "skip", "candidate", "original", "candidate"],
                              "per_image": {"psnr": rng.uniform(5, 100, n).tolist(), "ssim": rng.uniform(0, 1, n).tolist(),
                                            "mse": rng.uniform(0, 0.2, n).tolist()}})

    def run(k: int) -> dict:
        acc = float(rng.uniform(0.1, 0.99))
        return {"accuracy": acc, "accuracy_victim": acc, "test_loss": 1.0, "wall_s": 1.0,
                "curve": [[0, 0.1], [10, acc / 2], [20, acc]], "sent": {"candidate": 3, "original": 1},
                "rounds": 20, "clients": 4, "batch": 16, "defended": "all", "test_images": 100}

    utility = {row.name: merge_utility([run(k) for k in seeds], list(seeds)) for row in rows}
    extras = {}
    if paper.key == "loda":
        from leakgym.reproduce.encoding_diagnosis import VARIANTS

        extras["encoding_diagnosis"] = {"variants": {v: {"plain": [0.5, 0.6, 0.7], "flipped": [0.1, 0.1, 0.1],
                                                         "curve": [[10, 0.5]]} for v in VARIANTS},
                                        "rounds": 20, "clients": 4, "batch": 16, "lr": 0.5, "k": 4,
                                        "seeds": list(seeds), "wall_s": 1.0}
    result = {"paper": paper.key, "title": paper.title, "source": paper.source, "paper_setting": paper.paper_setting,
              "size": "small", "seeds": list(seeds), "dataset": "digits", "cifar10": "not present",
              "settings": {k: v.to_dict() for k, v in settings.items()}, "utility_setting": next(iter(settings)),
              "rows": [{"name": r.name, "config": r.config.to_dict(), "active": r.config.active(),
                        "precode": r.precode, "attacks": list(r.attacks) if r.attacks else None, "note": r.note}
                       for r in rows],
              "columns": [], "cells": cells, "utility": utility, "paper_numbers": paper.paper_numbers,
              "deviations": paper.deviations, "scale_overrides": {}, "extras": extras, "wall_s": 1.0}
    result["plateau"] = plateau(result)
    result["verdicts"] = paper.verdicts(result)
    return result


def _numbers(text: str) -> list[float]:
    # Leave out what is ours or a label: "k=4", "B=8", "NG05", "±"-parts are ours anyway.
    return [float(m) for m in NUMBER.findall(text)]


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_every_section_of_the_paper_table_is_cited(name):
    paper = paper_spec(name)
    for section, entries in paper.paper_numbers.items():
        assert isinstance(entries, dict) and entries.get("cite"), (name, section)
    for section in paper.printed:
        assert section in paper.paper_numbers, (name, section)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_quoted_numbers_come_from_the_paper_table(name):
    """Every number in a verdict's "paper" field is one of the table's numbers (or a label such as k=4)."""
    paper = paper_spec(name)
    table = numbers_in(paper.paper_numbers)
    names = " ".join([*(r.name for r in paper.rows("small")), *paper.scales["small"], "k=4 k=6 B=8 B=64"])
    labels = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", names)}
    for v in fake_result(paper)["verdicts"]:
        for x in _numbers(v["paper"]):
            assert x in table or x in labels, (name, v["claim"], x, v["paper"])


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_markdown_prints_the_paper_table(name):
    """Every number of the sections the markdown claims to print appears in it, as quote() writes it."""
    paper = paper_spec(name)
    md = markdown(paper, fake_result(paper))
    for section in paper.printed:
        for x in numbers_in({k: v for k, v in paper.paper_numbers[section].items() if k != "cite"}):
            assert quote(x) in md, (name, section, x)
    assert "--seeds 0,1,2" in md and "±" in md


def test_ppp_accuracy_claim_quotes_table_ii():
    """The old "others within 0.1" misquote: Table II has GC90 95.02 -> 98.79 (+3.77)."""
    paper = paper_spec("ppp")
    texts = [v["paper"] for v in fake_result(paper)["verdicts"]]
    assert any("GC90 95.02 -> 98.79" in t for t in texts)
    assert not any("within 0.1" in t for t in texts)


def test_quote_formats_like_the_paper():
    assert quote(1.0) == "1.00" and quote(0.0195) == "0.0195" and quote(17.819) == "17.819" and quote(None) == "n/a"


def test_rerender_rewrites_markdown_and_figure_from_the_json(tmp_path):
    import json

    from leakgym.reproduce.runner import rerender

    paper = paper_spec("censor")
    result = fake_result(paper)
    result["verdicts"] = []
    path = tmp_path / "reproduce_censor.json"
    path.write_text(json.dumps(result))
    again = rerender(paper, path)
    assert again["verdicts"] and (tmp_path / "reproduce_censor.png").stat().st_size > 0
    md = (tmp_path / "reproduce_censor.md").read_text()
    assert "as written and as intended" in md and "raw-gradient updates" in md
    with pytest.raises(ValueError, match="not 'dcs2'"):
        rerender(paper_spec("dcs2"), path)

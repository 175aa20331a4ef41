"""The LODA reproduction's diagnosis (leakgym.reproduce.loda_diagnosis) and its computed wording."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from leakgym.defenses import DefenseConfig
from leakgym.reproduce import loda as repro
from leakgym.reproduce import loda_diagnosis as ld
from leakgym.reproduce.harness import DefenseRow, Scale, measure_utility
from leakgym.reproduce.stats import FAILS, HOLDS


@pytest.fixture(autouse=True)
def _one_thread_and_own_cache(one_torch_thread, tmp_path_factory, monkeypatch):
    # The LODA extractor is trained once into this module's own cache (not the user's).
    monkeypatch.setenv("LEAKGYM_DATA", str(tmp_path_factory.getbasetemp() / "loda-repro-data"))


@pytest.fixture(scope="module")
def split():
    from leakgym.data import federated_split, load_dataset

    return federated_split(load_dataset("digits", image_size=16), num_clients=4, seed=0)


def test_fedsgd_replays_the_utility_run_bit_for_bit(split):
    """The diagnosis' training loop is the harness's FedSGD without a defense: same curve, to the last bit
    (so its round-200 numbers are the utility column's). Fails if the batch draws, the model seed or the
    server step drift apart."""
    scale = Scale(utility_rounds=12, utility_batch=16, utility_eval_every=4, eval_size=None)
    want = measure_utility(DefenseRow("plain"), scale, split=split, seed=2, progress=False)["curve"]
    got = ld.fedsgd(split, rounds=12, clients=4, batch=16, lr=scale.utility_lr, seed=2, eval_every=4,
                    tests={"plain": (split.test_x, split.test_y)})["curves"]["plain"]
    assert got == want
    other = ld.fedsgd(split, rounds=12, clients=4, batch=16, lr=scale.utility_lr, seed=3, eval_every=4,
                      tests={"plain": (split.test_x, split.test_y)})["curves"]["plain"]
    assert other != want
    with pytest.raises(ValueError, match="BatchNorm"):
        ld.fedsgd(split, model="convnet", rounds=1, clients=1, batch=4, lr=0.1, seed=0, eval_every=1, tests={})


def test_obscure_split_keeps_labels_and_draws_starts_per_seed(split):
    cfg = DefenseConfig(loda_c=9.0, loda_steps=2, loda_layers=5)
    a, info_a = ld.obscure_split(split, cfg, seed=0)
    b, info_b = ld.obscure_split(split, cfg, seed=0)
    c, _ = ld.obscure_split(split, cfg, seed=1)
    for (xo, yo), (x, y), (xb, _), (xc, _) in zip(a.clients, split.clients, b.clients, c.clients):
        assert torch.equal(yo, y) and xo.shape == x.shape
        assert xo.min() >= 0 and xo.max() <= 1
        assert not torch.allclose(xo, x)  # obscured, not the private images
        assert torch.equal(xo, xb) and not torch.equal(xo, xc)
    assert [len(s) for s in info_a["start_labels"]] == [len(y) for _, y in split.clients]
    assert all(torch.equal(p, q) for p, q in zip(info_a["start_labels"], info_b["start_labels"]))
    assert torch.equal(a.test_x, split.test_x) and torch.equal(a.public_x, split.public_x)


class _Fixed(nn.Module):
    """A 'classifier' that predicts a fixed label per image (by its position in the batch)."""

    def __init__(self, labels: torch.Tensor) -> None:
        super().__init__()
        self.labels = labels

    def forward(self, x):
        return nn.functional.one_hot(self.labels[: len(x)], 10).float()


def test_extractor_view_counts_labels_starts_and_collapses(split):
    spec = split.spec
    x = split.clients[0][0][:4]
    y = torch.tensor([1, 2, 3, 4])
    starts = torch.tensor([1, 0, 3, 0])
    pred = torch.tensor([1, 2, 3, 9])  # 3 of 4 own labels, 2 of 4 start labels
    moved = x.clone()
    moved[2:] = 1 - moved[2:]  # two images far from their originals
    view = ld.extractor_view(spec, _Fixed(pred), moved, y, original=x, start_labels=starts)
    assert view["label"] == 0.75 and view["start_label"] == 0.5
    assert view["collapsed"] == 0.5 and view["ssim"] < 1.0


def _fake_diagnosis(*, obscured_test: float, c9_long: float, c9_prev: float = 0.6) -> dict:
    """A diagnosis result shaped like diagnose()'s: 3 seeds, rounds 0..40 every 10, short 20, long 40."""
    def curves(short, prev, long_, jitter=0.01):
        return [[[0, 0.1], [10, short / 2], [20, short + k * jitter], [30, prev + k * jitter], [40, long_ + k * jitter]]
                for k in range(3)]

    plain = {"c": None, "steps": None, "layers": None, "seeds": [0, 1, 2], "view": [{"label": 0.97}],
             "curves": curves(0.95, 0.96, 0.97), "curves_obscured_test": []}
    c9 = {"c": 9.0, "steps": 100, "layers": 5, "seeds": [0, 1, 2],
          "view": [{"label": 0.41 + k / 100, "start_label": 0.47, "ssim": 0.28, "collapsed": 0.0} for k in range(3)],
          "curves": curves(0.36, c9_prev, c9_long), "curves_obscured_test": curves(0.2, 0.5, obscured_test)}
    return {"rows": {"plain (no LODA)": plain, repro.LODA_C9: c9}, "subset": {}, "short_rounds": 20,
            "long_rounds": 40, "eval_every": 10, "clients": 4, "batch": 16, "lr": 0.5, "seeds": [0, 1, 2],
            "model": "lenet", "extractor_test_accuracy": 0.94, "wall_s": 1.0}


def test_loda_reason_is_worded_from_the_measured_numbers():
    """The verdict's reason follows the numbers: a model better on obscured test images than on plain ones is
    called a shift, a worse one is not; a curve still rising at the end is called so."""
    worse = repro._loda_why({"extras": {"loda_diagnosis": _fake_diagnosis(obscured_test=0.70, c9_long=0.82)}})
    better = repro._loda_why({"extras": {"loda_diagnosis": _fake_diagnosis(obscured_test=0.95, c9_long=0.82)}})
    assert "worse, so it is not a shift" in worse and "42.0 ± 0.6%" in worse and "more slowly" in worse
    assert "better, so part of the gap is a shift" in better
    assert "not run" in repro._loda_why({"extras": {}})

    rising = repro._converged_verdict({"extras": {"loda_diagnosis": _fake_diagnosis(obscured_test=0.7, c9_long=0.82)}})
    flat = repro._converged_verdict({"extras": {"loda_diagnosis": _fake_diagnosis(obscured_test=0.7, c9_long=0.82,
                                                                                    c9_prev=0.82)}})
    close = repro._converged_verdict({"extras": {"loda_diagnosis": _fake_diagnosis(obscured_test=0.7, c9_long=0.95)}})
    assert rising["status"] == FAILS and "still rising" in rising["why"]
    assert flat["status"] == FAILS and "no longer rising" in flat["why"]
    assert close["status"] == HOLDS  # a 2-point drop is within the paper's 5.7-point gap


def test_diagnose_end_to_end_small(split, monkeypatch):
    """A reduced diagnosis: every row measured, the reused shards not obscured again, and the short-round
    accuracy of an obscured row equal to the utility column's on the same shards and seed."""
    cfg = DefenseConfig(loda_c=9.0, loda_steps=2, loda_layers=5)
    shards = {"c9": {0: ld.obscure_split(split, cfg, 0)}}
    calls = []
    real = ld.obscure_split

    def counted(data, config, seed):
        calls.append((config.loda_c, seed))
        return real(data, config, seed)

    monkeypatch.setattr(ld, "obscure_split", counted)
    out = ld.diagnose(split, settings={"c9": (cfg, 2), "c5": (DefenseConfig(loda_c=5.0, loda_steps=2), 1)},
                      shards=copy.copy(shards), short_rounds=4, long_rounds=8, clients=4, batch=16, lr=0.5,
                      seeds=[0, 1], eval_every=4, obscured_test=("c9",),
                      subset={"c9 subset": DefenseConfig(loda_c=9.0, loda_steps=3)}, subset_images=2)
    rows = out["rows"]
    assert calls == [(9.0, 1), (5.0, 0)]  # seed 0 of c9 was given
    assert list(rows) == ["plain (no LODA)", "c9", "c5"]
    assert [len(rows[k]["curves"]) for k in rows] == [2, 2, 1]
    assert len(rows["c9"]["curves_obscured_test"]) == 2 and not rows["c5"]["curves_obscured_test"]
    assert 0.0 <= rows["c9"]["view"][0]["label"] <= 1.0 and "start_label" in rows["c9"]["view"][0]
    assert out["subset"]["c9 subset"]["images"] == 8 and out["subset"]["c9 subset"]["steps"] == 3
    scale = Scale(utility_rounds=4, utility_batch=16, utility_eval_every=4, eval_size=None)
    want = measure_utility(DefenseRow("c9"), scale, split=shards["c9"][0][0], seed=0, progress=False)["accuracy"]
    assert ld.at_round(rows["c9"]["curves"][0], 4) == want
    with pytest.raises(ValueError, match="short_rounds"):
        ld.diagnose(split, settings={}, short_rounds=5, long_rounds=8, clients=4, batch=16, lr=0.5, seeds=[0],
                    eval_every=4)


def test_paper_c_reason_follows_the_subset_numbers():
    def sub(label, start, collapsed, c):
        return {"c": c, "layers": 5, "steps": 100, "images": 64, "label": label, "start_label": start,
                "collapsed": collapsed, "ssim": 0.5, "feature_distance": 0.9, "feature_distance_init": 0.97}

    def why(printed, pixel):
        d = {"subset": {"LODA1 (paper c as printed): c=20, first 5 conv layers, 100 steps": printed,
                        "LODA1 (paper c in pixel units): c=2.04, first 5 conv layers, 100 steps": pixel}}
        return repro._paper_c_why({"extras": {"loda_diagnosis": d}}, "LODA1")

    both_fail = why(sub(0.06, 0.88, 0.0, 20.0), sub(0.9, 0.05, 0.8, 2.04))
    assert "c=20 (as printed): 6% / 88%" in both_fail and "start image's digit wins" in both_fail
    assert "c=2.04 (in pixel units)" in both_fail and "collapse onto their private originals" in both_fail
    assert "does not transfer" in both_fail
    one_works = why(sub(0.06, 0.88, 0.0, 20.0), sub(0.8, 0.05, 0.05, 2.04))
    assert "the own label wins" in one_works and "does not transfer" not in one_works
    leaky = why(sub(0.06, 0.88, 0.0, 20.0), sub(0.9, 0.05, 0.41, 2.04))
    assert "many images collapse" in leaky and "does not transfer" in leaky
    assert repro._paper_c_why({"extras": {}}, "LODA1").startswith("utility not measured")

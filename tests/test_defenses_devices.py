"""Every registered defense runs once on the caller's device: its tensors and generators stay there.

The CUDA variant is marked ``cuda`` (skipped where no CUDA device is present); the CPU variant runs
the same cases everywhere, so the table below is exercised on every machine.
"""

from __future__ import annotations

import pytest
import torch
from method_checks import DEFENSE_CASES, changed_fields

from leakgym.data import dataset_spec
from leakgym.defenses import DEFENSES, DefenseConfig, UpdateDefense, apply_defense, real_field, registered
from leakgym.models import build_model

SPEC = dataset_spec("digits", image_size=16)

#: One cheap "on" setting per case; together they switch on every built-in defense (checked below).
CASES: dict[str, dict] = {
    "oasis": {"oasis": 31},  # every transformation, kornia's warps included
    "loda": {"loda_c": 9.0, "loda_steps": 2},
    "mixup": {"mixup_k": 2},
    "instahide": {"instahide_k": 3},  # cross-dataset: public images in the mix
    "dcs2": {"dcs2_lambda_g": 0.7, "dcs2_steps": 2},
    "dcs2-random": {"dcs2_lambda_g": 0.7, "dcs2_steps": 2, "dcs2_start": "random"},
    "censor": {"censor_trials": 3},
    "censor-samples-skip": {"censor_trials": 2, "censor_step": 1e3, "censor_subspace": "samples",
                            "censor_fallback": "skip"},
    "ppp": {"ppp": "ng"},
    "soteria": {"soteria": 0.5},
    "prune": {"prune": 0.5},
    "topk": {"topk": 0.5},
    "clip": {"clip": 1.0},
    "clip_value": {"clip_value": 0.01},
    "noise": {"noise_sigma": 0.01, "noise_kind": "laplace"},
    "noise-gaussian": {"noise_sigma": 0.01},
}
# A registered defense without a cheap case above runs its method-check case (tests/method_checks.py,
# which every registered defense has): adding a defense needs no entry here.
_COVERED = {name for settings in CASES.values() for name in DefenseConfig(**settings).active()}
CASES.update({name: dict(changed_fields(case.config)) for name, case in DEFENSE_CASES.items() if name not in _COVERED})


_SEEN: list = []


class _Probe(UpdateDefense):
    """Records where the context's generator and public split live."""

    name = "probe"
    fields = (real_field("probe", 0.0, "test probe; 0 off"),)

    def apply(self, ctx, update, x, y):
        _SEEN.append((ctx.generator.device, ctx.public_x.device, ctx.public_y.device))
        return update, {}


def _watch_public_reads(monkeypatch) -> tuple[dict[str, bool], set[str]]:
    """Make the pipeline's contexts record, by defense name, whether they were given the public split and
    whether their defense read it (``ctx.public_x`` or ``ctx.public_y``)."""
    from leakgym.defenses import pipeline
    from leakgym.defenses.registry import DefenseContext

    given: dict[str, bool] = {}
    read: set[str] = set()

    class Watched(DefenseContext):
        def __getattribute__(self, name):
            if name in ("public_x", "public_y"):
                read.add(object.__getattribute__(self, "name"))
            return super().__getattribute__(name)

    def context(**kwargs):
        given[kwargs["name"]] = kwargs["public_x"] is not None
        return Watched(**kwargs)

    monkeypatch.setattr(pipeline, "DefenseContext", context)
    return given, read


def _run_every_defense(device: torch.device, tmp_path, monkeypatch) -> None:
    """Every case on ``device`` with a public split passed. Each defense is given the split (normalised)
    exactly when it declares that it reads it (``Defense.reads_public_split``), and one that declares it never
    reads it does not touch ``ctx.public_x`` or ``ctx.public_y`` (it would get None)."""
    monkeypatch.setenv("LEAKGYM_DATA", str(tmp_path))  # LODA trains its extractor here, once
    given, read = _watch_public_reads(monkeypatch)
    readers = set()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 16, 16, generator=g).to(device)
    y = torch.tensor([3, 8, 1, 3]).to(device)
    public_x = torch.rand(32, 1, 16, 16, generator=g).to(device)
    public_y = torch.randint(0, 10, (32,), generator=g).to(device)
    for case, settings in CASES.items():
        model = build_model("lenet", SPEC, precode=case == "ppp", seed=0, device=device)
        cfg = DefenseConfig(**settings)
        given.clear(), read.clear()
        upd, rep = apply_defense(model, x, y, cfg, seed=1, public_x=public_x, public_y=public_y)
        assert rep.applied == cfg.active(), case
        for name in rep.applied:
            declared = DEFENSES[name].reads_public_split(cfg)
            assert given[name] is declared, (case, name)
            assert declared or name not in read, f"{name} reads ctx.public_x but declares it never reads the split"
            readers |= {f"{name}-{cfg.dcs2_start}" if name == "dcs2" else name} if declared else set()
        for name, t in upd.tensors.items():
            assert t.device.type == device.type and bool(torch.isfinite(t).all()), (case, name)
        for key, t in upd.metadata.get("encoding", {}).items():
            assert not isinstance(t, torch.Tensor) or t.device.type == device.type, (case, key)
    assert readers == {"loda", "instahide", "dcs2-mixup"}  # DCS²'s 'random' start draws no public image
    _SEEN.clear()
    with registered(_Probe()):
        apply_defense(build_model("lenet", SPEC, seed=0, device=device), x, y, DefenseConfig(probe=1.0),
                      public_x=public_x, public_y=public_y)
    assert [tuple(d.type for d in devs) for devs in _SEEN] == [(device.type,) * 3]


def test_cases_switch_on_every_builtin_defense():
    on = {name for settings in CASES.values() for name in DefenseConfig(**settings).active()}
    assert on == set(DEFENSES)


def test_every_defense_runs_on_cpu(tmp_path, monkeypatch):
    _run_every_defense(torch.device("cpu"), tmp_path, monkeypatch)


@pytest.mark.cuda
def test_every_defense_runs_on_cuda(cuda_device, tmp_path, monkeypatch):
    _run_every_defense(cuda_device, tmp_path, monkeypatch)

"""Every attack runs against every defense through plain data (tiny budgets; no quality bars here).

The same matrix runs on CUDA where a device is present (``-m cuda``): every tensor and generator
must live on the caller's device.
"""

import pytest
import torch

from leakgym.attacks import ATTACKS, AttackerKnowledge, build_attack
from leakgym.data import federated_split, load_dataset
from leakgym.defenses import DefenseConfig, apply_defense
from leakgym.models import build_model

DEFENSES = {
    "none": DefenseConfig(),
    "noise+prune": DefenseConfig(noise_sigma=0.01, prune=0.5),
    "soteria": DefenseConfig(soteria=0.5),
    "dcs2": DefenseConfig(dcs2_lambda_g=0.7, dcs2_steps=2),
    "censor": DefenseConfig(censor_trials=3),
    "oasis": DefenseConfig(oasis=1 | 8),
    "mixup": DefenseConfig(mixup_k=2),
    "instahide": DefenseConfig(instahide_k=2),
    "loda": DefenseConfig(loda_c=9.0, loda_steps=2),
    "clip_value": DefenseConfig(clip_value=1e-3),
}
TINY = {"iterations": 2, "restarts": 1}


@pytest.fixture(scope="module")
def setting():
    ds = load_dataset("digits")
    split = federated_split(ds, num_clients=1, seed=0)
    model = build_model("lenet", ds.spec, seed=0)
    x = ds.spec.normalize(split.clients[0][0][:2])
    y = split.clients[0][1][:2]
    return ds.spec, split, model, x, y


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("defense", sorted(DEFENSES))
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_runs_on_defended_update(attack, defense, device, setting):
    spec, split, model, x, y = setting
    model, x, y = build_model("lenet", spec, seed=0, device=device), x.to(device), y.to(device)
    public_x, public_y = split.public_x.to(device), split.public_y.to(device)
    cls = ATTACKS[attack]
    fields = {f for f in cls.Config.__dataclass_fields__}
    atk = build_attack(attack, **{k: v for k, v in TINY.items() if k in fields})
    sent = atk.prepare_model(model, spec, public_x=public_x)
    update, _ = apply_defense(sent, x, y, DEFENSES[defense], seed=0, public_x=public_x, public_y=public_y)
    if defense in ("mixup", "instahide"):
        assert update.metadata["encoding"]["scheme"] == defense
    knowledge = AttackerKnowledge(model=sent, spec=spec, batch_size=2, public_x=public_x, public_y=public_y)
    result = atk.reconstruct(update, knowledge, seed=0)
    assert result.images.shape == (2, *spec.shape)
    assert result.images.device.type == torch.device(device).type
    assert torch.isfinite(result.images).all()
    assert result.labels.shape == (2,)
    assert result.cost.units >= 1

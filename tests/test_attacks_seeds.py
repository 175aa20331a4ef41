"""Per-problem seeds: result i of a batched call is a function of (update i, knowledge i, seeds[i]).

Every attack in the registry is checked (tiny budgets, CPU, one thread): problem i's result from
``reconstruct_batch(us, ks, seeds=[s0, s1, s2])`` equals ``reconstruct(us[i], ks[i], seed=s_i)`` and
the result when it is batched with *different* neighbours at a different position.

Exactness. The random numbers of problem i are exactly its own. The arithmetic is exact on the
engine's sequential path (``vectorize=False``: every problem's tensors have the same shapes whatever N
is), so that path is compared with ``torch.equal``. The vectorised path runs one batched kernel for all
rows, and BLAS/oneDNN pick their algorithm by the batch size (GEMV for a single row, an ungrouped
convolution weight-gradient for one problem and a grouped one for several, blocking thresholds in
GEMM), so rows agree to rounding only, and optimisers can amplify the rounding: measured on a 2-core
x86 CPU, 20 iterations, the row of N = 2, 8, 64 against N = 1 was bit-identical for signed-Adam
Inverting Gradients on LeNet/ConvNet at B = 1 and 2 (one other ConvNet B = 1 instance: 1.5 max abs
pixel difference, SSIM moved by 0.12, sign() of near-zero gradients), 2e-5 to 8e-5 for L-BFGS DLG on
LeNet (SSIM moved < 1e-5) and up to 1.8 for DLG on ConvNet B = 1 (SSIM moved 0.13). In this file's tiny
setting the vectorised rows were bit-identical too, but that depends on the machine's kernels, so
they are compared within ``VECTORISED_TOL``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from leakgym.attacks import ATTACKS, AttackerKnowledge, build_attack
from leakgym.attacks.base import problem_seeds
from leakgym.attacks.engine import (
    MatchingObjective,
    ProblemSet,
    Schedule,
    run_gradient_matching,
)
from leakgym.attacks.engine.problems import UpdateSimulator
from leakgym.data import federated_split, load_dataset
from leakgym.defenses import DefenseConfig, apply_defense
from leakgym.fl.client import compute_update
from leakgym.fl.update import SharedUpdate
from leakgym.models import build_model, task_loss
from leakgym.optim import BatchedGenerator, seeded_generator

#: Budgets small enough for a few hundred milliseconds per call; only the fields a config has are used.
TINY = {
    "iterations": 2, "restarts": 2, "eot_samples": 2, "prior_noise": 0.1, "inversion_steps": 2,
    "extractor_epochs": 0, "decode_steps": 2, "num_bins": 16, "num_neurons": 32,
}
#: Attacks that only apply to one defense's updates get that defense; all others attack plain updates.
DEFENSE_FOR = {"mixup-decoding": DefenseConfig(mixup_k=2)}
#: Attacks without any random draw: the seed must not change their result.
DETERMINISTIC = {
    "analytic": "closed form; the seed only draws the probe that locates the layer",
    "imprint": "closed form; the block's randomness is fixed in prepare_model by config.seed",
    "trap-weights": "closed form; the block's randomness is fixed in prepare_model by config.seed",
}
#: Vectorised rows vs the same problem alone at tiny budgets (measured: 0 on a 2-core x86 CPU; 7e-5
#: for DLG at B = 1 and 5 iterations, where the kernels differ).
VECTORISED_TOL = {"rtol": 1e-4, "atol": 1e-4}
#: On CUDA, cuDNN convolutions run in TF32 by default and pick algorithms by shape.
CUDA_TOL = {"rtol": 1e-2, "atol": 1e-2}
SEEDS = [11, 2**40 + 3, 7]


@pytest.fixture(scope="module")
def setting():
    ds = load_dataset("digits", image_size=16)
    split = federated_split(ds, num_clients=1, seed=0)
    return ds.spec, split, build_model("lenet", ds.spec, seed=0)


def problems_for(name: str, setting, cache_dir, *, n: int = 5, b: int = 2, device: str = "cpu"):
    """``(attack, updates, knowledges)``: n distinct victims of the registered attack ``name``."""
    spec, split, model = setting
    cls = ATTACKS[name]
    fields = set(cls.Config.__dataclass_fields__)
    options = {k: v for k, v in TINY.items() if k in fields}
    if "cache_dir" in fields:
        options["cache_dir"] = str(cache_dir)
    attack = build_attack(name, **options)
    sent = attack.prepare_model(copy.deepcopy(model).to(device), spec, public_x=split.public_x)
    xs, ys = split.clients[0]
    updates, knowledges = [], []
    for i in range(n):
        x = spec.normalize(xs[i * b:(i + 1) * b]).to(device)
        y = ys[i * b:(i + 1) * b].to(device)
        update, _ = apply_defense(sent, x, y, DEFENSE_FOR.get(name, DefenseConfig()), seed=i,
                                  public_x=split.public_x, public_y=split.public_y)
        updates.append(update)
        knowledges.append(AttackerKnowledge(model=sent, spec=spec, batch_size=b,
                                            public_x=split.public_x, public_y=split.public_y))
    return attack, updates, knowledges


def assert_same_result(a, b, tol: dict | None) -> None:
    """Same result: bit for bit (``tol=None``) or within ``tol`` (images and histories)."""
    assert torch.equal(a.labels, b.labels)
    assert a.cost.iterations == b.cost.iterations and a.cost.restarts == b.cost.restarts
    assert a.history.keys() == b.history.keys()
    if tol is None:
        assert torch.equal(a.images, b.images)
        assert a.history == b.history
        assert a.final_loss == b.final_loss or (a.final_loss != a.final_loss and b.final_loss != b.final_loss)
    else:
        torch.testing.assert_close(a.images, b.images, **tol)
        for key in a.history:
            assert a.history[key] == pytest.approx(b.history[key], rel=tol["rtol"], abs=tol["atol"])


def check_seeds_are_per_problem(attack, updates, knowledges, tol: dict | None) -> None:
    batch = attack.reconstruct_batch(updates[:3], knowledges[:3], seeds=SEEDS)
    # The same three problems among different neighbours, at different positions.
    order = [3, 2, 4, 0, 1]
    mixed = attack.reconstruct_batch([updates[i] for i in order], [knowledges[i] for i in order],
                                     seeds=[5, SEEDS[2], 6, SEEDS[0], SEEDS[1]])
    for i in range(3):
        alone = attack.reconstruct(updates[i], knowledges[i], seed=SEEDS[i])
        assert_same_result(batch[i], alone, tol)
        assert_same_result(mixed[order.index(i)], alone, tol)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_batched_result_depends_only_on_the_problem_and_its_seed(name, setting, tmp_path):
    """Exact on the sequential path (and for per-problem attacks); within VECTORISED_TOL vectorised."""
    attack, updates, knowledges = problems_for(name, setting, tmp_path)
    if hasattr(attack, "vectorize"):
        attack.vectorize = False
        check_seeds_are_per_problem(attack, updates, knowledges, None)
        attack.vectorize = True
        check_seeds_are_per_problem(attack, updates, knowledges, VECTORISED_TOL)
    else:
        check_seeds_are_per_problem(attack, updates, knowledges, None)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_different_seeds_give_different_starts(name, setting, tmp_path):
    attack, updates, knowledges = problems_for(name, setting, tmp_path, n=1)
    a = attack.reconstruct(updates[0], knowledges[0], seed=1)
    b = attack.reconstruct(updates[0], knowledges[0], seed=2)
    if name in DETERMINISTIC:
        assert torch.equal(a.images, b.images), DETERMINISTIC[name]
        return
    assert not torch.equal(a.images, b.images)
    if "matching_loss" in a.history:  # the loss at the initial point differs: different starts
        assert a.history["matching_loss"][0] != b.history["matching_loss"][0]


def test_default_seeds_are_seed_plus_index(setting, tmp_path):
    attack, updates, knowledges = problems_for("inverting-gradients", setting, tmp_path, n=2)
    implicit = attack.reconstruct_batch(updates, knowledges, seed=40)
    explicit = attack.reconstruct_batch(updates, knowledges, seeds=[40, 41])
    for a, b in zip(implicit, explicit):
        assert torch.equal(a.images, b.images)
    assert problem_seeds(3, seed=5) == [5, 6, 7]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seeds": [1]}, "got 1 seeds for 2 problems"),
        ({"seeds": [1, -1]}, r"seeds\[1\]=-1"),
        ({"seeds": [1, 2**63]}, r"seeds\[1\]=9223372036854775808; allowed range"),
        ({"seeds": [1.5, 2]}, r"seeds\[0\]=1.5"),
        ({"seeds": [True, 2]}, r"seeds\[0\]=True"),
        ({"seed": -3}, "seed=-3"),
    ],
)
def test_bad_seeds_are_rejected(kwargs, match, setting, tmp_path):
    attack, updates, knowledges = problems_for("analytic", setting, tmp_path, n=2)
    with pytest.raises(ValueError, match=match):
        attack.reconstruct_batch(updates, knowledges, **kwargs)


# -- the per-problem generator ----------------------------------------------------------------------
def test_batched_generator_draws_each_block_from_its_own_generator():
    gen = BatchedGenerator.from_seeds([3, 4, 5], "cpu", rows_per_problem=2)
    first, second = gen.randn((4,)), gen.rand((2, 3), dtype=torch.float64)
    assert first.shape == (6, 4) and second.shape == (6, 2, 3) and second.dtype == torch.float64
    alone = seeded_generator(4)
    torch.testing.assert_close(first[2:4], torch.randn((2, 4), generator=alone), rtol=0, atol=0)
    torch.testing.assert_close(second[2:4], torch.rand((2, 2, 3), generator=alone, dtype=torch.float64),
                               rtol=0, atol=0)
    assert gen.with_rows(1).randn((1,)).shape == (3, 1)
    with pytest.raises(ValueError, match="rows_per_problem=0"):
        BatchedGenerator.from_seeds([1], "cpu", rows_per_problem=0)
    with pytest.raises(ValueError, match="at least one generator"):
        BatchedGenerator([])


def test_subsets_and_row_changes_continue_the_same_streams_with_checked_counts():
    """``subset`` and ``with_rows`` (derived without checking every generator again) keep the problems'
    streams, devices and row counts, and still refuse bad row counts and an empty subset."""
    gen = BatchedGenerator.from_seeds([3, 4, 5], "cpu", rows_per_problem=[1, 2, 3])
    part = gen.subset([2, 0])
    assert part.counts == [3, 1] and part.rows_per_problem == (3, 1) and part.device == gen.device and part.rows == 4
    assert part.generators[0] is gen.generators[2]
    wide = part.with_rows(2)
    assert wide.rows_per_problem == 2 and wide.rows == 4 and part.with_rows([1, 4]).rows_per_problem == (1, 4)
    five, three = seeded_generator(5), seeded_generator(3)
    torch.testing.assert_close(wide.randn((2,)), torch.cat([torch.randn((2, 2), generator=five),
                                                           torch.randn((2, 2), generator=three)]), rtol=0, atol=0)
    for bad in (0, [1], [1, True], [1, 2.0]):
        with pytest.raises(ValueError, match="rows_per_problem"):
            part.with_rows(bad)
    with pytest.raises(ValueError, match="at least one generator"):
        gen.subset([])


def test_engine_rejects_a_generator_per_problem_mismatch(setting):
    spec, _, model = setting
    updates, knowledges = [], []
    for i in range(2):
        x, y = torch.zeros(1, *spec.shape), torch.tensor([i])
        updates.append(compute_update(model, x, y))
        knowledges.append(AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y))
    ps = ProblemSet.from_updates(updates, knowledges, names=list(updates[0].tensors),
                                 labels=torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"expected one per problem \(2\)"):
        run_gradient_matching(ps, MatchingObjective(), Schedule(iterations=1), torch.zeros(2, 1, 1, *spec.shape),
                              generator=BatchedGenerator.from_seeds([1], "cpu"))


# -- stochastic models ------------------------------------------------------------------------------
def test_engine_bottleneck_forward_is_precode_forward_with_given_noise(setting):
    """The engine's copy computes VariationalBottleneck.forward exactly, with eps supplied."""
    spec = setting[0]
    model = build_model("lenet", spec, precode=True, precode_dim=8, seed=0).train()
    x, y = torch.randn(2, *spec.shape, generator=seeded_generator(0)), torch.tensor([1, 2])
    update = compute_update(model, x, y)
    k = AttackerKnowledge(model=model, spec=spec, batch_size=2, labels=y)
    ps = ProblemSet.from_updates([update], [k], names=list(update.tensors), labels=y.reshape(1, 2))
    sim = UpdateSimulator(ps, 1, record_bn=False)
    h = torch.randn(2, model.bottleneck.in_features, generator=seeded_generator(1))
    with torch.random.fork_rng():
        torch.manual_seed(3)
        expected = model.bottleneck(h)
        torch.manual_seed(3)
        eps = torch.randn(2, 8)
    assert sim.noise_numel == 16
    sim.noise.start(eps.flatten())
    got = ps.model.bottleneck(h)
    sim.noise.stop()
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    sim.close()
    assert "forward" not in vars(ps.model.bottleneck)  # the class's own forward is back


@pytest.mark.parametrize("kind", ["gradient", "model_delta"])
def test_precode_noise_is_per_problem(kind, setting):
    """PRECODE samples inside the attack; problem i's noise is its own (FedSGD and 2-step FedAvg)."""
    spec, split, _ = setting
    model = build_model("lenet", spec, precode=True, precode_dim=8, seed=0).train()
    steps = 2 if kind == "model_delta" else 1
    xs, ys = split.clients[0]
    updates, knowledges = [], []
    for i in range(4):
        x, y = spec.normalize(xs[i:i + 1]), ys[i:i + 1]
        torch.manual_seed(i)
        updates.append(compute_update(model, x, y, kind=kind, local_steps=steps, local_lr=0.05))
        knowledges.append(AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y))
    attack = build_attack("inverting-gradients", iterations=3, restarts=2, signed=False)
    for vectorize, tol in ((False, None), (True, VECTORISED_TOL)):
        attack.vectorize = vectorize
        check_seeds_are_per_problem(attack, updates + updates[:1], knowledges + knowledges[:1], tol)
    # The vectorised and sequential paths now see the same noise, so they agree to rounding.
    attack.vectorize = False
    slow = attack.reconstruct_batch(updates, knowledges, seeds=[1, 2, 3, 4])
    attack.vectorize = True
    fast = attack.reconstruct_batch(updates, knowledges, seeds=[1, 2, 3, 4])
    for a, b in zip(slow, fast):
        torch.testing.assert_close(a.images, b.images, rtol=1e-3, atol=1e-3)


class _DropoutNet(nn.Module):
    """A model with a random op the engine cannot seed per problem."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(d, 16), nn.Dropout(0.5))
        self.head = nn.Linear(16, 10)

    def forward(self, x, return_kl=False):
        logits = self.head(self.body(x))
        return (logits, logits.new_zeros(())) if return_kl else logits


def test_other_random_ops_are_rejected_by_the_vectorised_path(setting):
    spec = setting[0]
    torch.manual_seed(0)
    model = _DropoutNet(256)
    x, y = torch.zeros(1, *spec.shape), torch.tensor([3])
    grads = torch.autograd.grad(task_loss(model.eval(), x, y), list(model.parameters()))
    update = SharedUpdate({n: g for (n, _), g in zip(model.named_parameters(), grads)}, batch_size=1)
    k = AttackerKnowledge(model=model, spec=spec, batch_size=1, labels=y)
    with pytest.raises(ValueError, match="global RNG"):
        build_attack("inverting-gradients", iterations=1).reconstruct(update, k)


# -- CUDA (run on a GPU machine; skipped elsewhere) -------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_attack_runs_on_cuda(name, setting, tmp_path, cuda_device):
    attack, updates, knowledges = problems_for(name, setting, tmp_path, n=3, device=str(cuda_device))
    results = attack.reconstruct_batch(updates, knowledges, seeds=SEEDS)
    for r in results:
        assert r.images.device.type == "cuda"
        assert torch.isfinite(r.images).all()
        assert r.labels.device.type == "cpu" and r.labels.shape == (2,)
    for i in range(3):
        alone = attack.reconstruct(updates[i], knowledges[i], seed=SEEDS[i])
        assert_same_result(results[i], alone, None if name in DETERMINISTIC else CUDA_TOL)


@pytest.mark.cuda
def test_cuda_generators_feed_cuda_tensors(cuda_device):
    gen = BatchedGenerator.from_seeds([1, 2], cuda_device)
    assert gen.randn((3,)).device.type == "cuda"
    assert gen.device == torch.device("cuda", torch.cuda.current_device())
    with pytest.raises(ValueError, match="one device"):
        BatchedGenerator([seeded_generator(1, "cpu"), seeded_generator(2, cuda_device)])

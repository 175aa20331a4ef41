"""ModelBank: a vector's global models as stacked tensors whose rows the games' modules view."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import leakgym  # noqa: F401  (registers the ids)
from leakgym.envs import RoundError
from leakgym.fl import batched as fl_batched
from leakgym.fl.bank import ModelBank


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _bank(n=3):
    models = [_net(i) for i in range(n)]
    values = [copy.deepcopy(m.state_dict()) for m in models]
    bank = ModelBank(n)
    for i, m in enumerate(models):
        bank.bind(i, m)
    return bank, models, values


def test_bound_models_keep_their_values_and_share_the_rows():
    bank, models, values = _bank()
    for i, m in enumerate(models):
        for name, p in m.named_parameters():
            assert torch.equal(p, values[i][name]) and torch.equal(bank.stacks[name][i], p)
            assert p.is_leaf and p.requires_grad and isinstance(p, nn.Parameter)
    with torch.no_grad():
        models[1][0].weight.add_(1.0)  # in place on the module: the row changes
    assert torch.equal(bank.stacks["0.weight"][1], values[1]["0.weight"] + 1)
    bank.scatter([2, 0], {"2.bias": torch.tensor([[5.0, 6.0], [7.0, 8.0]])})  # the rows: the modules change
    assert models[2][2].bias.tolist() == [5.0, 6.0] and models[0][2].bias.tolist() == [7.0, 8.0]
    models[0].load_state_dict(values[2])
    assert torch.equal(bank.stacks["0.weight"][0], values[2]["0.weight"])
    loss = models[0](torch.randn(5, 3)).sum()
    loss.backward()  # autograd sees ordinary leaf parameters
    assert models[0][0].weight.grad.shape == (4, 3)


def test_stacked_parameters_of_bound_models_equal_a_stack_of_them():
    bank, models, _ = _bank()
    order = [models[2], models[0]]
    via_bank = fl_batched.stack_parameters(order)
    assert ModelBank.of(order) == (bank, [2, 0])
    for name, t in via_bank.items():
        assert torch.equal(t, torch.stack([dict(m.named_parameters())[name].detach() for m in order]))
    via_bank["0.weight"].add_(1.0)  # a copy: the models do not change
    assert torch.equal(bank.stacks["0.weight"][2], models[2][0].weight)


def test_a_model_whose_parameters_left_the_bank_is_not_read_from_it():
    bank, models, _ = _bank()
    copied = copy.deepcopy(models[0])  # a copy holds its own parameters (not the whole bank)
    assert ModelBank.of([copied]) is None and copied[0].weight.data_ptr() != models[0][0].weight.data_ptr()
    assert ModelBank.of([models[0], models[0]]) is None  # one row twice
    _, others, _ = _bank(2)
    assert ModelBank.of([models[0], others[1]]) is None  # two banks
    models[1].double()  # .to() another dtype replaces the parameters' data
    assert ModelBank.of([models[1]]) is None and ModelBank.of([models[0], models[2]]) == (bank, [0, 2])
    stacked = fl_batched.stack_parameters([models[0], models[1].float()])
    assert torch.equal(stacked["0.weight"][1], models[1][0].weight)


def test_rebinding_a_row_releases_the_previous_model():
    bank, models, values = _bank()
    fresh = _net(9)
    bank.bind(0, fresh)
    assert ModelBank.of([models[0]]) is None and ModelBank.of([fresh]) == (bank, [0])
    with torch.no_grad():
        fresh[0].weight.zero_()
    assert torch.equal(models[0][0].weight, values[0]["0.weight"])  # the released model kept its values


def test_bad_rows_and_architectures_are_refused():
    bank, models, _ = _bank()
    with pytest.raises(ValueError, match=r"row=3; allowed: integers in \[0, 2\]"):
        bank.bind(3, _net(0))
    with pytest.raises(ValueError, match="does not have the bank's parameters"):
        bank.bind(0, nn.Linear(3, 2))
    with pytest.raises(ValueError, match="bound to another bank or row"):
        bank.bind(1, models[0])
    with pytest.raises(ValueError, match="size=0"):
        ModelBank(0)


def test_a_refused_first_bind_leaves_the_bank_unset():
    """A first bind refused because the model was bound elsewhere had already fixed the bank's layout (and
    allocated its stacks): the next model, of another architecture, was refused though none was ever bound."""
    bank, models, _ = _bank()
    fresh = ModelBank(2)
    with pytest.raises(ValueError, match="bound to another bank or row"):
        fresh.bind(0, models[0])
    assert fresh.stacks == {} and fresh._layout is None
    other = nn.Sequential(nn.Linear(5, 2))
    fresh.bind(0, other)  # the first model actually bound gives the layout
    assert ModelBank.of([other]) == (fresh, [0]) and set(fresh.stacks) == {"0.weight", "0.bias"}
    assert ModelBank.of([models[0]]) == (bank, [0])  # still where it was


def test_rows_are_checked_and_numpy_integers_are_rows():
    """release(-1) released the last row; gather/scatter out of range were torch's IndexError and an unknown
    name a KeyError; bind(np.int64(1), ...) was refused with a message saying integers are allowed."""
    bank, models, _ = _bank()
    for bad in (-1, 3, True, 1.0):
        with pytest.raises(ValueError, match=rf"row={bad!r}; allowed: integers in \[0, 2\]"):
            bank.release(bad)
    assert ModelBank.of(models) == (bank, [0, 1, 2])  # nothing was released
    for rows in ([3], [-1], [0, 5]):
        with pytest.raises(ValueError, match=r"rows span -?\d\.\.-?\d; allowed: integers in \[0, 2\]"):
            bank.gather(rows)
        with pytest.raises(ValueError, match=r"rows span -?\d\.\.-?\d; allowed: integers in \[0, 2\]"):
            bank.scatter(rows, {"2.bias": torch.zeros(len(rows), 2)})
    with pytest.raises(ValueError, match=r"rows=\[0.5\]; allowed: integers in \[0, 2\]"):
        bank.gather([0.5])
    with pytest.raises(ValueError, match=r"parameter names \['nope'\] are not the bank's; allowed: \['0.weight'"):
        bank.gather([0], ["nope"])
    before = {n: t.clone() for n, t in bank.stacks.items()}
    with pytest.raises(ValueError, match=r"parameter names \['nope'\] are not the bank's"):
        bank.scatter([0], {"2.bias": torch.ones(1, 2), "nope": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match=r"values\['2.weight'\] has shape \(1, 3\); allowed: \(1, 2, 4\)"):
        bank.scatter([0], {"2.bias": torch.ones(1, 2), "2.weight": torch.zeros(1, 3)})
    assert all(torch.equal(before[n], t) for n, t in bank.stacks.items())  # nothing written before the check
    with pytest.raises(ValueError, match="the bank holds no model yet"):
        ModelBank(2).gather([0])

    bank2 = ModelBank(np.int64(2))
    assert bank2.size == 2 and type(bank2.size) is int
    model = _net(5)
    bank2.bind(np.int64(1), model)
    assert ModelBank.of([model]) == (bank2, [1])
    assert torch.equal(bank2.gather(np.array([1]))["0.weight"][0], model[0].weight)
    for rows in (np.array([1], dtype=np.int32), [np.int32(1)], torch.tensor([1], dtype=torch.int32)):  # (refused)
        assert torch.equal(bank2.gather(rows)["0.weight"][0], model[0].weight)
    bank2.release(np.int64(1))
    assert ModelBank.of([model]) is None


@pytest.mark.parametrize("batch_clients", [False, True])
def test_a_vectors_games_live_in_its_bank_across_rounds_and_resets(cheap_overrides, batch_clients):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, batch_clients=batch_clients, **cheap_overrides)
    vec.reset(seed=0)
    games = vec.unwrapped.games
    bank = games.bank
    action = np.zeros((3, len(vec.single_action_space.nvec)), dtype=np.int64)
    for _ in range(cheap_overrides["rounds"] + 1):  # past the end: the games reset and bind new models
        vec.step(action)
        assert ModelBank.of([games.model(i) for i in range(3)]) == (bank, [0, 1, 2])
        for i in range(3):
            for name, p in games.model(i).named_parameters():
                assert torch.equal(bank.stacks[name][i], p)


def test_a_failed_vector_round_restores_the_banked_parameters(cheap_overrides, monkeypatch):
    """A round fails after aggregation wrote every game's new parameters into the bank: the snapshot's copy
    of the bank rows puts them back (the per-game part of the snapshot leaves banked parameters out)."""
    from leakgym.game import round as round_module

    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, batch_clients=True, **cheap_overrides)
    vec.reset(seed=0)
    games = vec.unwrapped.games
    action = np.zeros((3, len(vec.single_action_space.nvec)), dtype=np.int64)
    vec.step(action)
    before = [{n: p.detach().clone() for n, p in games.model(i).named_parameters()} for i in range(3)]
    original = round_module._conclude

    def fails(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(round_module, "_conclude", fails)
    with pytest.raises(RoundError, match="disk on fire"):
        vec.step(action)
    assert ModelBank.of([games.model(i) for i in range(3)]) == (games.bank, [0, 1, 2])
    for i, b in enumerate(before):
        for n, p in games.model(i).named_parameters():
            assert torch.equal(p, b[n])
    monkeypatch.setattr(round_module, "_conclude", original)
    vec.step(action)  # and it plays on


def _same_named(a, b) -> bool:
    return [n for n, _ in a] == [n for n, _ in b] and all(p is q for (_, p), (_, q) in zip(a, b))


def test_a_bound_models_named_parameters_come_from_the_bank():
    bank, models, _ = _bank()
    models[1][0].weight.requires_grad_(False)
    for m in models:
        assert _same_named(ModelBank.named_parameters(m), tuple(m.named_parameters()))  # the same objects
    assert not dict(ModelBank.named_parameters(models[1]))["0.weight"].requires_grad
    assert ModelBank.named_parameters(_net(5)) is None  # never bound
    assert ModelBank.named_parameters(copy.deepcopy(models[0])) is None
    models[2].double()  # its parameters' data left the row
    assert ModelBank.named_parameters(models[2]) is None
    bank.bind(0, _net(9))  # released: its parameters are copies now
    assert ModelBank.named_parameters(models[0]) is None
    tied, tied_bank = _Tied(), ModelBank(1)
    tied_bank.bind(0, tied)
    assert _same_named(ModelBank.named_parameters(tied), tuple(tied.named_parameters()))  # listed once


class _Tied(nn.Module):
    """Two layers sharing one weight (tied weights): ``named_parameters`` lists it once."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_tied_parameters_stay_tied_when_bound_and_released():
    """Found in review: bind replaced a parameter shared by two modules in the first module only (the one
    ``named_parameters`` names), so the second kept the old tensor: the tie was broken, and an update of
    the bank row no longer reached the second layer. Release did the same."""
    torch.manual_seed(0)
    model = _Tied()
    bank = ModelBank(2)
    bank.bind(1, model)
    assert model.b.weight is model.a.weight
    with torch.no_grad():
        model.a.weight.add_(1.0)
    assert torch.equal(model.b.weight, bank.stacks["a.weight"][1])
    bank.bind(1, _Tied())  # releases the model: its copies are tied too
    assert ModelBank.of([model]) is None and model.b.weight is model.a.weight


def test_a_row_does_not_release_a_model_bound_elsewhere_since():
    """Found in review: a model that left its row (its data replaced) may be bound again at another row;
    the old row still named it, and binding a new model there released it from its new row."""
    bank, models, _ = _bank()
    models[0][0].weight.data = models[0][0].weight.data.clone()  # out of the bank: of() no longer sees it
    assert ModelBank.of([models[0]]) is None
    spare = ModelBank(1)
    spare.bind(0, models[0])
    bank.bind(0, _net(7))  # row 0 of `bank` gets a new model; models[0] lives in `spare` now
    assert ModelBank.of([models[0]]) == (spare, [0])


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_of_a_vectors_games_bank_apart_from_the_original(cheap_overrides, how):
    """Found in review: a copy of a bank kept its rows' weak references to the original's models, so
    resetting a deep copy of a game released the original game's model from the vector's bank (it then
    fell back to the unbanked paths); and weak references do not pickle, so ``pickle.dumps`` of a vector
    env (which worked before the bank: its games are rebuilt from their arguments) raised TypeError."""
    import pickle

    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, **cheap_overrides)
    vec.reset(seed=0)
    games = vec.unwrapped.games
    action = np.zeros((2, len(vec.single_action_space.nvec)), dtype=np.int64)
    duplicate = copy.deepcopy if how == "deepcopy" else lambda x: pickle.loads(pickle.dumps(x))
    twin = duplicate(games)
    assert ModelBank.of([twin.model(0), twin.model(1)]) == (twin.bank, [0, 1])  # the copy's own bank
    twin.reset(0, 5)
    assert ModelBank.of([games.model(0), games.model(1)]) == (games.bank, [0, 1])
    other = duplicate(vec.unwrapped)
    other.reset(seed=0)
    other.step(action)
    copied = other.games
    assert copied.bank is not games.bank
    assert ModelBank.of([copied.model(0), copied.model(1)]) == (copied.bank, [0, 1])
    vec.step(action)
    assert ModelBank.of([games.model(0), games.model(1)]) == (games.bank, [0, 1])
    for i in range(2):  # the same seeds and actions: the same models
        for (name, p), q in zip(games.model(i).named_parameters(), copied.model(i).parameters()):
            assert torch.equal(p, q), name


def test_a_refused_join_changes_nothing(cheap_overrides, monkeypatch):
    """An env may join another batch only before its first reset: a refused join leaves it in its batch and
    row, its model in that batch's bank, and a failed round still restores its parameters from there."""
    from leakgym.envs import load_scenario, parallel_env
    from leakgym.game import round as round_module
    from leakgym.game.batch import GameBatch

    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, **cheap_overrides)
    vec.reset(seed=0)
    env = vec.unwrapped.envs[1].parallel
    games = vec.unwrapped.games
    with pytest.raises(ValueError, match="before its first reset"):
        env.join(GameBatch(env.scenario, 1), 0)
    assert env.games is games and env.row == 1
    assert ModelBank.of([games.model(1)]) == (games.bank, [1])
    before = {n: p.detach().clone() for n, p in games.model(1).named_parameters()}

    def fails(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(round_module, "_conclude", fails)
    with pytest.raises(RoundError, match="disk on fire"):
        vec.step(np.zeros((2, len(vec.single_action_space.nvec)), dtype=np.int64))
    for n, p in games.model(1).named_parameters():
        assert torch.equal(p, before[n]), n
    fresh = parallel_env("digits", **cheap_overrides)
    with pytest.raises(ValueError, match="scenario or device differs"):
        fresh.join(GameBatch(load_scenario("digits", **dict(cheap_overrides, rounds=7)), 1), 0)

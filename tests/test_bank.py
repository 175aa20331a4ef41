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


@pytest.mark.parametrize("batch_clients", [False, True])
def test_a_vectors_games_live_in_its_bank_across_rounds_and_resets(cheap_overrides, batch_clients):
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, batch_clients=batch_clients, **cheap_overrides)
    vec.reset(seed=0)
    games = [e.parallel.game for e in vec.unwrapped.envs]
    bank = vec.unwrapped.bank
    action = np.zeros((3, len(vec.single_action_space.nvec)), dtype=np.int64)
    for _ in range(cheap_overrides["rounds"] + 1):  # past the end: the games reset and bind new models
        vec.step(action)
        assert ModelBank.of([g.server.model for g in games]) == (bank, [0, 1, 2])
        for i, g in enumerate(games):
            for name, p in g.server.model.named_parameters():
                assert torch.equal(bank.stacks[name][i], p)


def test_a_failed_vector_round_restores_the_banked_parameters(cheap_overrides, monkeypatch):
    """A round fails after aggregation wrote every game's new parameters into the bank: the Round's copy of
    the bank rows puts them back (the games' own snapshots leave banked parameters out)."""
    import leakgym.envs.game as game_module

    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=3, batch_clients=True, **cheap_overrides)
    vec.reset(seed=0)
    games = [e.parallel.game for e in vec.unwrapped.envs]
    action = np.zeros((3, len(vec.single_action_space.nvec)), dtype=np.int64)
    vec.step(action)
    before = [{n: p.detach().clone() for n, p in g.server.model.named_parameters()} for g in games]
    original = game_module.LeakGame.conclude

    def fails(self, *args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(game_module.LeakGame, "conclude", fails)
    with pytest.raises(RoundError, match="disk on fire"):
        vec.step(action)
    for g, b in zip(games, before):
        assert g.banked
        for n, p in g.server.model.named_parameters():
            assert torch.equal(p, b[n])
    monkeypatch.setattr(game_module.LeakGame, "conclude", original)
    vec.step(action)  # and it plays on

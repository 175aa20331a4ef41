"""leakgym.game: a GameBatch's rows and play_round's arguments are checked before anything changes."""

import copy

import numpy as np
import pytest
import torch

from leakgym.envs import load_scenario
from leakgym.game.batch import GameBatch
from leakgym.game.round import play_round


@pytest.fixture
def games(cheap_overrides):
    batch = GameBatch(load_scenario("digits", **cheap_overrides), 3)
    batch.reset(0, seed=0)
    batch.reset(1, seed=1)  # row 2 is never reset
    return batch


def _zeros(batch):
    return (np.zeros(len(batch.menus["defender"].dims), np.int64), np.zeros(len(batch.menus["attacker"].dims), np.int64))


def _state(batch, rows):
    return ([{k: v.clone() for k, v in batch.model(r).state_dict().items()} for r in rows],
            [copy.deepcopy(batch.rngs[r].bit_generator.state) for r in rows], batch.round.copy())


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_a_batch_needs_a_whole_positive_size(cheap_overrides, size):
    with pytest.raises(ValueError, match=rf"size={size!r}; allowed: integers >= 1"):
        GameBatch(load_scenario("digits", **cheap_overrides), size)


@pytest.mark.parametrize(("rows", "error", "match"), [
    ([0, 3], ValueError, r"row=3; allowed: integers in \[0, 2\]"),
    ([0, -1], ValueError, r"row=-1"),
    ([0, 0], ValueError, r"each game may play once per round"),
    ([], ValueError, r"at least one game"),
    ([0, 2], RuntimeError, r"game 2 has not been reset"),
])
def test_bad_rows_are_refused_before_anything_changes(games, rows, error, match):
    before = _state(games, [0, 1])
    with pytest.raises(error, match=match):
        play_round(games, rows, [_zeros(games)] * len(rows))
    after = _state(games, [0, 1])
    assert all(torch.equal(a[k], b[k]) for a, b in zip(before[0], after[0]) for k in a)
    assert before[1] == after[1] and np.array_equal(before[2], after[2])


def test_a_bad_action_in_one_game_changes_no_game(games):
    before = _state(games, [0, 1])
    good, bad = _zeros(games), (_zeros(games)[0], np.full(len(games.menus["attacker"].dims), 99))
    with pytest.raises(ValueError, match="allowed range"):
        play_round(games, [0, 1], [good, bad])
    with pytest.raises(ValueError, match="got 1 action pairs for 2 games"):
        play_round(games, [0, 1], [good])
    after = _state(games, [0, 1])
    assert all(torch.equal(a[k], b[k]) for a, b in zip(before[0], after[0]) for k in a)
    assert before[1] == after[1] and np.array_equal(before[2], after[2])
    (outcome,) = play_round(games, [1], [good])  # and the batch plays on, one row alone
    assert games.round.tolist() == [0, 1, 0] and outcome.infos["attacker"]["round"] == 1

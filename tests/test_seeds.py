"""Seeds that matter: with the actions fixed, the reset seed alone decides a game.

Same seed: the same model, private batches, shared updates, reconstructions, observations and rewards,
bit for bit. Another seed: another model and, in every round, another private batch, update and
reconstruction. Checked on the PettingZoo game, the Gymnasium view and the vector env (the checks are
in ``method_checks.py``). ``tests/test_round.py`` checks that a game plays the same alone or in a vector
and that games of a vector with different seeds get different rewards; here the vector's games are
compared on what they draw. ``test_sabotage.py`` shows each check fails when the reset ignores its seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from method_checks import check_reset_seed, check_vector_seeds, play_gymnasium, play_pettingzoo, play_vector


def test_the_reset_seed_alone_decides_a_pettingzoo_game(cheap_overrides):
    check_reset_seed(lambda seed: play_pettingzoo(cheap_overrides, seed))


def test_the_reset_seed_alone_decides_a_gymnasium_game(cheap_overrides):
    check_reset_seed(lambda seed: play_gymnasium(cheap_overrides, seed))


@pytest.mark.parametrize("batch_attacks", [False, True])
def test_games_of_a_vector_draw_what_their_seeds_say(cheap_overrides, batch_attacks):
    """Seeds [1, 2, 1]: games 0 and 2 draw the same model, batches and updates (and, without attack
    batching, the same reconstructions bit for bit; batched attacks may differ by rounding); game 1 draws others."""
    check_vector_seeds(play_vector(cheap_overrides, [1, 2, 1], batch_attacks=batch_attacks), exact=not batch_attacks)


def test_a_precode_game_does_not_depend_on_torchs_global_rng(cheap_overrides):
    """Found in review: the benign clients of a PRECODE game (its bottleneck samples with
    torch.randn_like) drew from the process's global RNG, so one game seed gave different losses after
    a different torch.manual_seed. They now train with the global RNG seeded from the round seed."""
    import numpy as np
    import torch

    from leakgym.envs import parallel_env

    def trajectory(torch_seed):
        torch.manual_seed(torch_seed)
        env = parallel_env("digits", **{**cheap_overrides, "precode": True, "num_clients": 2})
        env.reset(seed=5)
        rng, out = np.random.default_rng(1), []
        while env.agents:
            _, rewards, _, _, infos = env.step({a: rng.integers(0, env.action_space(a).nvec) for a in env.agents})
            out.append((infos["defender"]["test_loss"], rewards["attacker"], rewards["defender"]))
        return out

    assert trajectory(0) == trajectory(123)


def test_derived_seeds_equal_numpys_seed_sequence():
    """The attack seeds of a round's games come from one vectorised computation of numpy's SeedSequence
    arithmetic; each equals ``SeedSequence([seed, stream]).generate_state(1)[0]`` (random and edge seeds,
    several streams), and seeds outside one entropy word are refused."""
    from leakgym.optim.randomness import derived_seeds

    seeds = np.random.default_rng(0).integers(0, 2**31 - 1, size=3000).tolist() + [0, 1, 2**31 - 2, 2**31, 2**32 - 1]
    for stream in (0, 1, 2, 2**32 - 1):
        want = [int(np.random.SeedSequence([s, stream]).generate_state(1)[0]) for s in seeds]
        assert derived_seeds(seeds, stream) == want
    assert derived_seeds([], 1) == []
    with pytest.raises(ValueError, match="seeds must be"):
        derived_seeds([2**32], 1)
    with pytest.raises(ValueError, match="stream"):
        derived_seeds([1], -1)

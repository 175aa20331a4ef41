"""Third-party RL clients drive LeakGym unchanged (issue 37, item 2): TorchRL (``GymEnv`` by id,
``GymWrapper`` on the single-agent and the native vector env, ``PettingZooWrapper``), Tianshou, SB3 on
the batched env (:func:`leakgym.envs.make_sb3_vec`), SuperSuit (:func:`leakgym.envs.supersuit_vec_env`),
Gymnasium's ``TypeError`` for an unknown keyword, infos with the same numeric keys from ``reset`` on,
the vector env's autoreset modes, and mid-episode copies that play on. TorchRL and Tianshou are in the
dev extra; a test skips (with the reason) where its client is not installed."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import leakgym  # noqa: F401  (registers the ids)
from leakgym.envs import parallel_env

ID = "LeakGym-Digits-v0"


def _needs(module: str):
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[dev]' installs it)")


# -- unknown keywords ---------------------------------------------------------------------------------
def test_an_unknown_keyword_is_a_type_error_naming_it_with_a_suggestion(cheap_overrides):
    for make in (lambda: gym.make(ID, roundz=3), lambda: gym.make_vec(ID, num_envs=2, roundz=3),
                 lambda: parallel_env("digits", roundz=3)):
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'roundz' \(did you mean 'rounds'\?\)"):
            make()
    # still a ValueError, LeakGym's bad-input type (callers that catch it keep working)
    with pytest.raises(ValueError, match="unknown scenario option"):
        gym.make(ID, frameskip=4)


# -- TorchRL ------------------------------------------------------------------------------------------
def test_torchrl_gym_env_by_id(cheap_overrides):
    _needs("torchrl")
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import check_env_specs

    env = GymEnv(ID, opponent="random", **cheap_overrides)  # probes frameskip=1, drops it on the TypeError
    check_env_specs(env, seed=0)
    td = env.rollout(cheap_overrides["rounds"] + 1, break_when_any_done=False)
    assert td["next", "done"].squeeze(-1).tolist() == [False, False, True, False]
    assert env.observation_spec["observation"].shape == (env._env.observation_space.shape[0],)
    env.close()


def test_torchrl_gym_wrapper_on_the_single_agent_env(cheap_overrides):
    _needs("torchrl")
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    env = GymWrapper(gym.make(ID, role="defender", opponent="random", **cheap_overrides))
    check_env_specs(env, seed=0)
    td = env.rollout(cheap_overrides["rounds"])
    assert td.batch_size == (cheap_overrides["rounds"],) and bool(td["next", "terminated"][-1])
    env.close()


@pytest.mark.parametrize("mode", ["SAME_STEP", "DISABLED"])
def test_torchrl_gym_wrapper_on_the_native_vector_env(cheap_overrides, mode):
    """TorchRL takes a Gymnasium vector env whose autoreset_mode is SAME_STEP or DISABLED (an attribute)."""
    _needs("torchrl")
    from torchrl.envs import GymWrapper

    venv = gym.make_vec(ID, num_envs=2, opponent="random", autoreset_mode=getattr(gym.vector.AutoresetMode, mode),
                        **cheap_overrides)
    env = GymWrapper(venv)
    rounds = cheap_overrides["rounds"]
    td = env.rollout(2 * rounds + 1, break_when_any_done=False)
    assert td.batch_size == (2, 2 * rounds + 1)
    done = td["next", "done"].squeeze(-1)
    assert done.sum(dim=1).tolist() == [2, 2] and done[:, rounds - 1].all() and done[:, 2 * rounds - 1].all()
    env.close()


def test_torchrl_pettingzoo_wrapper_on_the_parallel_env(cheap_overrides):
    """TorchRL builds its info spec from the reset infos and stacks every step's: same numeric keys."""
    _needs("torchrl")
    from torchrl.envs import PettingZooWrapper

    from leakgym.game.feedback import info_template

    env = PettingZooWrapper(parallel_env("digits", **cheap_overrides), use_mask=False, seed=0)
    assert set(env.group_map) == {"attacker", "defender"}
    rounds = cheap_overrides["rounds"]
    td = env.rollout(rounds, break_when_any_done=False)
    assert td.batch_size == (rounds,)
    for role in ("attacker", "defender"):
        assert set(td["next", role, "info"].keys()) == set(info_template(role))
        assert td["next", role, "info", "round"].squeeze(-1).tolist() == list(range(1, rounds + 1))
    assert bool(td["next", "attacker", "terminated"][-1].all())
    env.close()


# -- Tianshou -----------------------------------------------------------------------------------------
def test_tianshou_collector_over_a_dummy_vector_env(cheap_overrides):
    _needs("tianshou")
    from tianshou.algorithm.algorithm_base import RandomActionPolicy
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    # Tianshou's random policy samples Discrete spaces only: flat actions
    envs = DummyVectorEnv([lambda: gym.make(ID, opponent="random", flat_actions=True, **cheap_overrides)] * 2)
    envs.seed(0)
    collector = Collector(RandomActionPolicy(envs.action_space[0]), envs, VectorReplayBuffer(32, 2))
    collector.reset()
    stats = collector.collect(n_step=2 * cheap_overrides["rounds"])
    assert stats.n_collected_steps == 2 * cheap_overrides["rounds"]
    assert stats.n_collected_episodes == 2
    assert np.isfinite(collector.buffer.info["leakage"][: stats.n_collected_steps]).all()
    envs.close()


# -- Stable-Baselines3 on the batched env --------------------------------------------------------------
def test_make_sb3_vec_feeds_ppo(cheap_overrides):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecEnv, VecMonitor

    from leakgym.envs import make_sb3_vec

    venv = make_sb3_vec(ID, 2, seed=0, opponent="random", **cheap_overrides)
    assert isinstance(venv, VecEnv) and isinstance(venv, VecMonitor) and venv.num_envs == 2
    model = PPO("MlpPolicy", venv, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=8)
    assert model.num_timesteps == 8
    venv.close()
    with pytest.raises(ValueError, match="did you mean 'LeakGym-Digits-v0'"):
        make_sb3_vec("LeakGym-Digit-v0", 2)
    with pytest.raises(ValueError, match="needs the default NEXT_STEP"):  # it resets finished games itself
        make_sb3_vec(ID, 2, autoreset_mode="SameStep", **cheap_overrides)



@pytest.mark.parametrize("seed", [True, "0", -1, 1.5])
def test_make_sb3_vec_checks_its_seed_as_every_view(cheap_overrides, seed):
    """Found in an audit: seed=True played as seed 1, "0" was SB3's own TypeError, and -1 was accepted when
    built and refused only at the first reset."""
    from leakgym.envs import make_sb3_vec

    with pytest.raises(ValueError, match=rf"seed={seed!r}; allowed: None or an integer >= 0"):
        make_sb3_vec(ID, 2, seed=seed, opponent="random", **cheap_overrides)
    venv = make_sb3_vec(ID, 2, opponent="random", **cheap_overrides)
    with pytest.raises(ValueError, match=rf"seed={seed!r}; allowed"):
        venv.seed(seed)  # (what PPO(..., seed=...) calls)
    venv.close()

# -- SuperSuit ----------------------------------------------------------------------------------------
#: a defender menu as large as the cheap attacker menu (2 x 2 x 1 x 2 = 8 flat actions)
EQUAL_MENUS = {"defender_menu": {"noise_sigma": [0.0, 0.1], "prune": [0.0, 0.9], "censor_trials": [0, 5]},
               "oasis_bits": []}


def _game(cheap_overrides):
    return {k: v for k, v in cheap_overrides.items() if k != "rounds"} | {"max_cycles": 2}


def test_supersuit_recipe_refuses_unequal_menus_by_default(cheap_overrides):
    _needs("supersuit")
    from leakgym.envs import supersuit_vec_env

    with pytest.raises(ValueError, match=r"attacker 8, defender 144.*invalid_action='raise'"):
        supersuit_vec_env("digits", 2, **_game(cheap_overrides))
    with pytest.raises(ValueError, match="invalid_action='remap'; allowed"):
        supersuit_vec_env("digits", 2, invalid_action="remap", **_game(cheap_overrides))


def test_supersuit_recipe_pads_and_a_padded_action_raises(cheap_overrides):
    _needs("supersuit")
    from leakgym.envs import supersuit_vec_env

    venv = supersuit_vec_env("digits", 2, invalid_action="raise", **_game(cheap_overrides))
    assert venv.num_envs == 4 and venv.action_space.n == 144  # 2 games x (attacker, defender)
    obs = venv.reset()
    assert obs.shape == (4, venv.observation_space.shape[0])
    np.testing.assert_array_equal(obs[:, -2:], [[1, 0], [0, 1], [1, 0], [0, 1]])  # the role indicator
    _, rewards, _, _ = venv.step(np.array([7, 143, 0, 100]))  # the last in-menu actions are played
    assert np.isfinite(rewards).all()
    with pytest.raises(ValueError, match=r"attacker flat action 8 is a padding action.*0\.\.7"):
        venv.step(np.array([8, 0, 0, 0]))
    venv.close()


def test_the_padding_wrapper_leaves_bad_agent_keys_to_the_env(cheap_overrides):
    """Found in an audit: an unknown agent was a KeyError and a list an AttributeError in the padding
    check, before the env's own check could name the allowed agents."""
    from leakgym.envs.supersuit_vec import PaddedFlatActions

    padded = PaddedFlatActions(parallel_env("digits", flat_actions=True, **_game(cheap_overrides)))
    padded.reset(seed=0)
    with pytest.raises(ValueError, match=r"exactly the agents \['attacker', 'defender'\].*unknown \['spy'\]"):
        padded.step({"attacker": 0, "defender": 0, "spy": 0})
    with pytest.raises(ValueError, match="must be a dict"):
        padded.step([0, 0])


def test_supersuit_recipe_feeds_sb3_ppo_with_equal_menus(cheap_overrides):
    _needs("supersuit")
    from stable_baselines3 import PPO
    from stable_baselines3.common.utils import set_random_seed

    from leakgym.envs import supersuit_vec_env

    venv = supersuit_vec_env("digits", 2, **_game(cheap_overrides), **EQUAL_MENUS)  # refuse: sizes are equal
    assert venv.num_envs == 4 and venv.action_space.n == 8
    set_random_seed(0)
    model = PPO("MlpPolicy", venv, n_steps=4, batch_size=8, n_epochs=1, device="cpu")
    model.learn(16)
    assert model.num_timesteps == 16
    venv.close()


def test_supersuit_recipe_takes_sb3_seeding(cheap_overrides):
    """Found in an audit: SuperSuit's SB3 wrapper seeds through ConcatVecEnv.seed, which does not exist, so
    ``PPO(..., seed=0)`` and ``reset(seed=0)`` were AttributeErrors and every run drew fresh entropy."""
    _needs("supersuit")
    from stable_baselines3 import PPO

    from leakgym.envs import supersuit_vec_env

    def first_observations(seed):
        venv = supersuit_vec_env("digits", 2, invalid_action="raise", **_game(cheap_overrides))
        assert venv.seed(seed) == [seed, seed, seed + 1, seed + 1]  # game i gets seed + i, in both its slots
        obs = venv.reset()
        venv.close()
        return obs

    np.testing.assert_array_equal(first_observations(3), first_observations(3))
    assert not np.array_equal(first_observations(3), first_observations(4))
    venv = supersuit_vec_env("digits", 2, **_game(cheap_overrides), **EQUAL_MENUS)
    PPO("MlpPolicy", venv, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu").learn(8)
    for bad in (True, -1, "0"):
        with pytest.raises(ValueError, match=rf"seed={bad!r}; allowed: None or an integer >= 0"):
            venv.seed(bad)
    venv.close()


@pytest.mark.parametrize("base_class", ["stable_baselines3", "gymnasium"])
def test_supersuit_recipe_refuses_a_bad_slot_before_any_game_plays(cheap_overrides, base_class):
    """Found in an audit: SuperSuit steps the games one after another, so a padded (or any bad) action in
    game 1 was refused after game 0 had played its round, and the games were out of step from then on."""
    _needs("supersuit")
    from leakgym.envs import supersuit_vec_env

    venv = supersuit_vec_env("digits", 2, invalid_action="raise", base_class=base_class, **_game(cheap_overrides))
    venv.reset() if base_class == "stable_baselines3" else venv.reset(seed=0)
    games = (venv.venv if base_class == "stable_baselines3" else venv.env).vec_envs

    def rounds():
        return [g.par_env.unwrapped.round for g in games]

    step = venv.step if base_class == "gymnasium" else (lambda a: (venv.step_async(a), venv.step_wait()))
    for bad, message in (([0, 0, 100, 0], r"slot 2 \(game 1's attacker\): attacker flat action 100 is a padding"),
                         ([0, 0, 0, 144], r"slot 3 \(game 1's defender\): .*defender flat action 144; allowed range"),
                         ([0, 0, 0, -1], r"slot 3 .*flat action -1"),
                         ([0, 0, 0], r"3 actions for 4 slots"),
                         # (review) accepted here, then numpy's own error inside SuperSuit
                         ([0.0, 0.0, 1.0, 1.0], r"dtype float64; allowed: a 1-d integer array of 4"),
                         ([[0], [0], [1], [1]], r"shape \(4, 1\) .*allowed: a 1-d integer array")):
        with pytest.raises(ValueError, match=message):
            step(np.array(bad))
        assert rounds() == [0, 0]
    step(np.array([7, 143, 0, 0]))
    assert rounds() == [1, 1]
    if base_class == "gymnasium":  # (review) SuperSuit's own attributes through the checking wrapper
        assert len(venv.vec_envs) == 2 and venv.env_is_wrapped(object) == [False] * 4
    venv.close()


def test_a_fractional_action_is_not_called_a_padding_action():
    """(review) 2.5 was reported as "flat action 2 is a padding action"; it is left to the menu's own check,
    which refuses it as not an integer."""
    from leakgym.envs.supersuit_vec import padding_refusal

    sizes = {"attacker": 2, "defender": 8}
    assert padding_refusal(sizes, "attacker", 2.5) is None
    assert "flat action 3 is a padding action" in padding_refusal(sizes, "attacker", 3.0)
    assert padding_refusal(sizes, "attacker", 8) is None  # past the shared space too: the menu's own check


@pytest.mark.parametrize(("keyword", "value", "allowed"), [("num_envs", 0, "integers >= 1"),
                                                          ("num_envs", 1.5, "integers >= 1"),
                                                          ("num_envs", True, "integers >= 1"),
                                                          ("num_cpus", -1, "0 "),
                                                          ("num_cpus", 2, r"0 \(every game .* give two games one seed"),
                                                          ("base_class", "stable_baselines", "'stable_baselines3'")])
def test_supersuit_recipe_checks_its_arguments(cheap_overrides, keyword, value, allowed):
    """num_envs=0 was an IndexError and 1.5 a TypeError, from inside SuperSuit after the env was built."""
    _needs("supersuit")
    from leakgym.envs import supersuit_vec_env

    kwargs = {"num_envs": 2, keyword: value}
    with pytest.raises(ValueError, match=rf"{keyword}={value!r}; allowed: .*{allowed}"):
        supersuit_vec_env("digits", invalid_action="raise", **kwargs, **_game(cheap_overrides))


def test_supersuit_docstring_example_trains(cheap_overrides):
    """The module's example (equal menus, PPO seeded) runs; it used invalid_action='raise' with an unmasked PPO,
    which samples the padding and failed in its first rollout."""
    _needs("supersuit")
    import ast
    import re

    from stable_baselines3 import PPO

    import leakgym.envs.supersuit_vec as module
    from leakgym.envs import supersuit_vec_env

    menu = ast.literal_eval(re.search(r"menu = (\{.*?\})\n", module.__doc__, re.DOTALL).group(1))
    venv = supersuit_vec_env("digits", num_envs=1, attacker_menu=menu, num_clients=1, eval_size=32, max_cycles=2)
    assert venv.action_space.n == 144
    PPO("MlpPolicy", venv, n_steps=4, batch_size=4, n_epochs=1, seed=0, device="cpu").learn(4)
    venv.close()


# -- infos: the same numeric keys from reset on ---------------------------------------------------------
def _same_type(a, b) -> bool:
    return type(a) is type(b) or (isinstance(a, float) and isinstance(b, float))


def test_infos_have_the_same_numeric_keys_from_reset_on(cheap_overrides):
    from leakgym.game.feedback import DETAILS, info_template

    e = parallel_env("digits", **cheap_overrides)
    _, first = e.reset(seed=0)
    lpips = e.games.reports_lpips  # LPIPS is reported (a key) only where its weights are on disk
    assert {a: set(i) for a, i in first.items()} == {a: set(info_template(a, lpips=lpips)) for a in first}
    assert all(math.isfinite(v) for i in first.values() for v in i.values())
    while e.agents:
        *_, infos = e.step({a: e.action_space(a).sample() for a in e.agents})
        for a, info in infos.items():
            assert set(info) == set(first[a])
            assert all(isinstance(v, (bool, int, float)) and _same_type(v, first[a][k]) for k, v in info.items())
            assert all(math.isfinite(v) for v in info.values())  # determinism checkers compare with ==
            details = e.round_details(a)
            assert details["round"] == info["round"] and set(DETAILS) & set(details)
    assert e.round_details("attacker")["strategy"] == e.scenario.strategies[infos["attacker"]["strategy_index"]]

    single = gym.make(ID, role="defender", opponent="random", **cheap_overrides)
    _, first = single.reset(seed=0)
    _, _, _, _, info = single.step(single.action_space.sample())
    assert set(first) == set(info) == set(info_template("defender", lpips=lpips))
    assert isinstance(single.unwrapped.round_details()["defenses"], list)  # the defender's own record

    venv = gym.make_vec(ID, num_envs=2, opponent="random", **cheap_overrides)
    _, first = venv.reset(seed=0)
    _, _, _, _, infos = venv.step(venv.action_space.sample())
    assert set(first) == set(infos)
    assert {k for k in infos if not k.startswith("_")} == set(info_template("attacker", lpips=lpips))
    assert all(np.asarray(v).dtype != object for v in infos.values())
    venv.close()


# -- mid-episode copies -------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_mid_episode_copy_plays_on_the_same_trajectory(cheap_overrides, how):
    import copy
    import pickle

    def dup(env):
        return copy.deepcopy(env) if how == "deepcopy" else pickle.loads(pickle.dumps(env))

    overrides = dict(cheap_overrides, rounds=4)
    rng = np.random.default_rng(0)
    e = parallel_env("digits", **overrides)
    e.reset(seed=0)
    for _ in range(2):
        e.step({a: e.action_space(a).sample() for a in e.agents})
    twin = dup(e)
    assert (twin.games.images is e.games.images) == (how == "deepcopy")  # a copy in-process shares the data
    assert twin.games.model(0) is not e.games.model(0)
    while e.agents:
        actions = {a: rng.integers(e.action_space(a).nvec) for a in e.agents}
        o1, r1, t1, _, i1 = e.step(actions)
        o2, r2, t2, _, i2 = twin.step(actions)
        for a in actions:
            np.testing.assert_array_equal(o1[a], o2[a])
            assert i1[a]["leakage"] == i2[a]["leakage"]
        assert r1 == r2 and t1 == t2
    assert not twin.agents

    single = gym.make(ID, opponent="random", **overrides)  # the opponent's generator is copied too
    single.reset(seed=1)
    for _ in range(2):
        single.step(single.action_space.sample())
    twin = dup(single)
    for _ in range(2):
        action = rng.integers(single.action_space.nvec)
        o1, r1, t1, _, _ = single.step(action)
        o2, r2, t2, _, _ = twin.step(action)
        np.testing.assert_array_equal(o1, o2)
        assert (r1, t1) == (r2, t2)
    assert t1

    venv = gym.make_vec(ID, num_envs=2, opponent="random", **overrides)  # the games' one batch travels once
    venv.reset(seed=2)
    for _ in range(2):
        venv.step(venv.action_space.sample())
    twin = dup(venv)
    assert twin.games is not venv.games and all(env.parallel.games is twin.games for env in twin.envs)
    for _ in range(3):  # to the end of the episode and into the autoreset
        actions = rng.integers(venv.single_action_space.nvec, size=(2, len(venv.single_action_space.nvec)))
        o1, r1, t1, _, _ = venv.step(actions)
        o2, r2, t2, _, _ = twin.step(actions)
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(t1, t2)


def test_vector_autoreset_modes_play_the_same_games(cheap_overrides):
    """SAME_STEP and DISABLED play the trajectories of the default NEXT_STEP; only the resets move."""
    from gymnasium.vector import AutoresetMode

    rounds = cheap_overrides["rounds"]
    kwargs = dict(cheap_overrides, num_envs=2, opponent="random", batch_attacks=False)
    nxt = gym.make_vec(ID, **kwargs)
    same = gym.make_vec(ID, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
    off = gym.make_vec(ID, autoreset_mode="Disabled", **kwargs)
    assert (same.autoreset_mode, off.metadata["autoreset_mode"]) == (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED)
    first = [v.reset(seed=3)[0] for v in (nxt, same, off)]
    np.testing.assert_array_equal(first[0], first[1])
    rng = np.random.default_rng(0)
    nvec = nxt.single_action_space.nvec
    for t in range(rounds):
        actions = rng.integers(nvec, size=(2, len(nvec)))
        o1, r1, d1, _, _ = nxt.step(actions)
        o2, r2, d2, _, i2 = same.step(actions)
        o3, r3, d3, _, _ = off.step(actions)
        if t < rounds - 1:
            np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(r1, r3)
        assert d1.tolist() == d2.tolist() == d3.tolist() == [t == rounds - 1] * 2
    np.testing.assert_array_equal(np.stack(i2["final_obs"]), o1)  # SAME_STEP: the final observation in infos
    assert (i2["final_info"]["round"] == rounds).all() and (i2["round"] == 0).all()
    np.testing.assert_array_equal(o1, o3)
    with pytest.raises(RuntimeError, match="reset_mask"):
        off.step(actions)
    o3, i3 = off.reset(options={"reset_mask": np.array([True, False])})
    assert i3["_round"].tolist() == [True, False]
    with pytest.raises(RuntimeError, match=r"sub-environment\(s\) \[1\]"):
        off.step(actions)
    with pytest.raises(ValueError, match="autoreset_mode='sometimes'"):
        gym.make_vec(ID, autoreset_mode="sometimes", **kwargs)
    for v in (nxt, same, off):
        v.close()


def _equal_infos(a, b) -> bool:
    if a.keys() != b.keys() or list(a) != list(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not (isinstance(y, dict) and _equal_infos(x, y)):
                return False
        elif not (x.dtype == y.dtype and x.shape == y.shape
                  and all(np.array_equal(p, q) for p, q in zip(x.tolist(), y.tolist()))):
            return False
    return True


def test_vector_infos_equal_gymnasiums_add_info_entry_by_entry(cheap_overrides):
    """The vector env gathers its games' infos one array per key; the result equals Gymnasium's
    ``_add_info`` taken entry by entry (keys and their order, dtypes, values, masks), for a step where some
    games reset and the others play, for a reset of some games, and for SAME_STEP's final entries."""
    from gymnasium.vector import AutoresetMode

    from leakgym.game.feedback import info_template

    venv = gym.make_vec(ID, num_envs=3, opponent="random", **cheap_overrides).unwrapped

    def by_entry(entries):
        out = {}
        for i, info in entries:
            out = venv._add_info(out, info, i)
        return out

    reset_one = info_template("attacker", accuracy=0.1, test_loss=2.3)
    one = dict(reset_one, round=1, leakage=0.4, model_diverged=True, strategy_index=2)
    two = dict(reset_one, round=1, leakage=0.7, update_skipped=True, matching_loss=3.5)
    for entries in ([(1, reset_one), (0, one), (2, two)], [(2, two)], [(0, one), (0, two)],
                    [(0, one), (0, {"final_obs": np.zeros(3), "final_info": one}), (0, reset_one)],
                    [(1, {**one, "extra": "text"})], [(0, one), (1, {**two, "round": 2.5})]):
        assert _equal_infos(venv._vector_infos(entries), by_entry(entries)), entries
    assert venv._vector_infos([]) == {}
    got = venv._vector_infos([(0, one), (2, two)])
    masks = [v for k, v in got.items() if k.startswith("_")]
    assert len({id(m) for m in masks}) == len(masks) == len(one)  # one array per key, as _add_info's
    same = gym.make_vec(ID, num_envs=2, opponent="random", autoreset_mode=AutoresetMode.SAME_STEP, **cheap_overrides)
    same.reset(seed=0)
    for _ in range(cheap_overrides["rounds"]):
        infos = same.step(np.zeros((2, len(same.single_action_space.nvec)), np.int64))[4]
    assert infos["_final_obs"].all() and (infos["final_info"]["round"] == cheap_overrides["rounds"]).all()
    for v in (venv, same):
        v.close()

"""Finite by construction, presets that never crash together, bounded configurations.

Issue "Trust boundaries and bad input", items 3-5: every number an environment returns is finite and
every observation lies in its space, whatever the actions and however extreme the menus; every
attacker preset plays every defender preset on every offline scenario (or is refused up front).
"""

import math

import numpy as np
import pytest

from leakgym.agents.policies.presets import preset_action, preset_names
from leakgym.envs import parallel_env
from leakgym.game.scenario import load_scenario

#: cheap settings that keep each scenario's own menus (dims) but small budgets
CHEAP = {"rounds": 3, "num_clients": 1, "eval_size": 32, "iterations": [2, 3], "restarts": [1, 2],
         "defense_defaults": {"dcs2_steps": 2}}
MALICIOUS_CHEAP = {"rounds": 3, "num_clients": 1, "eval_size": 32, "attack_defaults": {"num_neurons": 64}}

#: extreme but valid menus: huge noise, a large server step, PRECODE with noise, FedAvg, every OASIS bit
EXTREME = [
    dict(CHEAP, defender_menu={"noise_sigma": [0.0, 1e3], "prune": [0.0, 0.999], "clip": [0.0, 1e-6]},
         server_lr=50.0),
    dict(CHEAP, model="mlp", model_width=32, precode=True, defender_menu={"ppp": ["off", "ng"], "ppp_sigma": [0.5, 100.0], "prune": [0.0, 0.9]},
         strategies=["inverting-gradients", "layer-skipping"], server_lr=5.0),
    dict(CHEAP, update_kind="model_delta", local_steps=3, local_lr=10.0, batch_size=4,
         defender_menu={"noise_sigma": [0.0, 10.0], "topk": [1.0, 0.001]},
         oasis_bits=["major_rotation", "minor_rotation", "shear", "hflip", "vflip"]),
]


def _all_finite(value) -> bool:
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v) for v in value)
    if isinstance(value, (float, np.floating)):
        return math.isfinite(value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return bool(np.isfinite(value).all())
    return True


def _play(env, rng, rounds):
    env.reset(seed=int(rng.integers(1000)))
    for _ in range(rounds):
        actions = {a: rng.integers(0, env.action_space(a).nvec) for a in env.agents}
        obs, rewards, _, _, infos = env.step(actions)
        for a in ("attacker", "defender"):
            assert env.observation_space(a).contains(obs[a]), (a, obs[a])
            assert math.isfinite(rewards[a]), (a, rewards[a])
            assert _all_finite(infos[a]), (a, infos[a])
        assert math.isfinite(env.state().sum())


@pytest.mark.parametrize(
    "scenario,overrides",
    [("digits", CHEAP), ("digits-malicious", MALICIOUS_CHEAP)] + [("digits", o) for o in EXTREME],
    ids=["digits", "digits-malicious", "extreme-noise", "extreme-precode", "extreme-fedavg"],
)
def test_fuzz_every_number_finite_and_every_observation_in_space(scenario, overrides):
    env = parallel_env(scenario, **overrides)
    rng = np.random.default_rng(0)
    for _ in range(12):  # 12 episodes x 3 rounds of random action pairs per configuration (180 in all)
        _play(env, rng, overrides["rounds"])


def test_diverged_model_is_flagged_not_leaked_as_nan():
    # The largest noise a configuration takes (1e6) and a server step that overflows float32 weights.
    env = parallel_env("digits", **dict(EXTREME[0], defender_menu={"noise_sigma": [1e6]}, oasis_bits=[], server_lr=1e36))
    env.reset(seed=0)
    flagged = False
    for _ in range(3):
        _, rewards, _, _, infos = env.step({"attacker": np.zeros(4, np.int64), "defender": np.zeros(1, np.int64)})
        assert _all_finite(infos) and all(math.isfinite(r) for r in rewards.values())
        flagged = flagged or infos["defender"]["model_diverged"]
    assert flagged and infos["defender"]["diverged_round"] >= 1
    assert infos["defender"]["accuracy"] == 0.0  # not the share of one class (arg-max over NaN logits)


@pytest.mark.parametrize("scenario,overrides", [("digits", CHEAP), ("digits-malicious", MALICIOUS_CHEAP)])
def test_every_preset_pair_plays_or_is_refused_up_front(scenario, overrides):
    sc = load_scenario(scenario, **overrides)
    attackers, defenders = [], []
    for role, bucket in (("attacker", attackers), ("defender", defenders)):
        for name in preset_names(role):
            try:
                bucket.append((name, preset_action(name, sc, role)))
            except ValueError as exc:  # refused up front, with a reason naming the preset
                assert name in str(exc)
    assert attackers and defenders
    env = parallel_env(sc)
    for a_name, a_action in attackers:
        env.reset(seed=0)
        for d_name, d_action in defenders:
            if not env.agents:
                env.reset(seed=0)
            _, rewards, *_ = env.step({"attacker": a_action, "defender": d_action})
            assert all(math.isfinite(r) for r in rewards.values()), (a_name, d_name)


def test_malicious_attacker_menu_offers_an_attack_knob():
    sc = load_scenario("digits-malicious")
    assert sc.attacker_dims == ["strategy", "num_bins"]
    assert sc.decode_attacker(np.array([0, 1])) == {"strategy": "imprint", "num_bins": 128}


def test_adaptive_decoders_play_against_any_defense():
    """Mixup decoding and LODA inversion against defenses they were not built for: they play."""
    env = parallel_env("digits", **dict(CHEAP, strategies=["mixup-decoding", "loda-inversion"], iterations=[2],
                                        restarts=[1], defender_menu={"noise_sigma": [0.0, 0.1]}, oasis_bits=[]))
    env.reset(seed=0)
    for strategy in (0, 1):
        for defense in (0, 1):
            if not env.agents:
                env.reset(seed=0)
            _, rewards, _, _, infos = env.step({"attacker": np.array([strategy, 0, 0, 0]),
                                                "defender": np.array([defense])})
            assert math.isfinite(rewards["attacker"]) and _all_finite(infos)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_an_attack_returning_non_finite_pixels_is_scored_not_a_failed_round(monkeypatch, value):
    """A diverged attack (a user-registered one; the built-in attacks keep their best finite iterate) may
    return NaN or infinite pixels. The metrics refuse non-finite images, so NaN pixels made every step a
    RoundError: the game now scores NaN as grey (nothing_sent's guess) and clamps the infinities."""
    import leakgym.game.round as game_round

    play = game_round.reconstruct_all

    def diverged(jobs, **kwargs):
        results, seconds = play(jobs, **kwargs)
        for r in results:
            r.images = r.images.clone()
            r.images[..., :3, :] = value
        return results, seconds

    monkeypatch.setattr(game_round, "reconstruct_all", diverged)
    env = parallel_env("digits", **CHEAP)
    env.reset(seed=0)
    _, rewards, _, _, infos = env.step({a: np.zeros(len(env.action_space(a).nvec), np.int64) for a in env.agents})
    assert all(math.isfinite(r) for r in rewards.values()) and _all_finite(infos)
    game = env.unwrapped
    images = np.asarray(game.games.last[game.row].reconstructions)  # what render() shows
    assert np.isfinite(images).all()
    assert (images[..., :3, :] == (0.5 if math.isnan(value) else float(value > 0))).all()


@pytest.mark.parametrize("metric", ["ssim", "psnr", "ssim+psnr"])
def test_a_nan_score_is_no_leakage_not_a_nan_reward(metric):
    """max(nan, 0.0) is NaN in Python: a NaN SSIM or PSNR (a reconstruction with NaN pixels) made NaN
    rewards."""
    from leakgym.game.feedback import leakage_score
    from leakgym.metrics import ReconstructionScores

    nan = ReconstructionScores(per_image={}, mean={"ssim": math.nan, "psnr": math.nan, "mse": math.nan},
                               assignment=np.zeros(1, np.int64), label_accuracy=None)
    assert leakage_score(nan, metric) == 0.0
    full = ReconstructionScores(per_image={}, mean={"ssim": 1.0, "psnr": math.inf, "mse": 0.0},
                                assignment=np.zeros(1, np.int64), label_accuracy=None)
    assert leakage_score(full, metric) == 1.0

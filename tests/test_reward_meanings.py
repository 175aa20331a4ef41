"""What the rewards and the information channels mean, tested by behaviour (issue 38, item 1).

Each test plays the public PettingZoo env (``leakgym.envs.parallel_env``) and checks a documented
direction or formula (:mod:`leakgym.game.feedback`, :mod:`leakgym.game.feedback`), so that a
reward term of the wrong sign, a self-audit that does not run, private labels withheld from an
attacker that should know them, or a server that drops the victim's update fails the suite. "All else
fixed" is done with common random numbers: the same episode seed and the same actions give the same
round (the seed tests check that), so two runs that differ in one setting differ only through it.

The breaks each test was seen to catch are listed in docs/reliability.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leakgym.envs import parallel_env

#: small, fast rounds: two attack strengths (DLG with 1 and 60 iterations: leakage about 0 and 1 on
#: 16x16 digits with B = 1), one benign client, a small evaluation set
CHEAP = {"rounds": 3, "num_clients": 1, "eval_size": 32, "strategies": ["inverting-gradients", "dlg"],
         "iterations": [1, 60], "restarts": [1], "tv": [0.0]}
IG, DLG = 0, 1
WEAK, STRONG = 0, 1
#: defender actions of the digits menu: noise_sigma, prune, dcs2_lambda_g, censor_trials, two OASIS bits
NO_DEFENSE = [0, 0, 0, 0, 0, 0]
NOISE = [2, 0, 0, 0, 0, 0]  # noise_sigma = 0.1
PRUNE = [0, 2, 0, 0, 0, 0]  # prune = 0.9
DCS2 = [0, 0, 1, 0, 0, 0]  # DCS² with 2 synthesis steps (defense_defaults below): 3 compute units
ZERO_WEIGHTS = {"attack_cost": 0.0, "fidelity": 0.0, "accuracy": 0.0, "defense_overhead": 0.0}


def play(attacker, defender, *, steps=1, seed=0, **overrides):
    """``steps`` rounds of ``parallel_env("digits", **CHEAP, **overrides)`` from ``reset(seed=seed)`` with
    fixed actions: ``(env, [(observations, rewards, infos), ...])``."""
    env = parallel_env("digits", **{**CHEAP, "defense_defaults": {"dcs2_steps": 2}, **overrides})
    env.reset(seed=seed)
    out = []
    for _ in range(steps):
        obs, rewards, _, _, infos = env.step({"attacker": np.array(attacker), "defender": np.array(defender)})
        out.append((obs, rewards, infos))
    return env, out


# --------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------
def test_rewards_are_the_documented_formulas_of_what_the_round_measured():
    """r_A = L - w_cost * units / 1000 and r_D = -L + w_fid * fidelity + w_acc * accuracy - w_ovh * units
    (leakgym/game/feedback.py), computed here from the raw measurements in the infos, not from the reward parts."""
    env, out = play([DLG, STRONG, 0, 0], DCS2, steps=2)
    w = env.scenario.rewards
    for _, rewards, infos in out:
        a, d = infos["attacker"], infos["defender"]
        assert a["leakage"] == d["leakage"] > 0.1
        assert a["attack_units"] > 0 and d["defense_units"] > 0 and d["fidelity"] > 0
        assert rewards["attacker"] == pytest.approx(a["leakage"] - w.attack_cost * a["attack_units"] / 1000, abs=1e-9)
        assert rewards["defender"] == pytest.approx(
            -d["leakage"] + w.fidelity * d["fidelity"] + w.accuracy * d["accuracy"]
            - w.defense_overhead * d["defense_units"], abs=1e-9)


def test_defender_reward_falls_and_attacker_reward_rises_with_leakage_all_else_fixed():
    """Same seed and defender action, a weak and a strong attack: the model, the shared update and so
    accuracy, fidelity and overhead are the same; only the leakage differs, and the rewards move by it."""
    _, [(_, r_weak, i_weak)] = play([DLG, WEAK, 0, 0], NO_DEFENSE)
    _, [(_, r_strong, i_strong)] = play([DLG, STRONG, 0, 0], NO_DEFENSE)
    for key in ("accuracy", "fidelity", "defense_units"):
        assert i_weak["defender"][key] == i_strong["defender"][key], key
    leak_weak, leak_strong = i_weak["attacker"]["leakage"], i_strong["attacker"]["leakage"]
    assert leak_weak < 0.1 and leak_strong > 0.9  # DLG converges on one 16x16 digit in 60 steps
    assert r_strong["defender"] < r_weak["defender"] - 0.8
    assert r_strong["defender"] - r_weak["defender"] == pytest.approx(-(leak_strong - leak_weak), abs=1e-9)
    assert r_strong["attacker"] > r_weak["attacker"] + 0.8


def test_with_only_the_leakage_terms_the_rewards_are_plus_and_minus_leakage():
    _, out = play([DLG, STRONG, 0, 0], NOISE, steps=2, rewards=ZERO_WEIGHTS)
    for _, rewards, infos in out:
        leak = infos["attacker"]["leakage"]
        assert leak > 0.1
        assert rewards["attacker"] == pytest.approx(leak, abs=1e-9)
        assert rewards["defender"] == pytest.approx(-leak, abs=1e-9)


#: [rewards] weight -> (the role whose reward it moves, its documented sign, the info it multiplies)
WEIGHT_TERMS = {
    "attack_cost": ("attacker", -1.0, lambda i: i["attacker"]["attack_units"] / 1000),
    "fidelity": ("defender", +1.0, lambda i: i["defender"]["fidelity"]),
    "accuracy": ("defender", +1.0, lambda i: i["defender"]["accuracy"]),
    "defense_overhead": ("defender", -1.0, lambda i: i["defender"]["defense_units"]),
}


@pytest.mark.parametrize("weight", sorted(WEIGHT_TERMS))
def test_every_reward_weight_moves_its_reward_in_its_documented_direction(weight):
    """The same round under two values of one ``[rewards]`` weight: only that term's reward moves, by the
    weight difference times its measurement, in the documented direction (a cost lowers it)."""
    role, sign, measured = WEIGHT_TERMS[weight]
    base = {"attack_cost": 0.05, "fidelity": 0.5, "accuracy": 0.5, "defense_overhead": 0.002}
    _, [(_, r_low, i_low)] = play([DLG, STRONG, 0, 0], DCS2, rewards=base)
    _, [(_, r_high, i_high)] = play([DLG, STRONG, 0, 0], DCS2, rewards={**base, weight: base[weight] + 2.0})
    quantity = measured(i_low)
    assert quantity > 0 and quantity == measured(i_high)
    assert r_high[role] - r_low[role] == pytest.approx(sign * 2.0 * quantity, rel=1e-6)
    other = "defender" if role == "attacker" else "attacker"
    assert r_high[other] == r_low[other]


def test_defender_reward_rises_with_the_global_models_accuracy():
    """Round 1 under two server learning rates: the attack and the defense see the same initial model
    (same leakage and fidelity); only the aggregated model, and so the measured accuracy, differs. The
    reward is higher where the accuracy is, by w_acc times the difference; the accuracy is the one the
    defender observes."""
    runs = []
    for lr in (1e-6, 1.0):
        _, [(obs, r, i)] = play([DLG, STRONG, 0, 0], NO_DEFENSE, server_lr=lr, eval_size=256)
        runs.append((r["defender"], i["defender"], obs["defender"]))
    (r_a, i_a, o_a), (r_b, i_b, o_b) = runs
    assert i_a["leakage"] == i_b["leakage"] and i_a["fidelity"] == i_b["fidelity"]
    assert i_a["accuracy"] != i_b["accuracy"]
    assert (r_b - r_a) * (i_b["accuracy"] - i_a["accuracy"]) > 0
    assert r_b - r_a == pytest.approx(0.5 * (i_b["accuracy"] - i_a["accuracy"]), abs=1e-9)
    for obs, info in ((o_a, i_a), (o_b, i_b)):
        assert obs[1] == pytest.approx(info["accuracy"], abs=1e-6)  # defender observation entry test_accuracy


# --------------------------------------------------------------------------------------------------
# Information channels
# --------------------------------------------------------------------------------------------------
def test_known_labels_gives_the_attacker_the_private_labels():
    """``known_labels = true``: DLG, which otherwise optimises the labels, reports the private labels
    from its first step (label accuracy 1 in every round of B = 4), and after 60 steps reconstructs
    better than without them (measured: SSIM leakage about 0.95 vs 0.57)."""
    def run(known, strength):
        _, out = play([DLG, strength, 0, 0], NO_DEFENSE, steps=2, batch_size=4, known_labels=known)
        return [i["attacker"] for _, _, i in out]

    assert all(i["label_accuracy"] == 1.0 for i in run(True, WEAK))
    assert min(i["label_accuracy"] for i in run(False, WEAK)) < 1.0  # the check can tell the two apart
    with_labels = np.mean([i["leakage"] for i in run(True, STRONG)])
    without = np.mean([i["leakage"] for i in run(False, STRONG)])
    assert with_labels > without + 0.2


def test_self_audit_runs_when_asked_and_its_observation_tracks_its_leakage():
    """``audit_iterations > 0``: the defender's observation entry ``audit_leakage`` is the audit's score
    of every round (the info's value), clearly above 0 without a defense and lower under a defense that
    lowers leakage (prune 0.9); ``audit_iterations = 0``: the entry stays 0."""
    _, off = play([IG, WEAK, 0, 0], NO_DEFENSE, steps=2, audit_iterations=0)
    assert all(o["defender"][-2] == 0.0 and i["defender"]["audit_leakage"] == 0.0 for o, _, i in off)
    audits = {}
    for name, action in (("none", NO_DEFENSE), ("prune", PRUNE)):
        _, out = play([IG, WEAK, 0, 0], action, steps=3, audit_iterations=60)
        for obs, _, infos in out:
            assert obs["defender"][-2] == pytest.approx(infos["defender"]["audit_leakage"], abs=1e-6)
        audits[name] = np.mean([i["defender"]["audit_leakage"] for _, _, i in out])
    assert audits["none"] > 0.3  # measured 0.60 (60 steps of Inverting Gradients with known labels)
    assert audits["prune"] < audits["none"] - 0.1  # measured 0.33


# --------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------
def _parameters(env) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in env.games.model(env.row).named_parameters()}


@pytest.mark.parametrize("num_clients", [0, 2])
def test_victims_update_moves_the_global_model_by_its_weight(num_clients):
    """FedSGD with B = 1 and K benign clients of 8 images each: the server's step is
    ``-server_lr * (1 * u_victim + sum_k 8 * u_k) / (1 + 8 K)``. Two runs with the same seed whose victims
    share different updates (no defense vs noise) draw the same benign batches, so their new global
    models differ by exactly ``-server_lr / (1 + 8 K) * (u_a - u_b)``."""
    lr = 0.5
    runs = []
    for action in (NO_DEFENSE, NOISE):
        env = parallel_env("digits", **{**CHEAP, "num_clients": num_clients, "server_lr": lr})
        env.reset(seed=3)
        before = _parameters(env)
        env.step({"attacker": np.array([IG, WEAK, 0, 0]), "defender": np.array(action)})
        runs.append((before, _parameters(env), env.last_round.update.tensors))
    (before_a, after_a, u_a), (before_b, after_b, u_b) = runs
    weight = 1.0 / (1 + 8 * num_clients)
    moved = 0.0
    for name in after_a:
        assert torch.equal(before_a[name], before_b[name])
        expected = -lr * weight * (u_a[name] - u_b[name])
        torch.testing.assert_close(after_a[name] - after_b[name], expected, atol=1e-6, rtol=1e-4)
        moved += float((u_a[name] - u_b[name]).abs().sum())
        if num_clients == 0:  # the victim alone: the step is its update
            torch.testing.assert_close(after_a[name] - before_a[name], -lr * u_a[name], atol=1e-6, rtol=1e-4)
    assert moved > 0  # the noise changed the update, so the check above has something to see


def test_victims_update_reaches_the_model_in_the_batched_aggregation():
    """The same weight through the vector envs' path (``play_round(batch_clients=True)``: the games' benign
    clients and aggregations as one computation): two games with the same seed, one victim without a
    defense and one with noise, end one aggregation apart by the victim's weighted difference."""
    from leakgym.game.batch import GameBatch
    from leakgym.game.round import play_round
    from leakgym.game.scenario import load_scenario

    sc = load_scenario("digits", **{**CHEAP, "num_clients": 2, "server_lr": 0.5})
    games = GameBatch(sc, 2)
    for i in range(2):
        games.reset(i, seed=3)
    before = [{k: v.detach().clone() for k, v in games.model(i).named_parameters()} for i in range(2)]
    play_round(games, [0, 1], [(np.array(NO_DEFENSE), np.array([IG, WEAK, 0, 0])),
                               (np.array(NOISE), np.array([IG, WEAK, 0, 0]))], batch_clients=True)
    after = [dict(games.model(i).named_parameters()) for i in range(2)]
    u_a, u_b = (games.last[i].update.tensors for i in range(2))
    for name in after[0]:
        assert torch.equal(before[0][name], before[1][name])
        torch.testing.assert_close((after[0][name] - after[1][name]).detach(), -0.5 / 17 * (u_a[name] - u_b[name]),
                                   atol=1e-5, rtol=1e-3)
    assert any(not torch.equal(u_a[n], u_b[n]) for n in u_a)


@pytest.mark.parametrize(("strategy", "module", "stage", "overrides"), [
    ("loda-inversion", "loda_inversion", "invert_obscuring", {}),
    ("mixup-decoding", "mixup_decoding", "demix",
     {"batch_size": 2, "defender_menu": {"mixup_k": [0, 2]}, "attack_defaults": {"decode_steps": 10}}),
])
def test_a_two_stage_attack_is_charged_its_second_stage_once_whatever_the_restarts(strategy, module, stage, overrides,
                                                                                   monkeypatch):
    """Found in an audit: LODA inversion's Eq. 6 steps and Mixup decoding's demixing were added to the
    iterations, so attack_units charged them once per restart, although they run once on the best restart."""
    import importlib

    attacks = importlib.import_module(f"leakgym.attacks.{module}")
    steps = []
    real = getattr(attacks, stage)

    def counting(*args, **kwargs):
        steps.append(kwargs["steps"])
        return real(*args, **kwargs)

    monkeypatch.setattr(attacks, stage, counting)
    env = parallel_env("digits", **{**CHEAP, "strategies": [strategy], "iterations": [3], "restarts": [1, 2], **overrides})
    env.reset(seed=0)
    defender = np.zeros(env.action_space("defender").shape, np.int64)
    defender[0] = 1 if "defender_menu" in overrides else 0  # Mixup on: what Mixup decoding decodes
    for restarts in (1, 2):
        steps.clear()
        _, _, _, _, infos = env.step({"attacker": np.array([0, 0, restarts - 1, 0]), "defender": defender})
        assert len(steps) == 1
        assert infos["attacker"]["attack_units"] == 3 * restarts + steps[0]

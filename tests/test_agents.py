"""Scripted agents, presets, the ε-greedy bandit and make_agent."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from leakgym.agents import (
    PRESETS,
    EpsilonGreedyBandit,
    FixedAgent,
    RoundRobinAgent,
    UniformRandomAgent,
    default_arms,
    make_agent,
    preset_action,
    preset_names,
    valid_presets,
)
from leakgym.agents.experiments.cli_common import parse_overrides, split_agent_list
from leakgym.game.scenario import load_scenario


@pytest.fixture(scope="module")
def digits():
    return load_scenario("digits")


# ---------------------------------------------------------------------------------------- presets
# The presets the digits menu can express (the others need settings digits does not offer).
DIGITS_DEFENDER_PRESETS = {
    "none": {},
    "noise-0.01": {"noise_sigma": 0.01},
    "noise-0.1": {"noise_sigma": 0.1},
    "prune-0.9": {"prune": 0.9},
    "dcs2-paper": {"dcs2_lambda_g": 0.5},  # paper 0.7 -> nearest digits level 0.5
    "censor-paper": {"censor_trials": 5},  # paper 20 -> digits' largest level 5
    "oasis-mr": {"oasis": ["major_rotation"]},
}
DIGITS_ATTACKER_PRESETS = {
    "dlg-paper": ("dlg", 150, 1, 0.0),  # 300 iterations -> digits' largest level 150
    "ig-paper": ("inverting-gradients", 150, 1, 1e-4),
    "gradinversion-paper": ("gradinversion", 150, 2, 1e-4),
    "prior-init-dcs2": ("prior-init", 150, 1, 1e-4),
}


def test_defender_presets_map_to_the_expected_digits_settings(digits):
    space = spaces.MultiDiscrete(digits.defender_nvec)
    for name, expected in DIGITS_DEFENDER_PRESETS.items():
        action = preset_action(name, digits, "defender")
        assert space.contains(action), name
        decoded = digits.decode_defender(action)
        for key in digits.defender_menu:
            assert decoded[key] == expected.get(key, digits.defender_menu[key][0]), (name, key)
        assert decoded["oasis"] == expected.get("oasis", []), name


def test_attacker_presets_map_to_the_expected_digits_settings(digits):
    space = spaces.MultiDiscrete(digits.attacker_nvec)
    for name, (strategy, iterations, restarts, tv) in DIGITS_ATTACKER_PRESETS.items():
        action = preset_action(name, digits, "attacker")
        assert space.contains(action), name
        assert digits.decode_attacker(action) == {
            "strategy": strategy, "iterations": iterations, "restarts": restarts, "tv": tv
        }, name


def test_valid_presets_lists_exactly_the_playable_ones(digits):
    assert valid_presets(digits, "defender") == list(DIGITS_DEFENDER_PRESETS)
    assert valid_presets(digits, "attacker") == list(DIGITS_ATTACKER_PRESETS)
    assert set(preset_names()) == set(PRESETS)
    assert all(PRESETS[n].role == "attacker" for n in preset_names("attacker"))


def test_preset_outside_the_menu_names_preset_key_and_menu(digits):
    with pytest.raises(ValueError, match=r"ppp-ng2.*'ppp'.*defender menu.*noise_sigma=\[0.0, 0.01, 0.1\]"):
        preset_action("ppp-ng2", digits)
    with pytest.raises(ValueError, match=r"oasis-mr\+sh.*'shear'.*oasis_bits"):
        preset_action("oasis-mr+sh", digits)
    with pytest.raises(ValueError, match=r"imprint-oasis.*'imprint'.*strategy menu"):
        preset_action("imprint-oasis", digits)


def test_preset_that_would_collapse_to_off_is_refused(digits):
    coarse = digits.replace(defender_menu={"noise_sigma": [0.0, 0.5]})
    with pytest.raises(ValueError, match=r"noise-0.1.*noise_sigma=0.1 maps to the menu's off value 0.0"):
        preset_action("noise-0.1", coarse)
    assert preset_action("noise-0.1", coarse.replace(defender_menu={"noise_sigma": [0.0, 0.15]})).tolist()[0] == 1
    # Found in an audit: "off" is the value played, wherever the menu lists it (the check read index 0):
    # noise-0.1 played no noise on [0.5, 0.0], and prune-0.9 was refused for mapping to 0.99.
    with pytest.raises(ValueError, match=r"noise-0.1.*noise_sigma=0.1 maps to the menu's off value 0.0"):
        preset_action("noise-0.1", digits.replace(defender_menu={"noise_sigma": [0.5, 0.0]}))
    reordered = digits.replace(defender_menu={"prune": [0.99, 0.0]})
    assert reordered.decode_defender(preset_action("prune-0.9", reordered))["prune"] == 0.99


def test_an_attacker_preset_whose_prior_would_collapse_to_off_is_refused(digits):
    """Found in an audit: ig-paper's TV prior (1e-4) became tv = 0 in a menu [0, 1e-3, 1e-2] (SVHN's), without a
    word; only the defender presets were checked. A menu with a value near it still plays the preset."""
    from leakgym.game.scenario import load_scenario

    coarse = digits.replace(tv=[0.0, 1e-3, 1e-2])
    for name in ("ig-paper", "prior-init-dcs2"):
        with pytest.raises(ValueError, match=rf"{name}.*tv=0.0001 maps to the menu's off value 0.0"):
            preset_action(name, coarse, "attacker")
    with pytest.raises(ValueError, match="tv=0.0001 maps to the menu's off value"):
        preset_action("ig-paper", load_scenario("svhn"), "attacker")
    assert digits.decode_attacker(preset_action("ig-paper", digits, "attacker"))["tv"] == 1e-4
    dlg = preset_action("dlg-paper", coarse, "attacker")  # DLG's preset asks for no prior: tv stays 0
    assert coarse.decode_attacker(dlg).get("tv", 0.0) == 0.0


def test_preset_role_and_name_errors(digits):
    with pytest.raises(ValueError, match="plays the defender, not the attacker; attacker presets"):
        preset_action("dcs2-paper", digits, "attacker")
    with pytest.raises(ValueError, match="unknown preset 'dcs3'"):
        preset_action("dcs3", digits)


# ---------------------------------------------------------------------------------------- scripted
def test_fixed_and_round_robin_agents():
    space = spaces.MultiDiscrete([3, 2, 4])
    rng = np.random.default_rng(0)
    fixed = FixedAgent([2, 1, 3])
    assert [fixed.act(None, space, rng).tolist() for _ in range(2)] == [[2, 1, 3]] * 2
    with pytest.raises(ValueError, match=r"action\[2\] = 4; allowed range 0..3"):
        FixedAgent([0, 0, 4]).act(None, space, rng)
    sweep = RoundRobinAgent()
    played = np.array([sweep.act(None, space, rng) for _ in range(4)])
    assert played.tolist() == [[0, 0, 0], [1, 1, 1], [2, 0, 2], [0, 1, 3]]
    sweep.reset()
    assert sweep.act(None, space, rng).tolist() == [0, 0, 0]
    cycle = RoundRobinAgent([[1, 0, 0], [0, 1, 2]])
    assert [cycle.act(None, space, rng).tolist() for _ in range(3)] == [[1, 0, 0], [0, 1, 2], [1, 0, 0]]


CHEAP = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "restarts": [1], "eval_size": 16}


def _misfits(nvec: np.ndarray) -> dict[str, object]:
    """Agents with an action outside ``nvec`` only after their first round, or from the start."""
    ok, bad = [0] * len(nvec), [0] * (len(nvec) - 1) + [int(nvec[-1])]
    return {"bandit arm": EpsilonGreedyBandit(arms=[ok, bad]), "round-robin action": RoundRobinAgent([ok, bad]),
            "fixed action": FixedAgent(bad), "short fixed action": FixedAgent(ok[:-1])}


@pytest.mark.parametrize("case", ["bandit arm", "round-robin action", "fixed action", "short fixed action"])
def test_an_opponent_that_cannot_play_its_role_fails_when_the_env_is_built(digits, case, tmp_path):
    """A bandit arm or round-robin action outside the menu failed only when first played (step 1, or
    later), mid-rollout; the single-agent and vector envs and ``evaluate`` now check the opponent's
    actions against its role's space when they are built, before anything runs or is written."""
    import gymnasium as gym

    from leakgym.agents.experiments.evaluation.play import evaluate

    agent = _misfits(np.asarray(digits.defender_nvec))[case]
    with pytest.raises(ValueError, match=r"action\[\d\] = \d|entries; the space has"):
        gym.make("LeakGym-Digits-v0", role="attacker", opponent=agent, **CHEAP)
    with pytest.raises(ValueError, match=r"action\[\d\] = \d|entries; the space has"):
        gym.make_vec("LeakGym-Digits-v0", num_envs=2, role="attacker", opponent=agent, **CHEAP)
    with pytest.raises(ValueError, match=r"action\[\d\] = \d|entries; the space has"):
        evaluate("LeakGym-Digits-v0", ["random"], [agent], episodes=1, overrides=CHEAP, progress=False,
                 out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_uniform_random_agent_covers_the_space():
    space = spaces.MultiDiscrete([3, 2])
    rng = np.random.default_rng(1)
    seen = {tuple(UniformRandomAgent().act(None, space, rng)) for _ in range(200)}
    assert seen == {(a, b) for a in range(3) for b in range(2)}


# ---------------------------------------------------------------------------------------- bandit
def test_bandit_converges_to_the_best_arm_of_a_synthetic_bandit():
    """Gaussian arms with means 0.2 / 0.5 / 0.45 / 0.1 and noise sd 0.3, eps = 0.1, 2000 pulls.

    Measured (seeds 0/1): best arm 1 found, pulled 1829/2000 times (91%); bar: best arm, >= 80%.
    """
    means = np.array([0.2, 0.5, 0.45, 0.1])
    space = spaces.MultiDiscrete([len(means)])
    bandit = EpsilonGreedyBandit([[i] for i in range(len(means))], epsilon=0.1)
    rng, noise = np.random.default_rng(0), np.random.default_rng(1)
    pulls = np.zeros(len(means), int)
    for _ in range(2000):
        arm = int(bandit.act(None, space, rng)[0])
        pulls[arm] += 1
        bandit.observe(means[arm] + 0.3 * noise.standard_normal(), {})
    assert bandit.best_arm == 1
    assert pulls[1] >= 0.8 * pulls.sum(), pulls
    assert np.allclose(bandit.means, means, atol=0.15)
    bandit.reset(seed=3)  # statistics persist across episodes ...
    assert bandit.best_arm == 1
    bandit.forget()  # ... until forgotten
    assert bandit.counts.sum() == 0


def test_bandit_errors_and_default_arms(digits):
    with pytest.raises(ValueError, match=r"epsilon=1.5; allowed range \[0, 1\]"):
        EpsilonGreedyBandit([[0]], epsilon=1.5)
    with pytest.raises(ValueError, match="needs arms, or a scenario and a role"):
        EpsilonGreedyBandit()
    with pytest.raises(RuntimeError, match="before act"):
        EpsilonGreedyBandit([[0]]).observe(1.0, {})
    arms = default_arms(digits, "attacker", num_random_arms=3, seed=0)
    presets = [preset_action(n, digits, "attacker") for n in valid_presets(digits, "attacker")]
    assert [a.tolist() for a in arms[: len(presets)]] == [p.tolist() for p in presets]
    assert len(arms) == len(presets) + 3 and len({tuple(a) for a in arms}) == len(arms)
    assert [a.tolist() for a in default_arms(digits, "attacker", num_random_arms=3, seed=0)] == [
        a.tolist() for a in arms
    ]


# ---------------------------------------------------------------------------------------- make_agent
def test_make_agent_names(digits):
    assert isinstance(make_agent("random", role="attacker", scenario=digits), UniformRandomAgent)
    assert isinstance(make_agent("round-robin", role="defender", scenario="digits"), RoundRobinAgent)
    bandit = make_agent("bandit", role="defender", scenario=digits)
    assert isinstance(bandit, EpsilonGreedyBandit) and len(bandit.arms) > len(valid_presets(digits, "defender"))
    fixed = make_agent("fixed:1,0,1,2", role="attacker", scenario=digits)
    assert fixed.action.tolist() == [1, 0, 1, 2]
    preset = make_agent("dcs2-paper", role="defender", scenario=digits)
    assert preset.name == "dcs2-paper" and preset.action.tolist() == preset_action("dcs2-paper", digits).tolist()
    same = FixedAgent([0, 0, 0, 0])
    assert make_agent(same, role="attacker", scenario=digits) is same


def test_make_agent_errors(digits):
    with pytest.raises(ValueError, match=r"unknown agent 'randm' \(did you mean 'random'\?\); allowed: \['random', 'round-robin', 'bandit'"):
        make_agent("randm", role="attacker", scenario=digits)
    with pytest.raises(ValueError, match=r"needs 4 entries.*nvec = \[4, 3, 2, 3\]"):
        make_agent("fixed:1,0", role="attacker", scenario=digits)
    with pytest.raises(ValueError, match=r"nvec = \[4, 3, 2, 3\]"):
        make_agent("fixed:4,0,0,0", role="attacker", scenario=digits)
    with pytest.raises(ValueError, match="fixed:<comma-separated integers>"):
        make_agent("fixed:a,b", role="attacker", scenario=digits)
    with pytest.raises(ValueError, match="role='server'"):
        make_agent("random", role="server", scenario=digits)
    with pytest.raises(ValueError, match="does not exist"):
        make_agent("missing/policy.zip", role="attacker", scenario=digits)


def test_cli_helpers():
    assert split_agent_list("random, fixed:1,0,2,0,dlg-paper") == ["random", "fixed:1,0,2,0", "dlg-paper"]
    assert parse_overrides(["rounds=2", "iterations=[1, 2]", "strategies=[dlg,prior-init]"]) == {
        "rounds": 2, "iterations": [1, 2], "strategies": ["dlg", "prior-init"]
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["rounds"])



def test_cli_overrides_read_exponent_numbers_as_numbers_everywhere(capsys):
    """Found in an audit: PyYAML (YAML 1.1) read ``1e-4`` as a string, which a scalar field converted but a
    menu level or a defaults table did not: ``--overrides 'tv=[0,1e-4]'`` was refused while
    ``gym.make(..., tv=[0, 1e-4])`` and TOML take it."""
    from leakgym.cli import main
    from leakgym.game.scenario import load_scenario

    parsed = parse_overrides(["tv=[0,1e-4]", "defender_menu={noise_sigma: [0, 1e-3]}", "attack_defaults={lr: 1e-2}",
                              "local_lr=-2E+3", "name=1e", "label='1e-4'", "server_lr=.5e1", "tag=1.2.3", "odd=._e3"])
    assert parsed == {"tv": [0, 1e-4], "defender_menu": {"noise_sigma": [0, 1e-3]}, "attack_defaults": {"lr": 1e-2},
                      "local_lr": -2000.0, "name": "1e", "label": "1e-4", "server_lr": 5.0,
                      "tag": "1.2.3", "odd": "._e3"}  # (1e, '1e-4', 1.2.3, ._e3 are not numbers: strings)
    assert load_scenario("digits", tv=parsed["tv"]).attacker_menu["tv"] == [0, 1e-4]
    for override in ("tv=[0,1e-4]", "defender_menu={noise_sigma: [0, 1e-3]}", "attack_defaults={lr: 1e-2}"):
        assert main(["describe", "LeakGym-Digits-v0", "--overrides", override]) == 0, capsys.readouterr().err
    capsys.readouterr()

def test_the_docs_agents_table_lists_every_preset():
    """The agents table (README's, now docs/agents.md) had fallen behind the registry (loda-calibrated was
    missing)."""
    from pathlib import Path

    from leakgym.agents.policies.presets import preset_names

    readme = (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text()
    for role in ("defender", "attacker"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| presets ({role}) |"))
        assert sorted(row.split("|")[2].replace("`", "").replace(" ", "").split(",")) == sorted(preset_names(role))

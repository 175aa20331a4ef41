"""Scenarios: TOML catalogue, action menus, encoding, and clear errors for bad input."""

import numpy as np
import pytest
from leakgym.envs.scenario import Scenario, check_action, load_scenario, scenario_gym_id, scenario_names


def test_every_named_scenario_loads_and_has_an_id():
    names = scenario_names()
    assert {"digits", "digits-malicious", "mnist", "fashion-mnist", "cifar10", "cifar100"} <= set(names)
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name
        assert scenario_gym_id(name).startswith("LeakGym-")
        assert len(sc.defender_nvec) == len(sc.defender_dims)


def test_overrides_apply_and_unknown_ones_are_named():
    sc = load_scenario("digits", rounds=3, batch_size=4)
    assert (sc.rounds, sc.batch_size) == (3, 4)
    with pytest.raises(ValueError, match="unknown scenario option.*'roundz'"):
        load_scenario("digits", roundz=3)
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        load_scenario("nope")
    with pytest.raises(ValueError, match="batch_size=0"):
        load_scenario("digits", batch_size=0)


def test_decode_encode_round_trip():
    sc = load_scenario("digits")
    action = np.array([2, 1, 1, 1, 1, 0])
    settings = sc.decode_defender(action)
    assert settings["noise_sigma"] == 0.1 and settings["prune"] == 0.5
    assert settings["oasis"] == ["major_rotation"]
    np.testing.assert_array_equal(sc.encode_defender(settings), action)
    a = sc.encode_attacker({"strategy": "dlg", "iterations": 60, "restarts": 2, "tv": 1e-2})
    assert sc.decode_attacker(a) == {"strategy": "dlg", "iterations": 60, "restarts": 2, "tv": 1e-2}


def test_encode_picks_nearest_menu_value_and_rejects_unknown_keys():
    sc = load_scenario("digits")
    assert sc.decode_defender(sc.encode_defender({"noise_sigma": 0.08}))["noise_sigma"] == 0.1
    with pytest.raises(ValueError, match="not in its menu"):
        sc.encode_defender({"loda_c": 1.0})
    with pytest.raises(ValueError, match="strategy 'imprint' not in its menu"):
        sc.encode_attacker({"strategy": "imprint"})


def test_invalid_actions_name_the_value_and_range():
    sc = Scenario()
    with pytest.raises(ValueError, match=r"attacker action\[1\] \(iterations\) = 7; allowed range 0..2"):
        sc.decode_attacker(np.array([0, 7, 0, 0]))
    with pytest.raises(ValueError, match="shape"):
        check_action([0, 0], sc.attacker_nvec, "attacker", sc.attacker_dims)
    with pytest.raises(ValueError, match=r"defender action\[0\] \(noise_sigma\) = -1"):
        sc.decode_defender(np.array([-1, 0, 0, 0, 0, 0]))

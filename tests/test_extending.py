"""Adding a defense through the registry alone reaches every part of LeakGym (docs/extending.md)."""

import numpy as np
import pytest
from toy_defense import ToyScale

from leakgym.cli import main
from leakgym.defenses import DefenseConfig, registered
from leakgym.envs import parallel_env


def test_a_toy_defense_is_listed_offered_in_a_menu_played_and_charged(cheap_overrides, capsys):
    with registered(ToyScale()):
        assert main(["list"]) == 0
        assert "toy_scale" in capsys.readouterr().out
        assert DefenseConfig(toy_scale=-1.0).active() == ["toy_scale"]

        env = parallel_env("digits", **dict(cheap_overrides, defender_menu={"toy_scale": [1.0, -1.0]}),
                           oasis_bits=[])
        assert env.scenario.defender_dims == ["toy_scale"]
        env.reset(seed=0)
        _, _, _, _, infos = env.step({"attacker": np.zeros(4, np.int64), "defender": np.array([1])})
        assert env.round_details("defender")["defenses"] == ["toy_scale"]
        assert env.round_details("defender")["defense_settings"] == {"toy_scale": -1.0, "oasis": []}
        assert infos["defender"]["defense_units"] == 0.25  # the toy's own cost model
        assert infos["defender"]["fidelity"] == pytest.approx(-1.0)  # the shared update is the clean one negated
    # unregistered again: the menu no longer validates
    with pytest.raises(ValueError, match="toy_scale"):
        parallel_env("digits", **dict(cheap_overrides, defender_menu={"toy_scale": [1.0, -1.0]}))


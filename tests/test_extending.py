"""Adding a defense through the registry alone reaches every part of LeakGym (docs/extending.md)."""

import re
from pathlib import Path

import numpy as np
import pytest
from toy_defense import ToyMask, ToyScale

from leakgym.cli import main
from leakgym.defenses import DEFENSES, DefenseConfig, defense_fields, registered
from leakgym.envs import parallel_env
from leakgym.game.scenario import LIMITS, load_scenario

GAME = Path(__file__).resolve().parents[1] / "leakgym" / "game"


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
    # and the env built while it was registered refuses the action it already played, as it refuses a new
    # one (found in an audit: its cached plan reported toy_scale -1.0 and played without it), unchanged
    state = env.state().copy()
    for action in ([1], [0]):
        with pytest.raises(ValueError, match=r"unknown DefenseConfig field\(s\) \['toy_scale'\]"):
            env.step({"attacker": np.zeros(4, np.int64), "defender": np.array(action)})
        assert np.array_equal(env.state(), state)



def test_a_toy_defense_brings_its_limits_and_bit_menu_to_scenarios(cheap_overrides, tmp_path):
    """A defense registered from a test module: a scenario offers its bit mask bit by bit (through the option
    its field declares), holds its levels to the limits its fields declare, and neither envs/ nor leakgym/game/ is touched."""
    with registered(ToyMask()):
        assert LIMITS["toy_repeats"] == 8 and "toy_group" not in LIMITS
        sc = load_scenario("digits", **cheap_overrides, defender_menu={"toy_repeats": [1, 4]},
                           toy_mask_bits=["second"], oasis_bits=[])
        assert sc.toy_mask_bits == ["second"] and sc.defender_bits["toy_mask"] == ["second"]
        assert sc.defender_dims == ["toy_repeats", "toy_mask_second"]
        menu = sc.defender_menu_dims
        assert menu.config_fields([1, 1]) == {"toy_repeats": 4, "toy_mask": 2}
        assert sc.decode_defender(np.array([1, 1])) == {"toy_repeats": 4, "oasis": [], "toy_mask": ["second"]}
        assert sc.encode_defender({"toy_mask": ["second"]}).tolist() == [0, 1]
        # a scenario file names the option like any key; the default offers no bit
        path = tmp_path / "toy.toml"
        path.write_text('name = "toy"\ntoy_mask_bits = ["first", "second"]\noasis_bits = []\n')
        assert load_scenario(path).defender_dims[-2:] == ["toy_mask_first", "toy_mask_second"]
        assert load_scenario("digits").toy_mask_bits == []
        # the limits: the documented one (lifted by allow_large), the scenario option's, the bits' names
        with pytest.raises(ValueError, match=r"toy_repeats=9 exceeds the limit 8.*allow_large"):
            sc.replace(defender_menu={"toy_repeats": [1, 9]})
        assert load_scenario(sc, allow_large=True).replace(defense_defaults={"toy_repeats": 9}).allow_large
        with pytest.raises(ValueError, match=r"defender_menu toy_group=\[3\] groups up to k images of the private "
                                             r"batch; needs k <= batch_size \(batch_size=2\)"):
            sc.replace(batch_size=2, defense_defaults={"toy_group": 3})
        with pytest.raises(ValueError, match=r"toy_mask_bits \['third'\] unknown; allowed: \['first', 'second'\]"):
            sc.replace(toy_mask_bits=["third"])
        with pytest.raises(ValueError, match=r"toy_mask_bits='first'; allowed: a list of toy quarter names"):
            sc.replace(toy_mask_bits="first")
        # played: the bits the defender switches on reach the defense
        env = parallel_env(sc)
        env.reset(seed=0)
        env.step({"attacker": np.zeros(4, np.int64), "defender": np.array([1, 1])})
        assert env.round_details("defender")["defenses"] == ["toy_mask"]
        assert env.round_details("defender")["defense_settings"] == {"toy_repeats": 4, "oasis": [], "toy_mask": ["second"]}
    # unregistered again: the option and the limit are gone with it
    assert "toy_repeats" not in LIMITS
    with pytest.raises(ValueError, match=r"unknown scenario option\(s\) \['toy_mask_bits'\]"):
        load_scenario("digits", toy_mask_bits=["first"])


def test_scenarios_and_menus_name_no_defense():
    """What a scenario knows of a defense comes from the registry: its menus and limits name none."""
    names = set(DEFENSES) | set(defense_fields())
    for spec in defense_fields().values():  # a bit menu's scenario option and bit names
        names |= {spec.bit_menu.option, *spec.bit_menu.bits} if spec.bit_menu else set()
    for module in ("scenario.py", "menus.py"):
        source = (GAME / module).read_text()
        named = sorted(n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", source))
        assert not named, f"leakgym/game/{module} names defense(s) or field(s) {named}: declare them in the registry"

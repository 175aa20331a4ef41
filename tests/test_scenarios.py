"""Scenarios: TOML catalogue, action menus, encoding, and clear errors for bad input."""

import numpy as np
import pytest

from leakgym.game.scenario import Scenario, check_action, load_scenario, scenario_gym_id, scenario_names


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



def test_the_name_field_can_be_overridden_like_any_other(capsys):
    """Found in an audit: ``name`` is a scenario field, but load_scenario's first parameter had that name, so
    ``gym.make(id, name="mine")`` and ``--overrides name=mine`` were a TypeError traceback."""
    import gymnasium as gym

    from leakgym.cli import main
    from leakgym.envs import parallel_env

    assert load_scenario("digits", name="mine").name == "mine"
    assert load_scenario().name == "digits" and load_scenario(None, rounds=2).name == "digits"
    with pytest.raises(ValueError, match=r"load_scenario\(name='cifar10'\) names no scenario to load"):
        load_scenario(name="cifar10")  # (review: it gave digits renamed 'cifar10' without a word)
    with pytest.raises(ValueError, match="name=''; allowed: a non-empty string"):
        load_scenario("digits", name="")
    assert parallel_env("digits", name="mine").scenario.name == "mine"
    env = gym.make("LeakGym-Digits-v0", name="mine", opponent="random")
    assert env.unwrapped.scenario.name == "mine"
    env.close()
    assert main(["describe", "LeakGym-Digits-v0", "--overrides", "name=mine"]) == 0
    capsys.readouterr()


def test_a_strategy_that_is_not_a_name_is_refused_by_name():
    with pytest.raises(ValueError, match=r"attacker_menu strategy=\[\['dlg'\]\]; allowed: a list of attack names"):
        load_scenario("digits", attacker_menu={"strategy": [["dlg"]]})


def test_a_bad_attack_default_is_named_as_a_default():
    """A bad attack_defaults value was blamed on the first menu level built with it ("attacker_menu
    iterations=[20, 60, 150] ...: lr=-1")."""
    with pytest.raises(ValueError, match=r"attack_defaults \{'lr': -1\} for 'inverting-gradients': lr=-1"):
        load_scenario("digits", attack_defaults={"lr": -1})

@pytest.mark.parametrize(("overrides", "hint"), [
    ({"model": "lenett"}, "(did you mean 'lenet'?)"),
    ({"update_kind": "model-delta"}, "(did you mean 'model_delta'?)"),
    ({"strategies": ["dgl"]}, "(did you mean 'dlg'?)"),
    ({"attack_defaults": {"iteratons": 5}}, "(did you mean 'iterations'?)"),
    ({"attacker_menu": {"strategy": ["dlg"], "iteratons": [5]}}, "(did you mean 'iterations'?)"),
])
def test_a_misspelt_name_gets_the_closest_one(overrides, hint):
    """docs/cli.md promises the closest allowed name for every name; models, strategies and attack fields
    had none (found in an audit)."""
    with pytest.raises(ValueError) as exc:
        load_scenario("digits", **overrides)
    assert hint in str(exc.value), str(exc.value)

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


# -- complete validation at construction (issue "Trust boundaries", item 3) ---------------------------
@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"strategies": ["nope"]}, r"attacker_menu strategy \['nope'\] unknown"),
        ({"defender_menu": {"noise_sigma": [0.0, -1.0]}}, r"defender_menu noise_sigma=.*allowed range"),
        ({"defender_menu": {"prune": [0.0, 1.5]}}, r"defender_menu prune=.*prune=1.5"),
        ({"defense_defaults": {"dcs2_steps": 0}}, r"defense_defaults=.*dcs2_steps"),
        ({"oasis_bits": ["spin"]}, r"oasis_bits \['spin'\] unknown"),
        ({"model": "transformer"}, r"model='transformer'; allowed: lenet"),
        ({"public_fraction": 1.5}, r"public_fraction=1.5; allowed: finite numbers in \(0, 1\)"),
        ({"dirichlet_alpha": -1.0}, r"dirichlet_alpha=-1.0"),
        ({"server_lr": float("nan")}, r"server_lr=nan"),
        ({"local_lr": float("inf")}, r"local_lr=inf"),
        ({"num_clients": "1x"}, r"num_clients='1x'; allowed: integers >= 0"),
        ({"num_clients": True}, r"num_clients=True"),
        ({"rewards": [1]}, r"rewards=\[1\]; allowed: a table"),
        ({"rewards": {"fidelity": float("nan")}}, r"rewards.fidelity=nan"),
        ({"rewards": {"bonus": 1.0}}, r"unknown reward weight\(s\) \['bonus'\]"),
        ({"iterations": [10**9]}, r"iterations=1000000000 exceeds the limit 30000.*allow_large=True"),
        ({"restarts": [10**6]}, r"restarts=1000000 exceeds the limit 64"),
        ({"local_steps": 10**9, "update_kind": "model_delta"}, r"local_steps=1000000000 exceeds the limit 100"),
        ({"num_clients": 10**4}, r"num_clients=10000 exceeds the limit 64"),
        ({"image_size": 10**5}, r"image_size=100000 exceeds the limit 256"),
        ({"local_steps": 3}, r"local_steps=3 needs update_kind='model_delta'"),
        ({"defender_menu": {"mixup_k": [0, 4]}}, r"mixup_k=\[4\].*needs k <= batch_size"),
        # two dimensions whose values are fine alone and refused together (a defender action plays both)
        ({"batch_size": 2, "defender_menu": {"dcs2_lambda_g": [0.0, 0.5], "mixup_k": [0, 2]}},
         r"dcs2_lambda_g=0.5 together with mixup_k=2: .*use one of them"),
        ({"batch_size": 2, "defender_menu": {"mixup_k": [0, 2], "instahide_k": [0, 2]}},
         r"mixup_k=2 together with instahide_k=2: .*at most one"),
        ({"tv": [1e-4], "strategies": ["dlg"]}, r"attacker_menu 'tv' is a field of none of the strategies"),
        ({"attacker_menu": {"iterations": [1]}}, r"needs a 'strategy' entry"),
        # found in review: accepted, then failing (or overflowing) in every round
        ({"attacker_menu": {"strategy": ["dlg"]}, "attack_defaults": {"lr": -1.0}},
         r"attack_defaults \{'lr': -1.0\} for 'dlg': lr=-1.0"),
        ({"attacker_menu": {"strategy": ["inverting-gradients"], "tv": [0.0]},
          "attack_defaults": {"iterations": 10**6}}, r"iterations=1000000 exceeds the limit 30000"),
        ({"attacker_menu": {"strategy": ["inverting-gradients"], "tv": [0.0]},
          "attack_defaults": {"restarts": 10**5}}, r"restarts=100000 exceeds the limit 64"),
        ({"rewards": {"fidelity": 1e308}}, r"rewards.fidelity=1e\+308"),
        # the defenses' inner loops: accepted, then a round that never ends (or holds T + 1 model copies)
        ({"defense_defaults": {"censor_trials": 10**12}}, r"censor_trials=1000000000000 exceeds the limit 1000"),
        ({"defender_menu": {"censor_trials": [0, 5000]}}, r"censor_trials=5000 exceeds the limit 1000"),
        ({"defense_defaults": {"dcs2_steps": 10**9}}, r"dcs2_steps=1000000000 exceeds the limit 30000"),
        ({"defense_defaults": {"dcs2_num_concealed": 10**4}}, r"dcs2_num_concealed=10000 exceeds the limit 64"),
        ({"defense_defaults": {"loda_steps": 10**9}}, r"loda_steps=1000000000 exceeds the limit 30000"),
        ({"strategies": ["imprint"]}, r"strategy \['imprint'\] modify the model .* threat_model='honest'"),
        ({"public_fraction": 1e-6}, r"public_fraction=1e-06 leaves no public image of the 1438 training images"),
        ({"public_fraction": 0.9999, "num_clients": 1}, r"num_clients=1 benign clients and the victim need 2 private"),
        # found in an audit: accepted, then every round failed (a RoundError, so an episode could not go on)
        ({"defender_menu": {"ppp": ["off", "ng"]}}, r"ppp='ng' perturbs the layers .* needs precode=True"),
        ({"public_fraction": 0.003, "defender_menu": {"instahide_k": [0, 8]}},
         r"instahide_k=8 mixes 7 public images into each example \(k=8, batch_size=1\); the public split holds 4"),
        ({"defender_menu": {"instahide_k": [0, 200]}}, r"instahide_k=200 mixes 199 public images .* holds 143"),
        ({"update_kind": "model_delta", "local_lr_schedule": "exponential", "local_lr_decay": 0.01, "rounds": 40},
         r"local learning rate of the last round, 40 \(1e-79.*is 0 in float32"),
        ({"update_kind": "model_delta", "local_lr_schedule": "exponential", "local_lr_decay": 0.5, "rounds": 160},
         r"last round, 160 \(1.37e-49.*is 0 in float32"),
        ({"update_kind": "model_delta", "local_lr": 1e-46}, r"last round, \d+ \(1e-46.*is 0 in float32"),
        ({"update_kind": "model_delta", "local_weight_decay": 1e39}, r"local_weight_decay=1e\+39 with .*at most 3.40282e\+38"),
        ({"update_kind": "model_delta", "local_lr": 1e39},
         r"local_lr=1e\+39 with update_kind='model_delta'; allowed: at most 3.40282e\+38 \(float32\)"),
        # (audit) Adam's first step is lr / (1 - 0.9): accepted up to 3.4e38, then every round failed
        ({"update_kind": "model_delta", "local_optimizer": "adam", "local_lr": 3.5e37},
         r"local_lr=3.5e\+37 .*at most 3.40282e\+37 \(float32 with local_optimizer='adam', whose first step"),
        # (review) a requirement is checked after the value's own type: the field's error, not a TypeError
        ({"defender_menu": {"instahide_k": [0, "4"]}}, r"instahide_k.*allowed: integers >= 0"),
        ({"defender_menu": {"ppp": ["off", "bogus"]}}, r"ppp.*allowed: 'off', 'ng', 'gc'"),
    ],
)
def test_bad_configurations_are_refused_when_built(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_scenario("digits", **overrides)


def test_the_largest_adam_rate_accepted_plays_a_round():
    """The bound is where PyTorch's Adam step stops overflowing float32: the largest rate accepted plays."""
    from leakgym.envs import parallel_env
    from leakgym.game.scenario import FLOAT32_MAX

    largest = FLOAT32_MAX * 0.1 * (1 - 2e-6)
    env = parallel_env("digits", update_kind="model_delta", local_optimizer="adam", local_lr=largest, rounds=2,
                       iterations=[1], eval_size=16, num_clients=1)
    env.reset(seed=0)
    _, rewards, *_ = env.step({a: 0 for a in env.agents} if env.flat_actions else
                              {a: np.zeros(len(env.action_space(a).nvec), dtype=np.int64) for a in env.agents})
    assert all(np.isfinite(r) for r in rewards.values())

def test_fedsgd_takes_no_local_rate_so_none_is_refused():
    """(review) FedSGD shares a gradient: the float32 checks of FedAvg's local rate do not apply to it."""
    assert load_scenario("digits", local_lr=1e-46).local_lr == 1e-46
    assert load_scenario("digits", local_lr=1e39).local_lr == 1e39


def test_a_default_of_a_menu_field_is_never_played_so_never_refused():
    """Every action sets every menu field: a default Mixup k that the menu overrides with 0 does not make
    the menu's DCS² values 'refused together with Mixup' (helper review)."""
    sc = load_scenario("digits", batch_size=4, defense_defaults={"mixup_k": 2},
                       defender_menu={"dcs2_lambda_g": [0.0, 0.5], "mixup_k": [0]})
    assert sc.defender_menu["mixup_k"] == [0]


def test_strings_are_coerced_like_the_cli_and_limits_can_be_lifted():
    sc = load_scenario("digits", rounds="3", server_lr="0.5", known_labels="true", allow_large="1")
    assert (sc.rounds, sc.server_lr, sc.known_labels) == (3, 0.5, True)
    assert load_scenario("digits", iterations=[40_000], allow_large=True).iterations == [40_000]
    assert load_scenario("digits", defense_defaults={"censor_trials": 2000}, allow_large=True).defense_defaults[
        "censor_trials"] == 2000


def test_numpy_levels_tuples_and_arrays_are_checked_as_python_values():
    """np.int64(10**6) iterations passed the limit check (it looked at int and float only) and a menu
    given as a tuple was called empty; menus and defaults are now the Python lists and scalars TOML
    gives, and a level that is not a list says what it needs."""
    with pytest.raises(ValueError, match="iterations=1000000 exceeds the limit 30000"):
        load_scenario("digits", iterations=[np.int64(1_000_000)])
    with pytest.raises(ValueError, match="censor_trials=5000 exceeds the limit"):
        load_scenario("digits", defense_defaults={"censor_trials": np.int32(5000)})
    sc = load_scenario("digits", iterations=(2, 3), defender_menu={"noise_sigma": np.array([0.0, 0.1])},
                       attack_defaults={"lr": np.float32(0.25)})
    assert sc.attacker_menu["iterations"] == [2, 3] and sc.defender_menu["noise_sigma"] == [0.0, 0.1]
    assert type(sc.defender_menu["noise_sigma"][1]) is float and type(sc.attack_defaults["lr"]) is float
    for bad in (5, "abc", []):
        with pytest.raises(ValueError, match=r"attacker menu 'iterations' = .*; needs a non-empty list of levels"):
            load_scenario("digits", iterations=bad)


def test_a_model_that_cannot_take_the_images_is_refused_when_the_scenario_is_built():
    """ConvNet needs 9x9 images: with image_size=8 the scenario was built and the first reset failed."""
    with pytest.raises(ValueError, match=r"model='convnet' with image_size=8: ConvNet needs images of at least 9x9"):
        load_scenario("digits", model="convnet", image_size=8)
    assert load_scenario("digits", model="convnet", image_size=9).model == "convnet"


def test_scenario_files_only_from_the_package_or_an_explicit_path(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario '../digits'"):
        load_scenario("../digits")
    bad = tmp_path / "mine.toml"
    bad.write_text('name = "mine"\nbatch_size = 2\nrewards = [1]\n')
    with pytest.raises(ValueError, match=r"scenario file '.*mine.toml': .*rewards=\[1\]"):
        load_scenario(str(bad))
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(ValueError, match=r"scenario file '.*broken.toml': not valid TOML"):
        load_scenario(broken)
    good = tmp_path / "good.toml"
    good.write_text('name = "good"\nbatch_size = 2\n[attacker_menu]\nstrategy = ["dlg"]\niterations = [5]\n')
    sc = load_scenario(good, rounds=2)
    assert (sc.name, sc.batch_size, sc.rounds, sc.attacker_dims) == ("good", 2, 2, ["strategy", "iterations"])


@pytest.mark.parametrize("values", [[float("nan")], [2.5], [True], [0]])
def test_attack_budgets_must_be_integers_when_the_scenario_is_built(values):
    """A NaN budget passed ``iterations < 1`` and failed mid-rollout; 2.5 and True were played as numbers."""
    with pytest.raises(ValueError, match=r"iterations=.*must be an integer >= 1"):
        load_scenario("digits", iterations=values)
    with pytest.raises(ValueError, match=r"restarts=.*must be an integer >= 1"):
        load_scenario("digits", restarts=values)


def test_scenario_inputs_found_in_the_user_file_audit(tmp_path):
    """Found in an audit of the scenario files users hand in: an OASIS bit named twice built and was refused by
    the env as a dimension named twice; a shorthand and the attacker_menu table setting one key kept one of the
    two silently; a file that is not UTF-8 was the decoder's message without the file."""
    with pytest.raises(ValueError, match=r"oasis_bits=\['hflip', 'hflip'\] names \['hflip'\] twice"):
        load_scenario("digits", oasis_bits=["hflip", "hflip"])
    with pytest.raises(ValueError, match=r"iterations=\[5\] and attacker_menu iterations=\[1\] both set"):
        load_scenario("digits", iterations=[5], attacker_menu={"strategy": ["inverting-gradients"], "iterations": [1]})
    both = tmp_path / "both.toml"
    both.write_text('name = "both"\ndataset = "digits"\nstrategies = ["dlg"]\n[attacker_menu]\n'
                    'strategy = ["inverting-gradients"]\n')
    with pytest.raises(ValueError, match=r"strategies=\['dlg'\] and attacker_menu strategy=\['inverting-gradients'\]"):
        load_scenario(str(both))
    assert load_scenario("digits", iterations=[5]).attacker_menu["iterations"] == [5]  # one way alone: as before
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe rounds = 2")
    with pytest.raises(ValueError, match=rf"scenario file '{bad}': not UTF-8 text \(byte 0xff at offset 0\)"):
        load_scenario(str(bad))

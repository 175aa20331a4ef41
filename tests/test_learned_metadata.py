"""Malformed numbers in a saved policy's ``policy.json``: each is one ``ValueError`` naming the file and the
field (``leakgym: error: ...``, exit 2), like every other malformed field, not an OverflowError traceback or
a parser's or gymnasium's message that names neither."""

from __future__ import annotations

import json
import re
import shutil

import gymnasium as gym
import pytest

from leakgym.agents.policies import learned
from leakgym.cli import main

TINY = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An untrained PPO attacker saved with LeakGym's metadata."""
    from stable_baselines3 import PPO

    env = gym.make("LeakGym-Digits-v0", role="attacker", **TINY)
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=8, seed=0, device="cpu", policy_kwargs={"net_arch": [8]})
    path = tmp_path_factory.mktemp("policy") / "policy.zip"
    meta = learned.save_policy(model, path, {"algo": "ppo", "role": "attacker", "seed": 0,
                                             "hyperparams": {"n_steps": 8}})
    env.close()
    return path, meta


def _bad_copy(saved, folder, text: str):
    """The saved policy copied into ``folder`` with ``text`` as its JSON file."""
    path = folder / "bad.zip"
    shutil.copyfile(saved[0], path)
    learned.metadata_path(path).write_text(text)
    return path


def _with(meta: dict, **changes) -> dict:
    out = json.loads(json.dumps(meta))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = out
        for key in parents:
            target = target[key]
        target[last] = value
    return out


def test_huge_out_of_range_and_crossed_observation_bounds_name_the_file_and_field(saved, tmp_path):
    """Found in an audit: a bound of 10**400 ended in an OverflowError traceback (math.isfinite of a huge
    int), one past float32's range became an infinite bound, and low > high was gymnasium's Box message,
    which does not name the file."""
    meta = saved[1]
    size = meta["observation_space"]["shape"][0]
    where = str(tmp_path / "bad.json")
    for key, bound in (("low", [10**400] * size), ("high", [1e39] * size), ("low", [-(10**39)] * size)):
        path = _bad_copy(saved, tmp_path, json.dumps(_with(meta, **{f"observation_space__{key}": bound})))
        with pytest.raises(ValueError) as info:
            learned.load_policy(path)
        assert str(info.value).startswith(f"{where}: 'observation_space.{key}' must be a list of {size} finite "
                                          "numbers of float32's range (at most 3.403e+38 in size); got [")
    low, high = list(meta["observation_space"]["low"]), list(meta["observation_space"]["high"])
    low[3], high[3] = 2.0, 1.0
    path = _bad_copy(saved, tmp_path, json.dumps(_with(meta, observation_space__low=low, observation_space__high=high)))
    message = (f"{where}: 'observation_space.low' must be at most 'observation_space.high' at every index; "
               "got 'low[3]=2.0 > high[3]=1.0'")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        learned.load_policy(path)


def test_an_integer_of_more_digits_than_python_converts_names_the_file_and_field(saved, tmp_path):
    """Found in an audit: a "seed" of 5,000 digits was json.loads' ValueError about the 4,300-digit limit,
    which names neither the file nor the field (and was not caught as a malformed file)."""
    text = json.dumps(saved[1])
    where = str(tmp_path / "bad.json")
    for field, old, new in (("seed", '"seed": 0', '"seed": ' + "7" * 5000),
                            ("hyperparams.n_steps", '"n_steps": 8', '"n_steps": -' + "1" * 4301)):
        assert old in text
        path = _bad_copy(saved, tmp_path, text.replace(old, new))
        with pytest.raises(ValueError) as info:
            learned.read_metadata(path)
        digits = len(new.rpartition(" ")[2].lstrip("-"))
        assert str(info.value) == f"{where}: '{field}' must be an integer of at most 4300 digits; got one of {digits} digits"
    path = _bad_copy(saved, tmp_path, text.replace('"seed": 0', '"seed": ' + "7" * 4300))
    assert learned.read_metadata(path)["seed"] == int("7" * 4300)  # Python's own limit, not a smaller one


def test_eval_names_the_malformed_policy_file_in_one_line(saved, tmp_path, capsys):
    size = saved[1]["observation_space"]["shape"][0]
    path = _bad_copy(saved, tmp_path, json.dumps(_with(saved[1], observation_space__low=[10**400] * size)))
    code = main(["eval", "--attackers", str(path), "--defenders", "none", "--episodes", "1", "--no-progress",
                 "--out", str(tmp_path / "out"), "--overrides", *(f"{k}={v}" for k, v in TINY.items())])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"leakgym: error: {tmp_path / 'bad.json'}: 'observation_space.low' must be a list of")

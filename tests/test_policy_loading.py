"""Loading a saved policy never un-pickles anything from the file (issue "Trust boundaries", item 1).

The policy is rebuilt from LeakGym's JSON file and the zip's ``policy.pth`` read with
``torch.load(weights_only=True)``; a zip whose entries would run a command (here: create a marker
file) is either refused or has those entries ignored, and the command never runs."""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import os
import pickle
import shlex
import warnings
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch

from leakgym.agents import LearnedAgent, make_agent
from leakgym.agents.policies import learned
from leakgym.game.scenario import load_scenario

TINY = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}


class _RunsCommand:
    """Un-pickling this runs ``command`` with os.system."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.fixture
def marker(tmp_path):
    """A file the hostile payloads create; the fixture checks that the payload really does."""
    path = tmp_path / "pwned"
    payload = pickle.dumps(_RunsCommand(f"touch {shlex.quote(str(path))}"))
    pickle.loads(payload)  # armed: plain un-pickling runs the command
    assert path.exists()
    path.unlink()
    return path


def _hostile(marker) -> _RunsCommand:
    return _RunsCommand(f"touch {shlex.quote(str(marker))}")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An untrained PPO attacker (ReLU, separate pi/vf layers) saved with LeakGym's metadata."""
    from stable_baselines3 import PPO

    env = gym.make("LeakGym-Digits-v0", role="attacker", **TINY)
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=8, seed=3, device="cpu",
                policy_kwargs={"net_arch": {"pi": [16], "vf": [8, 8]}, "activation_fn": torch.nn.ReLU})
    path = tmp_path_factory.mktemp("policy") / "policy.zip"
    meta = learned.save_policy(model, path, {"algo": "ppo", "role": "attacker", "env_id": "LeakGym-Digits-v0"})
    env.close()
    return path, model, meta


def _copy_policy(saved, folder, *, replace: dict[str, bytes] | None = None, meta: dict | None = None):
    """The saved policy copied into ``folder``, with zip entries and/or the JSON replaced."""
    path, _, original_meta = saved
    out = folder / "policy.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, (replace or {}).get(name, src.read(name)))
    if meta is not False:
        learned.metadata_path(out).write_text(json.dumps(original_meta if meta is None else meta))
    return out


def test_loaded_policy_acts_exactly_like_the_saved_model(saved):
    path, model, meta = saved
    assert meta["policy"] == {"class": "ActorCriticPolicy", "net_arch": {"pi": [16], "vf": [8, 8]},
                              "activation_fn": "ReLU", "share_features_extractor": True, "normalize_images": True}
    sc = load_scenario("digits", **TINY)
    agent = make_agent(str(path), role="attacker", scenario=sc)
    assert isinstance(agent, LearnedAgent) and agent.algo == "ppo"
    want = model.policy.state_dict()
    got = agent.policy.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    rng = np.random.default_rng(0)
    space = gym.spaces.MultiDiscrete(sc.attacker_nvec)
    for _ in range(20):
        obs = rng.random(model.observation_space.shape, dtype=np.float32)
        expected, _ = model.predict(obs, deterministic=True)
        np.testing.assert_array_equal(agent.act(obs, space, rng), expected)


def test_hostile_data_entry_is_never_unpickled(saved, tmp_path, marker):
    from stable_baselines3 import PPO

    path = saved[0]
    with zipfile.ZipFile(path) as zf:
        data = json.loads(zf.read("data"))
    evil = base64.b64encode(pickle.dumps(_hostile(marker))).decode()
    serialized = [k for k, v in data.items() if isinstance(v, dict) and ":serialized:" in v]
    assert {"policy_class", "observation_space", "action_space"} <= set(serialized)
    for key in serialized:
        data[key][":serialized:"] = evil
    hostile = _copy_policy(saved, tmp_path, replace={"data": json.dumps(data).encode()})

    # The zip is really hostile: Stable-Baselines3's own loader runs the command.
    with contextlib.suppress(Exception):
        PPO.load(hostile, device="cpu")
    assert marker.exists()
    marker.unlink()

    agent = LearnedAgent(hostile, role="attacker")  # LeakGym reads only policy.json and policy.pth
    assert not marker.exists()
    obs = np.zeros(agent.policy.observation_space.shape, np.float32)
    agent.act(obs, agent.policy.action_space, np.random.default_rng(0))
    env = gym.make("LeakGym-Digits-v0", role="defender", opponent=str(hostile), **TINY)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    assert not marker.exists()

    # Without LeakGym's JSON file the zip is refused, before any entry is read.
    learned.metadata_path(hostile).unlink()
    with pytest.raises(ValueError, match="has no policy.json beside it"):
        make_agent(str(hostile), role="attacker", scenario="digits")
    with pytest.raises(ValueError, match="has no policy.json beside it"):
        gym.make("LeakGym-Digits-v0", role="defender", opponent=str(hostile), **TINY)
    assert not marker.exists()


def test_hostile_weights_are_refused(saved, tmp_path, marker):
    buffer = io.BytesIO()
    torch.save({"mlp_extractor.policy_net.0.weight": _hostile(marker)}, buffer)
    hostile = _copy_policy(saved, tmp_path, replace={"policy.pth": buffer.getvalue()})
    with pytest.raises(ValueError, match="policy.pth is not a plain tensor state_dict; refused"):
        LearnedAgent(hostile)
    assert not marker.exists()

    # A damaged pickle: torch's weights-only reader raised KeyError (a memo entry it never stored)
    # and AssertionError (a persistent id that is not a tuple), a traceback from `leakgym eval`.
    for damaged in (b"\x80\x02h\x80.", b"\x80\x02K\x01Q."):
        broken = _copy_policy(saved, tmp_path, replace={"policy.pth": damaged})
        with pytest.raises(ValueError, match="policy.pth is not a plain tensor state_dict; refused"):
            LearnedAgent(broken)

    # A plain pickle (not torch's format) naming os.system is refused the same way, and in one line: torch's
    # legacy-format warning no longer comes before the refusal (found in an audit).
    for protocol in (2, 4):  # (torch warns about protocol 4)
        hostile = _copy_policy(saved, tmp_path, replace={"policy.pth": pickle.dumps(_hostile(marker), protocol=protocol)})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="refused"):
                LearnedAgent(hostile)
        assert not marker.exists() and [str(w.message) for w in caught] == []


def test_policy_metadata_and_spaces_are_checked(saved, tmp_path, monkeypatch):
    path, _, meta = saved
    with pytest.raises(ValueError, match="trained as the attacker; it cannot play the defender"):
        LearnedAgent(path, role="defender")
    other = load_scenario("digits", **{**TINY, "iterations": [1, 2, 5]})
    assert len(other.attacker_nvec) == len(load_scenario("digits", **TINY).attacker_nvec)
    with pytest.raises(ValueError, match=r"acts in MultiDiscrete\(\[.*\]\), but the attacker's action space"):
        LearnedAgent(path, role="attacker", scenario=other)
    agent = LearnedAgent(path)
    with pytest.raises(ValueError, match="expects observations of shape"):
        agent.act(np.zeros(3, np.float32), agent.policy.action_space, np.random.default_rng(0))
    # As an opponent, a policy trained on observations of another shape fails when the env is built.
    with pytest.raises(ValueError, match=r"expects observations of shape \(\d+,\), got \(3,\)"):
        agent.check_spaces(gym.spaces.Box(0, 1, (3,)), agent.policy.action_space)

    def broken(field: str, value) -> dict:
        changed = json.loads(json.dumps(meta))
        *parents, last = field.split(".")
        node = changed
        for key in parents:
            node = node[key]
        node[last] = value
        return changed

    cases = [
        ("format", None, "'format' must be 'leakgym-policy-v1'"),
        ("algo", "sac", "'algo' must be one of"),
        ("algo", "dqn", r"'policy.class' must be 'DQNPolicy' \(for algo 'dqn'\)"),
        ("role", "server", "'role' must be one of"),
        ("policy.activation_fn", "os.system", "'policy.activation_fn' must be one of"),
        ("policy.net_arch", [10**9], "'policy.net_arch' must be a list of up to 16 layer widths in 1..4096"),
        ("policy.net_arch", {"pi": [16], "vf": [8], "x": [1]}, "'policy.net_arch'"),
        ("policy.class", "builtins.eval", "'policy.class' must be 'ActorCriticPolicy'"),
        ("action_space.nvec", [0, 3], "'action_space.nvec' must be"),
        ("action_space", {"n": 0}, "'action_space.n' must be an integer in 1.."),
        # found in an audit: accepted, then loading indexed the list as an object (a TypeError)
        ("action_space", [4, 1, 2, 3], r"'action_space' must be an object with 'nvec'"),
        ("action_space", {"n": 6, "nvec": [2, 2]}, "'action_space.nvec' must be a menu whose product is action_space.n = 6"),
        ("observation_space.shape", [2**40], "'observation_space.shape'"),
        ("observation_space.low", [0.0], "'observation_space.low' must be a list of"),
        ("policy.share_features_extractor", "yes", "must be true or false"),
    ]
    for i, (field, value, message) in enumerate(cases):
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        copy = _copy_policy(saved, folder, meta=broken(field, value))
        with pytest.raises(ValueError, match=message):
            LearnedAgent(copy)
    # Valid JSON that does not describe the weights: the architecture check catches it.
    copy = _copy_policy(saved, tmp_path, meta=broken("policy.net_arch", {"pi": [32], "vf": [8, 8]}))
    with pytest.raises(ValueError, match="the weights do not fit the architecture in policy.json"):
        LearnedAgent(copy)
    # ... before building it: a JSON within its limits may describe a network larger than its weights,
    # which is never allocated when the weights cannot fill it; one beyond the parameter budget (here
    # ~4 GB of float32) is refused from the JSON alone.
    def no_building(*args, **kwargs):
        raise AssertionError("the policy was built before the weights were checked against it")

    monkeypatch.setattr(learned, "_policy_classes", lambda: {"ActorCriticPolicy": no_building, "DQNPolicy": no_building})
    for name, arch, message in (
        ("large", {"pi": [1024] * 4, "vf": [8, 8]}, r"needs at least \d+ parameters, policy.pth holds \d+"),
        ("huge", {"pi": [4096] * 16, "vf": [4096] * 16},
         (r"'policy.net_arch' must be a network of at most 16777216 parameters \(MAX_POLICY_PARAMETERS; this one "
         r"has up to 1007345710\)")),
    ):
        (tmp_path / name).mkdir()
        with pytest.raises(ValueError, match=message):
            LearnedAgent(_copy_policy(saved, tmp_path / name, meta=broken("policy.net_arch", arch)))
    monkeypatch.undo()
    copy = _copy_policy(saved, tmp_path / "huge")
    learned.metadata_path(copy).write_text("{not json")
    with pytest.raises(ValueError, match="policy.json: cannot read the policy metadata"):
        LearnedAgent(copy)
    not_a_zip = tmp_path / "junk.zip"
    not_a_zip.write_bytes(b"PK\x03\x04 truncated")
    learned.metadata_path(not_a_zip).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="junk.zip: not a readable zip file"):
        LearnedAgent(not_a_zip)


# ------------------------------------------------------------------ flat (Discrete) policies and DQN
CHEAP = {**TINY, "iterations": [1], "restarts": [1], "strategies": ["inverting-gradients", "dlg"]}


def test_dqn_on_flat_actions_saves_loads_and_plays_in_both_kinds_of_space(tmp_path):
    """SB3 DQN on ``gym.make(..., flat_actions=True)``: a few hundred steps, then save_policy /
    load_policy and a LearnedAgent that acts in the flat env and as a MultiDiscrete opponent."""
    from stable_baselines3 import DQN

    env = gym.make("LeakGym-Digits-v0", role="attacker", opponent="none", flat_actions=True, **CHEAP)
    sc = load_scenario("digits", **CHEAP)
    assert env.action_space == gym.spaces.Discrete(int(np.prod(sc.attacker_nvec)))
    model = DQN("MlpPolicy", env, learning_starts=50, train_freq=4, target_update_interval=50, batch_size=16,
                policy_kwargs={"net_arch": [16]}, seed=0, device="cpu")
    model.learn(200)
    assert model.num_timesteps == 200
    path = tmp_path / "dqn.zip"
    meta = learned.save_policy(model, path, {"algo": "dqn", "role": "attacker"}, flat_nvec=sc.attacker_nvec)
    assert meta["policy"] == {"class": "DQNPolicy", "net_arch": [16], "activation_fn": "ReLU", "normalize_images": True}
    assert meta["action_space"] == {"n": int(np.prod(sc.attacker_nvec)), "nvec": sc.attacker_nvec.tolist()}
    policy, _ = learned.load_policy(path)
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in model.policy.state_dict().items())

    agent = make_agent(str(path), role="attacker", scenario=sc)
    assert agent.flat and agent.algo == "dqn"
    rng = np.random.default_rng(0)
    multi = gym.spaces.MultiDiscrete(sc.attacker_nvec)
    for _ in range(10):
        obs = rng.random(env.observation_space.shape, dtype=np.float32)
        flat, _ = model.predict(obs, deterministic=True)
        assert int(agent.act(obs, env.action_space, rng)) == int(flat)  # the flat env's own space
        np.testing.assert_array_equal(agent.act(obs, multi, rng), np.unravel_index(int(flat), sc.attacker_nvec))
    obs, _ = env.reset(seed=1)
    _, _, _, _, info = env.step(agent.act(obs, env.action_space, rng))
    assert 0.0 <= info["accuracy"] <= 1.0
    # As the opponent of a (MultiDiscrete) defender view.
    view = gym.make("LeakGym-Digits-v0", role="defender", opponent=str(path), **CHEAP)
    view.reset(seed=0)
    view.step(view.action_space.sample())
    env.close()

    # Its menu is recorded: a scenario whose attacker menu has as many actions in another shape is refused.
    same_size = load_scenario("digits", **{**CHEAP, "iterations": [1, 2, 5], "tv": [0.0]})
    assert np.prod(same_size.attacker_nvec) == np.prod(sc.attacker_nvec)
    assert not np.array_equal(same_size.attacker_nvec, sc.attacker_nvec)
    with pytest.raises(ValueError, match=r"acts in Discrete\(\d+, the flattened MultiDiscrete\(\[.*\]\)\), but the "
                                         r"attacker's action space in this scenario is"):
        LearnedAgent(path, role="attacker", scenario=same_size)
    with pytest.raises(ValueError, match=r"acts in Discrete\(\d+.*\(\d+ actions\), but this role's action space is "
                                         r"Discrete\(3\)"):
        agent.act(obs, gym.spaces.Discrete(3), rng)


def test_multidiscrete_policy_plays_in_a_flat_space(saved):
    path, model, _ = saved
    sc = load_scenario("digits", **TINY)
    agent = LearnedAgent(path, role="attacker", scenario=sc)
    flat_space = gym.spaces.Discrete(int(np.prod(sc.attacker_nvec)))
    rng = np.random.default_rng(1)
    obs = rng.random(model.observation_space.shape, dtype=np.float32)
    expected, _ = model.predict(obs, deterministic=True)
    assert int(agent.act(obs, flat_space, rng)) == int(np.ravel_multi_index(tuple(expected), sc.attacker_nvec))


def test_a_sampling_learned_agent_draws_from_the_environment_generator(saved):
    """``deterministic=False`` samples with the ``rng`` it is given, not torch's global RNG: the same
    generator seed replays the same actions whatever torch's global state, another seed differs, and
    the draws follow the policy's distribution (an untrained policy: every entry is used)."""
    path, _, _ = saved
    scenario = load_scenario("digits", **TINY)
    agent = LearnedAgent(path, role="attacker", scenario=scenario, deterministic=False)
    space = gym.spaces.MultiDiscrete(scenario.attacker_nvec)
    obs = np.zeros(agent.policy.observation_space.shape, dtype=np.float32)

    def draws(seed, torch_seed):
        torch.manual_seed(torch_seed)
        rng = np.random.default_rng(seed)
        return np.stack([agent.act(obs, space, rng) for _ in range(40)])

    first = draws(0, torch_seed=1)
    np.testing.assert_array_equal(first, draws(0, torch_seed=2))
    assert not np.array_equal(first, draws(1, torch_seed=1))
    assert all(len(np.unique(first[:, j])) > 1 for j in range(first.shape[1]))
    assert np.all((first >= 0) & (first < np.asarray(scenario.attacker_nvec)))
    flat = gym.spaces.Discrete(int(np.prod(scenario.attacker_nvec)))
    a = agent.act(obs, flat, np.random.default_rng(0))
    assert a.shape == () and 0 <= int(a) < flat.n


def test_non_finite_weights_are_refused_when_loaded_and_when_saved(saved, tmp_path):
    """NaN weights loaded silently: PPO then failed at its first move mid-episode, DQN played action 0."""
    _, model, _ = saved
    state = {k: v.clone() for k, v in model.policy.state_dict().items()}
    state["action_net.weight"][0, 0] = float("nan")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    broken = _copy_policy(saved, tmp_path, replace={"policy.pth": buffer.getvalue()})
    with pytest.raises(ValueError, match=r"tensor 'action_net.weight' holds non-finite values; refused to load it"):
        LearnedAgent(broken)
    diverged = copy.deepcopy(model)
    with torch.no_grad():
        diverged.policy.action_net.weight.fill_(float("inf"))
    with pytest.raises(ValueError, match=r"action_net.weight holds non-finite values \(the training diverged\)"):
        learned.save_policy(diverged, tmp_path / "diverged.zip", {"algo": "ppo", "role": "attacker"})
    assert not (tmp_path / "diverged.zip").exists()


def test_a_device_this_machine_lacks_is_named_before_the_file_is_read(saved):
    with pytest.raises(ValueError, match=r"device='cuda:99' is not available on this machine"):
        learned.load_policy(saved[0], device="cuda:99")  # was blamed on the file: "not a plain tensor state_dict"


def test_a_path_without_a_suffix_saves_a_loadable_zip_as_sb3_names_it(saved, tmp_path):
    _, model, _ = saved
    learned.save_policy(model, tmp_path / "mine", {"algo": "ppo", "role": "attacker"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "mine.zip"]
    learned.load_policy(tmp_path / "mine.zip")


def test_a_save_interrupted_between_its_two_files_leaves_the_earlier_pair(saved, tmp_path, monkeypatch):
    """policy.zip was written, then policy.json: a Ctrl-C between them left a new zip beside an old JSON."""
    _, model, _ = saved
    path = tmp_path / "policy.zip"
    learned.save_policy(model, path, {"algo": "ppo", "role": "attacker", "run": 1})
    before = path.read_bytes(), learned.metadata_path(path).read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    other = copy.deepcopy(model)  # other weights: a new zip would differ from the earlier one
    with torch.no_grad():
        other.policy.action_net.weight.add_(1.0)
    monkeypatch.setattr(learned.json, "dumps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        learned.save_policy(other, path, {"algo": "ppo", "role": "attacker", "run": 2})
    assert (path.read_bytes(), learned.metadata_path(path).read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "policy.zip"]  # no partial files


# ------------------------------------------------------------------ issue 38: weights bounded by their real size
def _weights_bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(("make", "message"), [
    # one stored number read as 16.8 M: isfinite() on it used to allocate them all (8 GB for the file)
    (lambda w: {**w, "huge": torch.zeros(1).expand(4096, 4096)}, (r"tensor 'huge' is not contiguous \(shape \(4096, 4096\), "
     r"strides \(0, 0\): an expanded or strided view")),
    (lambda w: {k: (v.t() if v.ndim == 2 else v) for k, v in w.items()}, "is not contiguous"),
    (lambda w: {**w, "a": torch.arange(10.0)[0:6], "b": torch.arange(10.0)[4:10]}, None),
    (lambda w: {**w, "s": torch.eye(3).to_sparse()}, r"tensor 's' has layout torch.sparse_coo; allowed: dense"),
])
def test_weights_that_take_more_memory_than_the_file_are_refused_before_use(saved, tmp_path, monkeypatch, make, message):
    """Stride-0 (expanded), strided and overlapping views are refused before any computation reads them."""
    _, model, _ = saved
    weights = {k: v.clone() for k, v in model.policy.state_dict().items()}
    state = make(weights)
    if message is None:  # two views of one storage that overlap
        base = torch.arange(10.0)
        state = {**weights, "a": base[0:6], "b": base[4:10]}
        message = "tensor 'b' overlaps tensor 'a' in their shared storage"
    copy = _copy_policy(saved, tmp_path, replace={"policy.pth": _weights_bytes(state)})

    def no_reading(*args, **kwargs):
        raise AssertionError("a tensor was computed on before its storage was checked")

    monkeypatch.setattr(torch.Tensor, "isfinite", no_reading)
    with pytest.raises(ValueError, match=message) as exc:
        LearnedAgent(copy)
    assert "\n" not in str(exc.value) and "refused to load it" in str(exc.value)


def test_disjoint_views_of_one_storage_are_weights_like_any_other(saved, tmp_path):
    """Views of one storage side by side are not overlapping: the check refuses only what it must (the
    extra names make the weights not fit the architecture, which is the error, not the storage)."""
    _, model, _ = saved
    base = torch.arange(10.0)
    state = {**model.policy.state_dict(), "a": base[0:5], "b": base[5:10]}
    copy = _copy_policy(saved, tmp_path, replace={"policy.pth": _weights_bytes(state)})
    with pytest.raises(ValueError, match="the weights do not fit the architecture"):
        LearnedAgent(copy)


def test_deeply_nested_policy_json_is_one_line_error(saved, tmp_path):
    """A policy.json nested 100,000 deep ended in a RecursionError traceback; now refused unparsed."""
    _, _, meta = saved
    copy = _copy_policy(saved, tmp_path)
    nested = json.dumps({**meta, "extra": "x"}).replace('"x"', "[" * 100_000 + "]" * 100_000)
    learned.metadata_path(copy).write_text(nested)
    with pytest.raises(ValueError, match=r"policy.json: lists and objects nested 100001 deep; allowed: at most 32"):
        LearnedAgent(copy)
    # brackets inside strings are not nesting
    learned.metadata_path(copy).write_text(json.dumps({**meta, "note": "[" * 1000 + '\\"{'}))
    assert LearnedAgent(copy).metadata["note"].startswith("[[")
    assert learned.json_depth(json.dumps(meta)) <= 4


def test_oversized_policy_json_is_refused_before_it_is_read(saved, tmp_path, monkeypatch):
    copy = _copy_policy(saved, tmp_path)
    monkeypatch.setattr(learned, "MAX_METADATA_BYTES", 100)
    with pytest.raises(ValueError, match=r"policy.json: \d+ bytes; allowed: at most 100 \(MAX_METADATA_BYTES\)"):
        LearnedAgent(copy)


def test_loading_a_policy_leaves_the_callers_random_stream_and_dtype_alone(saved):
    """The SB3 policy's initial weights (replaced by the file's) were drawn from the caller's torch generator,
    and under a float64 default dtype the policy was built in float64 and failed its first action."""
    path, model, _ = saved
    sc = load_scenario("digits", **TINY)
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        agent = make_agent(str(path), role="attacker", scenario=sc)
        obs = np.random.default_rng(0).random(model.observation_space.shape, dtype=np.float32)
        action = agent.act(obs, gym.spaces.MultiDiscrete(sc.attacker_nvec), np.random.default_rng(0))
    finally:
        torch.set_default_dtype(before)
    assert torch.equal(torch.rand(3), want)
    np.testing.assert_array_equal(action, model.predict(obs, deterministic=True)[0])


@pytest.mark.parametrize("call", ["load_dataset('digits', image_size=16)", "load_policy(PATH)"])
def test_the_first_dataset_or_policy_load_of_a_process_leaves_pythons_random_stream(saved, call):
    """scikit-learn's digits and Stable-Baselines3 import rich.style, which draws from Python's global
    ``random`` when first imported: the first load of a process moved the caller's stream (found in an
    audit). A fresh process, as a user's script is."""
    import subprocess
    import sys

    code = ("import random; from leakgym.data import load_dataset; from leakgym.agents.policies.learned import "
            f"load_policy; PATH = {str(saved[0])!r}; random.seed(5); state = random.getstate(); {call}; "
            "print(random.getstate() == state, 'rich.style' in __import__('sys').modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr

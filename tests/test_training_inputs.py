"""Hostile and malformed inputs of a training run: hyperparameter files and values, and the settings of
:class:`TrainConfig` and self-play, refused up front as one ``ValueError`` (``leakgym: error: ...``, exit 2)
before anything is built, written or removed."""

from __future__ import annotations

import re

import pytest

from leakgym.agents.experiments import training as tr
from leakgym.agents.experiments.training import hyperparams as tr_hyperparams
from leakgym.agents.experiments.training import loop as tr_loop
from leakgym.cli import main

TINY = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}
TINY_ARGS = [f"{k}={v}" for k, v in TINY.items()]


def _laughs(levels: int = 9) -> str:
    """A "billion laughs" YAML file: nine aliases of the previous list in each of ``levels`` lists."""
    lines = ["anchors:", "  a0: &a0 [0, 0, 0, 0, 0, 0, 0, 0, 0]"]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"LeakGym-Digits-v0: {{env_kwargs: {{opponent: noise-0.1, foo: *a{levels - 1}}}}}")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)
def test_a_hyperparameter_file_of_nested_aliases_is_refused_at_once(tmp_path, capsys):
    """Found in an audit: nine nested aliases nine times over (9**9 values in ten lines) kept `leakgym train`
    at 100% CPU for minutes: the check for NaN walked the shared lists as a tree before the unknown
    env_kwargs key was refused."""
    path = tmp_path / "laughs.yml"
    path.write_text(_laughs())
    out = tmp_path / "out"
    assert main(["train", "--hyperparams", str(path), "--timesteps", "16", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"leakgym: error: hyperparameter file {str(path)!r}: more than 100000 values")
    assert "MAX_HYPERPARAMS_VALUES" in err and not out.exists()
    # the overrides of the Python API are bounded too: by their size, shared lists counted where used ...
    shared = [0] * 9
    for _ in range(8):
        shared = [shared] * 9
    with pytest.raises(ValueError, match=r"command line \(--hyperparams\): more than 100000 values"):
        tr.load_hyperparams("LeakGym-Digits-v0", "ppo", {"policy_kwargs": {"optimizer_kwargs": {"eps": shared}}})
    # ... and their depth (a RecursionError in the checks, or in deepcopy, before)
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"nested more than 32 deep; allowed: at most 32 \(MAX_HYPERPARAMS_DEPTH\)"):
        tr.load_hyperparams("LeakGym-Digits-v0", "ppo", {"env_kwargs": {"restarts": deep}})
    # aliases that expand to a few values are fine, as in rl-zoo's own files
    path.write_text("common: &common {n_steps: 8, gamma: 0.9}\nLeakGym-Digits-v0: {<<: *common, n_epochs: 2}\n")
    params = tr.load_hyperparams("LeakGym-Digits-v0", "ppo", path=path)
    assert params["n_steps"] == 8 and params["n_epochs"] == 2


@pytest.mark.parametrize(("algo", "token", "message"), [
    ("ppo", "policy_kwargs={net_arch: [8], optimizer_kwargs: {foo: 1}}",
     (r"policy_kwargs.optimizer_kwargs={'foo': 1}; allowed: null or a mapping of Adam's arguments \[.*'eps'.*\]"
     r" \(SB3 sets \['params', 'lr'\] itself\), not \['foo'\]")),
    ("ppo", "policy_kwargs={optimizer_kwargs: {lr: -1}}",
     r"policy_kwargs.optimizer_kwargs.lr=-1; allowed: no 'lr' key \(learning_rate sets"),
    ("ppo", "policy_kwargs={optimizer_kwargs: [1]}",
     r"policy_kwargs.optimizer_kwargs=\[1\]; allowed: null or a mapping of Adam's arguments"),
    ("ppo", "policy_kwargs={features_extractor_kwargs: {foo: 1}}",
     (r"policy_kwargs.features_extractor_kwargs={'foo': 1}; allowed: null or {} \(SB3 sets every argument of "
     r"FlattenExtractor itself")),
    ("a2c", "policy_kwargs={activation_fn: null}", r"policy_kwargs.activation_fn=None; allowed: one of \['Tanh'"),
    # (found in a review: checked against Adam's arguments, while SB3's A2C replaces them with RMSprop's)
    ("a2c", "policy_kwargs={net_arch: [8], optimizer_kwargs: {alpha: 0.9}}",
     r"policy_kwargs.optimizer_kwargs={'alpha': 0.9} with A2C's use_rms_prop \(true by default\), which replaces"),
    ("ppo", "rollout_buffer_kwargs={foo: 1}",
     r"rollout_buffer_kwargs={'foo': 1}; allowed: null or {} \(SB3 sets every argument of RolloutBuffer itself"),
    ("ppo", "rollout_buffer_kwargs=[1]", r"rollout_buffer_kwargs=\[1\]; allowed: null or {}"),
    ("dqn", "replay_buffer_kwargs={foo: 1}",
     (r"replay_buffer_kwargs={'foo': 1}; allowed: null or a mapping of ReplayBuffer's arguments "
     r"\['handle_timeout_termination'\]")),
])
def test_nested_hyperparameters_are_checked_before_anything_is_built(tmp_path, monkeypatch, capsys, algo, token,
                                                                     message):
    """Found in an audit: what lies inside policy_kwargs' optimizer_kwargs and features_extractor_kwargs and in
    the buffers' kwargs was never checked, and ended in a TypeError traceback from Adam or SB3 (exit 1) once
    the games were built; activation_fn: null too."""
    monkeypatch.setattr(tr_loop, "make_training_env", lambda *a, **k: pytest.fail("built an environment"))
    out = tmp_path / "out"
    assert main(["train", "--algo", algo, "--timesteps", "16", "--opponent", "noise-0.1", "--no-progress",
                 "--out", str(out), "--hyperparams", token, "--overrides", *TINY_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"leakgym: error: command line (--hyperparams {token}): ") and err.count("\n") == 1
    assert re.search(message, err) and not out.exists()


def test_hyperparameters_sb3_refuses_while_building_the_model_are_one_line(tmp_path, capsys):
    """Found in an audit: a value no check foresees (here an optimiser argument of the wrong type) ended in a
    traceback from torch while SB3 built the model, after the run's folder was made."""
    out = tmp_path / "out"
    token = "policy_kwargs={net_arch: [8], optimizer_kwargs: {eps: abc}}"
    assert main(["train", "--timesteps", "16", "--opponent", "noise-0.1", "--no-progress", "--out", str(out),
                 "--hyperparams", token, "n_envs=1", "--overrides", *TINY_ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"leakgym: error: hyperparameter file {str(tr_hyperparams.hyperparams_file('ppo'))!r} "
                          "with --hyperparams {'policy_kwargs': ")
    assert "Stable-Baselines3 could not build PPO from these hyperparameters: TypeError: " in err
    assert not out.exists()


@pytest.mark.parametrize(("config", "message"), [
    ({"timesteps": 16.7}, r"timesteps=16.7; allowed: integers >= 1, or None"),
    ({"timesteps": True}, r"timesteps=True; allowed: integers >= 1"),
    ({"timesteps": "16"}, r"timesteps='16'; allowed: integers >= 1"),
    ({"timesteps": 0}, r"timesteps=0; allowed: integers >= 1"),
    ({"eval_freq": 8, "eval_episodes": 1.5}, r"eval_episodes=1.5; allowed: integers >= 0"),
    ({"eval_freq": None}, r"eval_freq=None; allowed: integers >= 0 \(0: no evaluations\)"),
    ({"eval_freq": 8.0}, r"eval_freq=8.0; allowed: integers >= 0"),
    ({"checkpoint_freq": 2.5}, r"checkpoint_freq=2.5; allowed: integers >= 1, 0 \(no checkpoints\) or None"),
    ({"checkpoint_freq": True}, r"checkpoint_freq=True; allowed: integers >= 1"),
    ({"batch_clients": "no"}, r"batch_clients='no'; allowed: True, False or None"),
])
def test_train_settings_of_the_wrong_type_are_refused_before_anything_is_built(tmp_path, monkeypatch, config,
                                                                               message):
    """Found in an audit: eval_episodes=1.5 trained the whole run, then failed at the final evaluation with no
    policy saved; timesteps=16.7 trained 16 steps silently, True one step and '16' sixteen; eval_freq=None
    was a TypeError. Refused as seed=True already was (bools are not integers here)."""
    monkeypatch.setattr(tr_loop, "make_training_env", lambda *a, **k: pytest.fail("built an environment"))
    kwargs = {"timesteps": 16, "opponent": "none", "out": tmp_path / "run", "overrides": TINY, "progress": False,
              **config}
    with pytest.raises(ValueError, match=f"^{message}"):
        tr.train(tr.TrainConfig(**kwargs))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("bad", "message"), [
    ({"iterations": 2.5}, r"iterations=2.5; allowed: integers >= 1"),
    ({"iterations": True}, r"iterations=True; allowed: integers >= 1"),
    ({"eval_episodes": 1.5}, r"eval_episodes=1.5; allowed: integers >= 0"),
    ({"seed": True}, r"seed=True; allowed: integers >= 0"),
    ({"seed": -2}, r"seed=-2; allowed: integers >= 0"),
    ({"timesteps": 16.7}, r"timesteps=16.7; allowed: integers >= 1"),
])
def test_selfplay_settings_of_the_wrong_type_leave_an_earlier_run_alone(tmp_path, bad, message):
    """Found in an audit: selfplay(iterations=2.5) into an earlier run's folder deleted its iter_01/ and
    iter_02/ and rewrote its summary.json, then failed with a TypeError (only iterations < 1 was checked)."""
    from leakgym.agents.experiments.selfplay import selfplay

    out = tmp_path / "sp"
    for k in (1, 2):
        (out / f"iter_0{k}" / "attacker").mkdir(parents=True)
        (out / f"iter_0{k}" / "attacker" / "policy.zip").write_text("an earlier run's")
    (out / "summary.json").write_text('{"previous": "run"}')
    before = sorted(str(p) for p in out.rglob("*"))
    kwargs = {"iterations": 2, "timesteps": 16, "overrides": TINY, **bad}
    with pytest.raises(ValueError, match=f"^{message}"):
        selfplay("LeakGym-Digits-v0", out=out, progress=False, **kwargs)
    assert sorted(str(p) for p in out.rglob("*")) == before
    assert (out / "summary.json").read_text() == '{"previous": "run"}'


def test_a2c_takes_optimizer_kwargs_with_adam_only():
    """A2C with use_rms_prop: false trains with Adam, and its optimizer_kwargs are Adam's (found in a review)."""
    params = tr_hyperparams.load_hyperparams("LeakGym-Digits-v0", "a2c", {
        "use_rms_prop": False, "policy_kwargs": {"net_arch": [8], "optimizer_kwargs": {"betas": [0.5, 0.6]}}})
    assert params["policy_kwargs"]["optimizer_kwargs"] == {"betas": [0.5, 0.6]}
    with pytest.raises(ValueError, match=r"not \['alpha'\]"):
        tr_hyperparams.load_hyperparams("LeakGym-Digits-v0", "a2c", {
            "use_rms_prop": False, "policy_kwargs": {"optimizer_kwargs": {"alpha": 0.9}}})


def test_policy_json_is_read_where_python_has_no_integer_digit_limit(monkeypatch):
    """Found in a review: Python before 3.10.7 (allowed by requires-python) has no sys.get_int_max_str_digits,
    and reading any integer of a policy.json called it."""
    import sys

    from leakgym.agents.policies import learned

    monkeypatch.delattr(sys, "get_int_max_str_digits", raising=False)
    assert learned._parse_int("12") == 12 and learned._parse_int("-" + "9" * 100) == -int("9" * 100)

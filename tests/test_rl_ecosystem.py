"""LeakGym with the tools RL researchers already use: rl-baselines3-zoo, Ray RLlib, and the worked
example (SuperSuit, TorchRL, Tianshou and SB3's batched env: tests/test_rl_clients.py). Each test skips
cleanly when its optional package is not installed (CI installs only ``.[dev]``, which has neither
rl_zoo3 nor RLlib)."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from leakgym.agents.experiments import training as tr

REPO = Path(__file__).resolve().parents[1]
#: a tiny digits game for the rl-zoo run
TINY = {"rounds": 2, "num_clients": 1, "eval_size": 32, "iterations": [1, 2], "restarts": [1],
        "strategies": ["inverting-gradients", "dlg"], "defense_defaults": {"dcs2_steps": 2}}


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def test_rl_zoo3_trains_from_leakgyms_hyperparams_file(tmp_path):
    """``python -m rl_zoo3.train`` reads agents/experiments/hyperparams/ppo.yml and trains on LeakGym-Digits-v0."""
    _needs("rl_zoo3")
    env_kwargs = ["role:'attacker'", "opponent:'none'"] + [f"{k}:{v!r}" for k, v in TINY.items()]
    cmd = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo", "--env", "LeakGym-Digits-v0",
           "--gym-packages", "leakgym", "-conf", str(tr.hyperparams_file("ppo")), "-n", "8", "-f", str(tmp_path),
           "--eval-freq", "-1", "--seed", "0", "-params", "n_steps:8", "batch_size:8", "n_epochs:1",
           "--env-kwargs", *env_kwargs]
    done = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Loading hyperparameters from: " + str(tr.hyperparams_file("ppo")) in done.stdout
    assert "('gamma', 0.9)" in done.stdout and "('n_steps', 8)" in done.stdout  # the file's value, the override
    assert "env_kwargs={'role': 'attacker', 'opponent': 'none'" in done.stdout
    assert (tmp_path / "ppo" / "LeakGym-Digits-v0_1" / "LeakGym-Digits-v0.zip").is_file()


def test_rllib_example_trains_both_roles_for_one_iteration(tmp_path):
    _needs("ray")
    try:  # Ray core alone (the dev extra's, for `leakgym metagame --ray`) lacks RLlib's own dependencies
        import ray.rllib  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"RLlib is not installed (pip install 'leakgym[rllib]'): {exc}")
    cmd = [sys.executable, str(REPO / "examples" / "rllib_selfplay.py"), "--iterations", "1", "--env-runners", "2",
           "--tiny", "--episodes", "1", "--epochs", "1", "--out", str(tmp_path), "--no-progress"]
    done = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "iterations.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert int(row["env_steps"]) == 2 * 2  # two runners, one 2-round episode each
    for key in ("attacker_return", "defender_return", "leakage_ssim"):
        assert np.isfinite(float(row[key])), row
    assert (tmp_path / "checkpoint" / "rllib_checkpoint.json").is_file()


def test_worked_example_trains_evaluates_and_draws_the_gallery(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("train_eval_gallery", REPO / "examples" / "train_eval_gallery.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--tiny", "--out", str(tmp_path), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "$ leakgym train " in printed and "$ leakgym eval " in printed and "mean leakage_ssim" in printed
    payoff = json.loads((tmp_path / "eval" / "payoff.json").read_text())
    assert payoff["attackers"] == [str(tmp_path / "attacker" / "policy.zip"), "random"]
    assert payoff["defenders"] == ["noise-0.1", "prune-0.9"]
    from matplotlib.image import imread

    assert imread(tmp_path / "eval" / "gallery.png").ndim == 3

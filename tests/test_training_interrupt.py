"""Ctrl-C in ``leakgym train`` / ``leakgym selfplay`` keeps the policy reached so far and a summary."""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback

from leakgym.agents import LearnedAgent
from leakgym.agents.experiments import selfplay as sp
from leakgym.agents.experiments import training as tr
from leakgym.agents.experiments.cli_common import INTERRUPTED
from leakgym.agents.experiments.training import cli as train_cli
from leakgym.agents.experiments.training import loop as tr_loop

TINY = {"rounds": 2, "num_clients": 1, "iterations": [1, 2], "eval_size": 64}


class InterruptAfter(BaseCallback):
    """Raises KeyboardInterrupt (as Ctrl-C does) once ``steps`` environment steps were taken."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.steps:
            self.weights = {k: v.clone() for k, v in self.model.policy.state_dict().items()}
            raise KeyboardInterrupt
        return True


def test_interrupted_training_saves_the_current_policy(tmp_path):
    stop = InterruptAfter(5)
    config = tr.TrainConfig(role="attacker", algo="a2c", timesteps=64, opponent="none", out=tmp_path,
                            overrides=TINY, hyperparams={"n_steps": 2, "n_envs": 1}, progress=False, callback=stop)
    with pytest.raises(tr.TrainingInterrupted) as info:
        tr.train(config)
    assert isinstance(info.value, KeyboardInterrupt)
    result = info.value.result
    assert result.interrupted and result.policy_path == tmp_path / "policy.zip"
    meta = json.loads((tmp_path / "policy.json").read_text())
    assert meta["interrupted"] is True and meta["timesteps"] == 5 and meta["algo"] == "a2c"
    # The saved policy is the one at the moment of the interrupt (after two A2C updates), and it plays.
    agent = LearnedAgent(result.policy_path, role="attacker")
    saved = agent.policy.state_dict()
    assert all(np.array_equal(saved[k].numpy(), v.numpy()) for k, v in stop.weights.items())
    obs = np.zeros(agent.policy.observation_space.shape, np.float32)
    action = agent.act(obs, agent.policy.action_space, np.random.default_rng(0))
    assert agent.policy.action_space.contains(action)


def test_interrupted_training_on_the_batched_vector_env_saves_the_policy(tmp_path):
    """The hyperparameter files' default: several games per step on the batched vector env (batch_clients on)."""
    stop = InterruptAfter(6)
    config = tr.TrainConfig(role="attacker", timesteps=64, opponent="random", out=tmp_path, overrides=TINY,
                            hyperparams={"n_steps": 2, "n_envs": 2, "batch_size": 4}, progress=False, callback=stop)
    with pytest.raises(tr.TrainingInterrupted) as info:
        tr.train(config)
    meta = json.loads((tmp_path / "policy.json").read_text())
    assert meta["interrupted"] is True and meta["timesteps"] == 6  # two games per step: 3 vector steps
    assert meta["batch_clients"] is True and meta["hyperparams"]["n_envs"] == 2
    saved = LearnedAgent(info.value.result.policy_path, role="attacker").policy.state_dict()
    assert all(np.array_equal(saved[k].numpy(), v.numpy()) for k, v in stop.weights.items())


def test_train_cli_exits_130_with_a_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tr_loop, "_progress_callback", lambda total: InterruptAfter(3))
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--role", "defender", "--algo", "a2c", "--timesteps", "32", "--opponent", "dlg-paper",
                              "--out", str(tmp_path), "--checkpoint-freq", "2", "--hyperparams", "n_steps=2", "n_envs=1",
                              "--overrides", *(f"{k}={v}" for k, v in TINY.items())])
    assert train_cli.main(args) == INTERRUPTED
    assert "interrupted after 3 steps" in capsys.readouterr().err
    assert json.loads((tmp_path / "policy.json").read_text())["timesteps"] == 3
    checkpoint = tmp_path / "checkpoints" / "policy_2_steps.zip"
    assert json.loads(checkpoint.with_suffix(".json").read_text())["timesteps"] == 2
    LearnedAgent(checkpoint, role="defender")


def test_interrupted_selfplay_saves_summary_and_policies(tmp_path, monkeypatch, capsys):
    real_train = tr.train

    def defender_interrupted(config):
        if config.role == "defender":
            config = dataclasses.replace(config, callback=InterruptAfter(2))
        return real_train(config)

    monkeypatch.setattr(sp, "train", defender_interrupted)
    parser = argparse.ArgumentParser()
    sp.add_arguments(parser)
    args = parser.parse_args(["--iterations", "2", "--timesteps", "4", "--algo", "a2c", "--out", str(tmp_path),
                              "--no-progress", "--hyperparams", "n_steps=2", "n_envs=1",
                              "--overrides", *(f"{k}={v}" for k, v in TINY.items())])
    assert sp.main(args) == INTERRUPTED
    assert "interrupted in iteration 1 (defender training)" in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] == {"iteration": 1, "stage": "defender training"}
    (entry,) = summary["history"]
    assert entry["interrupted"] == "defender training" and entry["attacker_opponent"] == "random"
    assert entry["attacker"] == str(tmp_path / "iter_01" / "attacker" / "policy.zip")
    assert entry["defender"] == str(tmp_path / "iter_01" / "defender" / "policy.zip")
    defender_meta = json.loads((tmp_path / "iter_01" / "defender" / "policy.json").read_text())
    assert defender_meta["interrupted"] is True and defender_meta["timesteps"] == 2
    assert json.loads((tmp_path / "iter_01" / "attacker" / "policy.json").read_text())["interrupted"] is False

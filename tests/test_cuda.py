"""The environments on CUDA (skipped where no CUDA device is present; see shared/device/README.md).

Every offline scenario in both roles, the vector env, a game's trajectory alone vs in a vector, and a
short training run. CPU-only tests cannot see device bugs (a CPU generator feeding a CUDA tensor), so
these run the same paths with ``device="cuda"``.
"""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import leakgym  # noqa: F401
from leakgym.agents.policies.scripted import FixedAgent

pytestmark = pytest.mark.cuda

MALICIOUS_CHEAP = {"rounds": 3, "num_clients": 1, "eval_size": 32, "attack_defaults": {"num_neurons": 64}}


@pytest.fixture
def game_model_devices(monkeypatch):
    """The device of every game model built while the test runs (a run that silently stayed on the CPU
    would still pass a test that only compares two paths or checks an exit status)."""
    import leakgym.game.batch as game_module

    devices = []
    real = game_module.build_model

    def recording(*args, **kwargs):
        model = real(*args, **kwargs)
        devices.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(game_module, "build_model", recording)
    return devices


def _scenarios(cheap):
    full_menu = dict(cheap, strategies=["inverting-gradients", "dlg", "prior-init", "gradinversion"],
                     defender_menu={"noise_sigma": [0.0, 0.1], "prune": [0.0, 0.9], "dcs2_lambda_g": [0.0, 0.5],
                                    "censor_trials": [0, 3], "soteria": [0.0, 0.5]})
    return [("LeakGym-Digits-v0", full_menu), ("LeakGym-Digits-Malicious-v0", MALICIOUS_CHEAP)]


@pytest.mark.parametrize("role", ["attacker", "defender"])
def test_every_offline_scenario_plays_on_cuda_in_both_roles(role, cheap_overrides):
    for gym_id, overrides in _scenarios(cheap_overrides):
        env = gym.make(gym_id, role=role, device="cuda", **overrides)
        game = env.unwrapped.parallel
        env.reset(seed=0)
        assert next(game.games.model(game.row).parameters()).device.type == "cuda"
        for _ in range(overrides["rounds"]):
            obs, reward, *_ = env.step(env.action_space.sample())
            assert env.observation_space.contains(obs) and math.isfinite(reward)
            last = game.last_round
            assert last.update.tensors[next(iter(last.update.tensors))].device.type == "cuda"


@pytest.mark.parametrize("batch_clients", [False, True])
def test_vector_env_on_cuda_matches_the_single_view_within_tolerance(cheap_overrides, batch_clients,
                                                                    game_model_devices):
    """On CUDA, batched kernels (TF32, shape-dependent algorithms) change the attack's rounding:
    game 0 of a vector matches the single-agent view within 1e-2 in every attack-derived number, also
    with the victims' clean updates and the FL round batched over games (``batch_clients``)."""
    overrides = dict(cheap_overrides, rounds=2)
    opponent = FixedAgent([1, 2, 1, 0, 1, 0])
    single = gym.make("LeakGym-Digits-v0", opponent=opponent, device="cuda", **overrides)
    single.reset(seed=3)
    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=8, opponent=opponent, device="cuda", batch_clients=batch_clients,
                       **overrides)
    vec.reset(seed=[3, *range(10, 17)])
    for t in range(2):
        mine = np.array([t % 2, 1, 0, 1])
        actions = vec.action_space.sample()
        actions[0] = mine
        obs, rew, *_ = vec.step(actions)
        s_obs, s_rew, *_ = single.step(mine)
        np.testing.assert_allclose(obs[0], s_obs, atol=1e-2)
        assert rew[0] == pytest.approx(s_rew, abs=1e-2)
    assert len(game_model_devices) >= 9 and set(game_model_devices) == {"cuda"}
    for last in vec.unwrapped.games.last:
        assert {t.device.type for t in last.update.tensors.values()} == {"cuda"}


def test_a_short_training_run_on_cuda(tmp_path, cheap_overrides):
    from stable_baselines3 import PPO

    env = gym.make("LeakGym-Digits-v0", role="attacker", device="cuda", **cheap_overrides)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=8, n_epochs=1, device="cuda", seed=0)
    model.learn(total_timesteps=32)
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())
    assert model.policy.device.type == "cuda"
    assert next(env.unwrapped.parallel.games.model(0).parameters()).device.type == "cuda"
    model.save(tmp_path / "policy.zip")


def test_leakgym_train_on_the_batched_vector_env_on_cuda(tmp_path, game_model_devices):
    """`leakgym train --n-envs 4 --device cuda --batch-clients`: the batched games (defenses included: the
    random defender plays DCS² and CENSOR) and the policy on the GPU."""
    from leakgym.cli import main

    rc = main(["train", "--env", "LeakGym-Digits-v0", "--n-envs", "4", "--timesteps", "16", "--opponent", "random",
               "--device", "cuda", "--batch-clients", "--out", str(tmp_path / "run"), "--no-progress",
               "--checkpoint-freq", "0", "--overrides", "rounds=2", "num_clients=1", "eval_size=16", "iterations=[2]",
               "restarts=[1]"])
    assert rc == 0 and (tmp_path / "run" / "policy.zip").is_file()
    assert len(game_model_devices) >= 4 and set(game_model_devices) == {"cuda"}


def test_leakgym_train_with_the_default_hyperparameters_on_cuda(tmp_path, game_model_devices):
    """The files' defaults (8 games per step, batch_clients on) with `--device cuda`; DQN too (flat actions,
    train_freq x n_envs collections)."""
    import json

    from leakgym.cli import main

    for algo, steps in (("ppo", 16), ("dqn", 16)):
        out = tmp_path / algo
        rc = main(["train", "--algo", algo, "--timesteps", str(steps), "--device", "cuda", "--out", str(out),
                   "--no-progress", "--checkpoint-freq", "0", "--hyperparams", "learning_starts=8" if algo == "dqn"
                   else "n_epochs=1", "--overrides", "rounds=2", "num_clients=1", "eval_size=16", "iterations=[2]"])
        meta = json.loads((out / "policy.json").read_text())
        assert rc == 0 and meta["hyperparams"]["n_envs"] == 8 and meta["batch_clients"] is True
    assert len(game_model_devices) >= 16 and set(game_model_devices) == {"cuda"}


def test_eval_in_lockstep_on_cuda_matches_pair_by_pair(cheap_overrides, game_model_devices):
    """`leakgym eval`'s lockstep groups (several games, one Round per round: step_together) on CUDA;
    the games' shared normalised dataset lives on the device."""
    from leakgym.agents.experiments.evaluation.play import evaluate

    kwargs = {"episodes": 1, "overrides": cheap_overrides, "progress": False, "device": "cuda"}
    attackers, defenders = ["random", "bandit"], ["none", "random"]
    together = evaluate("LeakGym-Digits-v0", attackers, defenders, lockstep=4, **kwargs)
    alone = evaluate("LeakGym-Digits-v0", attackers, defenders, lockstep=1, **kwargs)
    for metric in ("leakage_ssim_mean", "accuracy_mean"):
        assert np.isfinite(together.matrix(metric)).all()
        np.testing.assert_allclose(together.matrix(metric), alone.matrix(metric), rtol=0, atol=2e-2)
    assert game_model_devices and set(game_model_devices) == {"cuda"}


def test_devices_this_machine_has_are_accepted_and_others_named():
    from leakgym.devices import available_devices, check_device

    assert check_device("cuda").type == "cuda" and "cuda:0" in available_devices()
    assert check_device(f"cuda:{torch.cuda.device_count() - 1}").type == "cuda"
    with pytest.raises(ValueError, match="is not available on this machine"):
        check_device(f"cuda:{torch.cuda.device_count()}")
    from leakgym.devices import canonical_device

    # one spelling per device: an eval log started with --device cuda resumes with --device cuda:<current>
    assert canonical_device("cuda") == canonical_device(f"cuda:{torch.cuda.current_device()}")
    assert str(canonical_device("cuda")) == f"cuda:{torch.cuda.current_device()}"


def test_training_evaluations_in_lockstep_on_cuda(game_model_devices):
    from leakgym.agents.experiments import training as tr

    kwargs = {"rounds": 1, "num_clients": 1, "iterations": [1], "restarts": [1], "eval_size": 32,
              "opponent": "random", "device": "cuda"}

    def predict(obs):
        return np.zeros((len(obs), 4), dtype=np.int64)

    alone = tr.run_eval_episodes(gym.make("LeakGym-Digits-v0", **kwargs), lambda o: predict(o[None])[0], 2, seed=1)
    together = tr.run_eval_episodes_together(gym.make_vec("LeakGym-Digits-v0", num_envs=2, **kwargs), predict, seed=1)
    for a, b in zip(alone, together):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
        assert math.isfinite(b["leakage_ssim"]) and b["leakage_ssim"] == pytest.approx(a["leakage_ssim"], abs=1e-3)
    assert len(game_model_devices) >= 3 and set(game_model_devices) == {"cuda"}


def test_seeding_for_the_cpu_leaves_the_gpu_generators_alone():
    """build_model(seed=...) and seeded_global_rng(seed, cpu) re-seeded every GPU for good (torch.manual_seed
    inside fork_rng(devices=[])); a CUDA block re-seeds only the generator it forks, and restores it."""
    from leakgym.data.spec import DatasetSpec
    from leakgym.defenses.registry import seeded_global_rng
    from leakgym.models import build_model

    torch.cuda.manual_seed_all(123)
    before = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    build_model("lenet", DatasetSpec("digits", 1, 16, 10, (0.5,), (0.5,)), seed=7)
    with seeded_global_rng(7, torch.device("cpu")):
        torch.rand(2)
    with seeded_global_rng(7, torch.device("cuda")):
        drawn = torch.rand(2, device="cuda")
    after = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    with torch.random.fork_rng(devices=[torch.device("cuda")]):
        torch.manual_seed(7)
        assert torch.equal(drawn, torch.rand(2, device="cuda"))  # the state torch.manual_seed gives


def test_a_vectors_model_bank_lives_on_cuda(cheap_overrides):
    from leakgym.fl.bank import ModelBank

    vec = gym.make_vec("LeakGym-Digits-v0", num_envs=2, device="cuda", batch_clients=True, **cheap_overrides)
    vec.reset(seed=0)
    vec.step(np.zeros((2, len(vec.single_action_space.nvec)), dtype=np.int64))
    games = vec.unwrapped.games
    bank = games.bank
    assert ModelBank.of([games.model(0), games.model(1)]) == (bank, [0, 1])
    assert {t.device.type for t in bank.stacks.values()} == {"cuda"}
    for i in range(2):
        for name, p in games.model(i).named_parameters():
            assert torch.equal(bank.stacks[name][i], p)

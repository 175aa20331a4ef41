"""``allow_large`` only from the caller; allocation failures as one line (issue 38, item 3)."""

from __future__ import annotations

import pytest
import torch

from leakgym.agents.experiments.evaluation import cli as evaluation
from leakgym.cli import main
from leakgym.game.round import RoundError
from leakgym.game.scenario import load_scenario

EVAL = ["eval", "--env", "LeakGym-Digits-v0", "--attackers", "random", "--defenders", "none", "--episodes", "1",
        "--no-progress"]


def test_a_scenario_file_cannot_lift_the_limits(tmp_path):
    """image_size = 100,000 with allow_large = true in the file tried to allocate 71.9 TB."""
    path = tmp_path / "big.toml"
    path.write_text('name = "big"\ndataset = "digits"\nimage_size = 100000\nallow_large = true\n')
    with pytest.raises(ValueError, match=r"big.toml'?: allow_large=True in a scenario file: the documented limits are "
                                         r"lifted only by the caller: --allow-large on the command line"):
        load_scenario(path)
    path.write_text('name = "big"\ndataset = "digits"\nimage_size = 100000\n')
    with pytest.raises(ValueError, match=r"image_size=100000 exceeds the limit 256; pass allow_large=True \(on the "
                                         r"command line: --allow-large\)"):
        load_scenario(path)
    # the caller may: a Python keyword
    assert load_scenario("digits", iterations=[40_000], allow_large=True).allow_large


def test_an_override_cannot_lift_the_limits_but_the_flag_can(tmp_path, capsys, monkeypatch):
    code = main([*EVAL, "--out", str(tmp_path / "a"), "--overrides", "allow_large=true", "image_size=100000"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("leakgym: error: override 'allow_large=true': the documented limits are lifted only by the "
                          "caller: --allow-large")
    seen = {}

    def evaluate(env, attackers, defenders, **kwargs):
        seen.update(kwargs["overrides"])
        raise KeyboardInterrupt  # stop here: the flag reached the scenario overrides

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    assert main([*EVAL, "--out", str(tmp_path / "b"), "--overrides", "rounds=1", "--allow-large"]) == 130
    assert seen == {"rounds": 1, "allow_large": True}
    seen.clear()
    assert main([*EVAL, "--out", str(tmp_path / "c"), "--overrides", "rounds=1"]) == 130
    assert seen == {"rounds": 1}


def test_a_hyperparameter_file_cannot_lift_the_limits(tmp_path, capsys):
    hyper = tmp_path / "h.yml"
    hyper.write_text("LeakGym-Digits-v0:\n  n_timesteps: 8\n  policy: MlpPolicy\n  env_kwargs:\n    allow_large: true\n")
    code = main(["train", "--env", "LeakGym-Digits-v0", "--timesteps", "8", "--out", str(tmp_path / "t"),
                 "--no-progress", "--hyperparams", str(hyper)])
    err = capsys.readouterr().err
    assert code == 2 and "env_kwargs allow_large=True in the hyperparameter file: the documented limits are lifted " \
                         "only by the caller" in err and err.count("\n") == 1


def _out_of_memory_round(*args, **kwargs):
    """What a round that runs out of host memory raises: torch's allocator's RuntimeError, wrapped by the
    Round as a RoundError (here a real failed allocation of 4 EiB)."""
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as exc:
        raise RoundError("round 1 of scenario 'digits' ... failed") from exc
    raise AssertionError("allocating 4 EiB succeeded")


@pytest.mark.parametrize("raise_it", [_out_of_memory_round,
                                      lambda *a, **k: (_ for _ in ()).throw(MemoryError("Unable to allocate 5.8 TiB"))])
def test_an_allocation_failure_is_one_line_with_the_estimate_and_the_knobs(tmp_path, capsys, monkeypatch, raise_it):
    """Torch's CPU allocation failure is a RuntimeError, which the CLI's MemoryError handler missed: a
    traceback and exit 1."""
    monkeypatch.setattr(evaluation, "evaluate", raise_it)
    code = main([*EVAL, "--out", str(tmp_path), "--overrides", "batch_size=4"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("leakgym: error: not enough memory: ")
    expected = load_scenario("digits", batch_size=4)
    from leakgym.game.scenario import estimated_round_bytes

    assert f"one round of this scenario at {estimated_round_bytes(expected) / 2**30:.2f} GiB per game (limit 8 GiB)" in err
    assert "lower batch_size, restarts, image_size or num_clients (--overrides)" in err


def test_other_runtime_errors_still_propagate(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        main([*EVAL, "--out", str(tmp_path)])


@pytest.mark.cuda
def test_a_cuda_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    def cuda_oom(*args, **kwargs):
        torch.empty(2**50, dtype=torch.uint8, device="cuda")  # 1 PiB

    monkeypatch.setattr(evaluation, "evaluate", cuda_oom)
    code = main([*EVAL, "--out", str(tmp_path), "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("leakgym: error: not enough memory: "), err
    assert "GiB per game" in err

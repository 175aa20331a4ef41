"""``leakgym bench trace``: the files one round enters (docs/architecture.md quotes its counts)."""

import json

from leakgym.bench.trace import LAYER, trace_round
from leakgym.cli import main

CHEAP = {"num_clients": 1, "eval_size": 16, "rounds": 3}


def test_one_round_enters_five_files_of_the_game_and_env_layer():
    """The structure target of issue 35: the view, then the game's round, state, menus and feedback."""
    out = trace_round("digits", [1, 0, 1, 0, 0, 0], [0, 0, 0, 0], **CHEAP)
    assert out["files"][0] == "envs/leakgym_env.py"
    assert set(out["layer_files"]) == {"envs/leakgym_env.py", "leakgym/game/round.py", "leakgym/game/batch.py",
                                       "leakgym/game/menus.py", "leakgym/game/feedback.py"}
    assert out["layer_count"] == 5 and all(f.startswith(LAYER) for f in out["layer_files"])
    # the round reaches the library: the defenses chosen (DCS², noise), the attack engine, FL, metrics
    for used in ("leakgym/defenses/dcs2.py", "leakgym/defenses/perturbation.py", "leakgym/attacks/engine/matching.py",
                 "leakgym/fl/server.py", "leakgym/metrics/scores.py"):
        assert used in out["files"], used
    assert "agents" not in " ".join(out["files"])  # the environment never calls into agents/


def test_the_traced_round_decodes_its_own_actions():
    """The warm-up plays other actions, so the traced round still builds its plan (a batch decodes each
    action pair once): the attack's module is entered."""
    out = trace_round("digits", [0, 0, 0, 0, 0, 0], [1, 0, 0, 0], **CHEAP)
    assert "leakgym/attacks/dlg.py" in out["files"]


def test_the_command_writes_json_and_markdown(tmp_path):
    path = tmp_path / "trace.json"
    assert main(["bench", "trace", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert rows[0]["layer_count"] == len(rows[0]["layer_files"]) and rows[0]["file_count"] >= rows[0]["layer_count"]
    assert "game/env layer" in path.with_suffix(".md").read_text()
    import torch  # the machine line names this process's torch threads (it said 1 whatever they were)

    assert f"{torch.get_num_threads()} torch thread(s)" in json.loads(path.read_text())["machine"]
    assert main(["bench", "trace", "--json", str(tmp_path / "t2.json"), "--defender", "1,x"]) == 2


def test_a_menu_of_one_strategy_is_traced_with_the_action_given(tmp_path):
    """Found in an audit: a scenario whose attacker menu has one strategy failed with "attacker action[0]
    (strategy) = 1; allowed range 0..0" though the traced action 0,0,0,0 is valid: the warm-up always changed
    the strategy. It changes the first dimension that has a second value (here the restarts)."""
    from pathlib import Path

    import leakgym

    text = (Path(leakgym.__file__).parent / "game" / "scenarios" / "digits.toml").read_text().splitlines()
    lines = [line for line in text if not line.startswith("gym_id")]
    lines = ['name = "onestrat"' if line.startswith("name =") else
             'strategy = ["inverting-gradients"]' if line.startswith("strategy =") else
             "iterations = [1]" if line.startswith("iterations =") else line for line in lines]
    scenario = tmp_path / "onestrat.toml"
    scenario.write_text("\n".join(lines) + "\n")
    path = tmp_path / "trace.json"
    assert main(["bench", "trace", "--scenario", str(scenario), "--json", str(path)]) == 0
    row = json.loads(path.read_text())["rows"][0]
    assert row["attacker_action"] == [0, 0, 0, 0] and row["warm_up_actions"]["attacker"] == [0, 0, 1, 0]
    assert not row["warm_up_is_traced_pair"]


def test_the_warm_up_pair_differs_from_the_traced_one_where_a_menu_allows():
    """The attacker's action changes in its first dimension with a second value; with none, the defender's
    changes where "no defense" is the traced one; with neither, the warm-up plays the traced pair."""
    import numpy as np

    from leakgym.bench.trace import warm_up_actions

    def warm(defender, attacker, nvec_d, nvec_a):
        out = warm_up_actions({"defender": np.array(defender), "attacker": np.array(attacker)},
                              {"defender": nvec_d, "attacker": nvec_a})
        return out["defender"].tolist(), out["attacker"].tolist()

    assert warm([1, 0], [0, 0], [3, 2], [4, 2]) == ([0, 0], [1, 0])
    assert warm([1, 0], [2, 1], [3, 2], [4, 2]) == ([0, 0], [0, 0])
    assert warm([1, 0], [0, 0], [3, 2], [1, 2]) == ([0, 0], [0, 1])
    assert warm([1, 0], [0, 0], [3, 2], [1, 1]) == ([0, 0], [0, 0])  # the defenders differ: another pair
    assert warm([0, 0], [0, 0], [1, 2], [1, 1]) == ([0, 1], [0, 0])
    assert warm([0, 0], [0, 0], [1, 1], [1, 1]) == ([0, 0], [0, 0])  # one pair in all: the traced one

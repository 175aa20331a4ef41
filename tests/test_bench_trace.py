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

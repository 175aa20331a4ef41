"""`leakgym describe`, `leakgym list presets`, one-line CLI errors and the generated env pages."""

from pathlib import Path

import pytest

from leakgym.cli import main
from leakgym.envs.describe import describe, env_page
from leakgym.envs.registration import registered_ids

DOCS = Path(__file__).resolve().parents[1] / "docs" / "envs"


def test_describe_lists_every_observation_entry_and_action_value():
    info = describe("LeakGym-Digits-v0")
    att = info["roles"]["attacker"]
    assert [d["name"] for d in att["actions"]] == ["strategy", "iterations", "restarts", "tv"]
    assert att["actions"][0]["values"][:2] == ["inverting-gradients", "dlg"]
    import gymnasium as gym

    env = gym.make("LeakGym-Digits-v0", role="defender")
    assert len(info["roles"]["defender"]["observation"]) == env.observation_space.shape[0]
    assert [d["name"] for d in info["roles"]["defender"]["actions"]][-2:] == ["oasis_major_rotation", "oasis_hflip"]


def test_describe_cli_prints_both_roles(capsys):
    assert main(["describe", "digits-malicious"]) == 0
    out = capsys.readouterr().out
    assert "action[1] num_bins" in out and "0=64, 1=128" in out and "defender: observation" in out


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["describe", "LeakGym-Digts-v0"], "did you mean 'LeakGym-Digits-v0'"),
        (["eval", "--env", "digits", "--attackers", "rando", "--defenders", "none"], "did you mean 'random'"),
        (["eval", "--env", "digits", "--attackers", "random", "--defenders", "none", "--overrides", "roundz=2"],
         "did you mean 'rounds'"),
    ],
)
def test_user_errors_are_one_line_with_exit_status_2(argv, expected, capsys, tmp_path):
    if argv[0] == "eval":
        argv = [*argv, "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("leakgym: error: ") and expected in err and "\n" not in err


def test_list_presets_says_role_source_and_whether_the_env_allows_it(capsys):
    assert main(["list", "presets", "--env", "LeakGym-Digits-v0"]) == 0
    out = capsys.readouterr().out
    ppp = next(line for line in out.splitlines() if line.strip().startswith("ppp-ng2"))
    assert " no (" in ppp and "PPP" in ppp
    dcs2 = next(line for line in out.splitlines() if line.strip().startswith("dcs2-paper"))
    assert " yes " in dcs2 and "DCS²" in dcs2
    assert "attacker presets" in out and "defender presets" in out


def test_env_pages_are_generated_from_the_scenario_files():
    """docs/envs/ is what `leakgym describe --write-docs docs/envs` writes: it cannot drift."""
    from leakgym.docgen import env_page_full, environments_index, offline

    for gym_id in registered_ids():
        page = DOCS / f"{gym_id}.md"
        assert page.is_file(), f"missing {page}; run `leakgym describe --write-docs docs/envs`"
        assert page.read_text() == env_page_full(gym_id, offline(gym_id)), (
            f"{page} is stale; run `leakgym describe --write-docs docs/envs`")
        assert env_page(gym_id).split("\n", 1)[1].split("## Rewards")[0].strip() in page.read_text()
    assert (DOCS / "index.md").read_text() == environments_index()


@pytest.mark.parametrize("argv", [["eval"], ["train"], ["selfplay"], ["bench", "env"], ["bench", "attacks"]])
def test_every_long_command_takes_a_device(argv):
    from leakgym.cli import build_parser

    # (the name is checked against this machine's devices, so the test names one every machine has)
    assert build_parser().parse_args([*argv, "--device", "cpu"]).device == "cpu"

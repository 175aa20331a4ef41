"""Files read back by ``--resume`` (found in an audit): ``leakgym metagame``'s ``metagame.json`` is checked field
by field and its members' policy files by their hashes when the state is opened, before anything is rewritten;
``leakgym eval``'s saved last rounds that the gallery cannot show are ignored (the gallery leaves their pair out).
"""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest

from leakgym.agents.experiments.evaluation import episode_log as el
from leakgym.agents.experiments.evaluation.payoff import (
    METRICS,
    EpisodeStats,
    LastRound,
    PairResult,
    PayoffTable,
)
from leakgym.agents.experiments.evaluation.reporting import write_outputs
from leakgym.agents.experiments.metagame import CellSamples, Member, run_psro
from leakgym.agents.experiments.metagame.psro import STATE_FILE
from leakgym.agents.experiments.metagame.simulation import policy_sha256
from leakgym.cli import main as cli_main

# ---------------------------------------------------------------------------------------------- metagame
A = np.array([[1.0, -1.0], [-1.0, 1.0]])  # matching pennies: rows attackers, columns defenders
EPISODES = 2


class MatrixSimulator:
    """Payoffs of ``A`` (zero-sum), each member's row/column by ``index``, two different episodes per cell."""

    def __init__(self, index):
        self.index = index

    def play(self, attackers, defenders, tag):
        out = {}
        for a in attackers:
            for d in defenders:
                v = A[self.index[a.name], self.index[d.name]]
                values = {"attacker_return": [v, v + 0.5], "defender_return": [-v, -v - 0.5],
                          "leakage_ssim": [0.5, 0.25], "leakage_psnr": [12.0, 9.0], "accuracy": [0.5, 0.5]}
                out[(a.name, d.name)] = CellSamples(values, EPISODES)
        return out


class FileOracle:
    """The best pure strategy of ``A``, saved as a policy file pair (``.zip`` and ``.json``) with its hash."""

    def __init__(self, out, index):
        self.out, self.index = out, index

    def best_response(self, role, opponents, mixture, *, iteration, name):
        idx = [self.index[m.name] for m in opponents]
        u = A[:, idx] @ mixture if role == "attacker" else -(mixture @ A[idx, :])
        self.index[name] = int(np.argmax(u))
        folder = self.out / "policies" / name
        folder.mkdir(parents=True)
        (folder / "policy.zip").write_bytes(f"{name} {self.index[name]}".encode())
        (folder / "policy.json").write_text("{}")
        return Member(name, str(folder / "policy.zip"), iteration, policy_sha256(folder / "policy.zip")), 0


def _run(out, resume=False):
    index = {"a0": 0, "d0": 0, "psro-attacker-1": 1, "psro-defender-1": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_psro(out, settings={"episodes": EPISODES}, resume=resume,
                        initial={"attacker": [Member("a0", "a0")], "defender": [Member("d0", "d0")]},
                        simulator=MatrixSimulator(index), oracle=FileOracle(out, index), iterations=1)


@pytest.fixture
def finished(tmp_path):
    """A finished PSRO run of one iteration (its best responses saved as policy files)."""
    out = tmp_path / "run"
    state = _run(out)
    assert state.status == "finished" and len(state.populations["attacker"]) == 2
    return out


def _edit(out, change):
    path = out / STATE_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, allow_nan=True))
    return path.read_bytes()


def _cell(d):
    return d["cells"][0]


def _set(field, value, cell=0, episode=0):
    def change(d):
        d["cells"][cell][field][episode] = value
    return change


MALFORMED = {
    # found in an audit: "12" was read as the two episodes 1.0 and 2.0
    "a string of digits": (lambda d: _cell(d).update(attacker_return="12"),
                           r"cells\[0\] \(a0, d0\)\.attacker_return = '12'; allowed: a non-empty list"),
    "a string value": (_set("attacker_return", "1"), r"attacker_return\[0\] = '1'; allowed: a number"),
    "a boolean value": (_set("defender_return", True), r"defender_return\[0\] = True; allowed: a number"),
    # an SSIM of 7 was accepted
    "an SSIM out of range": (_set("leakage_ssim", 7.0),
                             r"leakage_ssim\[0\] = 7\.0 is outside its range \[-1\.0, 1\.0\]"),
    "an accuracy out of range": (_set("accuracy", -0.5), r"accuracy\[0\] = -0\.5 is outside its range \[0\.0, 1\.0\]"),
    # a return of 1e300 was accepted, and payoff.csv held 5e+299,-inf,inf
    "a return too large for its interval": (_set("attacker_return", 1e300),
                                            r"attacker_return = \[1e\+300, .*not finite numbers"),
    "a NaN spelled out": (_set("attacker_return", math.nan), r"attacker_return\[0\] = nan is not a finite number"),
    "an infinite value": (_set("leakage_psnr", math.inf), r"leakage_psnr\[0\] = inf is not a finite number"),
    "an undefined payoff": (_set("attacker_return", None), r"attacker_return\[0\] = None; allowed: a number$"),
    # a member listed twice was accepted (a fresh run refuses it)
    "a member twice": (lambda d: d["populations"]["attacker"].append(dict(d["populations"]["attacker"][0])),
                       r"the attacker population names \['a0'\] twice"),
    # found in an audit: an AttributeError, and a KeyError, as raw tracebacks
    "settings that are a list": (lambda d: d.update(settings=["x"]), r"settings = \['x'\]; allowed: an object"),
    "a cell without a metric": (lambda d: _cell(d).pop("attacker_return"), r"\(a0, d0\) has no attacker_return"),
    "pending that is a list": (lambda d: d.update(pending=[1]), r"pending = \[1\]; allowed: an object"),
    "a member that is a list": (lambda d: d["populations"].update(attacker=[["a0"]]),
                                r"populations\.attacker\[0\] = \['a0'\]; allowed: an object"),
    "a cell twice": (lambda d: d["cells"].append(dict(d["cells"][0])), r"\(a0, d0\) is there twice"),
    "a short metric": (lambda d: _cell(d)["accuracy"].pop(), r"different episode counts"),
    "other episode counts": (lambda d: [c[m].append(0.5) for c in d["cells"] for m in c if isinstance(c[m], list)],
                             r"its cells have 3 episodes, its settings 2"),
    "negative rounds": (lambda d: _cell(d).update(rounds=-1), r"\(a0, d0\)\.rounds = -1; allowed: integers >= 0"),
    "negative env steps": (lambda d: d.update(env_steps=-5), r"env_steps = -5; allowed: integers >= 0"),
    "an iteration record that is a number": (lambda d: d.update(iterations=[5]), r"iterations\[0\] = 5"),
    "an unknown status": (lambda d: d.update(status="done"), r"status = 'done'; allowed: running, interrupted"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_metagame_state_is_refused_in_one_line_before_it_is_rewritten(finished, case):
    change, message = MALFORMED[case]
    before = _edit(finished, change)
    with pytest.raises(ValueError) as exc:
        _run(finished, resume=True)
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith(f"{finished / STATE_FILE} is not a metagame state file: "), text
    assert re.search(message, text), text
    assert (finished / STATE_FILE).read_bytes() == before  # nothing rewritten


def test_an_undefined_leakage_value_is_read_as_nan_and_a_sound_state_resumes(finished):
    """The state file writes a non-finite value as null (json_safe): a metric other than the payoffs may be
    undefined, as an empty field in leakgym eval's episodes.csv."""
    _edit(finished, _set("leakage_ssim", None))
    state = _run(finished, resume=True)
    assert state.status == "finished" and math.isnan(state.game.cells[("a0", "d0")].values["leakage_ssim"][0])


@pytest.mark.parametrize("member", ["psro-defender-1", "psro-attacker-1"])
def test_a_changed_policy_file_is_refused_when_a_finished_run_is_opened(finished, member):
    """Found in an audit: the hash was checked only when a member played, so resuming a finished run with the
    same --iterations rewrote its reports from a changed policy file without a word."""
    policy = finished / "policies" / member / "policy.json"
    policy.write_text(policy.read_text() + " ")
    before = (finished / STATE_FILE).read_bytes()
    with pytest.raises(ValueError, match=rf"changed since their members joined the population: '{member}' "
                                         rf"\(.*policies/{member}/policy\.zip: sha256 [0-9a-f]{{12}}\.\.\., recorded"):
        _run(finished, resume=True)
    assert (finished / STATE_FILE).read_bytes() == before
    policy.write_text(policy.read_text()[:-1])  # restored: resumes
    assert _run(finished, resume=True).status == "finished"


def test_a_policy_without_its_json_is_named_as_not_there(finished):
    policy = finished / "policies" / "psro-defender-1" / "policy.json"
    policy.unlink()
    with pytest.raises(ValueError, match=r"names policy files that are not there: .*psro-defender-1/policy\.json"):
        _run(finished, resume=True)


# ---------------------------------------------------------------------------------------------- eval
DIGITS = {"env_id": "LeakGym-Digits-v0", "scenario": "digits", "attackers": ["A1", "A2"], "defenders": ["D1"],
          "episodes": 2, "seed": 7, "overrides": {"rounds": 1}}


def _pair(attacker, originals):
    n = len(originals)
    episodes = [EpisodeStats({m: 0.25 for m in METRICS}, 1) for _ in range(2)]
    return PairResult(attacker, "D1", episodes, LastRound(originals, 1 - originals, np.full(n, 0.5), np.full(n, 12.0),
                                                          np.arange(n) % 10))


# found in an audit: 5 channels failed in the gallery after the payoff files were rewritten, 0 images failed
# there too ("Number of rows must be a positive integer"), and 64 x 64 images were shown for 16-pixel digits
UNSHOWABLE = {
    "5 channels": np.zeros((1, 5, 16, 16), np.float32),
    "0 images": np.zeros((0, 1, 16, 16), np.float32),
    "64 x 64 images in the 16-pixel scenario": np.zeros((1, 1, 64, 64), np.float32),
    "3 channels in the grey scenario": np.zeros((1, 3, 16, 16), np.float32),
    "0 x 0 pixels": np.zeros((1, 1, 0, 0), np.float32),
}


@pytest.mark.parametrize("case", list(UNSHOWABLE))
def test_a_saved_last_round_the_gallery_cannot_show_is_ignored_on_resume(tmp_path, case):
    log = el.EpisodeLog.open(tmp_path, DIGITS, resume=False)
    log.append(_pair("A1", np.full((2, 1, 16, 16), 0.25, np.float32)))
    log.append(_pair("A2", UNSHOWABLE[case]))
    resumed = el.EpisodeLog.open(tmp_path, DIGITS, resume=True)
    assert set(resumed.finished) == {("A1", "D1"), ("A2", "D1")}  # the pair's rows still count
    assert resumed.finished[("A1", "D1")].last_round is not None
    assert resumed.finished[("A2", "D1")].last_round is None


def _table(pairs):
    return PayoffTable(env_id="LeakGym-Digits-v0", scenario="digits", attackers=[p.attacker for p in pairs],
                       defenders=["D1"], pairs=pairs, seed=7, overrides={}, episodes=2)


def test_the_gallery_leaves_out_a_pair_it_cannot_show(tmp_path):
    good, bad = _pair("A1", np.full((2, 1, 16, 16), 0.25, np.float32)), _pair("A2", UNSHOWABLE["5 channels"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (few episodes)
        paths = write_outputs(_table([good, bad]), tmp_path / "both")
    assert (tmp_path / "both" / "gallery.png").is_file() and "gallery.png" in paths
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = write_outputs(_table([bad]), tmp_path / "bad")
    assert any("gallery.png not written" in str(w.message) for w in caught)
    assert "gallery.png" not in paths and (tmp_path / "bad" / "payoff.csv").is_file()


def test_eval_resume_with_a_five_channel_last_round_writes_every_table(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["eval", "--env", "LeakGym-Digits-v0", "--attackers", "random", "--defenders", "none", "--episodes", "1",
            "--out", str(out), "--no-progress", "--overrides", "rounds=1", "num_clients=1", "iterations=[1]",
            "eval_size=16"]
    assert cli_main(args) == 0
    path = next((out / el.LAST_ROUND_DIR).glob("*.npz"))
    with np.load(path) as data:
        arrays = dict(data)
    arrays.update(originals=np.zeros((1, 5, 16, 16), np.float32), matched=np.zeros((1, 5, 16, 16), np.float32),
                  ssim=np.zeros(1), psnr=np.zeros(1))
    arrays.pop("labels", None)
    np.savez(path, **arrays)
    (out / "gallery.png").unlink()
    capsys.readouterr()
    assert cli_main([*args, "--resume"]) == 0, capsys.readouterr().err
    assert (out / "payoff.csv").is_file() and not (out / "gallery.png").exists()

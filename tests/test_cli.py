"""The `leakgym` command line: listing and argument errors."""

import pytest

from leakgym.cli import build_parser, main


def test_list_names_every_catalogue(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for needle in ("digits", "lenet", "inverting-gradients", "imprint", "censor", "dcs2",
                   "LeakGym-Digits-v0", "LeakGym-CIFAR-v0", "dcs2-paper", "round-robin"):
        assert needle in out


def test_subcommands_are_wired():
    parser = build_parser()
    for argv in (["demo"], ["eval", "--env", "LeakGym-Digits-v0"], ["bench", "attacks", "--json", "x.json"],
                 ["bench", "defenses"], ["bench", "env", "--json", "x.json"], ["reproduce", "dcs2"],
                 ["train", "--env", "LeakGym-Digits-v0"], ["selfplay", "--env", "LeakGym-Digits-v0"]):
        assert callable(parser.parse_args(argv).func)


def test_unknown_subcommand_is_an_argparse_error():
    with pytest.raises(SystemExit):
        main(["frobnicate"])


@pytest.mark.parametrize("argv, message", [
    (["eval", "--device", "cuda:7"], "argument --device: device='cuda:7' is not available on this machine"),
    (["eval", "--device", "bogus"], "argument --device: device='bogus' is not a torch device name"),
    (["eval", "--seed", "-1"], "argument --seed: -1; allowed: integers >= 0"),
    (["selfplay", "--device", "bogus"], "argument --device: device='bogus'"),
])
def test_device_and_seed_are_checked_before_anything_runs(tmp_path, capsys, argv, message):
    """Checked by the parser: an earlier run in --out is not touched (the log used to be reopened first)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "episodes.csv").write_text("earlier run\n")
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(out)])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert (out / "episodes.csv").read_text() == "earlier run\n"


@pytest.mark.parametrize("bench", ["env", "attacks", "eval"])
def test_bench_device_is_checked_by_the_parser(capsys, bench):
    """``leakgym bench ... --device cuda`` on a machine without it is an argparse error naming the
    value, as for eval/train/selfplay (it used to fail inside the measurement)."""
    with pytest.raises(SystemExit) as exc:
        main(["bench", bench, "--device", "bogus"])
    assert exc.value.code == 2 and "argument --device: device='bogus' is not a torch device name" in capsys.readouterr().err


def test_an_out_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    """OSErrors (an --out or docs folder that is a file) used to print a traceback."""
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert main(["describe", "--write-docs", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leakgym: error:") and "Traceback" not in err


def test_user_errors_print_their_whole_message(capsys, monkeypatch):
    """The CLI printed the first line only: a missing dataset's message lost where it looked and how to
    provide the files; a setting too large to allocate (DQN buffer_size=10**11) printed a traceback."""
    from pathlib import Path

    import leakgym.cli
    from leakgym.data.loading import DatasetUnavailableError

    def unavailable(args):
        raise DatasetUnavailableError("cifar10", [(Path("/nowhere/cifar-10-batches-py"), ["data_batch_1"])],
                                      "Download disabled.", "put the files into /nowhere")

    def too_big(args):
        raise MemoryError("Unable to allocate 5.82 TiB for an array with shape (99999999999, 16)")

    for fail, expected in ((unavailable, ["/nowhere/cifar-10-batches-py", "put the files into /nowhere"]),
                           (too_big, ["leakgym: error: not enough memory: Unable to allocate 5.82 TiB"])):
        monkeypatch.setattr(leakgym.cli, "_describe", fail)
        assert main(["describe"]) == 2
        err = capsys.readouterr().err
        assert all(text in err for text in expected) and "Traceback" not in err, err

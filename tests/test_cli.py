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

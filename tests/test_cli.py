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


@pytest.mark.parametrize("command", [["eval"], ["train"], ["selfplay"], ["metagame"], ["reproduce", "dcs2"], ["demo"]])
@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_by_the_parser(tmp_path, monkeypatch, capsys, command, out):
    """Found in an audit: --out '' is Path('') == the current directory, where eval wrote its files and train
    removed an earlier run's stale ones (an unset shell variable does it)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([*command, "--out", out])
    assert exc.value.code == 2 and f"argument --out: {out!r} names no folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("command", [["eval"], ["train"], ["selfplay"], ["metagame"], ["reproduce", "dcs2"], ["demo"]])
@pytest.mark.parametrize("inside", [False, True])
def test_an_out_with_a_file_in_its_way_is_refused_by_the_parser(tmp_path, capsys, command, inside):
    """An --out that is a file, or lies under one, was an OSError ("[Errno 17] File exists") once the command
    made its folder, after its other checks; reproduce alone refused it, in its own words."""
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    out = a_file / "run" if inside else a_file
    with pytest.raises(SystemExit) as exc:
        main([*command, "--out", str(out)])
    err = capsys.readouterr().err
    where = f"{str(out)!r}: {str(a_file)!r}" if inside else repr(str(out))
    assert exc.value.code == 2 and f"argument --out: {where} is a file, not a folder" in err, err
    assert a_file.read_text() == "x"


@pytest.mark.parametrize("kind", ["dangling", "loop", "inside-dangling", "too-long", "link-to-file"])
def test_an_out_through_a_broken_link_or_too_long_is_one_line(tmp_path, capsys, kind):
    """(review) A broken or looping link passed the file-in-the-way check (it does not exist as a folder or a
    file) and failed later with "[Errno 17] File exists"; a name past the file system's limit made the check
    itself raise, a traceback."""
    link = tmp_path / "link"
    (tmp_path / "afile").write_text("x")
    link.symlink_to(tmp_path / {"loop": "link", "link-to-file": "afile"}.get(kind, "nowhere"))
    out = {"inside-dangling": link / "run", "too-long": tmp_path / ("x" * 300)}.get(kind, link)
    try:
        code = main(["eval", "--out", str(out)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    if kind == "link-to-file":  # (a working link to a file is a file in the way, not a broken link)
        assert "/link' is a file, not a folder" in err, err
    elif kind != "too-long":
        assert "is a broken link, not a folder" in err, err

def test_demo_takes_the_resume_its_interrupt_message_asks_for(tmp_path, monkeypatch):
    """Found in an audit: Ctrl-C in `leakgym demo` said "run the same command with --resume" (eval's words),
    which demo refused as an unknown argument; it passes --resume on to its evaluation now."""
    import importlib

    evaluation = importlib.import_module("leakgym.agents.experiments.evaluation.cli")
    seen = []
    monkeypatch.setattr(evaluation, "main", lambda args: seen.append(args) or 0)
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    assert main(["demo", "--out", str(tmp_path / "d"), "--resume"]) == 0
    assert [a.resume for a in seen] == [False, True] and seen[1].out == tmp_path / "d"


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


def test_top_level_help_imports_no_subcommand_module():
    """``leakgym --help`` lists the subcommands without importing them (torch took ~5 s of it); the
    measured start-up time is in docs/cli.md, not asserted here."""
    import subprocess
    import sys

    code = ("import sys\nfrom leakgym.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'leakgym.agents.experiments.evaluation.cli', 'leakgym.bench.attacks', "
            "'leakgym.reproduce', 'leakgym.data') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "usage: leakgym" in done.stdout and "eval" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_subcommand_help_still_lists_its_arguments(capsys):
    """The lazily built subcommand parser loads its module's arguments for --help, too."""
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert "--attackers" in out and "--episodes EPISODES   episodes per pair (default: 3)" in out


def _option_helps():
    """(command, option, help as printed) for every option of every (sub)command."""
    import argparse

    from leakgym.cli import LazyParser

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    if isinstance(sub, LazyParser):
                        sub.load()
                    yield from walk(sub, f"{name} {sub_name}")
            elif action.option_strings and not isinstance(action, argparse._HelpAction):
                text = parser._get_formatter()._get_help_string(action) % {**vars(action), "prog": parser.prog}
                yield name, action.option_strings[-1], text

    return list(walk(build_parser(), "leakgym"))


def test_every_option_help_states_its_default():
    helps = _option_helps()
    assert len(helps) > 60  # every command's options were reached
    missing = [(cmd, opt, text) for cmd, opt, text in helps if "default" not in text.lower()]
    assert missing == []
    assert ("leakgym eval", "--out", "output folder (default: runs/eval)") in helps
    # a flag says on/off, an option whose help explains its default keeps that explanation alone
    assert ("leakgym eval", "--no-progress", "hide the progress bar (default: off)") in helps
    assert not [t for _, _, t in helps if "(default: None)" in t or t.lower().count("default:") > 1]


@pytest.mark.parametrize("argv, suggestion", [
    (["eval", "--env", "LeakGym-Digit-v0"], "(did you mean 'LeakGym-Digits-v0'?)"),
    (["train", "--env", "digit"], "(did you mean 'digits'?)"),
    (["eval", "--attackers", "ig-papr"], "(did you mean 'ig-paper'?)"),
    (["evl"], "invalid choice: 'evl' (did you mean 'eval'?)"),
    (["train", "--algo", "pp0"], "invalid choice: 'pp0' (did you mean 'ppo'?)"),
    (["train", "--hyperparams", "n_step=16"], "run settings (did you mean 'n_steps'?)"),
    (["train", "--opponent", "dcs2-papr"], "(did you mean 'dcs2-paper'?)"),
    (["eval", "--overrides", "rondus=2"], "(did you mean 'rounds'?)"),
    (["reproduce", "dcs3"], "invalid choice: 'dcs3' (did you mean 'dcs2'?)"),
    (["bench", "attacks", "--models", "lenett"], "(did you mean 'lenet'?)"),
    (["bench", "defenses", "--model", "lenett"], "--model='lenett' (did you mean 'lenet'?)"),
    (["bench", "defenses", "--defenses", "PPP-NG4"], "(did you mean 'PPP-NG"),
])
def test_a_mistyped_name_is_one_line_with_a_suggestion(tmp_path, capsys, argv, suggestion):
    if argv[0] in ("eval", "train"):
        argv = [*argv, "--out", str(tmp_path / "run")]
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("leakgym") and ": error: " in err and suggestion in err, err


@pytest.mark.parametrize("call, suggestion", [
    ("leakgym.models:build_model('lenett', None)", "'lenet'"),
    ("leakgym.data.catalog:dataset_info('mnsit')", "'mnist'"),
    ("leakgym.attacks:build_attack('dgl')", "'dlg'"),
    ("leakgym.defenses.config:DefenseConfig.preset('guassian')", "'gaussian'"),
    ("leakgym.defenses.config:DefenseConfig(mixup_kk=2)", "'mixup_k'"),
    ("leakgym.reproduce:paper_spec('oasiss')", "'oasis'"),
])
def test_library_name_errors_suggest_the_closest_name(call, suggestion):
    import importlib

    module, expression = call.split(":")
    with pytest.raises(ValueError, match="did you mean " + suggestion.replace("(", r"\(")):
        eval(expression, vars(importlib.import_module(module)))


def test_a_bad_yaml_override_is_one_line(tmp_path, capsys):
    assert main(["eval", "--overrides", "rounds=[1,2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "override 'rounds=[1,2': cannot parse the value as YAML" in err, err
    assert "line 1, column 5" in err


def test_a_bad_yaml_hyperparameter_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text("LeakGym-Digits-v0:\n  n_steps: [1,\n")
    assert main(["train", "--hyperparams", str(bad), "--timesteps", "8", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"hyperparameter file {str(bad)!r}: not valid YAML (" in err, err


@pytest.mark.parametrize("where", ["too-long", "proc-missing", "proc"])
@pytest.mark.parametrize("argv", [["bench", "trace", "--json", "{}/y.json"], ["bench", "attacks", "--json", "{}/y.json"],
                                  ["eval", "--episodes", "1", "--out", "{}/y"]])
def test_a_run_folder_that_cannot_be_made_is_refused_naming_the_flag(tmp_path, capsys, where, argv):
    """Found in an audit: the run-folder lock made the folder before the command's own output check, so
    ``--json /proc/x/y.json`` was "[Errno 2] No such file or directory: '/proc/x'", ``--json /proc/y.json`` a
    message about the lock file, ``--out /proc/x/y`` the same: none named the flag."""
    import os

    if where.startswith("proc") and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc on this platform")
    parent = {"too-long": str(tmp_path / ("x" * 300)), "proc-missing": "/proc/x", "proc": "/proc"}[where]
    argv = [a.format(parent) for a in argv]
    flag = argv[-2]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"leakgym: error: {flag}={argv[-1]!r}: cannot write there (") and err.count("\n") == 1, err
    assert "allowed: a " in err and not any(tmp_path.iterdir())


def test_the_run_folder_check_leaves_no_folder_when_the_command_refuses(tmp_path, capsys):
    """The check makes the missing folders and removes them; the command's own refusal then leaves none."""
    assert main(["bench", "attacks", "--json", str(tmp_path / "a" / "b" / "x.json"), "--ns", "0"]) == 2
    assert "--ns entry '0'" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_a_run_folder_through_a_broken_link_is_named_as_one(tmp_path, capsys):
    """Found in a review: a --json under a broken link was "cannot write there (File exists)"."""
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    json_path = str(tmp_path / "dangling" / "r.json")
    assert main(["bench", "trace", "--json", json_path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"leakgym: error: --json={json_path!r}: {str(tmp_path / 'dangling')!r} is a broken link")


def test_two_run_folder_checks_at_once_do_not_refuse_each_other(tmp_path, monkeypatch):
    """Found in a review: one command's check removed the new folder it had made while another's check was
    writing in it, and the other was refused ("cannot write there (No such file or directory)"). Here the
    other command's removal happens between this check's two calls, every time but the last."""
    import tempfile

    from leakgym import cli

    real = tempfile.NamedTemporaryFile
    calls = []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) < 3:
            (tmp_path / "new").rmdir()  # the other command's clean-up
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", racing)
    assert cli.check_run_folder(tmp_path / "new", "--out", str(tmp_path / "new")) and len(calls) == 3


def test_a_ctrl_c_while_the_command_is_parsed_ends_without_a_traceback(monkeypatch, capsys):
    """Parsing imports the subcommand's module (torch among them): an interrupt there printed a traceback
    through importlib (found in an audit); it ends as one anywhere else does, status 130."""
    from leakgym import cli

    class Interrupted:
        def parse_args(self, argv):
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", lambda: Interrupted())
    assert cli.main(["eval", "--out", "x"]) == 130
    assert capsys.readouterr().err == "leakgym eval: interrupted\n"

"""`leakgym bench defenses` with tiny settings: JSON schema, markdown table, and that the PRECODE rows
train a model where PRECODE learns, compared with an undefended row of that same model."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from leakgym.bench import defenses as bench


def _args(tmp_path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--json", str(tmp_path / "bench.json"), "--no-progress", *extra])


def test_bench_defenses_tiny_run_writes_json_and_markdown(tmp_path):
    args = _args(tmp_path, "--defenses", "none,gaussian,PPP-NG1",
                 "--rounds", "2", "--clients", "2", "--batch-size", "4", "--victim-batch", "2",
                 "--attack-rounds", "2", "--attack-iterations", "2", "--eval-every", "1", "--eval-size", "32")
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    settings = result["settings"]
    assert result["benchmark"] == "defenses" and settings["attack_rounds"] == [0, 1]
    assert (settings["precode_model"], settings["precode_width"], settings["precode_lr"]) == ("mlp", 128, 0.1)
    rows = result["results"]
    # The PRECODE row's own undefended baseline is inserted before it.
    assert [(r["defense"], r["model"], r["precode"]) for r in rows] == [
        ("none", "lenet", False), ("gaussian", "lenet", False), ("none", "mlp", False), ("PPP-NG1", "mlp", True)]
    for r in rows:
        assert {"setting", "accuracy", "test_loss", "accuracy_curve", "fidelity", "overhead_ms", "wall_s",
                "ssim", "psnr", "leakage", "applied", "precode", "model", "width", "lr", "baseline",
                "delta_acc"} <= set(r)
        assert 0.0 <= r["accuracy"] <= 1.0 and len(r["accuracy_curve"]) == 2
        assert len(r["leakage"]) == 2 and all(math.isfinite(s["ssim"]) for s in r["leakage"])
    assert rows[0]["fidelity"] == 1.0 and rows[0]["applied"] == []
    assert rows[1]["baseline"]["model"] == "lenet" and rows[3]["baseline"] == {
        "defense": "none", "model": "mlp", "width": 128, "lr": 0.1}
    assert rows[3]["delta_acc"] == pytest.approx(100 * (rows[3]["accuracy"] - rows[2]["accuracy"]))
    md = (tmp_path / "bench.md").read_text()
    assert "| defense | model | setting | accuracy |" in md
    assert "| PPP-NG1 | mlp-128, lr 0.1 + PRECODE | ppp=ng |" in md and "| none | mlp-128, lr 0.1 | - |" in md
    assert "| none | lenet | - |" in md


def test_bench_precode_rows_train_above_chance_next_to_their_own_baseline(tmp_path):
    """With the default PRECODE model the PRECODE row learns (the PRECODE LeNet stays at 10%) and loses
    little against the undefended row of the same architecture; its leakage is measured by the same
    attack at the same rounds as the other rows."""
    args = _args(tmp_path, "--defenses", "none,precode", "--rounds", "30", "--clients", "2",
                 "--attack-rounds", "1", "--attack-iterations", "2", "--eval-every", "30", "--eval-size", "200")
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    pre = next(r for r in result["results"] if r["defense"] == "precode")
    assert pre["precode"] and pre["accuracy"] >= 0.5, f"PRECODE row at {pre['accuracy']:.0%}: near chance (10%)"
    rows = {(r["defense"], r["model"]): r for r in result["results"]}
    assert set(rows) == {("none", "lenet"), ("none", "mlp"), ("precode", "mlp")}
    base = rows[("none", "mlp")]
    assert not base["precode"] and pre["lr"] == base["lr"] and pre["width"] == base["width"]
    assert pre["baseline"]["model"] == "mlp"
    assert pre["delta_acc"] == pytest.approx(100 * (pre["accuracy"] - base["accuracy"]))
    assert abs(pre["delta_acc"]) <= 15.0
    assert result["settings"]["attack"] == "inverting-gradients"
    assert [s["round"] for s in pre["leakage"]] == [s["round"] for s in rows[("none", "lenet")]["leakage"]] == [0]


def test_delta_acc_is_against_the_same_architecture():
    def rec(defense, model, width, lr, precode, acc):
        return {"defense": defense, "model": model, "width": width, "lr": lr, "precode": precode, "accuracy": acc,
                "model_label": bench.Setup(model, width, lr, precode).label(0.5), "setting": "-",
                "bench_override": {}, "ssim": 0.1, "psnr": 7.0, "fidelity": 1.0, "overhead_ms": 0.0}

    records = [rec("none", "lenet", None, 0.5, False, 0.76), rec("gaussian", "lenet", None, 0.5, False, 0.75),
               rec("none", "mlp", 128, 0.1, False, 0.98), rec("precode", "mlp", 128, 0.1, True, 0.97),
               rec("PPP-NG1", "mlp", 64, 0.1, True, 0.90)]
    md = bench.markdown_table(records, {"image_size": 16, "rounds": 100, "clients": 4, "batch_size": 16,
                                        "victim_batch": 4, "lr": 0.5, "model": "lenet", "precode_model": "mlp",
                                        "precode_width": 128, "precode_lr": 0.1, "all_clients": False,
                                        "attack_iterations": 200, "attack_rounds": [0, 50, 99]})
    assert records[1]["delta_acc"] == pytest.approx(-1.0) and records[3]["delta_acc"] == pytest.approx(-1.0)
    assert records[3]["baseline"]["model"] == "mlp"
    assert records[4]["baseline"] is None and records[4]["delta_acc"] is None  # no mlp-64 baseline: no Δ
    assert "| precode | mlp-128, lr 0.1 + PRECODE | - | 97.0% | -1.0 |" in md
    assert "| PPP-NG1 | mlp-64, lr 0.1 + PRECODE | - | 90.0% |  |" in md


@pytest.mark.parametrize(("utility", "lpips"), [("victim", None), ("both", None), ("victim", "alex")])
def test_a_failed_row_has_as_many_cells_as_the_header(utility, lpips):
    """Found in an audit: a failed row's blanks were one cell short of the header in every layout."""
    ok = {"defense": "none", "model": "lenet", "width": None, "lr": 0.5, "precode": False, "model_label": "lenet",
          "setting": "-", "bench_override": {}, "accuracy": 0.5, "accuracy_all": 0.5, "fidelity": 1.0,
          "overhead_ms": 0.0, "ssim": 0.1, "psnr": 7.0}
    bad = {"defense": "gaussian", "model": "lenet", "width": None, "lr": 0.5, "precode": False, "model_label": "lenet",
           "error": "RuntimeError: boom"}
    settings = {"all_clients": False, "utility": utility, "lpips": lpips, "image_size": 16, "rounds": 1, "clients": 2,
                "batch_size": 4, "victim_batch": 1, "model": "lenet", "lr": 0.5, "attack_iterations": 1,
                "attack_rounds": [0]}
    rows = [line for line in bench.markdown_table([ok, bad], settings).splitlines() if line.startswith("|")]
    assert len({row.count("|") for row in rows}) == 1, rows


@pytest.mark.parametrize(("all_clients", "utility", "who"), [
    (False, "all", "applied by every client."), (True, "all", "applied by every client."),
    (False, "victim", "applied by the victim (client 0) only."),
    (False, "both", "applied by the victim (client 0) only in `accuracy` (and leakage), by every client in")])
def test_the_header_names_who_applied_the_defense(all_clients, utility, who):
    """Found in an audit: ``--utility all`` (without ``--all-clients``) trained every client defended, and the
    header said the victim alone had applied the defense."""
    row = {"defense": "none", "model": "lenet", "width": None, "lr": 0.5, "precode": False, "model_label": "lenet",
           "setting": "-", "bench_override": {}, "accuracy": 0.5, "accuracy_all": 0.5, "fidelity": 1.0,
           "overhead_ms": 0.0, "ssim": 0.1, "psnr": 7.0}
    settings = {"all_clients": all_clients, "utility": utility, "image_size": 16, "rounds": 1, "clients": 2,
                "batch_size": 4, "victim_batch": 1, "model": "lenet", "lr": 0.5, "attack_iterations": 1,
                "attack_rounds": [0]}
    assert f"defense {who}" in bench.markdown_table([row], settings)


def test_plan_puts_precode_rows_on_the_ppp_reproduction_model():
    from leakgym.reproduce.ppp import SCALES

    small = SCALES["small"]["B=1"]
    assert (bench.PRECODE_MODEL, bench.PRECODE_WIDTH, bench.PRECODE_LR) == (
        small.model, small.model_width, small.utility_lr)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    plan = bench.plan(["none", "gaussian", "precode", "PPP-GC90"], parser.parse_args([]))
    assert [(n, s.model, s.width, s.lr, s.precode) for n, s in plan] == [
        ("none", "lenet", None, 0.5, False), ("gaussian", "lenet", None, 0.5, False),
        ("none", "mlp", 128, 0.1, False), ("precode", "mlp", 128, 0.1, True), ("PPP-GC90", "mlp", 128, 0.1, True)]
    # The old setting on request: PRECODE on the main LeNet, compared with the main `none` row.
    old = bench.plan(["none", "precode"], parser.parse_args(["--precode-model", "lenet", "--precode-width", "0",
                                                              "--precode-lr", "0.5"]))
    assert [(n, s.model, s.width, s.precode) for n, s in old] == [("none", "lenet", None, False),
                                                                ("precode", "lenet", None, True)]


def test_bench_rejects_unknown_defense_names(tmp_path):
    args = _args(tmp_path, "--defenses", "none,bogus")
    with pytest.raises(ValueError, match=r"unknown name\(s\) \['bogus'\]"):
        bench.main(args)
    with pytest.raises(ValueError, match=r"--precode-model='vgg'"):
        bench.main(_args(tmp_path, "--precode-model", "vgg"))
    assert bench.attack_rounds(100, 3) == [0, 50, 99] and bench.attack_rounds(5, 0) == []


def _strict(constant):
    raise ValueError(f"non-finite number {constant} in JSON")


@pytest.mark.parametrize(("extra", "message"), [
    (["--eval-size", "0"], "--eval-size=0"),
    (["--eval-size", "-300"], "--eval-size=-300"),
])
def test_bench_defenses_rejects_bad_eval_size_before_training(tmp_path, monkeypatch, extra, message):
    monkeypatch.setattr(bench, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(ValueError, match=message):
        bench.main(_args(tmp_path, *extra))


def test_bench_defenses_unwritable_output_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    (tmp_path / "file").write_text("x")
    args = _args(tmp_path, "--defenses", "none")
    args.json = tmp_path / "file" / "bench.json"
    with pytest.raises(ValueError, match="--json="):
        bench.main(args)
    args = _args(tmp_path, "--defenses", "none", "--markdown", str(tmp_path / "file" / "t.md"))
    with pytest.raises(ValueError, match="--markdown="):
        bench.main(args)
    # the table replaced the JSON: both paths the same file, given or by --json ending in .md
    args = _args(tmp_path, "--defenses", "none", "--markdown", str(tmp_path / "bench.json"))
    with pytest.raises(ValueError, match=r"--markdown=.*is the --json file"):
        bench.main(args)
    args = _args(tmp_path, "--defenses", "none")
    args.json = tmp_path / "bench.md"
    with pytest.raises(ValueError, match=r"--json=.*bench.md'.*its markdown table goes to the same path"):
        bench.main(args)


def test_bench_defenses_records_the_machine_and_writes_atomically(tmp_path, monkeypatch):
    """Its timings (wall_s, overhead_ms) said nothing of where they were measured, and a Ctrl-C while the
    JSON was rewritten after a row left a truncated file (losing the rows before it too)."""
    import leakgym.bench.defenses as module

    written = []
    monkeypatch.setattr(module, "write_atomically", lambda path, data: written.append(path))
    assert bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0")) == 0
    assert tmp_path / "bench.json" in written and tmp_path / "bench.md" in written
    monkeypatch.undo()
    bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0"))
    machine = json.loads((tmp_path / "bench.json").read_text())["settings"]["machine"]
    assert "cores" in machine and "torch thread(s)" in machine and machine.endswith("device cpu")


TINY = ("--rounds", "2", "--clients", "2", "--batch-size", "4", "--victim-batch", "2", "--attack-iterations", "1",
        "--eval-every", "1", "--eval-size", "16")


def test_bench_defenses_without_attacks_writes_null_and_dash(tmp_path):
    assert bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0")) == 0
    result = json.loads((tmp_path / "bench.json").read_text(), parse_constant=_strict)
    (row,) = result["results"]
    assert result["complete"] is True and row["ssim"] is None and row["psnr"] is None and row["leakage"] == []
    assert "| none | lenet | - |" in (tmp_path / "bench.md").read_text()
    assert "| - | - | 1.000 |" in (tmp_path / "bench.md").read_text() and "nan" not in (tmp_path / "bench.md").read_text()


def test_bench_defenses_ctrl_c_keeps_the_trained_rows(tmp_path, monkeypatch, capsys):
    real = bench.run_defense
    calls = []

    def second_interrupts(name, *a, **k):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(name, *a, **k)

    monkeypatch.setattr(bench, "run_defense", second_interrupts)
    assert bench.main(_args(tmp_path, "--defenses", "none,gaussian,prune", *TINY)) == 130
    result = json.loads((tmp_path / "bench.json").read_text(), parse_constant=_strict)
    assert result["complete"] is False and [r["defense"] for r in result["results"]] == ["none"]
    assert result["results"][0]["ssim"] is None and result["results"][0]["accuracy"] >= 0
    md = (tmp_path / "bench.md").read_text()
    assert "| none | lenet | - |" in md and "gaussian" not in md and "Partial results" in md
    assert "interrupted: 1 of 3 rows" in capsys.readouterr().err


# --- --device / --threads, --image-size against the models' minimum, --seed range -----------------------------

def _no_training(monkeypatch):
    """Fail the test if anything is trained or loaded: the argument checks must come first."""
    import leakgym.data

    monkeypatch.setattr(bench, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    monkeypatch.setattr(leakgym.data, "load_dataset", lambda *a, **k: pytest.fail("loaded data before the check"))


def _bad_parse(tmp_path, capsys, *extra: str) -> str:
    """The argparse error of ``extra`` (exit status 2), as printed."""
    with pytest.raises(SystemExit) as exc:
        _args(tmp_path, *extra)
    assert exc.value.code == 2
    return capsys.readouterr().err


def _tiny_run_on(tmp_path, monkeypatch, device: str) -> dict:
    """A tiny run on ``device``; checks that the batches' generator, the data, the models, the defenses' and
    the attacks' tensors were all on it, and that the JSON and the table name it."""
    import torch

    import leakgym.data
    import leakgym.defenses
    from leakgym.bench import device_label
    from leakgym.devices import canonical_device

    where = canonical_device(device)
    seen: list = []
    real_apply, real_attack, real_randperm = leakgym.defenses.apply_defense, bench.attack_all, torch.randperm
    real_load = leakgym.data.load_dataset

    def apply_spy(model, x, y, config, **kwargs):
        seen.extend([("defense input", t) for t in (x, y, kwargs["public_x"], kwargs["public_y"])])
        seen.extend(("model", p) for p in model.parameters())
        upd, rep = real_apply(model, x, y, config, **kwargs)
        seen.extend(("shared update", t) for t in upd.tensors.values())
        return upd, rep

    def attack_spy(problems, args, spec, **kwargs):
        for _, _, upd, knowledge, orig in problems:
            seen.extend([("victim images", orig), ("known labels", knowledge.labels)])
            seen.extend(("attacked model", p) for p in knowledge.model.parameters())
        return real_attack(problems, args, spec, **kwargs)

    loading = []  # the dataset's fixed train/test split is drawn on the CPU while it loads (not a batch)

    def load_spy(*args, **kwargs):
        loading.append(True)
        try:
            return real_load(*args, **kwargs)
        finally:
            loading.pop()

    def randperm_spy(*args, generator=None, **kwargs):
        out = real_randperm(*args, generator=generator, **kwargs)
        if not loading:
            seen.append(("batch indices", out))
            assert generator is not None and generator.device == where, f"batch generator on {generator.device}"
        return out

    monkeypatch.setattr(leakgym.defenses, "apply_defense", apply_spy)
    monkeypatch.setattr(bench, "attack_all", attack_spy)
    monkeypatch.setattr(torch, "randperm", randperm_spy)
    monkeypatch.setattr(leakgym.data, "load_dataset", load_spy)
    args = _args(tmp_path, "--device", device, "--defenses", "none,gaussian,mixup,PPP-NG1", *TINY,
                 "--victim-batch", "4", "--attack-rounds", "1")  # (Mixup mixes k=4 images of the batch)
    assert bench.main(args) == 0
    monkeypatch.undo()
    kinds = {kind for kind, _ in seen}
    assert {"defense input", "model", "shared update", "victim images", "known labels", "batch indices"} <= kinds
    assert [(kind, t.device) for kind, t in seen if t.device != where] == []
    result = json.loads((tmp_path / "bench.json").read_text())
    label = device_label(where)
    assert result["settings"]["device"] == label and label.startswith(str(where))
    assert result["settings"]["machine"].endswith(f"device {label}")
    assert all("error" not in r and math.isfinite(r["ssim"]) for r in result["results"])
    assert f"Device: {label}." in (tmp_path / "bench.md").read_text()
    return result


def test_bench_defenses_takes_device_and_threads_like_the_other_benches(tmp_path, monkeypatch):
    """`leakgym bench defenses --device cpu` was refused ("unrecognized arguments"); the device was fixed to
    the CPU. Now the run is on --device, every tensor and generator there, and the device is recorded."""
    from leakgym.cli import build_parser

    args = build_parser().parse_args(["bench", "defenses", "--device", "cpu", "--threads", "2"])
    assert (args.device, args.threads) == ("cpu", 2)
    assert build_parser().parse_args(["bench", "defenses"]).device == "cpu"
    _tiny_run_on(tmp_path, monkeypatch, "cpu")


@pytest.mark.cuda
def test_bench_defenses_runs_on_cuda(tmp_path, monkeypatch, cuda_device):
    result = _tiny_run_on(tmp_path, monkeypatch, "cuda")
    assert result["settings"]["device"].startswith("cuda:")


@pytest.mark.parametrize(("device", "message"), [
    ("tpu", "device='tpu' is not a torch device name"),
    ("cuda:99", "device='cuda:99' is not available on this machine"),
])
def test_bench_defenses_refuses_a_bad_device_when_parsed(tmp_path, capsys, monkeypatch, device, message):
    assert message in _bad_parse(tmp_path, capsys, "--device", device)
    _no_training(monkeypatch)
    args = _args(tmp_path)
    args.device = device  # a namespace built in code: refused by main, before anything runs
    with pytest.raises(ValueError, match=f"--device: {message}"):
        bench.main(args)
    assert not (tmp_path / "bench.json").exists()


def test_bench_defenses_threads(tmp_path, monkeypatch, one_torch_thread):
    import torch

    torch.set_num_threads(2)
    assert bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "0", "--threads", "1")) == 0
    assert torch.get_num_threads() == 1
    assert ", 1 torch thread(s), device cpu" in json.loads((tmp_path / "bench.json").read_text())["settings"]["machine"]
    _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"--threads=0; allowed: integers >= 1"):
        bench.main(_args(tmp_path, "--threads", "0"))


@pytest.mark.parametrize(("extra", "smallest"), [
    (["--image-size", "2"], 7),  # the default run: LeNet 4x4, the PRECODE rows' MLP, leakage scores (SSIM window 7)
    (["--image-size", "6", "--defenses", "gaussian"], 7),
    (["--image-size", "3", "--defenses", "gaussian", "--attack-rounds", "0"], 4),  # no leakage scores: LeNet's 4
    (["--image-size", "8", "--model", "convnet", "--defenses", "none"], 9),
    # PRECODE rows only: no --model row, so no LeNet
    (["--image-size", "7", "--defenses", "precode", "--precode-model", "resnet18", "--attack-rounds", "0"], 8),
    (["--image-size", "1", "--model", "mlp", "--defenses", "none", "--attack-rounds", "0"], 2),  # the dataset's
    (["--image-size", "-5"], 7),
])
def test_bench_defenses_refuses_images_too_small_for_its_models(tmp_path, monkeypatch, extra, smallest):
    """`--image-size 2` passed the old check (>= 1) and every LeNet row then failed mid-run, writing files
    of error rows (and 4..6 failed after all rows were trained, in the leakage scores). The size is checked
    against the models and scores of the run before anything runs or is written."""
    _no_training(monkeypatch)
    with pytest.raises(ValueError, match=rf"--image-size={extra[1]}; allowed: integers >= {smallest} \(") as exc:
        bench.main(_args(tmp_path, *extra))
    message = str(exc.value)
    assert ("LeNet 4" in message) == ("precode" not in extra and "--model" not in extra)
    assert ("SSIM window" in message) == ("--attack-rounds" not in extra)
    if "precode" in extra:
        assert "ResNet18 8" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--image-size", "7"], ["--image-size", "4", "--attack-rounds", "0"],
                                   ["--image-size", "2", "--model", "mlp", "--attack-rounds", "0"]])
def test_bench_defenses_runs_at_the_smallest_image_size(tmp_path, extra):
    assert bench.main(_args(tmp_path, "--defenses", "none", *TINY, *extra)) == 0
    (row,) = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert "error" not in row and 0 <= row["accuracy"] <= 1


@pytest.mark.parametrize("seed", [str(2**64 - 1), str(2**70), str(2**40 + 1), "-1", "1.5"])
def test_bench_defenses_refuses_a_seed_out_of_range_when_parsed(tmp_path, capsys, seed):
    """`--seed 18446744073709551615` (and 2**70) failed in every row with "Overflow when unpacking long
    long": the clients' seeds are seed * 100_003 + ..."""
    err = _bad_parse(tmp_path, capsys, "--seed", seed)
    assert f"argument --seed: {seed if seed != '1.5' else repr(seed)} is " in err
    assert f"allowed: integers in [0, 2**40 = {2**40}]" in err


def test_bench_defenses_seed_range_and_derived_seeds(tmp_path, monkeypatch):
    # The largest seed runs: every derived seed (defenses, PRECODE's sampling, attacks) fits.
    args = _args(tmp_path, "--defenses", "gaussian,PPP-NG1", *TINY, "--attack-rounds", "1", "--seed", str(2**40))
    assert bench.main(args) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert all("error" not in r and math.isfinite(r["ssim"]) for r in rows)
    assert bench.client_seed(2**40, 1, 1) <= bench.MAX_DERIVED_SEED
    # A namespace built in code is checked by main too, before anything runs or is written.
    _no_training(monkeypatch)
    args = _args(tmp_path / "out")
    args.seed = 2**64 - 1
    with pytest.raises(ValueError, match=r"--seed=18446744073709551615; allowed: integers in \[0, 2\*\*40"):
        bench.main(args)
    args = _args(tmp_path / "out", "--seed", str(2**40))
    args.rounds = 10**17  # (seed * 100_003 + round * 101 + client) past 2**63 - 1
    with pytest.raises(ValueError, match=r"--seed=1099511627776 with --rounds=100000000000000000 .* exceeds 2\*\*63 - 1"):
        bench.main(args)
    assert not (tmp_path / "out").exists()


# --- issue 36: the FL protocol, both utility modes, several seeds -----------------------------------------
def test_bench_shows_both_utility_modes_over_seeds_with_standard_errors(tmp_path, monkeypatch):
    """--utility both (the default) trains a client-side defense twice -- the victim alone defending, then
    every client -- and a row without one (none) once; --seeds 2 gives the mean accuracy and its standard
    error over the seeds' runs, which are what run_defense returned."""
    runs = []
    real = bench.run_defense

    def spy(name, *a, **k):
        record, probs = real(name, *a, **k)
        runs.append((name, k["all_clients"], k["seed"], record["accuracy"], len(probs)))
        return record, probs

    monkeypatch.setattr(bench, "run_defense", spy)
    assert bench.main(_args(tmp_path, "--defenses", "none,censor-zeros", *TINY, "--attack-rounds", "1",
                            "--seeds", "2", "--seed", "3")) == 0
    assert [r[:3] for r in runs] == [("none", False, 3), ("none", False, 4), ("censor-zeros", False, 3),
                                     ("censor-zeros", False, 4), ("censor-zeros", True, 3), ("censor-zeros", True, 4)]
    assert [r[4] for r in runs] == [1, 0, 1, 0, 0, 0]  # leakage from the first run of each row only
    result = json.loads((tmp_path / "bench.json").read_text(), parse_constant=_strict)
    none, censor = result["results"]
    victim, every = [r[3] for r in runs[2:4]], [r[3] for r in runs[4:]]
    assert censor["accuracies"] == victim and censor["accuracies_all"] == every
    assert censor["accuracy"] == pytest.approx(sum(victim) / 2)
    assert censor["accuracy_se"] == pytest.approx(abs(victim[0] - victim[1]) / 2)  # sd / sqrt(2) for two values
    assert none["accuracy_all"] == none["accuracy"] and none["accuracies_all"] == none["accuracies"]
    assert censor["delta_acc_all"] == pytest.approx(100 * (censor["accuracy_all"] - none["accuracy_all"]))
    assert result["settings"]["utility"] == "both" and result["settings"]["seed_list"] == [3, 4]
    md = (tmp_path / "bench.md").read_text()
    assert "| accuracy | Δ acc | accuracy (all) | Δ acc (all) |" in md and "mean ± standard error over 2 seeds" in md
    assert "censor_fallback=zeros" in md


def test_every_client_defends_in_the_all_mode_and_only_the_victim_otherwise(tmp_path, monkeypatch):
    import leakgym.defenses

    calls = []
    real = leakgym.defenses.apply_defense
    monkeypatch.setattr(leakgym.defenses, "apply_defense", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k))
    for utility, per_round in (("victim", [2]), ("all", [2, 4])):
        calls.clear()
        assert bench.main(_args(tmp_path, "--defenses", "gaussian", *TINY, "--attack-rounds", "0",
                                "--utility", utility)) == 0
        assert calls == per_round * 2  # 2 rounds; the victim's batch is 2, the other client's 4


def test_bench_trains_fedavg_with_the_local_optimiser(tmp_path, monkeypatch):
    """--update-kind model_delta with Adam: the victim's pipeline and the honest clients get the protocol, the
    table names it; an optimiser with FedSGD is refused before anything runs."""
    from leakgym.fl import client as client_module
    from leakgym.fl.optim import LocalOptimizer

    seen = []
    real = client_module.compute_updates
    monkeypatch.setattr(client_module, "compute_updates", lambda jobs, *a, **k: seen.extend(
        (j.kind, j.local_steps, j.local_lr, j.optimizer) for j in jobs) or real(jobs, *a, **k))
    args = _args(tmp_path, "--defenses", "none", *TINY, "--attack-rounds", "1", "--update-kind", "model_delta",
                 "--local-steps", "3", "--local-lr", "1e-3", "--local-optimizer", "adam")
    assert bench.main(args) == 0
    assert set(seen) == {("model_delta", 3, 1e-3, LocalOptimizer("adam"))} and len(seen) == 4
    md = (tmp_path / "bench.md").read_text()
    assert "FedAvg (3 local steps, adam lr 0.001) 2 rounds" in md and "server step 1" in md
    _no_training(monkeypatch)
    for extra, message in ((("--local-optimizer", "adam"), "need --update-kind model_delta"),
                           (("--update-kind", "model_delta", "--local-momentum", "1.0"),
                            r"--local-momentum=1.0; allowed range \[0, 1\)"),
                           (("--update-kind", "model_delta", "--local-steps", "0"), "--local-steps=0"),
                           (("--seeds", "0"), "--seeds=0; allowed: integers >= 1")):
        with pytest.raises(ValueError, match=message):
            bench.main(_args(tmp_path / "out", *extra))


@pytest.mark.parametrize(("flag", "message"), [
    ("--batch-size", r"--batch-size=5000; allowed: integers in \[1, (\d+)\] \(the smallest honest client's shard"),
    ("--victim-batch", r"--victim-batch=5000; allowed: integers in \[1, (\d+)\] \(the victim's shard, client 0"),
])
def test_bench_defenses_batch_larger_than_a_shard_is_refused_before_training(tmp_path, monkeypatch, flag, message):
    """Found in an audit: ``--clients 2 --batch-size 5000 --victim-batch 5000`` drew every shard's ~650 images
    while the title and settings said 5000; the largest allowed size, the shard's, is named before anything
    is trained or written."""
    monkeypatch.setattr(bench, "run_defense", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(ValueError, match=message) as err:
        bench.main(_args(tmp_path, "--defenses", "none", *TINY, "--clients", "2", flag, "5000"))
    assert not any(tmp_path.iterdir())
    from leakgym.data import federated_split, load_dataset

    split = federated_split(load_dataset("digits", image_size=16), num_clients=2, seed=0)
    shard = len(split.clients[0 if flag == "--victim-batch" else 1][1])
    assert f"[1, {shard}]" in str(err.value)

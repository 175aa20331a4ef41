"""``leakgym bench defenses``: utility, leakage and cost of every defense next to no defense.

For each defense the same federated model (``--model``; the PRECODE/PPP rows: see below) is trained
from the same initialisation with FedSGD (default: :class:`leakgym.fl.server.Server`, example-weighted
mean of the clients' gradients, server learning rate ``--lr``) or FedAvg (``--update-kind model_delta``:
``--local-steps`` steps of the local optimiser -- ``--local-optimizer sgd|adam``, ``--local-lr``,
``--local-momentum``, ``--local-weight-decay``, :mod:`leakgym.fl.optim`, ``docs/fl_protocol.md`` -- and
the mean model difference applied with server step 1) on the digits dataset split over ``--clients`` IID
shards (:func:`leakgym.data.federated_split`, which also holds out a public split). Every round each
client draws a fresh batch from its shard; client 0 is the **victim**: it draws ``--victim-batch``
examples and shares its update through :func:`leakgym.defenses.apply_defense`.

Two utility modes (``--utility``, default ``both``): ``victim`` -- **only the victim defends** (the game's
setting: one defended client among honest ones); ``all`` -- **every client applies the defense** (the
defense's full cost in accuracy: a defense that only the victim applies is diluted by the honest
clients, e.g. CENSOR's "zeros" fallback costs 0.6 points as the victim's alone and stops training when
every client uses it). ``both`` trains each row in both modes and the table shows both accuracy
columns; a row whose defense is not a client-side change (``none``, ``precode``: the model is the
defense) is trained once, its two modes being the same run. ``--all-clients`` is ``--utility all`` (with
another ``--utility`` it is refused).
Leakage, fidelity and overhead are measured on the victim of the first mode's run.

``--seeds N`` trains every row with seeds ``--seed`` .. ``--seed + N - 1`` (model initialisation,
batches, defenses; the split stays that of ``--seed``, as the reproductions keep theirs) and reports the
mean accuracy with its standard error over the seeds (``accuracy_se``; per seed in ``accuracies``);
leakage is measured on the first seed's run.

Measured per defense:

* ``accuracy`` / ``test_loss``: the global model on the held-out test split after the last round
  (and ``accuracy_curve`` every ``--eval-every`` rounds);
* leakage: the reference attack (Inverting Gradients, ``--attack-iterations`` iterations, one
  restart, labels known to the attacker) on the victim's shared update at ``--attack-rounds``
  evenly spaced rounds (first and last included); ``ssim`` / ``psnr`` are the means over those
  rounds and the victim's images (:func:`leakgym.metrics.score_reconstruction`), and ``lpips`` beside
  them where the user's LPIPS backbone weights are on disk (``settings["lpips"]`` names the backbone;
  without the weights it is ``null``, ``settings["lpips_note"]`` says why, and the table has no LPIPS
  column). All attacks of a run are batched into one engine call at the end;
* ``fidelity``: the victim's mean cosine between shared and clean update (the DefenseReport's);
* ``overhead_ms``: the victim's mean extra wall time per update over the clean computation, and
  ``wall_s`` the training wall time of the whole run.

PRECODE is a model option (a variational bottleneck before the classifier head), so ``precode`` and
the ``PPP-*`` rows train a PRECODE model and attack it with the same reference attack as every other
row (plain Inverting Gradients on all layers, i.e. the paper's "PRECODE*" attack; the layer-skipping
attack that breaks PRECODE is in ``leakgym reproduce ppp``). They do **not** use ``--model``: a
PRECODE bottleneck on the DLG LeNet (sigmoid convolutions, ``U(-0.5, 0.5)`` initialisation) stays at
chance (10%) after 100 FedSGD rounds, which is not the paper's defense, whose utility claim is an
almost unchanged accuracy. They train ``--precode-model`` (default: the PPP reproduction's MLP, 4
hidden layers of width ``--precode-width`` 128 with BatchNorm, PRECODE ``K=256, beta=1e-3``) with
server learning rate ``--precode-lr`` (default 0.1, the reproduction's: with 0.5 its PRECODE MLP
diverged under PPP noise), and the bench adds an undefended ``none`` row on that same model and
learning rate, so their ``Δ acc`` is measured against the same architecture (every row's ``Δ acc``
is against the ``none`` row of its own model and learning rate; ``baseline`` in the JSON names it).
With ``--precode-model lenet --precode-width 0 --precode-lr 0.5`` (width 0: the class default) the
PRECODE rows share the main LeNet setting and its ``none`` row again. That LeNet's failure is the
protocol's, not PRECODE's: in FedAvg with the PPP paper's local optimiser (``--update-kind model_delta
--local-optimizer adam --local-lr 1e-3 --local-steps 5``, 100 rounds, 3 seeds) PRECODE-LeNet reaches
93.7 ± 0.2% against 93.6 ± 0.4% undefended (``docs/results/bench_defenses_fedavg_precode.md``,
``docs/fl_protocol.md``).

The whole run -- data, models, batch sampling (a ``torch.Generator`` on the device), defenses and
attacks -- runs on ``--device`` (default ``cpu``; checked when the arguments are parsed), with
``--threads`` torch CPU threads (default: torch's choice). Arguments are checked before anything runs
or is written: ``--image-size`` must be at least the smallest image side every model of the run accepts
(its class's ``min_image_size``, e.g. 4 for LeNet), 2 (the digits dataset's smallest) and, when leakage is
measured (``--attack-rounds`` > 0), the SSIM window of the scores
(:data:`leakgym.metrics.DEFAULT_SSIM_WINDOW`, 7); and
``--seed`` must be in ``[0, 2**40]`` (:data:`MAX_SEED`), so that every seed derived from it (the
victim's and clients' ``seed * 100_003 + round * 101 + client``, the attacks' ``seed + i``) fits in
``[0, 2**63 - 1]``; and, once the split is made (before the output paths are checked and anything is
trained), ``--victim-batch`` and ``--batch-size`` must be at most the victim's shard and the smallest honest
client's shard (:func:`check_batches`: a larger batch would be cut to the shard while the table names it).

The defense settings are the named presets of
:data:`leakgym.defenses.config.PRESETS`, except for DCS² and LODA whose per-update optimisation (1000
resp. 500 steps) is too slow to run every round on a CPU: the bench uses ``BENCH_OVERRIDES`` (fewer
steps) and says so in the table. With 20 steps each, the DCS² and LODA rows are the slowest of the
default run (about 0.3 s resp. 0.2 s per round, under 30 s per row, on the 2-core CI machine).

Output: a JSON file (``--json``) with the settings (the device in ``device`` and, with cores and threads,
in ``machine``) and one record per defense, and a markdown table next to it (``--markdown``, default: the
JSON path with ``.md``; its header names the device). Both are rewritten after every trained
row (``"complete": false`` and SSIM/PSNR ``null`` until the attacks at the end have run); Ctrl-C keeps
what is written and exits with status 130. A missing number (e.g. no leakage with ``--attack-rounds 0``)
is ``null`` in the JSON and ``-`` in the table.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from leakgym.bench import (
    check_distinct,
    check_output,
    device_label,
    dumps,
    interrupted,
    machine_label,
    progress_bar,
    smallest_image_side,
)
from leakgym.devices import canonical_device, check_device, device_argument
from leakgym.files import write_atomically
from leakgym.suggest import did_you_mean

#: ``--utility``: who applies the defense in the accuracy runs.
UTILITY_MODES = ("victim", "all", "both")
#: Rows of the default run, in table order.
DEFAULT_DEFENSES = (
    "none", "gaussian", "laplace", "clip+gaussian", "prune", "topk", "soteria", "dcs2", "censor", "oasis",
    "mixup", "instahide", "loda", "precode", "PPP-NG1", "PPP-GC90",
)
#: Bench-only changes to a preset (documented in the table): per-update optimisations kept short.
BENCH_OVERRIDES: dict[str, dict] = {
    "dcs2": {"dcs2_steps": 20},
    "loda": {"loda_steps": 20},
}
#: Rows that train a PRECODE model.
PRECODE_ROWS = ("precode", "PPP-NG3", "PPP-NG2", "PPP-NG1", "PPP-NG05", "PPP-GC90", "PPP-GC99")
#: Model, width and server learning rate of the PRECODE rows: those of the PPP reproduction's small
#: scale (``leakgym.reproduce.ppp.SCALES["small"]``), where PRECODE trains to ~98% on digits. The DLG
#: LeNet of the other rows stays at chance with a PRECODE bottleneck.
PRECODE_MODEL = "mlp"
PRECODE_WIDTH = 128
PRECODE_LR = 0.1
#: Largest ``--seed`` (as ``leakgym reproduce``'s): the clients' seeds are spread as ``seed * 100_003 +
#: round * 101 + client`` (:func:`client_seed`) and every derived seed must stay within ``2**63 - 1``.
MAX_SEED = 2**40
#: Largest derived seed: torch generators and the attacks' seeds take ``[0, 2**63 - 1]``.
MAX_DERIVED_SEED = 2**63 - 1
#: Smallest image side of the digits dataset (:func:`leakgym.data.catalog.check_image_size`).
DATASET_MIN_IMAGE_SIZE = 2


def client_seed(seed: int, rnd: int, client: int) -> int:
    """The seed of client ``client``'s defended update in round ``rnd`` of a run with ``--seed seed``."""
    return seed * 100_003 + rnd * 101 + client


def seed_argument(text: str) -> int:
    """``argparse`` type of ``--seed``: an integer in ``[0, MAX_SEED]``."""
    allowed = (f"allowed: integers in [0, 2**40 = {MAX_SEED}] (every derived seed, seed * 100_003 + round * 101 + "
               "client, must fit in 2**63 - 1)")
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; {allowed}") from None
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{seed} is out of range; {allowed}")
    return seed


@dataclass(frozen=True)
class Setup:
    """What a row trains: architecture, width (``None``: the class default) and server learning rate."""

    model: str
    width: int | None
    lr: float
    precode: bool = False

    @property
    def base(self) -> tuple:
        """The undefended setting this row is compared with (same model, width and lr, no PRECODE)."""
        return (self.model, self.width, self.lr)

    def label(self, main_lr: float) -> str:
        """E.g. ``lenet``, ``mlp-128, lr 0.1 + PRECODE`` (the lr only where it differs from ``--lr``)."""
        text = self.model if self.width is None else f"{self.model}-{self.width}"
        if self.lr != main_lr:
            text += f", lr {self.lr:g}"
        return text + (" + PRECODE" if self.precode else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``leakgym bench defenses``."""
    from leakgym.models import MODEL_CLASSES

    smallest = ", ".join(f"{name} {cls.min_image_size}" for name, cls in MODEL_CLASSES.items())
    parser.add_argument("--json", type=Path, default=Path("runs/bench/bench_defenses.json"),
                        help="where to write the JSON results (default: %(default)s; the committed "
                        "docs/results/bench_defenses.json is rewritten only when named here)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="where to write the markdown table (default: the JSON path with .md)")
    parser.add_argument("--defenses", type=str, default=",".join(DEFAULT_DEFENSES),
                        help="comma-separated preset names (see leakgym.defenses.PRESETS, plus 'precode')")
    parser.add_argument("--rounds", type=int, default=100, help="FedSGD rounds (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="number of clients K (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size of the honest clients")
    parser.add_argument("--victim-batch", type=int, default=4, help="batch size of the victim (client 0)")
    parser.add_argument("--lr", type=float, default=0.5, help="server learning rate (default: %(default)s)")
    parser.add_argument("--model", type=str, default="lenet",
                        help="architecture of the non-PRECODE rows (default: %(default)s)")
    parser.add_argument("--precode-model", type=str, default=PRECODE_MODEL,
                        help="architecture of the PRECODE/PPP rows and of their own undefended 'none' row "
                        "(default: %(default)s, the PPP reproduction's, where PRECODE trains)")
    parser.add_argument("--precode-width", type=int, default=PRECODE_WIDTH,
                        help="width of --precode-model (0: the class default; default: %(default)s)")
    parser.add_argument("--precode-lr", type=float, default=PRECODE_LR,
                        help="server learning rate of the PRECODE/PPP rows and their baseline "
                        "(default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=16,
                        help=f"digits image size: at least {DATASET_MIN_IMAGE_SIZE}, the smallest image side of "
                        f"every model of the run ({smallest}) and, with --attack-rounds > 0, the SSIM window of the "
                        "leakage scores (leakgym.metrics.DEFAULT_SSIM_WINDOW) (default: %(default)s)")
    parser.add_argument("--attack-rounds", type=int, default=3,
                        help="number of evenly spaced rounds at which the victim is attacked")
    parser.add_argument("--attack-iterations", type=int, default=200, help="Inverting Gradients iterations")
    parser.add_argument("--eval-every", type=int, default=10, help="rounds between accuracy evaluations")
    parser.add_argument("--eval-size", type=int, default=None, help="test images used (default: all)")
    parser.add_argument("--all-clients", action="store_true", help="every client applies the defense (= --utility all)")
    parser.add_argument("--utility", choices=UTILITY_MODES, default=None,
                        help="who defends in the accuracy runs: the victim only, every client, or both runs side by "
                        "side (default: both; all with --all-clients, which refuses another)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="train every row with this many seeds (--seed, --seed + 1, ...) and report mean accuracy "
                        "+- standard error (default: %(default)s)")
    parser.add_argument("--update-kind", choices=("gradient", "model_delta"), default="gradient",
                        help="FedSGD ('gradient', server lr --lr) or FedAvg ('model_delta', server step 1) "
                        "(default: %(default)s)")
    parser.add_argument("--local-steps", type=int, default=1, help="FedAvg local steps per round (default: 1)")
    parser.add_argument("--local-lr", type=float, default=0.1, help="FedAvg local learning rate (default: 0.1)")
    parser.add_argument("--local-optimizer", choices=("sgd", "adam"), default="sgd",
                        help="FedAvg local optimiser (default: %(default)s; PPP's clients: adam with --local-lr 1e-3)")
    parser.add_argument("--local-momentum", type=float, default=0.0, help="FedAvg SGD momentum in [0, 1) (default: 0)")
    parser.add_argument("--local-weight-decay", type=float, default=0.0,
                        help="FedAvg local weight decay >= 0 (default: 0)")
    parser.add_argument("--seed", type=seed_argument, default=0,
                        help="seed of split, model, batches, defenses and attacks; an integer in [0, 2**40] "
                        "(default: %(default)s)")
    parser.add_argument("--device", default="cpu", type=device_argument,
                        help="torch device of the whole run: data, models, defenses and attacks (default: cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="disable the tqdm progress bars")


def _check(args: argparse.Namespace) -> list[str]:
    from leakgym.defenses import PRESETS

    for name in ("rounds", "clients", "batch_size", "victim_batch", "attack_rounds", "attack_iterations",
                 "eval_every"):
        value = getattr(args, name)
        if not isinstance(value, int) or value < (0 if name == "attack_rounds" else 1):
            raise ValueError(f"--{name.replace('_', '-')}={value!r}; allowed: integers >= "
                             f"{0 if name == 'attack_rounds' else 1}")
    from leakgym.models import MODEL_NAMES

    for flag in ("lr", "precode_lr"):
        value = getattr(args, flag)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"--{flag.replace('_', '-')}={value!r}; allowed range (0, inf)")
    for flag in ("model", "precode_model"):
        if getattr(args, flag) not in MODEL_NAMES:
            value = getattr(args, flag)
            raise ValueError(f"--{flag.replace('_', '-')}={value!r}{did_you_mean(value, MODEL_NAMES)}; "
                             f"allowed: {', '.join(MODEL_NAMES)}")
    if args.eval_size is not None and (not isinstance(args.eval_size, int) or args.eval_size < 1):
        raise ValueError(f"--eval-size={args.eval_size!r}; allowed: integers >= 1 (default: all test images)")
    if not isinstance(args.precode_width, int) or args.precode_width < 0:
        raise ValueError(f"--precode-width={args.precode_width!r}; allowed: integers >= 0 (0: class default)")
    if not isinstance(args.seeds, int) or isinstance(args.seeds, bool) or args.seeds < 1:
        raise ValueError(f"--seeds={args.seeds!r}; allowed: integers >= 1")
    utility = getattr(args, "utility", None)
    if utility is not None and utility not in UTILITY_MODES:
        raise ValueError(f"--utility={args.utility!r}; allowed: {', '.join(UTILITY_MODES)}")
    if args.all_clients and utility not in (None, "all"):  # (--all-clients won: the run was --utility all)
        raise ValueError(f"--all-clients (= --utility all) with --utility {utility}: they disagree; allowed: one of "
                         f"them (--all-clients, or --utility {utility} alone)")
    _check_protocol(args)
    if args.threads is not None and (not isinstance(args.threads, int) or args.threads < 1):
        raise ValueError(f"--threads={args.threads!r}; allowed: integers >= 1 (default: torch's choice)")
    try:
        check_device(args.device)
    except ValueError as exc:
        raise ValueError(f"--device: {exc}") from None
    seed = args.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed={seed!r}; allowed: integers in [0, 2**40 = {MAX_SEED}]")
    largest = client_seed(seed + args.seeds - 1, args.rounds - 1, args.clients - 1)
    if largest > MAX_DERIVED_SEED:
        raise ValueError(f"--seed={seed} with --rounds={args.rounds} and --clients={args.clients}: the last client "
                         f"seed {largest} exceeds 2**63 - 1; allowed: --seed * 100_003 + (--rounds - 1) * 101 + "
                         "--clients - 1 <= 2**63 - 1")
    names = [n.strip() for n in args.defenses.split(",") if n.strip()]
    known = {k.lower(): k for k in PRESETS} | {"precode": "precode"}
    if not names:  # (it said "unknown name(s) []")
        raise ValueError(f"--defenses={args.defenses!r} names no defense; allowed: comma-separated names of "
                         f"{sorted(known.values())}")
    unknown = [n for n in names if n.lower() not in known]
    if unknown:
        hint = did_you_mean(unknown[0], known.values())
        raise ValueError(f"--defenses: unknown name(s) {unknown}{hint}; allowed: {sorted(known.values())}")
    names = [known[n.lower()] for n in names]
    check_distinct(names, "--defenses", args.defenses)  # (the same row trained twice)
    # The smallest image every model of the run accepts (a PRECODE model only with a PRECODE row), the
    # dataset and, when leakage is measured, the SSIM window of the scores (else the run fails after training).
    smallest, models = smallest_image_side([setup.model for _, setup in plan(names, args)], DATASET_MIN_IMAGE_SIZE)
    needs = [f"the digits dataset {DATASET_MIN_IMAGE_SIZE}", *models]
    if args.attack_rounds > 0:
        from leakgym.metrics import DEFAULT_SSIM_WINDOW

        needs.append(f"the SSIM window of the leakage scores (--attack-rounds > 0) {DEFAULT_SSIM_WINDOW}")
        smallest = max(smallest, DEFAULT_SSIM_WINDOW)
    size = args.image_size
    if isinstance(size, bool) or not isinstance(size, int) or size < smallest:
        raise ValueError(f"--image-size={size!r}; allowed: integers >= {smallest} (smallest image side of "
                         f"{', '.join(needs)})")
    return names


def check_batches(args: argparse.Namespace, split) -> None:
    """``--victim-batch`` at most the victim's shard (client 0) and ``--batch-size`` at most the smallest honest
    client's shard of ``split``: a larger batch was cut to the shard, while the table's title and the settings
    reported the size asked for (found in an audit)."""
    shards = [len(cy) for _, cy in split.clients]
    where = f"the digits training images split over --clients {args.clients} with a public split"
    if args.victim_batch > shards[0]:
        raise ValueError(f"--victim-batch={args.victim_batch}; allowed: integers in [1, {shards[0]}] (the victim's "
                         f"shard, client 0, of {where})")
    if len(shards) > 1 and args.batch_size > min(shards[1:]):
        raise ValueError(f"--batch-size={args.batch_size}; allowed: integers in [1, {min(shards[1:])}] (the smallest "
                         f"honest client's shard of {where})")


def _check_protocol(args: argparse.Namespace) -> None:
    """The FL protocol's options (FedAvg's local optimiser, :class:`leakgym.fl.optim.LocalOptimizer`)."""
    if args.update_kind not in ("gradient", "model_delta"):
        raise ValueError(f"--update-kind={args.update_kind!r}; allowed: gradient, model_delta")
    steps = args.local_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--local-steps={steps!r}; allowed: integers >= 1")
    if not (args.local_lr > 0 and math.isfinite(args.local_lr)):
        raise ValueError(f"--local-lr={args.local_lr!r}; allowed range (0, inf)")
    try:
        optimizer = protocol_optimizer(args)
    except ValueError as exc:
        raise ValueError(f"--{str(exc).replace('_', '-')}") from None
    if args.update_kind == "gradient" and (steps != 1 or optimizer is not None):
        raise ValueError(f"--local-steps={steps} / --local-optimizer={args.local_optimizer} (momentum "
                         f"{args.local_momentum}, weight decay {args.local_weight_decay}) need --update-kind "
                         "model_delta (FedSGD shares one gradient)")


def protocol_optimizer(args: argparse.Namespace):
    """The run's FedAvg local optimiser (None: plain SGD)."""
    from leakgym.fl.optim import LocalOptimizer

    opt = LocalOptimizer(args.local_optimizer, momentum=args.local_momentum, weight_decay=args.local_weight_decay)
    return None if opt.plain else opt


def protocol_label(settings: dict) -> str:
    """E.g. ``FedSGD`` or ``FedAvg (5 local steps, adam lr 0.001)``."""
    if settings.get("update_kind", "gradient") == "gradient":
        return "FedSGD"
    opt = settings.get("local_optimizer_label", "sgd")
    return f"FedAvg ({settings['local_steps']} local steps, {opt} lr {settings['local_lr']:g})"


def plan(names: list[str], args: argparse.Namespace) -> list[tuple[str, Setup]]:
    """The rows to run, each with its :class:`Setup`.

    Non-PRECODE rows train ``--model`` with ``--lr``; PRECODE rows train ``--precode-model`` with
    ``--precode-lr``. When that differs from the main setting, an undefended ``none`` row on the
    PRECODE rows' model and lr is inserted before the first PRECODE row, so that their ``Δ acc`` has a
    baseline of the same architecture.
    """
    main = Setup(args.model, None, args.lr)
    pre = Setup(args.precode_model, args.precode_width or None, args.precode_lr, precode=True)
    rows = [(n, pre if n in PRECODE_ROWS else main) for n in names]
    first = next((i for i, (n, _) in enumerate(rows) if n in PRECODE_ROWS), None)
    if first is not None and pre.base != main.base:
        rows.insert(first, ("none", Setup(pre.model, pre.width, pre.lr)))
    return rows


def baseline_index(records: list[dict], i: int) -> int | None:
    """Index of the undefended row on the same model, width and lr as ``records[i]`` (None: no such row)."""
    key = tuple(records[i][k] for k in ("model", "width", "lr"))
    for j, r in enumerate(records):
        if ("error" not in r and r["defense"] == "none" and not r["precode"]
                and tuple(r[k] for k in ("model", "width", "lr")) == key):
            return j
    return None


def _row_config(name: str):
    from leakgym.defenses import PRESETS, DefenseConfig

    cfg = DefenseConfig() if name == "precode" else PRESETS[name]
    if name in BENCH_OVERRIDES:
        cfg = cfg.replace(**BENCH_OVERRIDES[name])
    return cfg


def _setting(cfg) -> str:
    """The non-default fields of a config, e.g. ``noise_sigma=0.01``."""
    from leakgym.defenses import DefenseConfig

    default = DefenseConfig()
    base = default.to_dict()
    parts = [f"{name}={value}" for name, value in cfg.to_dict().items() if value != base[name]]
    if cfg.censor_trials and cfg.censor_fallback == base["censor_fallback"]:
        # the fallback decides what CENSOR sends when no trial improves: always named (issue 36)
        parts.append(f"censor_fallback={cfg.censor_fallback}")
    return ", ".join(parts) if parts else "-"


def attack_rounds(rounds: int, count: int) -> list[int]:
    """``count`` evenly spaced rounds in ``[0, rounds - 1]``, first and last included."""
    if count <= 0:
        return []
    if count == 1 or rounds == 1:
        return [0]
    return sorted({round(i * (rounds - 1) / (count - 1)) for i in range(count)})


def split_on(split, device: str | torch.device):
    """``split`` (a :class:`~leakgym.data.FederatedSplit`) with every image and label on ``device`` (the
    same tensors where they already are there)."""
    import dataclasses

    return dataclasses.replace(
        split, public_x=split.public_x.to(device), public_y=split.public_y.to(device),
        clients=[(cx.to(device), cy.to(device)) for cx, cy in split.clients],
        test_x=split.test_x.to(device), test_y=split.test_y.to(device))


def run_defense(name: str, args: argparse.Namespace, split, progress: bool,
                setup: Setup | None = None, *, all_clients: bool | None = None, seed: int | None = None,
                probe: bool = True) -> tuple[dict, list]:
    """Train under one defense on ``setup`` (default: the row's setup in :func:`plan`) on ``args.device``;
    returns (record without leakage, attack problems). ``all_clients``: every client defends (default:
    ``args.all_clients``); ``seed``: the run's seed (default ``args.seed``); ``probe``: collect the victim's
    updates for the attacks."""
    from tqdm import tqdm

    from leakgym.attacks.base import AttackerKnowledge
    from leakgym.defenses import apply_defense
    from leakgym.fl.client import compute_update
    from leakgym.fl.server import Server
    from leakgym.models import build_model

    device = canonical_device(args.device)
    split = split_on(split, device)
    spec = split.spec
    cfg = _row_config(name)
    all_clients = bool(args.all_clients) if all_clients is None else all_clients
    run_seed = args.seed if seed is None else seed
    kind, steps, local_lr = args.update_kind, args.local_steps, args.local_lr
    optimizer = protocol_optimizer(args)
    protocol = {"update_kind": kind, "local_steps": steps, "local_lr": local_lr, "optimizer": optimizer}
    if setup is None:
        setup = dict(plan([name], args))[name]
    model = build_model(setup.model, spec, precode=setup.precode, width=setup.width, seed=run_seed, device=device)
    test_x, test_y = split.test_x, split.test_y
    if args.eval_size is not None:
        test_x, test_y = test_x[: args.eval_size], test_y[: args.eval_size]
    server = Server(model, lr=setup.lr, eval_x=spec.normalize(test_x), eval_y=test_y)
    gen = torch.Generator(device=device).manual_seed(run_seed)
    probe_rounds = set(attack_rounds(args.rounds, args.attack_rounds)) if probe else set()
    overheads, fidelities, curve, problems = [], [], [], []
    start = time.perf_counter()
    desc = f"{name} [{setup.label(args.lr)}]"
    for rnd in tqdm(range(args.rounds), desc=f"{desc:>24s}", disable=not progress, leave=False):
        updates = []
        for k, (cx, cy) in enumerate(split.clients):
            size = args.victim_batch if k == 0 else args.batch_size
            idx = torch.randperm(len(cx), generator=gen, device=device)[:size]  # (size <= shard: check_batches)
            x, y = spec.normalize(cx[idx]), cy[idx]
            seed = client_seed(run_seed, rnd, k)
            if k == 0 or all_clients:
                upd, rep = apply_defense(model, x, y, cfg, seed=seed, public_x=split.public_x,
                                         public_y=split.public_y, **protocol)
                if k == 0:
                    overheads.append(rep.overhead_s)
                    fidelities.append(rep.fidelity)
            else:
                upd = compute_update(model, x, y, kind=kind, local_steps=steps, local_lr=local_lr, optimizer=optimizer)
            if k == 0 and rnd in probe_rounds:
                knowledge = AttackerKnowledge(model=copy.deepcopy(model), spec=spec, batch_size=upd.batch_size,
                                              labels=y.clone())
                problems.append((rnd, upd.detached(), knowledge, cx[idx].clone()))
            updates.append(upd)
        server.aggregate(updates)
        if (rnd + 1) % args.eval_every == 0 or rnd + 1 == args.rounds:
            acc, _ = server.evaluate()
            curve.append([rnd + 1, acc])
    wall = time.perf_counter() - start
    accuracy, loss = server.evaluate()
    record = {
        "defense": name,
        "setting": _setting(cfg),
        "bench_override": BENCH_OVERRIDES.get(name, {}),
        "model": setup.model,
        "width": setup.width,
        "lr": setup.lr,
        "precode": setup.precode,
        "model_label": setup.label(args.lr),
        "applied": cfg.active(),
        "all_clients": all_clients,
        "seed": run_seed,
        "accuracy": accuracy,
        "test_loss": loss,
        "accuracy_curve": curve,
        "fidelity": sum(fidelities) / len(fidelities),
        "overhead_ms": 1000 * sum(overheads) / len(overheads),
        "wall_s": wall,
    }
    return record, problems


def _plain_sgd():
    from leakgym.fl.optim import PLAIN_SGD

    return PLAIN_SGD


def utility_modes(args: argparse.Namespace) -> list[bool]:
    """The accuracy runs of a row, as ``all_clients`` values, the first one's run measuring leakage."""
    mode = "all" if args.all_clients else getattr(args, "utility", None) or "both"
    return {"victim": [False], "all": [True], "both": [False, True]}[mode]


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean (sample standard deviation / sqrt(n); None for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def train_row(name: str, args: argparse.Namespace, split, progress: bool, setup: Setup) -> tuple[dict, list]:
    """Every accuracy run of one row (:func:`utility_modes` x ``--seeds``) combined into one record:
    ``accuracy`` / ``accuracy_se`` / ``accuracies`` of the first mode (the victim-only mode unless
    ``--utility all``), ``accuracy_all`` / ``accuracy_all_se`` / ``accuracies_all`` of the every-client mode
    (None when it is not run); leakage problems, fidelity, overhead and curve from the first run. A row
    with no client-side defense (``none``, ``precode``) is the same run in both modes: trained once."""
    modes = utility_modes(args)
    seeds = [args.seed + i for i in range(args.seeds)]
    client_side = bool(_row_config(name).active())
    runs: dict[bool, list[dict]] = {}
    first, problems = None, []
    for all_clients in modes:
        if all_clients and False in runs and not client_side:
            runs[True] = runs[False]
            continue
        runs[all_clients] = []
        for seed in seeds:
            record, probs = run_defense(name, args, split, progress, setup, all_clients=all_clients, seed=seed,
                                        probe=first is None)
            if first is None:
                first, problems = record, probs
            runs[all_clients].append(record)
    out = dict(first)
    primary = runs[modes[0]]
    out["accuracy"], out["accuracy_se"] = _mean_se([r["accuracy"] for r in primary])
    out["test_loss"] = sum(r["test_loss"] for r in primary) / len(primary)
    out["accuracies"] = [r["accuracy"] for r in primary]
    out["seeds"] = seeds
    out["wall_s"] = sum(r["wall_s"] for rs in {id(v): v for v in runs.values()}.values() for r in rs)
    every = runs.get(True)
    out["accuracy_all"], out["accuracy_all_se"] = _mean_se([r["accuracy"] for r in every]) if every else (None, None)
    out["accuracies_all"] = [r["accuracy"] for r in every] if every else None
    out["all_clients"] = modes == [True]
    return out, problems


def attack_all(problems: list, args: argparse.Namespace, spec, *, lpips: bool = False) -> list[dict]:
    """Inverting Gradients on every collected victim update (one batched call, on ``args.device``);
    per-problem scores (``lpips``: with the LPIPS of each, from the user's backbone weights)."""
    from leakgym.attacks.inverting_gradients import InvertingGradients
    from leakgym.metrics import score_reconstruction

    if not problems:
        return []
    attack = InvertingGradients(iterations=args.attack_iterations, device=str(canonical_device(args.device)))
    results = attack.reconstruct_batch([p[2] for p in problems], [p[3] for p in problems], seed=args.seed)
    scores = []
    for (_, rnd, _, _, orig), res in zip(problems, results):
        s = score_reconstruction(spec.denormalize(res.images), orig, lpips=lpips)
        scores.append({"round": rnd, "ssim": s.mean["ssim"], "psnr": s.mean["psnr"],
                       **({"lpips": s.mean["lpips"]} if lpips else {}), "attack_s": res.cost.wall_time_s})
    return scores


def add_baselines(records: list[dict]) -> None:
    """Set ``baseline`` (the compared row: defense and model) and ``delta_acc`` (accuracy points against
    it, ``None`` without one) of every record, against the ``none`` row of the same model, width and lr."""
    for i, r in enumerate(records):
        if "error" in r:
            continue
        j = baseline_index(records, i)
        if j is None:
            r["baseline"], r["delta_acc"] = None, None
            if "accuracy_all" in r:
                r["delta_acc_all"] = None
        else:
            ref = records[j]
            r["baseline"] = {"defense": ref["defense"], "model": ref["model"], "width": ref["width"], "lr": ref["lr"]}
            r["delta_acc"] = 100 * (r["accuracy"] - ref["accuracy"])
            if "accuracy_all" in r:
                both = r["accuracy_all"] is not None and ref.get("accuracy_all") is not None
                r["delta_acc_all"] = 100 * (r["accuracy_all"] - ref["accuracy_all"]) if both else None


def _num(value, spec: str) -> str:
    """``value`` formatted with ``spec``; ``-`` when it is missing or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _percent(value, se) -> str:
    """``97.5%``, or ``97.5 ± 0.3%`` with a standard error; ``-`` when missing."""
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if se is None else f"{100 * value:.1f} ± {100 * se:.1f}%"


def markdown_table(records: list[dict], settings: dict) -> str:
    """The results as a markdown table (accuracy and leakage next to no defense on the same model); a
    missing or non-finite number shows ``-``."""
    add_baselines(records)
    # (``--all-clients`` is ``--utility all``; a file without ``utility`` predates the modes: victim only)
    mode = "all" if settings["all_clients"] else settings.get("utility", "victim")
    who = "every client" if mode == "all" else "the victim (client 0) only"
    both = mode == "both"
    if both:
        who = ("the victim (client 0) only in `accuracy` (and leakage), by every client in `accuracy (all)`, "
               "the utility mode of the defense's full cost")
    seeds = settings.get("seeds", 1)
    pre = settings.get("precode_model")
    server = f"server lr {settings['lr']}" if settings.get("update_kind", "gradient") == "gradient" else "server step 1"
    header = (
        f"Digits {settings['image_size']}x{settings['image_size']}, {protocol_label(settings)} {settings['rounds']} "
        f"rounds, {settings['clients']} clients (batch {settings['batch_size']}, victim batch "
        f"{settings['victim_batch']}); defense applied by {who}."
        + (f" Accuracy: mean ± standard error over {seeds} seeds {settings.get('seed_list')}." if seeds > 1 else "")
        + f" Model column: rows train {settings['model']} with {server}")
    if pre is not None:
        width = settings.get("precode_width") or "class default"
        header += (f"; the PRECODE/PPP rows train {pre} (width {width}) with a PRECODE bottleneck and "
                   + (f"server lr {settings['precode_lr']}" if server != "server step 1" else "server step 1")
                   + f", next to an undefended {pre} row with the same lr")
    header += (". Δ acc: accuracy points against the `none` row of the same model and lr. "
               f"Leakage: Inverting Gradients on all layers ({settings['attack_iterations']} iterations, labels "
               f"known) on the victim's update at rounds {settings['attack_rounds']}; SSIM/PSNR lower = less "
               "leakage.")
    with_lpips = settings.get("lpips") is not None
    if with_lpips:
        header += " LPIPS higher = less leakage (the digits upsampled to 32x32 where smaller)."
    elif settings.get("lpips_note"):  # said once, instead of a column of dashes
        header += f" {settings['lpips_note']}."
    if settings.get("device") is not None:  # (results written before the device was recorded have none)
        header += f" Device: {settings['device']}."
    extra_head, extra_rule = (" accuracy (all) | Δ acc (all) |", "---:|---:|") if both else ("", "")
    lpips_head, lpips_rule = (" LPIPS ↑ |", "---:|") if with_lpips else ("", "")
    lines = [
        header,
        "",
        (f"| defense | model | setting | accuracy | Δ acc |{extra_head} SSIM ↓ | PSNR ↓ |{lpips_head} fidelity | "
         "overhead ms/update |"),
        f"|---|---|---|---:|---:|{extra_rule}---:|---:|{lpips_rule}---:|---:|",
    ]
    columns = lines[2].count("|") - 1
    for r in records:
        if "error" in r:  # (as many cells as the header: the blanks were one short, found in an audit)
            blanks = " |" * (columns - 2)
            lines.append(f"| {r['defense']} | {r.get('model_label', '')} | error: {r['error']}{blanks}")
            continue
        delta = "" if r["delta_acc"] is None else _num(r["delta_acc"], "+.1f")
        setting = r["setting"] + (" (bench: fewer steps)" if r["bench_override"] else "")
        extra = ""
        if both:
            delta_all = "" if r.get("delta_acc_all") is None else _num(r["delta_acc_all"], "+.1f")
            extra = f" {_percent(r.get('accuracy_all'), r.get('accuracy_all_se'))} | {delta_all} |"
        lines.append(
            f"| {r['defense']} | {r['model_label']} | {setting} | {_percent(r['accuracy'], r.get('accuracy_se'))} | "
            f"{delta} |{extra} "
            f"{_num(r.get('ssim'), '.3f')} | {_num(r.get('psnr'), '.2f')} |"
            + (f" {_num(r.get('lpips'), '.3f')} |" if with_lpips else "") + f" {_num(r['fidelity'], '.3f')} | "
            f"{_num(r['overhead_ms'], '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def write_results(records: list[dict], settings: dict, json_path: Path, md_path: Path, *,
                  complete: bool) -> str:
    """Write the JSON (strict: non-finite numbers as ``null``) and the markdown table; return the table.
    Before the attacks (``complete=False``) trained rows have ``ssim``/``psnr``/``leakage`` ``null`` (and
    ``lpips`` where it is reported)."""
    add_baselines(records)
    unscored = {"ssim": None, "psnr": None, "leakage": None} | ({"lpips": None} if settings.get("lpips") else {})
    rows = [r if "error" in r or "leakage" in r else {**r, **unscored} for r in records]
    result = {"benchmark": "defenses", "complete": complete, "settings": settings, "results": rows}
    write_atomically(json_path, dumps(result) + "\n")  # Ctrl-C never leaves half a file (nor loses the rows)
    md = markdown_table(rows, settings)
    if not complete:
        md += (f"\nPartial results: {len(rows)} row(s) trained; leakage (SSIM/PSNR) is measured after the last "
               "row.\n")
    write_atomically(md_path, md)
    return md


def main(args: argparse.Namespace) -> int:
    """Run the benchmark; returns 0, 1 if any defense failed (its row then holds the error), or 130 after
    Ctrl-C (the rows trained so far are written)."""
    from leakgym.data import federated_split, load_dataset
    from leakgym.metrics import lpips_available, lpips_status

    names = _check(args)
    device = canonical_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # (every device's generator)
    progress = not args.no_progress
    dataset = load_dataset("digits", image_size=args.image_size)
    split = federated_split(dataset, num_clients=args.clients, seed=args.seed)
    check_batches(args, split)
    json_path = check_output(args.json, "--json", table=False)  # (its table: --markdown, checked next)
    md_path = check_output(args.markdown if args.markdown is not None else args.json.with_suffix(".md"),
                           "--markdown" if args.markdown is not None else "--json (its .md table)", table=False)
    if md_path.resolve() == json_path.resolve():
        raise ValueError(f"--markdown={str(md_path)!r} is the --json file; allowed: another path (the table would "
                         "replace the JSON)")
    split = split_on(split, device)
    settings = {
        "dataset": "digits", "image_size": args.image_size, "model": args.model, "rounds": args.rounds,
        "clients": args.clients, "batch_size": args.batch_size, "victim_batch": args.victim_batch,
        "lr": args.lr, "precode_model": args.precode_model, "precode_width": args.precode_width or None,
        "precode_lr": args.precode_lr, "all_clients": bool(args.all_clients), "seed": args.seed,
        "utility": "all" if args.all_clients else args.utility or "both", "seeds": args.seeds,
        "seed_list": [args.seed + i for i in range(args.seeds)], "update_kind": args.update_kind,
        "local_steps": args.local_steps, "local_lr": args.local_lr, "local_optimizer": args.local_optimizer,
        "local_momentum": args.local_momentum, "local_weight_decay": args.local_weight_decay,
        "local_optimizer_label": (protocol_optimizer(args) or _plain_sgd()).describe(),
        "attack": "inverting-gradients", "attack_iterations": args.attack_iterations,
        "attack_rounds": attack_rounds(args.rounds, args.attack_rounds), "bench_overrides": BENCH_OVERRIDES,
        "device": device_label(device),
        # LPIPS beside SSIM/PSNR where the user's backbone weights are on disk, else null with the reason once
        "lpips": "alex" if lpips_available() else None, "lpips_note": lpips_status(),
        "machine": machine_label(torch.get_num_threads(), device),  # where wall_s and overhead_ms were timed
    }
    records, problems, failed = [], [], False
    rows_plan = plan(names, args)
    try:
        with progress_bar(len(rows_plan), "bench defenses", progress) as bar:
            for name, setup in rows_plan:
                label = setup.label(args.lr)
                try:
                    record, probs = train_row(name, args, split, progress, setup)
                except Exception as err:  # noqa: BLE001 - keep the other rows; the failure is in the table and exit code
                    failed = True
                    bar.write(f"defense {name!r} [{label}] failed: {type(err).__name__}: {err}", file=sys.stderr)
                    records.append({"defense": name, "model": setup.model, "width": setup.width, "lr": setup.lr,
                                    "precode": setup.precode, "model_label": label,
                                    "error": f"{type(err).__name__}: {err}"})
                else:
                    records.append(record)
                    problems.extend((len(records) - 1, rnd, upd, kn, orig) for rnd, upd, kn, orig in probs)
                    every = record.get("accuracy_all")
                    bar.write(f"{name:>14s} [{label}]: accuracy {_percent(record['accuracy'], record['accuracy_se'])}"
                              + ("" if every is None or record["all_clients"] else
                                 f", every client defending {_percent(every, record['accuracy_all_se'])}") + "  "
                              f"wall {record['wall_s']:.1f}s", file=sys.stderr)
                write_results(records, settings, json_path, md_path, complete=False)
                bar.update()
        start = time.perf_counter()
        scores = attack_all(problems, args, split.spec, lpips=settings["lpips"] is not None)
    except KeyboardInterrupt:
        return interrupted(len(records), len(rows_plan), json_path, md_path,
                           save=lambda: write_results(records, settings, json_path, md_path, complete=False))
    print(f"attacks: {len(problems)} updates in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    per_row: dict[int, list[dict]] = {}
    for (row, *_), score in zip(problems, scores):
        per_row.setdefault(row, []).append(score)
    for i, record in enumerate(records):
        if "error" in record:
            continue
        rows = per_row.get(i, [])
        record["leakage"] = rows
        record["ssim"] = sum(s["ssim"] for s in rows) / len(rows) if rows else None  # None: not attacked
        record["psnr"] = sum(s["psnr"] for s in rows) / len(rows) if rows else None
        if settings["lpips"] is not None:
            record["lpips"] = sum(s["lpips"] for s in rows) / len(rows) if rows else None
    print(write_results(records, settings, json_path, md_path, complete=True))
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover - the CLI entry is `leakgym bench defenses`
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    raise SystemExit(main(p.parse_args()))

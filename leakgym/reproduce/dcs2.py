"""DCS² (Wu et al., "Concealing Sensitive Samples against Gradient Leakage in Federated Learning",
AAAI 2024), Table 1: DCS² vs DP-Gaussian, Prune and Soteria against the GS attack (= Inverting
Gradients, Geiping et al. 2020) on MNIST/LeNet and CIFAR-10/ConvNet, batch size 1, untrained model;
PSNR/SSIM of the reconstructions (lower = better protection) and the FL accuracy on the sensitive
data (Acc_S) and the test set (Acc_T).

Scaled down: digits 16x16 instead of MNIST 28x28, LeNet, 8 victim images per seed (``small``),
Inverting Gradients with 300 iterations instead of the GS attack's thousands, DCS² with 100 instead
of 1000 concealed-sample steps; utility from a FedSGD run long enough for the undefended model to
plateau, in which only the victim (the target client) conceals its samples (paper: full FL
training).
"""

from __future__ import annotations

from leakgym.defenses import DefenseConfig
from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, markdown_table
from leakgym.reproduce.runner import (
    Panel,
    Paper,
    accuracy,
    drop_verdict,
    est,
    extreme_verdict,
    lpips_reported,
    quote,
    ranking_verdict,
    still_rising,
    utility_table,
)
from leakgym.reproduce.stats import ranking

ROWS = ("None", "DP-Gaussian", "Prune", "Soteria", "DCS²")


def _t(psnr, ssim, acc_s, acc_t):
    return {"psnr": psnr, "ssim": ssim, "acc_s": acc_s, "acc_t": acc_t}


#: DCS² Table 1 (PSNR, SSIM, Acc_S %, Acc_T %): the paper's means (its ± omitted). The only source of the
#: paper's numbers printed by this reproduction.
PAPER = {
    "MNIST": {
        "cite": "DCS² Table 1, MNIST block (LeNet, GS attack, batch 1)",
        "None": _t(59.20, 1.00, 86.98, 87.16),
        "DP-Gaussian": _t(35.38, 0.83, 85.94, 86.91),
        "Prune": _t(14.13, 0.37, 85.94, 86.91),
        "Soteria": _t(9.67, 0.30, 86.98, 86.94),
        "DCS²": _t(7.84, 0.17, 86.98, 86.98),
    },
    "CIFAR10": {
        "cite": "DCS² Table 1, CIFAR10 block (ConvNet, GS attack, batch 1)",
        "None": _t(20.41, 0.73, 90.35, 80.41),
        "DP-Gaussian": _t(12.34, 0.28, 77.19, 79.65),
        "Prune": _t(11.26, 0.22, 77.80, 79.51),
        "Soteria": _t(11.48, 0.29, 84.70, 79.76),
        "DCS²": _t(8.04, 0.15, 80.39, 79.79),
    },
    "claim": {"cite": "DCS² §Results (Tabs. 1-2)",
              "text": "our defense provides the best protection with minimal drop in accuracy"},
}

#: The largest accuracy drop (points) we accept as "minimal", and why: the paper's own MNIST drop of
#: Acc_T is 87.16 -> 86.98; ours must be measured, so a drop is "minimal" if it stays below 1 point.
MAX_DROP = 1.0

SCALES = {
    "small": {"B=1": Scale(batch_size=1, images=8, iterations=300, utility_rounds=200, utility_batch=16,
                           eval_size=None, utility_defended="victim")},
    "full": {"B=1": Scale(batch_size=1, images=32, iterations=1000, restarts=2, utility_rounds=600, utility_batch=16,
                          eval_size=None, utility_defended="victim")},
}
DCS2_STEPS = {"small": 100, "full": 1000}


def rows(size: str) -> list[DefenseRow]:
    return [
        DefenseRow("None", DefenseConfig()),
        DefenseRow("DP-Gaussian", DefenseConfig.preset("gaussian"),
                   note="Gaussian noise sigma=1e-2 (DCS² authors' MNIST script)"),
        DefenseRow("Prune", DefenseConfig.preset("prune"), note="per-layer pruning p=0.9 (ratio not in our copy)"),
        DefenseRow("Soteria", DefenseConfig.preset("soteria"), note="80% of representation units pruned"),
        DefenseRow("DCS²", DefenseConfig.preset("dcs2").replace(dcs2_steps=DCS2_STEPS[size]),
                   note=f"lambda_g=0.7, {DCS2_STEPS[size]} concealed-sample steps (paper: 1000)"),
    ]


def columns(size: str) -> list[AttackColumn]:
    return [AttackColumn("GS (Inverting Gradients)", "inverting-gradients",
                         note="cosine + TV, Adam, signed gradients, box; labels known")]


ATTACK = "GS (Inverting Gradients)"


def verdicts(result: dict) -> list[dict]:
    mnist = PAPER["MNIST"]
    ours = {m: {r: est(result, r, ATTACK, m) for r in ROWS} for m in ("ssim", "psnr")}
    small_perturbation = ("a defense whose perturbation is small relative to the gradient at this scale "
                          "(sigma=1e-2 noise on an untrained LeNet) leaves the cosine-matching attack unaffected")

    def ranking_reason(m: str) -> str:
        """The reason that concerns the pairs that did not separate (issue 36: a canned noise reason was given
        for pairs of Soteria, Prune and DCS², which add no noise)."""
        if any(v is None for v in ours[m].values()):
            return ""
        _, notes = ranking(ours[m], {r: mnist[r][m] for r in ROWS})
        loose = {r for n in notes for r in ROWS if f"{r} " in n}
        reasons = []
        if "DP-Gaussian" in loose or "None" in loose:
            reasons.append(small_perturbation)
        strong = sorted(loose - {"DP-Gaussian", "None"})
        if strong:
            means = [ours[m][r].mean for r in strong]
            reasons.append(f"{', '.join(strong)} end within {max(means) - min(means):.2f} of each other "
                           f"({m.upper()} {min(means):.2f} to {max(means):.2f}): each already removes most of the "
                           "attack's signal on this 16x16 LeNet, and the gaps the paper reports between them are "
                           "smaller than two standard errors at this number of images and seeds (more images would "
                           "separate them or show that they coincide at this scale)")
        return "; ".join(reasons) + "." if reasons else ""

    out = [ranking_verdict(f"Defense ranking by {m.upper()} (best protection first) matches the paper's MNIST "
                           "ranking, every pair beyond two standard errors",
                           ours[m], {r: mnist[r][m] for r in ROWS}, why=ranking_reason(m))
           for m in ("ssim", "psnr")]
    for m in ("ssim", "psnr"):
        out.append(extreme_verdict(
            f"DCS² gives the lowest {m.upper()} (best protection)", ours[m], "DCS²",
            paper=f"DCS² {quote(mnist['DCS²'][m])} lowest (MNIST); \"{PAPER['claim']['text']}\"",
            why="DCS² was run with fewer concealed-sample steps than the paper (see its row), so the concealed "
                "sample is less converged; Prune and Soteria also destroy most of the signal at this scale."))
    out.append(extreme_verdict(
        "Every defense lowers PSNR below no defense", ours["psnr"], "None", lowest=False,
        paper=" / ".join(quote(mnist[r]["psnr"]) for r in ROWS), why=small_perturbation + "."))
    paper_drop = f"Acc_T {quote(mnist['None']['acc_t'])}% -> {quote(mnist['DCS²']['acc_t'])}%"
    for key, label, pd in (("accuracy", "Acc_T", paper_drop),
                           ("accuracy_victim", "Acc_S",
                            f"Acc_S {quote(mnist['None']['acc_s'])}% -> {quote(mnist['DCS²']['acc_s'])}%")):
        out.append(drop_verdict(
            f"DCS² keeps the {label} of no defense (drop below {MAX_DROP:g} point)",
            accuracy(result, "None", key), accuracy(result, "DCS²", key), MAX_DROP, labels=("None", "DCS²"),
            paper=pd, why="the concealed sample's gradient share (lambda_g) replaces most of the victim's signal "
                          "in every round; see the accuracy curves." + still_rising(result, "DCS²")))
    return out


def tables(result: dict) -> str:
    body = []
    with_lpips = lpips_reported(result)  # the paper reports no LPIPS; ours where the weights were present
    for r in ROWS:
        p, q = PAPER["MNIST"][r], PAPER["CIFAR10"][r]
        body.append([r, est(result, r, ATTACK, "psnr"), quote(p["psnr"]), quote(q["psnr"]),
                     est(result, r, ATTACK, "ssim"), quote(p["ssim"]), quote(q["ssim"]),
                     *([est(result, r, ATTACK, "lpips")] if with_lpips else []),
                     accuracy(result, r, "accuracy_victim"), quote(p["acc_s"]), quote(q["acc_s"]),
                     accuracy(result, r), quote(p["acc_t"]), quote(q["acc_t"])])
    header = ["defense", "PSNR↓ ours", "PSNR MNIST", "PSNR CIFAR10", "SSIM↓ ours", "SSIM MNIST", "SSIM CIFAR10",
              *(["LPIPS↑ ours"] if with_lpips else []),
              "Acc_S ours %", "Acc_S MNIST", "Acc_S CIFAR10", "Acc_T ours %", "Acc_T MNIST", "Acc_T CIFAR10"]
    settings = "\n".join(f"* {r['name']}: {r['note'] or '-'} (active: {', '.join(r['active']) or 'none'})"
                         for r in result["rows"])
    return (f"## Table 1 (GS attack): ours vs paper ({PAPER['MNIST']['cite']}; {PAPER['CIFAR10']['cite']})\n\n"
            + markdown_table(header, body) + "\n\n" + utility_table(result, ROWS)
            + "\n\nDefense settings:\n\n" + settings)


def panels(result: dict) -> list[Panel]:
    mnist = PAPER["MNIST"]
    return [Panel(f"{m.upper()} vs GS attack", f"{m.upper()} ↓", list(ROWS), [est(result, r, ATTACK, m) for r in ROWS],
                  [mnist[r][m] for r in ROWS]) for m in ("ssim", "psnr")] + [
        Panel("test accuracy", "Acc_T (%)", list(ROWS), [accuracy(result, r) for r in ROWS],
              [mnist[r]["acc_t"] for r in ROWS])]


PAPER_SPEC = Paper(
    key="dcs2",
    title="DCS² (Wu et al., AAAI 2024) — Table 1",
    source="DCS² Table 1 (MNIST and CIFAR-10 blocks; GS attack)",
    paper_setting="MNIST 28x28 / LeNet and CIFAR-10 / ConvNet, untrained model, batch 1, GS attack "
                  "(Inverting Gradients), 100% of the target client's data sensitive; PSNR/SSIM, Acc_S/Acc_T.",
    scales=SCALES,
    rows=rows,
    columns=columns,
    paper_numbers=PAPER,
    verdicts=verdicts,
    tables=tables,
    panels=panels,
    printed=("MNIST", "CIFAR10"),
    deviations=[
        "Digits 16x16 instead of MNIST 28x28 (offline); CIFAR-10 only if present (see the CIFAR-10 line).",
        "DCS² concealed-sample optimisation shortened (small: 100 steps, full: 1000 = paper).",
        ("The Prune ratio is not in our copy of the paper; we use p=0.9 (the PPP paper's GC90). Soteria prunes "
         "80% of the representation units (the DCS² text says Soteria perturbs ~90% on TinyImageNet; the MNIST "
         "ratio is not in our copy)."),
        (f"Acc_S/Acc_T come from a FedSGD run from scratch (only the victim defends, as in DCS²) of a fixed number of "
         f"rounds (small: {SCALES['small']['B=1'].utility_rounds}, full: {SCALES['full']['B=1'].utility_rounds}) "
         "chosen for the undefended model to plateau (the plateau line says whether it did), not the paper's full "
         "FL training."),
        (f"\"Minimal drop in accuracy\" is not a number in the paper; we accept a drop below {MAX_DROP:g} point "
         "(beyond two standard errors)."),
    ],
)

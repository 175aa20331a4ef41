"""PPP (Scheliga et al., "PRECODE with Partial Perturbation", WACV 2023), Tables I-II.

Table I: an MLP with a PRECODE bottleneck defeats plain Inverting Gradients (PRECODE*), but the
layer-skipping attack -- matching only the layers before the bottleneck (PPP Eq. 4) -- recovers the
images perfectly (PRECODE). Table II: noisy gradients (NG3/NG2/NG1/NG05: sigma 1e-3/1e-2/1e-1/0.5)
and gradient compression (GC90/GC99) on the whole model, attacked with Inverting Gradients, against
PPP -- the same perturbations on the pre-bottleneck layers of a PRECODE model only -- attacked with
layer skipping; test accuracy and SSIM/PSNR/MSE of the reconstructions.

Scaled down: digits 16x16 instead of MNIST, MLP width 128 (full: 1024, the official width), 8
victim images one at a time (the paper attacks each victim image independently), 300 attack
iterations (paper: up to 24k with early stopping), a 100-round FedSGD run for accuracy.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from leakgym.defenses import DefenseConfig
from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, kendall_tau, markdown_table
from leakgym.reproduce.runner import Paper, accuracy, metric, verdict

IG, LS = "IG", "IG layer-skipping"
LEVELS = ("NG3", "NG2", "NG1", "NG05", "GC90", "GC99")
SETTING = {"NG3": {"noise_sigma": 1e-3}, "NG2": {"noise_sigma": 1e-2}, "NG1": {"noise_sigma": 1e-1},
           "NG05": {"noise_sigma": 0.5}, "GC90": {"prune": 0.9}, "GC99": {"prune": 0.99}}
#: Table order: baselines on the plain MLP, then the PRECODE rows.
ROWS = ("Baseline", *LEVELS, "PRECODE*", "PRECODE", *(f"PPP-{lvl}" for lvl in LEVELS))

#: PPP Table II (accuracy %, SSIM, PSNR, MSE, LPIPS), MNIST and CIFAR-10 blocks, and Table I's PRECODE*
#: row (plain IG on PRECODE; its accuracy cell is empty in our copy). The PPP rows are unlabelled in our
#: text copy; their order is the text's "Pert in {NG3, NG2, NG1, NG05, GC90, GC99}".
_COLS = ("acc", "ssim", "psnr", "mse", "lpips")


def _t(*values):
    return dict(zip(_COLS, values))


PAPER = {
    "MNIST": {
        "Baseline": _t(98.83, 1.00, 60.09, 0.00, 0.00), "NG3": _t(98.83, 1.00, 42.41, 0.00, 0.01),
        "NG2": _t(98.82, 0.87, 22.29, 0.06, 0.20), "NG1": _t(98.36, 0.11, 7.43, 1.91, 0.67),
        "NG05": _t(93.32, 0.02, 6.02, 2.64, 0.69), "GC90": _t(95.02, 0.94, 27.57, 0.02, 0.11),
        "GC99": _t(64.93, 0.72, 15.98, 0.30, 0.35), "PRECODE*": _t(None, 0.01, 3.52, 4.68, 0.71),
        "PRECODE": _t(98.86, 1.00, 48.02, 0.00, 0.00),
        "PPP-NG3": _t(98.89, 0.97, 32.32, 0.01, 0.05), "PPP-NG2": _t(98.87, 0.47, 12.30, 0.61, 0.56),
        "PPP-NG1": _t(98.40, 0.03, 7.20, 2.01, 0.68), "PPP-NG05": _t(95.36, 0.01, 6.92, 2.15, 0.68),
        "PPP-GC90": _t(98.79, 0.94, 27.01, 0.02, 0.12), "PPP-GC99": _t(88.90, 0.78, 17.24, 0.20, 0.35),
    },
    "CIFAR10": {
        "Baseline": _t(59.91, 1.00, 59.50, 0.00, 0.00), "NG3": _t(60.08, 0.99, 38.65, 0.00, 0.01),
        "NG2": _t(59.81, 0.63, 18.73, 0.16, 0.32), "NG1": _t(55.69, 0.04, 8.43, 2.31, 0.67),
        "NG05": _t(25.55, 0.01, 7.80, 2.69, 0.67), "GC90": _t(55.31, 0.87, 23.52, 0.06, 0.11),
        "GC99": _t(42.14, 0.43, 14.45, 0.62, 0.40), "PRECODE*": _t(None, 0.01, 5.50, 4.63, 0.69),
        "PRECODE": _t(59.80, 1.00, 49.52, 0.00, 0.00),
        "PPP-NG3": _t(59.76, 0.92, 28.26, 0.02, 0.06), "PPP-NG2": _t(59.64, 0.17, 11.39, 1.12, 0.60),
        "PPP-NG1": _t(56.51, 0.02, 8.57, 2.23, 0.67), "PPP-NG05": _t(48.99, 0.01, 8.44, 2.31, 0.67),
        "PPP-GC90": _t(50.92, 0.87, 23.73, 0.06, 0.11), "PPP-GC99": _t(38.02, 0.47, 15.85, 0.40, 0.40),
    },
}

SCALES = {
    "small": {"B=1": Scale(model="mlp", model_width=128, batch_size=1, images=8, iterations=300, utility_rounds=100,
                          utility_lr=0.1)},
    "full": {"B=1": Scale(model="mlp", model_width=1024, batch_size=1, images=16, iterations=2000,
                          utility_rounds=300, utility_lr=0.1)},
}


def _ppp(level: str) -> DefenseConfig:
    return DefenseConfig.preset(f"PPP-{level}")


def rows(size: str) -> list[DefenseRow]:
    out = [DefenseRow("Baseline", DefenseConfig(), attacks=(IG,))]
    out += [DefenseRow(lvl, DefenseConfig(**SETTING[lvl]), attacks=(IG,), note=f"whole model: {SETTING[lvl]}")
            for lvl in LEVELS]
    out.append(DefenseRow("PRECODE*", DefenseConfig(), precode=True, attacks=(IG,),
                          note="PRECODE attacked by plain IG (Table I)"))
    out.append(DefenseRow("PRECODE", DefenseConfig(), precode=True, attacks=(LS,),
                          note="PRECODE attacked by layer skipping (Table I/II)"))
    out += [DefenseRow(f"PPP-{lvl}", _ppp(lvl), precode=True, attacks=(LS,),
                       note=f"pre-bottleneck layers only: {SETTING[lvl]}") for lvl in LEVELS]
    return out


def columns(size: str) -> list[AttackColumn]:
    return [
        AttackColumn(IG, "inverting-gradients", note="all layers; labels known"),
        AttackColumn(LS, "layer-skipping", {"layers": "before_bottleneck", "skip_zeros": False},
                     note="PPP Eq. 4: only the layers before the PRECODE bottleneck; labels known"),
    ]


def _attack(row: str) -> str:
    return LS if row == "PRECODE" or row.startswith("PPP-") else IG


def _m(result: dict, row: str, name: str) -> float | None:
    return metric(result, row, _attack(row), name)


def verdicts(result: dict) -> list[dict]:
    ssim = {r: _m(result, r, "ssim") for r in ROWS}
    out = [
        verdict("PRECODE protects against plain IG (SSIM far below the undefended baseline)",
                ssim["PRECODE*"] < ssim["Baseline"] - 0.3,
                ours=f"PRECODE* {ssim['PRECODE*']:.2f} vs Baseline {ssim['Baseline']:.2f}", paper="0.01 vs 1.00",
                why="the stochastic bottleneck did not derail IG at this scale."),
        verdict("Layer skipping breaks PRECODE (SSIM within 0.1 of the undefended baseline)",
                ssim["PRECODE"] >= ssim["Baseline"] - 0.1,
                ours=f"PRECODE (layer skipping) {ssim['PRECODE']:.2f} vs Baseline {ssim['Baseline']:.2f}",
                paper="1.00 vs 1.00",
                why="matching only the pre-bottleneck layers uses fewer equations; with our iteration budget "
                    "the attack has not converged (the paper reports >3x more iterations are needed)."),
    ]
    for prefix in ("", "PPP-"):
        seq = [ssim[f"{prefix}{lvl}"] for lvl in ("NG3", "NG2", "NG1", "NG05")]
        mono = all(a >= b - 0.02 for a, b in itertools.pairwise(seq))
        out.append(verdict(f"{'PPP-' if prefix else ''}NG: SSIM falls as the noise grows (NG3 >= NG2 >= NG1 >= NG05, "
                           "0.02 slack)", mono, ours=" / ".join(f"{v:.2f}" for v in seq),
                           paper=" / ".join(f"{PAPER['MNIST'][f'{prefix}{lvl}']['ssim']:.2f}"
                                            for lvl in ("NG3", "NG2", "NG1", "NG05")),
                           why="per-image variance with few victim images at this scale."))
    out.append(verdict("Noise of sigma=0.1 (NG1) protects (SSIM < 0.2), both on the whole model and as PPP",
                       ssim["NG1"] < 0.2 and ssim["PPP-NG1"] < 0.2,
                       ours=f"NG1 {ssim['NG1']:.2f}, PPP-NG1 {ssim['PPP-NG1']:.2f}", paper="0.11, 0.03",
                       why="the gradient scale of a 16x16 width-128 MLP differs from the paper's MNIST MLP, so the "
                           "same absolute sigma is a different relative perturbation."))
    out.append(verdict("Gradient compression is insufficient: GC99 leaks more than NG1 (higher SSIM)",
                       ssim["GC99"] > ssim["NG1"], ours=f"GC99 {ssim['GC99']:.2f} vs NG1 {ssim['NG1']:.2f}",
                       paper="0.72 vs 0.11", why="see the per-row numbers."))
    acc = {r: accuracy(result, r) for r in ROWS}
    pairs = [(lvl, acc[lvl], acc[f"PPP-{lvl}"]) for lvl in LEVELS]
    if any(a is None or b is None for _, a, b in pairs):
        out.append(verdict("PPP costs less accuracy than the same perturbation on the whole model", None,
                           why="utility not measured"))
    else:
        wins = sum(b >= a - 0.5 for _, a, b in pairs)
        out.append(verdict("PPP costs less accuracy than the same perturbation on the whole model "
                           "(PPP >= whole-model - 0.5 points for at least 5 of 6 levels)", wins >= 5,
                           ours=", ".join(f"{lvl} {a:.1f}->{b:.1f}" for lvl, a, b in pairs),
                           paper="NG05 93.3->95.4, GC99 64.9->88.9 (others within 0.1)",
                           why="a 100-round FedSGD run from scratch is not converged, and per-row accuracy "
                               "differences of a few points are within the run-to-run spread at this size."))
    tau = kendall_tau(ssim, {r: PAPER["MNIST"][r]["ssim"] for r in ROWS})
    out.append(verdict("SSIM across all 15 rows correlates with the paper's MNIST SSIM (Kendall tau >= 0.5)",
                       tau >= 0.5, ours=f"tau = {tau:.2f}", paper="-", why="see the rows that differ above."))
    return out


def tables(result: dict) -> str:
    body = []
    for r in ROWS:
        p, q = PAPER["MNIST"][r], PAPER["CIFAR10"][r]
        body.append([r, _attack(r), accuracy(result, r), p["acc"], _m(result, r, "ssim"), p["ssim"], q["ssim"],
                     _m(result, r, "psnr"), p["psnr"], q["psnr"], _m(result, r, "mse"), p["mse"]])
    header = ["defense", "attack", "Acc ours %", "Acc MNIST", "SSIM↑ ours", "SSIM MNIST", "SSIM CIFAR10",
              "PSNR ours", "PSNR MNIST", "PSNR CIFAR10", "MSE ours", "MSE MNIST"]
    note = ("Privacy metrics: higher SSIM/PSNR = more leakage. MSE: ours on unit images; the paper's scale is not "
            "stated in our copy (values up to 4.68 suggest normalised images), so compare it only within a column. "
            "LPIPS not measured (no pretrained backbone offline).")
    return "## Tables I-II: ours vs paper\n\n" + markdown_table(header, body) + "\n\n" + note


def figure(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    from leakgym.reproduce.plots import paired_bars, save

    fig, axes = plt.subplots(1, 2, figsize=(13, 3.8))
    paired_bars(axes[0], list(ROWS), [_m(result, r, "ssim") for r in ROWS],
                [PAPER["MNIST"][r]["ssim"] for r in ROWS], ylabel="SSIM (higher = more leakage)",
                title="SSIM (IG; layer skipping for PRECODE/PPP)")
    paired_bars(axes[1], list(ROWS), [accuracy(result, r) for r in ROWS],
                [PAPER["MNIST"][r]["acc"] for r in ROWS], ylabel="test accuracy (%)", title="accuracy")
    axes[0].legend(fontsize=7)
    fig.suptitle("PPP Tables I-II: ours (digits 16x16, MLP) vs paper (MNIST)", fontsize=10)
    save(fig, path)


PAPER_SPEC = Paper(
    key="ppp",
    title="PPP: PRECODE with Partial Perturbation (Scheliga et al., WACV 2023) — Tables I-II",
    source="PPP Table I (PRECODE vs plain IG and vs the layer-skipping attack) and Table II (MNIST and CIFAR-10)",
    paper_setting="MLP (4 hidden layers, BatchNorm, ReLU) with/without PRECODE (beta=1e-3, K=256) on MNIST and "
                  "CIFAR-10; each victim image attacked alone by IG (cosine + TV, Adam, up to 24k iterations), "
                  "labels known; accuracy from 5-client FL training with Adam.",
    scales=SCALES,
    rows=rows,
    columns=columns,
    paper_numbers=PAPER,
    verdicts=verdicts,
    tables=tables,
    figure=figure,
    deviations=[
        "Digits 16x16 instead of MNIST 28x28; MLP width 128 in the small run (1024 in full).",
        "Attack iterations capped (small: 300; the paper runs up to 24k with early stopping).",
        ("Accuracy from a 100-round FedSGD run (SGD, server lr 0.1) instead of FL training with Adam to convergence. "
        "With the server lr 0.5 of the other papers' runs, the PRECODE model diverged (loss NaN after ~50 rounds) "
        "under PPP-NG2/NG1/NG05/GC99 while the plain MLP did not; lr 0.1 is stable for every row."),
        ("The layer-skipping attack matches the pre-bottleneck layers even when PPP-GC zeroes most of them "
        "(skip_zeros=False), as in PPP Eq. 4."),
    ],
)

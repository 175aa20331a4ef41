"""LODA (Wan et al., "Defense Against Gradient Leakage Attacks via Learning to Obscure Data"), Tables 1-2.

Table 1: accuracy and privacy (PSNR of the gradient-leakage reconstruction; lower = better) of
gradient pruning (p = 0.9, 0.99), Mixup and InstaHide (k = 4, 6) and LODA (LODA1: first five conv
layers, c = 20; LODA2: all conv layers, c = 30) under the gradient leakage attack (Inverting
Gradients: cosine + TV). Table 2: the same with each encoding's *adaptive* attack -- demixing of
Mixup/InstaHide with the known mixing (Carlini et al. / Huang et al.; :mod:`leakgym.attacks.mixup_decoding`)
and the inversion of LODA's obscuring (LODA Eq. 6; :mod:`leakgym.attacks.loda_inversion`).

Scaled down: digits 16x16 with LeNet instead of CIFAR-10 with ResNet-18; the LODA feature extractor is
LeakGym's small ConvNet trained on the digits public split (paper: ResNet-18 trained on CIFAR-100);
LODA obscuring with 100 instead of 500 steps; batch 6 (Mixup/InstaHide mix inside the batch, so
the batch must hold k = 6 images; the paper attacks one gradient per image); 12 victim images; 300
attack iterations; accuracy from a 100-round FedSGD run with 2 clients that both encode their batch
every round (the paper retrains a model on the encoded training set).

Without an adaptive attack, Mixup/InstaHide updates are attacked by Inverting Gradients with labels
inferred from the gradient (the attacker does not know the encoding); the paper compares each
reconstruction with its largest-weight Mixup component, we match each to one private image by
optimal assignment (:func:`leakgym.metrics.score_reconstruction`) -- close, but not identical.
"""

from __future__ import annotations

from pathlib import Path

from leakgym.defenses import DefenseConfig
from leakgym.reproduce.harness import AttackColumn, DefenseRow, Scale, kendall_tau, markdown_table
from leakgym.reproduce.runner import Paper, accuracy, metric, verdict

IG, IG_ENC, DECODE, LODA_INV1, LODA_INV2 = (
    "IG", "IG on encodings", "Mixup decoding", "LODA inversion (5 layers)", "LODA inversion (all layers)")
ROWS = ("No Defense", "GradPruning p=0.9", "GradPruning p=0.99", "Mixup k=4", "Mixup k=6", "InstaHide k=4",
        "InstaHide k=6", "LODA1", "LODA2")
#: Row -> (column of Table 1, column of Table 2); rows without an adaptive attack repeat Table 1 (as the paper).
ATTACK_OF = {
    "No Defense": (IG, IG), "GradPruning p=0.9": (IG, IG), "GradPruning p=0.99": (IG, IG),
    "Mixup k=4": (IG_ENC, DECODE), "Mixup k=6": (IG_ENC, DECODE),
    "InstaHide k=4": (IG_ENC, DECODE), "InstaHide k=6": (IG_ENC, DECODE),
    "LODA1": (IG, LODA_INV1), "LODA2": (IG, LODA_INV2),
}
EXTRACTOR_CONV_LAYERS = 8  # LeakGym's default LODA extractor (ConvNet, width 8) has 8 conv layers

#: LODA Tables 1-2, CIFAR-10 (accuracy %, avg/min LPIPS, avg/max PSNR).
_K = ("acc", "lpips", "lpips_min", "psnr", "psnr_max")


def _t(*v):
    return dict(zip(_K, v))


PAPER = {
    "table1": {
        "No Defense": _t(95.20, 0.098, 0.016, 16.61, 20.78), "GradPruning p=0.9": _t(93.30, 0.224, 0.074, 11.48, 15.52),
        "GradPruning p=0.99": _t(88.64, 0.490, 0.300, 5.44, 10.43), "Mixup k=4": _t(93.84, 0.377, 0.091, 15.01, 18.02),
        "Mixup k=6": _t(92.38, 0.400, 0.224, 14.2, 18.03), "InstaHide k=4": _t(91.80, 0.656, 0.607, 9.51, 12.87),
        "InstaHide k=6": _t(88.52, 0.628, 0.560, 9.98, 12.25), "LODA1": _t(89.50, 0.589, 0.480, 5.77, 7.77),
        "LODA2": _t(91.78, 0.566, 0.423, 7.41, 12.08),
    },
    "table2": {
        "No Defense": _t(95.20, 0.098, 0.016, 16.61, 20.78), "GradPruning p=0.9": _t(93.30, 0.224, 0.074, 11.48, 15.52),
        "GradPruning p=0.99": _t(88.64, 0.490, 0.300, 5.44, 10.43), "Mixup k=4": _t(93.84, 0.039, 0.016, 29.23, 34.04),
        "Mixup k=6": _t(92.38, 0.049, 0.015, 28.25, 31.94), "InstaHide k=4": _t(91.80, 0.395, 0.273, 10.77, 18.72),
        "InstaHide k=6": _t(88.52, 0.394, 0.233, 10.62, 18.86), "LODA1": _t(89.50, 0.537, 0.452, 12.95, 16.24),
        "LODA2": _t(91.78, 0.558, 0.456, 13.04, 16.91),
    },
}

LODA_STEPS = {"small": 100, "full": 500}
SCALES = {
    "small": {"B=6": Scale(batch_size=6, images=12, iterations=300, utility_rounds=100, utility_clients=2)},
    "full": {"B=6": Scale(batch_size=6, images=36, iterations=1000, restarts=2, utility_rounds=300)},
}


def rows(size: str) -> list[DefenseRow]:
    steps = LODA_STEPS[size]
    return [
        DefenseRow("No Defense", DefenseConfig(), attacks=(IG,)),
        DefenseRow("GradPruning p=0.9", DefenseConfig(prune=0.9), attacks=(IG,)),
        DefenseRow("GradPruning p=0.99", DefenseConfig(prune=0.99), attacks=(IG,)),
        DefenseRow("Mixup k=4", DefenseConfig(mixup_k=4), attacks=(IG_ENC, DECODE)),
        DefenseRow("Mixup k=6", DefenseConfig(mixup_k=6), attacks=(IG_ENC, DECODE)),
        DefenseRow("InstaHide k=4", DefenseConfig(instahide_k=4), attacks=(IG_ENC, DECODE)),
        DefenseRow("InstaHide k=6", DefenseConfig(instahide_k=6), attacks=(IG_ENC, DECODE)),
        DefenseRow("LODA1", DefenseConfig(loda_c=20.0, loda_layers=5, loda_steps=steps), attacks=(IG, LODA_INV1),
                   note=f"first 5 conv layers, c=20, {steps} steps (paper: 500)"),
        DefenseRow("LODA2", DefenseConfig(loda_c=30.0, loda_layers=EXTRACTOR_CONV_LAYERS, loda_steps=steps),
                   attacks=(IG, LODA_INV2), note=f"all {EXTRACTOR_CONV_LAYERS} conv layers, c=30, {steps} steps"),
    ]


def columns(size: str) -> list[AttackColumn]:
    return [
        AttackColumn(IG, "inverting-gradients", note="cosine + TV; labels known"),
        AttackColumn(IG_ENC, "inverting-gradients", labels_known=False,
                     note="the non-adaptive attacker: IG with labels inferred from the gradient, unaware of the "
                          "encoding (mixup-decoding with decode_steps=0 returns its demixing start, not the "
                          "recovered encodings, so it cannot serve here)"),
        AttackColumn(DECODE, "mixup-decoding", note="inversion + demixing with the known mixing matrix (Adam, lr 0.01)"),
        AttackColumn(LODA_INV1, "loda-inversion", {"c": 1.0, "inversion_steps": 100, "layers": 5},
                     note="LODA Eq. 6, c=1, 100 steps (paper)"),
        AttackColumn(LODA_INV2, "loda-inversion", {"c": 1.0, "inversion_steps": 100, "layers": EXTRACTOR_CONV_LAYERS},
                     note="LODA Eq. 6 on all conv layers, c=1, 100 steps"),
    ]


def _m(result: dict, row: str, table: int, name: str) -> float | None:
    return metric(result, row, ATTACK_OF[row][table - 1], name)


def verdicts(result: dict) -> list[dict]:
    p1 = {r: _m(result, r, 1, "psnr") for r in ROWS}
    p2 = {r: _m(result, r, 2, "psnr") for r in ROWS}
    out = [
        verdict("Pruning p=0.99 protects better than p=0.9 (lower PSNR)", p1["GradPruning p=0.99"] < p1["GradPruning p=0.9"],
                ours=f"{p1['GradPruning p=0.99']:.2f} vs {p1['GradPruning p=0.9']:.2f}", paper="5.44 vs 11.48",
                why="see the per-image values."),
        verdict("Mixup loses its protection under the adaptive attack (Table 2 PSNR > Table 1 PSNR, k=4 and k=6)",
                all(p2[r] > p1[r] for r in ("Mixup k=4", "Mixup k=6")),
                ours=", ".join(f"{r}: {p1[r]:.2f} -> {p2[r]:.2f}" for r in ("Mixup k=4", "Mixup k=6")),
                paper="15.01 -> 29.23, 14.2 -> 28.25",
                why="demixing one round's encodings amplifies the inversion error when the mixing matrix is "
                    "ill-conditioned (tests/test_defenses_encodings.py measures the same for k=2); the paper "
                    "combines 50 rounds of encodings."),
        verdict("InstaHide protects better than Mixup without the adaptive attack (lower PSNR, k=4 and k=6)",
                all(p1[f"InstaHide k={k}"] < p1[f"Mixup k={k}"] for k in (4, 6)),
                ours=", ".join(f"k={k}: {p1[f'InstaHide k={k}']:.2f} vs {p1[f'Mixup k={k}']:.2f}" for k in (4, 6)),
                paper="9.51 vs 15.01, 9.98 vs 14.2",
                why="our non-adaptive attacker infers hard labels from a soft-label gradient and recovers little "
                    "from either encoding, so both sit near the floor of the metric."),
        verdict("Under the adaptive attacks LODA leaks less than Mixup (lower Table 2 PSNR than both Mixup rows)",
                max(p2["LODA1"], p2["LODA2"]) < min(p2["Mixup k=4"], p2["Mixup k=6"]),
                ours=", ".join(f"{r} {p2[r]:.2f}" for r in ROWS[3:]),
                paper="LODA 12.95/13.04 vs Mixup 29.23/28.25",
                why="our single-round Mixup decoding does not recover the images (see the Mixup verdict above), so "
                    "Mixup looks stronger than it is."),
        verdict("LODA protects best under the adaptive attacks (the paper's claim, made on LPIPS)", None,
                ours="LPIPS not measured", paper="LPIPS LODA 0.54/0.56 vs InstaHide 0.40/0.39; by PSNR the paper's own "
                "Table 2 ranks InstaHide (10.77/10.62) below LODA (12.95/13.04)",
                why="needs LPIPS (pretrained backbone, not available offline)."),
        verdict("LODA's adaptive attack recovers more than plain IG on LODA (Table 2 PSNR > Table 1 PSNR)",
                all(p2[r] > p1[r] for r in ("LODA1", "LODA2")),
                ours=", ".join(f"{r}: {p1[r]:.2f} -> {p2[r]:.2f}" for r in ("LODA1", "LODA2")),
                paper="5.77 -> 12.95, 7.41 -> 13.04",
                why="Eq. 6 only inverts the obscuring if the obscured image is a stationary point of Eq. 4; with "
                    "fewer obscuring steps (see the LODA rows) it is not, and the inversion starts from a public image."),
    ]
    tau = kendall_tau(p1, {r: PAPER["table1"][r]["psnr"] for r in ROWS})
    out.append(verdict("Table 1 PSNR across the 9 rows correlates with the paper's (Kendall tau >= 0.5)", tau >= 0.5,
                       ours=f"tau = {tau:.2f}", paper="-", why="see the rows that differ above."))
    acc = {r: accuracy(result, r) for r in ROWS}
    if acc["No Defense"] is None or any(acc[r] is None for r in ("LODA1", "InstaHide k=4")):
        out.append(verdict("LODA costs at most as much accuracy as InstaHide", None, why="utility not measured"))
    elif max(acc["LODA1"], acc["InstaHide k=4"]) <= 15.0:
        out.append(verdict("LODA1 costs at most as much accuracy as InstaHide k=4", None,
                           ours=f"No Defense {acc['No Defense']:.1f}%, InstaHide k=4 {acc['InstaHide k=4']:.1f}%, "
                                f"LODA1 {acc['LODA1']:.1f}% (chance level: nothing learned)",
                           paper="95.20 / 91.80 / 89.50",
                           why="both utility runs stayed at chance, so the comparison says nothing; our FedSGD run "
                               "re-encodes every batch every round (the paper encodes the training set once and "
                               "retrains to convergence)."))
    else:
        out.append(verdict("LODA1 costs at most as much accuracy as InstaHide k=4 (within 2 points)",
                           acc["LODA1"] >= acc["InstaHide k=4"] - 2.0,
                           ours=f"No Defense {acc['No Defense']:.1f}%, InstaHide k=4 {acc['InstaHide k=4']:.1f}%, "
                                f"LODA1 {acc['LODA1']:.1f}%", paper="95.20 / 91.80 / 89.50",
                           why="our extractor is a small ConvNet trained on ~180 public digits, and the images are "
                               "re-obscured every round with few steps; the paper obscures once with a ResNet-18 "
                               "trained on CIFAR-100 and retrains to convergence."))
    return out


def tables(result: dict) -> str:
    out = []
    for table in (1, 2):
        body = []
        for r in ROWS:
            p = PAPER[f"table{table}"][r]
            body.append([r, ATTACK_OF[r][table - 1], accuracy(result, r), p["acc"], _m(result, r, table, "psnr"),
                         p["psnr"], _m(result, r, table, "psnr_max"), p["psnr_max"], _m(result, r, table, "ssim")])
        header = ["defense", "attack", "Acc ours %", "Acc paper", "Avg PSNR↓ ours", "Avg PSNR paper",
                  "Max PSNR ours", "Max PSNR paper", "SSIM ours"]
        title = "Table 1: gradient leakage attack" if table == 1 else "Table 2: gradient leakage + adaptive attack"
        out.append(f"## {title} (ours vs paper, CIFAR-10)\n\n" + markdown_table(header, body))
    return "\n\n".join(out) + "\n\nLPIPS (the paper's other privacy metric) not measured: no pretrained backbone offline."


def figure(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    from leakgym.reproduce.plots import paired_bars, save

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
    for ax, table in zip(axes, (1, 2)):
        paired_bars(ax, list(ROWS), [_m(result, r, table, "psnr") for r in ROWS],
                    [PAPER[f"table{table}"][r]["psnr"] for r in ROWS], ylabel="Avg PSNR (dB) ↓",
                    title="Table 1: gradient leakage" if table == 1 else "Table 2: + adaptive attack")
    axes[0].legend(fontsize=7)
    fig.suptitle("LODA Tables 1-2: ours (digits 16x16, LeNet) vs paper (CIFAR-10, ResNet-18)", fontsize=10)
    save(fig, path)


PAPER_SPEC = Paper(
    key="loda",
    title="LODA (Wan et al.) — Tables 1-2",
    source="LODA Table 1 (gradient leakage attack) and Table 2 (+ adaptive attacks), CIFAR-10",
    paper_setting="CIFAR-10, ResNet-18, one gradient per private image; IG (cosine + TV); LODA feature extractor "
                  "ResNet-18 trained on CIFAR-100, 500 obscuring steps (lr 0.1); adaptive attacks: Mixup/InstaHide "
                  "decoding (Adam lr 0.01, 50 rounds of encodings combined), LODA Eq. 6 (c=1, 100 steps); accuracy "
                  "of a model retrained on the encoded data.",
    scales=SCALES,
    rows=rows,
    columns=columns,
    paper_numbers=PAPER,
    verdicts=verdicts,
    tables=tables,
    figure=figure,
    deviations=[
        ("Digits 16x16 and LeNet instead of CIFAR-10 and ResNet-18; LODA extractor: LeakGym's small ConvNet "
        "trained on the digits public split (8 conv layers; LODA2 uses all of them)."),
        "Batch 6 instead of one gradient per image: Mixup/InstaHide mix images inside the batch.",
        "LODA obscuring shortened (small: 100 steps; full: 500 = paper).",
        ("Mixup/InstaHide decoding uses one round's encodings (the paper combines 50); the attacker is given the "
        "mixing matrix (the upper-bound threat model of leakgym.attacks.mixup_decoding)."),
        ("Without the adaptive attack, Mixup/InstaHide are attacked by IG with inferred labels (the attacker does "
         "not know the encoding) and its reconstructions are matched to private images by optimal assignment, "
         "not to their largest-weight component."),
        ("Utility: 2 clients x 100 FedSGD rounds (LODA obscuring every batch every round is the cost); the "
         "encoded rows did not learn (chance accuracy), see the verdicts."),
        ("Gradient pruning is attacked with plain IG on the whole (pruned) update (paper: matching only the "
        "unpruned part)."),
        "LPIPS not measured.",
    ],
)

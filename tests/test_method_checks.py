"""Every registered defense and attack does what its paper says (the checks are in ``method_checks.py``).

Parametrised over the registries, so a newly registered defense or attack is checked too, and fails
until it has a case in ``DEFENSE_CASES`` / ``ATTACK_CASES``. ``test_sabotage.py`` shows that each
check fails on a broken version of its method. A difference counts when it exceeds 3 standard errors,
the seed-to-seed spread of either side and a floor (see ``method_checks``).

Measured (torch 2.15, CPU; mean SSIM; spread = seed-to-seed std; the bar a difference had to clear in brackets).
Defenses, reference IG 100 iterations on LeNet, B = 1, 4 images x 3 seeds: clean 0.897 (spread 0.034);
oasis 0.228, loda 0.476, dcs2 0.475, censor -0.013, soteria 0.423, prune 0.399, topk 0.231,
clip_value 0.351, noise 0.589 (every bar 0.034-0.058); clip: noise 1e-2 alone 0.894, with clipping
0.492 (bar 0.045). Mixup / InstaHide (B = 2, labels inferred, 3 batches x 3 seeds): clean 0.857,
mixup 0.724 (drop 0.133, bar 0.035), instahide 0.030. PPP-NG1 on PRECODE (layer skipping): clean
0.994, defended 0.062 (bar 0.080).
Attacks (best baseline in brackets: the mean public image scores 0.47-0.50 on these digits, uniform
noise ~0.01): dlg 0.991, inverting-gradients 0.897, gradinversion 0.972, analytic 1.000,
layer-skipping 0.994, eot 0.888 (all vs mean image ~0.50, margin 0.2); prior-init 0.877 (vs its
class-mean start 0.764, margin 0.05); loda-inversion 0.226 (vs noise 0.019, margin 0.1); mixup-decoding on
Mixup 0.758 (vs 0.472, margin 0.1); imprint 0.927, trap-weights 1.000 at B = 8 (vs 0.412).
Adaptive vs counterpart: layer skipping 0.994 vs IG -0.009 on PRECODE; prior-init 0.877 vs IG 0.172
at 20 iterations; GradInversion with its BN and group priors 0.188 vs 0.028 without (MLP, B = 2;
bar 0.041); mixup-decoding 0.278 vs IG 0.032 on InstaHide-encoded updates (bar 0.082).
"""

from __future__ import annotations

import pytest
from method_checks import check_attack, check_defense, prepared

from leakgym.attacks import ATTACKS
from leakgym.defenses import DEFENSES


@pytest.fixture(scope="module", autouse=True)
def _prepared(tmp_path_factory):
    with prepared(tmp_path_factory.getbasetemp() / "leakgym-data"):
        yield


@pytest.mark.parametrize("name", list(DEFENSES))
def test_defense_changes_the_update_and_lowers_the_leakage(name):
    r = check_defense(name)
    print(f"{name}: clean {r.clean}, defended {r.defended}, drop {r.drop}")


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_beats_its_baselines_and_its_counterpart(name):
    r = check_attack(name)
    gains = ", ".join(f"{b} {base.mean:.3f} (gain {r.gains[b]})" for b, base in r.baselines.items())
    print(f"{name}: {r.leakage}; baselines {gains}")
    if r.advantage is not None:
        print(f"  adaptive {r.adaptive} vs counterpart {r.counterpart}: {r.advantage}")

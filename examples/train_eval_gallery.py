"""Worked example: train a small attacker, play it against two defender presets, look at the gallery.

    python examples/train_eval_gallery.py                # 256 training rounds, 5 episodes per pair
    python examples/train_eval_gallery.py --tiny         # tiny budgets: a smoke run, not a result

It runs three ``leakgym`` commands (each printed before it runs, so you can paste it in a shell):

1. ``leakgym train``: PPO learns the attacker of LeakGym-Digits-v0 against the ``noise-0.1`` defender.
   The game is narrowed to one attack budget (20 iterations, one restart, one TV weight), so the
   attacker's choice is the strategy (Inverting Gradients, DLG, prior-init, GradInversion).
2. ``leakgym eval``: the learned attacker and the uniformly random one against the ``noise-0.1`` and
   ``prune-0.9`` defender presets, on the same episode seeds; prints the payoff table and who beats
   whom, writes ``payoff.csv`` / ``payoff.json`` / ``payoff.png``.
3. ``OUT/eval/gallery.png``: one panel per (attacker, defender) pair, the private images of its kept
   round beside the attacker's reconstructions, with SSIM and PSNR.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from leakgym.cli import main as leakgym

#: the game: one attack budget (iterations, restarts, TV weight), so the strategy is the attacker's choice
GAME = {"rounds": 4, "num_clients": 1, "eval_size": 64, "iterations": [20], "restarts": [1], "tv": [1e-4]}
#: --tiny: 2 rounds, one attack iteration, a smaller test set
TINY_GAME = {**GAME, "rounds": 2, "eval_size": 32, "iterations": [1]}
DEFENDERS = "noise-0.1,prune-0.9"


def _overrides(game: dict) -> list[str]:
    return [f"{k}={v}".replace(" ", "") for k, v in game.items()]


def run(argv: list[str]) -> None:
    print("$ leakgym " + shlex.join(argv), flush=True)
    status = leakgym(argv)
    if status:
        raise SystemExit(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/example"), help="output folder (default: runs/example)")
    parser.add_argument("--tiny", action="store_true", help="tiny budgets: a smoke run, not a result")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    game, timesteps, episodes = (TINY_GAME, 16, 1) if args.tiny else (GAME, 256, 5)
    # ppo.yml plays 8 games per step (the batched vector env): rollouts of n_steps x 8 games.
    hyperparams = ["n_steps=2", "batch_size=8", "n_epochs=2"] if args.tiny else [
        "n_steps=8", "batch_size=32", "learning_rate=0.003", "ent_coef=0.0"]
    quiet = ["--no-progress"] if args.no_progress else []
    policy = args.out / "attacker" / "policy.zip"
    run(["train", "--env", "LeakGym-Digits-v0", "--role", "attacker", "--algo", "ppo", "--opponent", "noise-0.1",
         "--timesteps", str(timesteps), "--out", str(policy.parent), "--hyperparams", *hyperparams, *quiet,
         "--overrides", *_overrides(game)])
    run(["eval", "--env", "LeakGym-Digits-v0", "--attackers", f"{policy},random", "--defenders", DEFENDERS,
         "--episodes", str(episodes), "--out", str(args.out / "eval"), *quiet, "--overrides", *_overrides(game)])
    print(f"gallery: {args.out / 'eval' / 'gallery.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

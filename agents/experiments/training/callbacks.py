"""Stable-Baselines3 callbacks of a training run: progress bar, checkpoints, LeakGym's TensorBoard metrics
and periodic evaluations."""

from __future__ import annotations

import csv
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from leakgym.agents.policies.learned import save_policy

from ..evaluation.payoff import t_interval
from .episodes import EVAL_METRICS, EVAL_RANGES, evaluate_policy


def _progress_callback(total: int):
    from stable_baselines3.common.callbacks import BaseCallback
    from tqdm.auto import tqdm

    class TqdmCallback(BaseCallback):
        """A tqdm bar over the steps really played (total and ETA), with the recent mean leakage SSIM."""

        def _on_training_start(self) -> None:
            self.bar = tqdm(total=total, desc="train", unit="step")
            self.recent: deque[float] = deque(maxlen=64)

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if math.isfinite(info.get("leakage_ssim", math.nan)):  # NaN: no round played (reset infos)
                    self.recent.append(float(info["leakage_ssim"]))
            if self.recent:
                self.bar.set_postfix(ssim=f"{np.mean(self.recent):.3f}", refresh=False)
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return TqdmCallback()


def _after_updates(freq: int):
    """The base class of a callback that acts once the steps have passed a multiple of ``freq``: at the next
    update's end (the next rollout's start, or the run's end), with ``num_timesteps`` the steps played then, so
    that what is labelled with a step count is the policy trained on those steps (found in an audit: acting when
    it came due, a checkpoint held the weights from before the update of the steps it was labelled with);
    several multiples passed within one rollout give one action. Subclasses define ``act()`` and may extend
    ``_init_callback``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class AfterUpdates(BaseCallback):
        def _init_callback(self) -> None:
            self.next_due = (self.num_timesteps // freq + 1) * freq
            self.due = False

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_due:
                self.due = True
                self.next_due = (self.num_timesteps // freq + 1) * freq
            return True

        def _act_if_due(self) -> None:
            if self.due:
                self.num_timesteps = self.model.num_timesteps
                self.act()
                self.due = False

        def _on_rollout_start(self) -> None:
            self._act_if_due()

        def _on_training_end(self) -> None:
            self._act_if_due()

    return AfterUpdates


def _checkpoint_callback(save_freq: int, folder: Path, metadata: dict[str, Any], flat_nvec: Any):
    class PolicyCheckpoints(_after_updates(save_freq)):
        """``folder/policy_<steps>_steps.zip`` and its JSON file once the steps have passed a multiple of
        ``save_freq``, labelled with the steps played at the next update's end (:func:`_after_updates`)."""

        def _init_callback(self) -> None:
            super()._init_callback()
            folder.mkdir(parents=True, exist_ok=True)

        def act(self) -> None:
            steps = int(self.num_timesteps)
            save_policy(self.model, folder / f"policy_{steps}_steps.zip", {**metadata, "timesteps": steps},
                        flat_nvec=flat_nvec)

    return PolicyCheckpoints()


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def leakgym_metrics_callback(window: int):
    """An SB3 callback that logs LeakGym's quantities of each round (``round_details()``) to TensorBoard.

    After each rollout holding at least ``window`` steps (PPO/A2C: every rollout; DQN, whose
    rollouts are ``train_freq`` steps: every ``window`` steps) it records the mean of the numeric
    infos in :data:`LeakGymMetricsCallback.MEANS` under ``leakgym/``, the share of steps that played
    each attack strategy (``leakgym/attack/<strategy>``) and applied each defense
    (``leakgym/defense/<name>``; ``leakgym/defense/none``: no defense), and histograms of the
    numeric attack and defense settings (``leakgym/attack_settings/<field>``, TensorBoard only). A
    choice seen once is logged in every later record (0 when not played), so its curve is continuous.
    """
    from stable_baselines3.common.callbacks import BaseCallback

    class LeakGymMetricsCallback(BaseCallback):
        MEANS = ("leakage", "leakage_ssim", "leakage_psnr", "leakage_lpips", "accuracy", "label_accuracy")

        def _init_callback(self) -> None:
            self.infos: list[dict[str, Any]] = []
            self.strategies: set[str] = set()
            self.defenses: set[str] = set()

        def _on_step(self) -> bool:
            # The infos hold numbers only (leakgym.envs.infos); each game's full record of the round just
            # played (strategy, settings, defenses applied; LPIPS only where measured) is round_details().
            self.infos.extend(d for d in self.training_env.env_method("round_details") if "leakage" in d)
            return True

        def _on_rollout_end(self) -> None:
            if len(self.infos) >= window:
                self.record_infos(self.infos)
                self.infos = []

        def record_infos(self, infos: list[dict[str, Any]]) -> None:
            for key in self.MEANS:
                values = [float(i[key]) for i in infos if _numeric(i.get(key))]
                if values:
                    self.logger.record(f"leakgym/{key}", float(np.mean(values)))
            strategies = Counter(i["strategy"] for i in infos if "strategy" in i)
            with_defenses = [i["defenses"] for i in infos if "defenses" in i]
            defenses = Counter(name for applied in with_defenses for name in applied)
            defenses["none"] = sum(1 for applied in with_defenses if not applied)
            self.strategies |= set(strategies)
            self.defenses |= {name for name, count in defenses.items() if count}
            if strategies:
                for name in sorted(self.strategies):
                    self.logger.record(f"leakgym/attack/{name}", strategies[name] / sum(strategies.values()))
            if with_defenses:
                for name in sorted(self.defenses):
                    self.logger.record(f"leakgym/defense/{name}", defenses[name] / len(with_defenses))
            for group in ("attack_settings", "defense_settings"):
                settings = [i[group] for i in infos if isinstance(i.get(group), dict)]
                for key in sorted({k for s in settings for k, v in s.items() if _numeric(v)}):
                    values = np.array([float(s[key]) for s in settings if _numeric(s.get(key))])
                    self.logger.record(f"leakgym/{group}/{key}", values, exclude=("stdout", "log", "json", "csv"))

    return LeakGymMetricsCallback()


EVAL_COLUMNS = ["timesteps", "wall_time_s", "episodes"] + [
    f"{m}_{s}" for m in EVAL_METRICS for s in ("mean", "ci95_low", "ci95_high")
]


def eval_callback(make_env: Callable[[int], Any], freq: int, episodes: int, seed: int, csv_path: Path, *,
                  together: bool = False):
    """An SB3 callback that evaluates the policy against the opponent every ``freq`` steps: once the steps have
    passed a multiple of ``freq``, at the next update's end (the next rollout's start, or the run's end), so that
    a row labelled with a step count evaluates the policy trained on those steps.

    Each evaluation is one :func:`evaluate_policy`: ``episodes`` episodes on environments built for it
    (``make_env(num_envs)``, so every evaluation meets the opponent in the same starting state), the
    learner acting deterministically, with the same reset seeds ``seed, seed + 1, ...`` every time
    (so evaluations differ only by the policy); ``together`` plays them in lockstep. It logs
    ``eval/<metric>`` (mean over episodes) to TensorBoard and appends a row to ``csv_path``:
    ``timesteps, wall_time_s, episodes`` and, for each metric in :data:`EVAL_METRICS`, the mean and its
    95% t-interval (clipped to :data:`EVAL_RANGES`).
    """
    class LeakGymEvalCallback(_after_updates(freq)):
        def _init_callback(self) -> None:
            super()._init_callback()
            self.t0 = time.perf_counter()
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            with open(csv_path, "w", newline="") as fh:
                csv.writer(fh).writerow(EVAL_COLUMNS)

        def act(self) -> None:
            self.evaluate()

        def evaluate(self) -> dict[str, Any]:
            rows = evaluate_policy(make_env, lambda obs: self.model.predict(obs, deterministic=True)[0],
                                   episodes, seed, together=together)
            record: dict[str, Any] = {"timesteps": int(self.num_timesteps),
                                      "wall_time_s": round(time.perf_counter() - self.t0, 3), "episodes": episodes}
            for m in EVAL_METRICS:
                mean, low, high = t_interval([r[m] for r in rows], bounds=EVAL_RANGES[m])
                record.update({f"{m}_mean": mean, f"{m}_ci95_low": low, f"{m}_ci95_high": high})
                self.logger.record(f"eval/{m}", mean)
            self.logger.dump(self.num_timesteps)
            with open(csv_path, "a", newline="") as fh:
                csv.writer(fh).writerow(["" if isinstance(v, float) and math.isnan(v) else v
                                         for v in (record[c] for c in EVAL_COLUMNS)])
            return record

    return LeakGymEvalCallback()

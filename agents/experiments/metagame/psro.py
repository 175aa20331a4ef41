"""Policy-Space Response Oracles (PSRO; Lanctot et al. 2017, Algorithm 1) over attacker and defender populations.

Three parts meet through plain data, as in OpenSpiel's ``psro_v2``:

* the **empirical game** (:class:`EmpiricalGame`): per-episode samples of every (attacker, defender) cell,
  filled by a :class:`Simulator` (LeakGym's environments in :mod:`.simulation`; an exact matrix game in
  the tests);
* the **meta-solver** (:mod:`.solvers`): the mean attacker and defender returns -> one mixture per side;
* the **oracle** (:class:`Oracle`): a best response of one role against the other side's mixture (a
  Stable-Baselines3 policy trained against :class:`~.mixture.MixtureAgent` in :mod:`.simulation`).

Iteration ``k`` (1-based) of :func:`run_psro`:

(a) fill the cells of the current populations that have no samples yet;
(b) solve the meta-game: ``(sigma_A, sigma_D)``;
(c) train one best response per role against the other side's ``sigma`` (each against the mixture of
    iteration ``k``, so the two trainings are independent);
(d) simulate the new members' cells (their row and column, and the cell where they meet), record each
    side's best-response gain against ``sigma`` and their sum, and add both to the populations.

**Exploitability.** With ``u_A`` the attacker's mean return, the attacker's gain is
``max_{a in P_A + {BR_A}} u_A(a, sigma_D) - u_A(sigma_A, sigma_D)`` (the best of the new best response
and the population's own members, so it is >= 0 whatever the meta-solver), likewise the defender's; their
sum is the approximate NashConv of ``sigma`` (Lanctot et al. 2017, Sec. 3; exact when the oracle is exact).
Its 95% interval comes from the evaluation episodes: every cell plays episode ``e`` with the same seed
(common random numbers), so the gain is a mean of per-episode paired differences, and its Student-t
interval is over those.

Everything is written as it goes (:class:`MetagameState`, ``metagame.json``): the populations, every
cell's samples, each finished iteration, and the best responses of an unfinished one. ``resume`` continues
a run without replaying finished cells or retraining a finished best response; a resume with other
settings is refused naming the difference (``iterations`` may grow). Before anything is rewritten, a state
file that the run did not write (a field of another type, a cell value outside its metric's range or not
finite: ``leakgym eval --resume``'s check; a member named twice) is refused in one line naming the file and
the field (:meth:`MetagameState.from_json`), and so is a member whose policy file changed since it joined
(its hash, checked for every member when the state is opened: :func:`open_state`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from leakgym.files import json_safe

from ..evaluation.payoff import clamped_metric_value, metric_value_error, t_interval
from .solvers import meta_solver

STATE_FILE = "metagame.json"
#: the values of a state's ``status``
STATUSES = ("running", "interrupted", "finished")
#: metrics every cell records per episode; the payoffs are the two returns
CELL_METRICS = ("attacker_return", "defender_return", "leakage_ssim", "leakage_psnr", "accuracy")
ROLES = ("attacker", "defender")


@dataclass
class Member:
    """A population member: ``name`` labels it in tables; ``spec`` is what builds it (a preset name, a
    policy path); ``iteration`` 0 for the initial population, ``k`` for the best response of iteration
    ``k``; ``sha256`` the policy file's hash (None for presets)."""

    name: str
    spec: str
    iteration: int = 0
    sha256: str | None = None


@dataclass
class CellSamples:
    """Per-episode values of one cell (each metric a list over episodes ``0..n-1``) and the rounds played."""

    values: dict[str, list[float]]
    rounds: int = 0

    @property
    def episodes(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0


class Simulator(Protocol):
    """Plays every attacker of ``attackers`` against every defender of ``defenders``; ``tag`` names the
    block (a folder for its files, so an interrupted block resumes)."""

    def play(self, attackers: Sequence[Member], defenders: Sequence[Member], tag: str
             ) -> dict[tuple[str, str], CellSamples]: ...


class Oracle(Protocol):
    """A best response of ``role`` against ``opponents`` mixed with ``mixture``; returns the new member and
    the environment steps it used. ``name`` is the member's name to use."""

    def best_response(self, role: str, opponents: Sequence[Member], mixture: np.ndarray, *, iteration: int,
                      name: str) -> tuple[Member, int]: ...


class MetagameInterrupted(KeyboardInterrupt):
    """Ctrl-C during PSRO, after the state was saved (``stage`` says where it stopped)."""

    def __init__(self, stage: str, path: Path) -> None:
        super().__init__(f"metagame interrupted during {stage}; everything finished is in {path}")
        self.stage = stage


@dataclass
class EmpiricalGame:
    """The samples of every cell played so far, keyed by ``(attacker name, defender name)``."""

    cells: dict[tuple[str, str], CellSamples] = field(default_factory=dict)

    def missing(self, attackers: Sequence[Member], defenders: Sequence[Member]) -> list[tuple[str, str]]:
        return [(a.name, d.name) for a in attackers for d in defenders if (a.name, d.name) not in self.cells]

    def samples(self, attackers: Sequence[str], defenders: Sequence[str], metric: str) -> np.ndarray:
        """``(m, n, episodes)`` array of ``metric`` (every cell must have the same episode count)."""
        rows = [[self.cells[(a, d)].values[metric] for d in defenders] for a in attackers]
        lengths = {len(v) for row in rows for v in row}
        if len(lengths) != 1:
            raise ValueError(f"cells have different episode counts {sorted(lengths)}; a table needs one count")
        return np.asarray(rows, dtype=np.float64)

    def means(self, attackers: Sequence[str], defenders: Sequence[str], metric: str) -> np.ndarray:
        return self.samples(attackers, defenders, metric).mean(axis=2)


def _interval(values: np.ndarray) -> dict[str, float]:
    mean, low, high = t_interval(values)
    return {"mean": mean, "ci95_low": low, "ci95_high": high}


def best_response_gain(samples: np.ndarray, member_samples: np.ndarray, own_mix: np.ndarray,
                       other_mix: np.ndarray) -> tuple[dict[str, float], int, np.ndarray]:
    """One side's gain against the other's mixture, from the row player's point of view.

    ``samples``: ``(m, n, E)`` this side's per-episode payoffs in the table (this side indexes rows);
    ``member_samples``: ``(n, E)`` the new best response's payoffs against each column; ``own_mix``
    ``(m,)``, ``other_mix`` ``(n,)``. Returns the interval of the gain, the index of the best deviation
    (``m`` = the new best response) and the per-episode gains.
    """
    value_e = np.einsum("i,ije,j->e", own_mix, samples, other_mix)
    candidates = np.concatenate([samples, member_samples[None]], axis=0)  # (m + 1, n, E)
    against_e = np.einsum("ije,j->ie", candidates, other_mix)
    best = int(np.argmax(against_e.mean(axis=1)))
    gains_e = against_e[best] - value_e
    return _interval(gains_e), best, gains_e


@dataclass
class MetagameState:
    """Everything :func:`run_psro` has done, as written to ``metagame.json``."""

    settings: dict[str, Any]
    populations: dict[str, list[Member]]
    game: EmpiricalGame = field(default_factory=EmpiricalGame)
    iterations: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] = field(default_factory=dict)
    """Best responses of the unfinished iteration: ``{"iteration": k, "env_steps_before": steps, "attacker": Member,
    ...}`` (``env_steps_before``: :attr:`env_steps` when the iteration began)."""
    final: dict[str, Any] = field(default_factory=dict)
    """The meta-strategies of the final table (after the last iteration's best responses joined)."""
    status: str = "running"
    env_steps: int = 0
    wall_time_s: float = 0.0

    def to_json(self, out: Path | None = None) -> dict[str, Any]:
        """The state as written to ``out/metagame.json``: a policy file inside ``out`` is named relative to it
        (:func:`_stored`), so that the folder can be resumed from another working directory, or moved."""
        def stored(m: Member) -> dict[str, Any]:
            return _stored(m, out)

        return json_safe({
            "settings": self.settings,
            "status": self.status,
            "env_steps": self.env_steps,
            "wall_time_s": round(self.wall_time_s, 3),
            "populations": {r: [stored(m) for m in ms] for r, ms in self.populations.items()},
            "iterations": self.iterations,
            "final": self.final,
            "pending": {k: (stored(v) if isinstance(v, Member) else v) for k, v in self.pending.items()},
            "cells": [{"attacker": a, "defender": d, "rounds": c.rounds, **c.values}
                      for (a, d), c in self.game.cells.items()],
        })

    @classmethod
    def from_json(cls, data: dict[str, Any], out: Path | None = None) -> MetagameState:
        """The state of ``data`` (read from ``out/metagame.json``): policy files named relative to ``out`` are
        found there. Anything that :meth:`to_json` does not write is refused (``ValueError``, one line naming
        the file, the field and what is allowed; see :func:`_checked_state`)."""
        path = Path(out) / STATE_FILE if out is not None else Path(STATE_FILE)
        try:
            return _checked_state(cls, data, out)
        except _Malformed as exc:
            raise ValueError(f"{path} is not a metagame state file: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(f"{path} is not a metagame state file ({type(exc).__name__}: {exc})") from None

    def save(self, out: Path) -> Path:
        """Write ``out/metagame.json`` atomically (a new file renamed over the old one)."""
        path = Path(out) / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(out), indent=1, allow_nan=False))
        os.replace(tmp, path)
        return path


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """A Ctrl-C (SIGINT) that arrives in the block is raised as ``KeyboardInterrupt`` when the block ends, not
    between its statements: for a change of the state that must happen whole. Only the main thread receives
    signals; elsewhere the block runs as it is. A handler other than Python's default is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    arrived: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if arrived:
        raise KeyboardInterrupt


class _Malformed(ValueError):
    """What is wrong with a state file (:func:`_checked_state`)."""


#: the payoffs: always numbers (the other metrics may be undefined: null, as ``json_safe`` writes NaN)
PAYOFF_METRICS = ("attacker_return", "defender_return")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_member(m: Any, where: str, out: Path | None) -> Member:
    """The member ``m`` of a state file, at ``where`` in it (:func:`_loaded`: its policy path)."""
    fields = {f.name for f in dataclasses.fields(Member)}
    if not isinstance(m, dict) or not {"name", "spec"} <= set(m) or not set(m) <= fields:
        raise _Malformed(f"{where} = {_short(m)}; allowed: an object with name, spec, iteration and sha256")
    for key in ("name", "spec"):
        if not isinstance(m[key], str) or not m[key]:
            raise _Malformed(f"{where}.{key} = {_short(m[key])}; allowed: a non-empty string")
    iteration, sha = m.get("iteration", 0), m.get("sha256")
    if not _is_int(iteration) or iteration < 0:
        raise _Malformed(f"{where}.iteration = {_short(iteration)}; allowed: integers >= 0")
    if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        raise _Malformed(f"{where}.sha256 = {_short(sha)}; allowed: null (a preset) or 64 lowercase hex digits")
    return _loaded(Member(m["name"], m["spec"], iteration, sha), out)


def _checked_value(metric: str, value: Any, where: str) -> float:
    """One per-episode value of ``metric``: a number in the metric's range (``leakgym eval --resume``'s check,
    :func:`~leakgym.agents.experiments.evaluation.payoff.metric_value_error`), or null (undefined) for
    a metric that is not a payoff."""
    if value is None and metric not in PAYOFF_METRICS:
        return float("nan")
    allowed = "a number" + ("" if metric in PAYOFF_METRICS else " or null (undefined)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Malformed(f"{where} = {_short(value)}; allowed: {allowed}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    why = metric_value_error(metric, number)
    if why is not None:
        raise _Malformed(f"{where} = {_short(value)} {why}; allowed: {allowed} in the metric's range")
    return clamped_metric_value(metric, number)  # (an SSIM float-rounded past 1 by an earlier version: 1)


def _checked_cell(c: Any, where: str) -> tuple[tuple[str, str], CellSamples]:
    """A cell of a state file: attacker and defender names, every metric of :data:`CELL_METRICS` as a list
    of per-episode values (one count for all), and the rounds played."""
    if not isinstance(c, dict) or not all(isinstance(c.get(k), str) for k in ("attacker", "defender")):
        raise _Malformed(f"{where} = {_short(c)}; allowed: an object with attacker and defender names, rounds "
                         f"and the per-episode values of {', '.join(CELL_METRICS)}")
    where = f"{where} ({c['attacker']}, {c['defender']})"
    values: dict[str, list[float]] = {}
    for m in CELL_METRICS:
        if m not in c:
            raise _Malformed(f"{where} has no {m}; a cell holds the per-episode values of {', '.join(CELL_METRICS)}")
        if not isinstance(c[m], list) or not c[m]:
            raise _Malformed(f"{where}.{m} = {_short(c[m])}; allowed: a non-empty list of per-episode values")
        values[m] = [_checked_value(m, v, f"{where}.{m}[{e}]") for e, v in enumerate(c[m])]
    counts = {m: len(v) for m, v in values.items()}
    if len(set(counts.values())) != 1:
        raise _Malformed(f"{where}: its metrics have different episode counts {counts}; allowed: one count")
    for m, v in values.items():  # (a return of 1e300 is finite, but its cell's interval was not: inf in payoff.csv)
        if not all(math.isfinite(x) for x in v):
            continue  # an undefined value: no interval, as in leakgym eval
        with np.errstate(over="ignore", invalid="ignore"):
            interval = t_interval(v)
        if not all(math.isfinite(x) for x in interval[: 1 if len(v) < 2 else 3]):
            raise _Malformed(f"{where}.{m} = {_short(v)}: its mean and 95% interval over the episodes "
                             f"{tuple(interval)} are not finite numbers; allowed: values whose mean and interval are")
    rounds = c.get("rounds", 0)
    if not _is_int(rounds) or rounds < 0:
        raise _Malformed(f"{where}.rounds = {_short(rounds)}; allowed: integers >= 0")
    return (c["attacker"], c["defender"]), CellSamples(values, rounds)


def _checked_state(cls: type[MetagameState], data: dict[str, Any], out: Path | None) -> MetagameState:
    """:meth:`MetagameState.from_json`'s reading: every field checked (:class:`_Malformed` naming it), so that a
    resume never solves, reports or rewrites a file that :meth:`MetagameState.to_json` did not write (found in
    an audit: ``"12"`` read as the two episodes 1.0 and 2.0, an SSIM of 7 and a return of 1e300 accepted and
    infinities written to payoff.csv, a member listed twice, settings that are a list)."""
    for key, kind in (("settings", dict), ("populations", dict), ("cells", list), ("iterations", list)):
        if key not in data:
            raise _Malformed(f"it has no {key!r}")
        if not isinstance(data[key], kind):
            raise _Malformed(f"{key} = {_short(data[key])}; allowed: {'an object' if kind is dict else 'a list'}")
    for key in ("pending", "final"):
        if not isinstance(data.get(key) or {}, dict):
            raise _Malformed(f"{key} = {_short(data[key])}; allowed: an object")
    populations: dict[str, list[Member]] = {}
    for role in ROLES:
        listed = data["populations"].get(role)
        if not isinstance(listed, list) or not listed:
            raise _Malformed(f"populations.{role} = {_short(listed)}; allowed: a non-empty list of members")
        populations[role] = [_checked_member(m, f"populations.{role}[{i}]", out) for i, m in enumerate(listed)]
    pending = dict(data.get("pending") or {})
    for role in ROLES:
        if role in pending:
            pending[role] = _checked_member(pending[role], f"pending.{role}", out)
    for key in ("iteration", "env_steps_before"):
        if key in pending and (not _is_int(pending[key]) or pending[key] < 0):
            raise _Malformed(f"pending.{key} = {_short(pending[key])}; allowed: integers >= 0")
    for role in ROLES:  # (a fresh run refuses a member named twice; the tables index members by name)
        names = [m.name for m in populations[role]] + ([pending[role].name] if role in pending else [])
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _Malformed(f"the {role} population names {twice} twice; allowed: one member per name")
    cells: dict[tuple[str, str], CellSamples] = {}
    for i, c in enumerate(data["cells"]):
        key, samples = _checked_cell(c, f"cells[{i}]")
        if key in cells:
            raise _Malformed(f"cells[{i}] ({key[0]}, {key[1]}) is there twice; allowed: one entry per cell")
        if cells and samples.episodes != next(iter(cells.values())).episodes:
            first = next(iter(cells))
            raise _Malformed(f"cells[{i}] ({key[0]}, {key[1]}) has {samples.episodes} episodes, cell ({first[0]}, "
                             f"{first[1]}) {next(iter(cells.values())).episodes}; allowed: one count for every cell")
        cells[key] = samples
    episodes = data["settings"].get("episodes")
    if cells and _is_int(episodes) and next(iter(cells.values())).episodes != episodes:
        raise _Malformed(f"its cells have {next(iter(cells.values())).episodes} episodes, its settings "
                         f"{episodes}; allowed: the settings' count")
    for k, record in enumerate(data["iterations"], start=1):
        if not isinstance(record, dict) or record.get("iteration") != k:
            raise _Malformed(f"iterations[{k - 1}] = {_short(record)}; allowed: the record of iteration {k}")
    env_steps, wall = data.get("env_steps", 0), data.get("wall_time_s", 0.0)
    if not _is_int(env_steps) or env_steps < 0:
        raise _Malformed(f"env_steps = {_short(env_steps)}; allowed: integers >= 0")
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not 0 <= wall < math.inf:
        raise _Malformed(f"wall_time_s = {_short(wall)}; allowed: a number >= 0")
    status = data.get("status", "running")
    if status not in STATUSES:
        raise _Malformed(f"status = {_short(status)}; allowed: {', '.join(STATUSES)}")
    return cls(settings=data["settings"], populations=populations, game=EmpiricalGame(cells),
               iterations=list(data["iterations"]), pending=pending, final=dict(data.get("final") or {}),
               status=status, env_steps=env_steps, wall_time_s=float(wall))


def policy_sha256(path: str | Path) -> str:
    """SHA-256 of a saved policy: its ``.zip`` and the ``.json`` beside it, which together make the agent."""
    from leakgym.agents.policies.learned import metadata_path

    h = hashlib.sha256()
    for part in (Path(path), metadata_path(path)):
        with open(part, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _stored(member: Member, out: Path | None) -> dict[str, Any]:
    """``member`` as ``metagame.json`` holds it: a policy file (a member with a hash) inside the run folder
    ``out`` by its path relative to ``out`` (found in an audit: paths relative to the working directory of the
    first run made ``--resume`` from another one fail, and a moved folder pointed at the old one), one
    outside it by its absolute path."""
    data = asdict(member)
    if member.sha256 is not None and out is not None:
        path, root = Path(member.spec).resolve(), Path(out).resolve()
        data["spec"] = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return data


def _loaded(member: Member, out: Path | None) -> Member:
    """``member`` read from ``out/metagame.json``: a relative policy path is inside ``out`` (:func:`_stored`;
    a state file written before that rule named it relative to the working directory, which is kept where the
    file is there and not in ``out``)."""
    if member.sha256 is not None and out is not None and not Path(member.spec).is_absolute():
        inside = Path(out) / member.spec
        if inside.is_file() or not Path(member.spec).is_file():
            return dataclasses.replace(member, spec=str(inside))
    return member


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if key == "iterations":
            continue  # a resume may run more (or fewer) iterations
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{prefix}{key}: {a!r} in the run, {b!r} now")
    return out


def open_state(out: Path, settings: dict[str, Any], initial: dict[str, list[Member]], *, resume: bool) -> MetagameState:
    """The state to continue (``resume``: read ``out/metagame.json`` and check its settings) or a new one
    (refusing to overwrite a state file that is there)."""
    path = Path(out) / STATE_FILE
    if resume:
        if not path.is_file():
            raise ValueError(f"--resume: {path} does not exist (nothing to resume); run without --resume first")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--resume: cannot read {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"--resume: {path} is not a metagame state file")
        state = MetagameState.from_json(data, out)
        from leakgym.agents.policies.learned import metadata_path

        members = [m for ms in state.populations.values() for m in ms]
        members += [v for v in state.pending.values() if isinstance(v, Member)]
        policies = [m for m in members if m.sha256 is not None]
        gone = [str(p) for m in policies for p in (Path(m.spec), metadata_path(m.spec)) if not p.is_file()]
        if gone:  # (refused before the state file is written again)
            raise ValueError(f"--resume: the run in {out} names policy files that are not there: {', '.join(gone)}")
        # every member's policy file is the one that joined (found in an audit: checked only when a member
        # played, so a finished run resumed with the same --iterations rewrote its reports from a changed file)
        changed = [f"{m.name!r} ({m.spec}: sha256 {actual[:12]}..., recorded {m.sha256[:12]}...)"
                   for m in policies if (actual := policy_sha256(m.spec)) != m.sha256]
        if changed:
            raise ValueError(f"--resume: policy files of the run in {out} changed since their members joined the "
                             f"population: {'; '.join(changed)}; restore them, or start a new run in another --out")
        diff = _differences(state.settings, json.loads(json.dumps(settings, default=str)))
        if diff:
            raise ValueError(f"--resume: the run in {out} had other settings: " + "; ".join(diff))
        state.settings["iterations"] = settings.get("iterations")
        state.status = "running"
        return state
    if path.exists():
        raise ValueError(f"{path} exists: continue that run with --resume, or choose another --out")
    for role, members in initial.items():
        if not members:
            raise ValueError(f"the initial {role} population is empty; PSRO needs at least one member per side")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"the initial {role} population names a member twice: {names}")
    return MetagameState(settings=json.loads(json.dumps(settings, default=str)),
                         populations={r: list(ms) for r, ms in initial.items()})


def solve(state: MetagameState, solver_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(sigma_A, sigma_D, A, B)``: the meta-strategies of the current populations and the mean returns."""
    att = [m.name for m in state.populations["attacker"]]
    dfn = [m.name for m in state.populations["defender"]]
    A = state.game.means(att, dfn, "attacker_return")
    B = state.game.means(att, dfn, "defender_return")
    sigma_a, sigma_d = meta_solver(solver_name)(A, B)
    return np.asarray(sigma_a, float), np.asarray(sigma_d, float), A, B


def fill_cells(state: MetagameState, simulator: Simulator, attackers: Sequence[Member], defenders: Sequence[Member],
          tag: str, out: Path) -> None:
    """Simulate the cells of ``attackers x defenders`` that have no samples, as blocks, saving after each."""
    missing = set(state.game.missing(attackers, defenders))
    if not missing:
        return
    # The missing cells are a union of blocks: rows that miss every column, and the remaining cells by row.
    rows_full = [a for a in attackers if all((a.name, d.name) in missing for d in defenders)]
    blocks: list[tuple[list[Member], list[Member]]] = [(rows_full, list(defenders))] if rows_full else []
    rest = [(a, d) for a in attackers for d in defenders if (a.name, d.name) in missing and a not in rows_full]
    cols: dict[str, list[Member]] = {}
    for a, d in rest:
        cols.setdefault(d.name, []).append(a)
    by_name = {d.name: d for d in defenders}
    blocks += [(atts, [by_name[d]]) for d, atts in cols.items()]
    for b, (atts, dfns) in enumerate(blocks):
        cells = simulator.play(atts, dfns, f"{tag}_{b}")
        for key, samples in cells.items():
            state.game.cells[key] = samples
            state.env_steps += samples.rounds
        state.save(out)


def run_psro(
    out: Path,
    *,
    settings: dict[str, Any],
    initial: dict[str, list[Member]],
    simulator: Simulator,
    oracle: Oracle,
    iterations: int,
    meta_solver_name: str = "nash",
    resume: bool = False,
    progress: bool = False,
) -> MetagameState:
    """Run PSRO for ``iterations`` iterations (see the module docstring); returns the final state, whose
    populations hold every best response and whose table is complete."""
    from tqdm.auto import tqdm

    meta_solver(meta_solver_name)  # the name is checked before anything is written
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations={iterations!r}; allowed: integers >= 1")
    out = Path(out)
    state = open_state(out, {**settings, "meta_solver": meta_solver_name, "iterations": iterations}, initial,
                       resume=resume)
    out.mkdir(parents=True, exist_ok=True)
    state.save(out)
    t0 = time.perf_counter() - state.wall_time_s
    stage = "filling the initial table"
    bar = tqdm(total=iterations, initial=min(len(state.iterations), iterations), desc="psro", unit="iter",
               disable=not progress)
    try:
        fill_cells(state, simulator, state.populations["attacker"], state.populations["defender"], "iter00", out)
        for k in range(len(state.iterations) + 1, iterations + 1):
            it_start = time.perf_counter()
            steps_before = state.env_steps
            stage = f"iteration {k}: solving the meta-game"
            sigma_a, sigma_d, A, B = solve(state, meta_solver_name)
            new: dict[str, Member] = {}
            if state.pending.get("iteration") == k:
                new = {r: state.pending[r] for r in ROLES if r in state.pending}
                # (the env steps before the iteration: its pending responses' steps are in env_steps already;
                # found in an audit, a resumed iteration counted only the steps trained after the interrupt)
                steps_before = int(state.pending.get("env_steps_before", steps_before))
            for role, own_mix, other_mix in (("attacker", sigma_a, sigma_d), ("defender", sigma_d, sigma_a)):
                if role in new:
                    continue  # trained before an interrupt
                stage = f"iteration {k}: training the {role}'s best response"
                other = "defender" if role == "attacker" else "attacker"
                member, steps = oracle.best_response(role, state.populations[other], other_mix, iteration=k,
                                                     name=f"psro-{role}-{k}")
                new[role] = member
                state.env_steps += steps
                state.pending = {"iteration": k, "env_steps_before": steps_before, **new}
                state.save(out)
            stage = f"iteration {k}: simulating the best responses' cells"
            atts = state.populations["attacker"]
            dfns = state.populations["defender"]
            fill_cells(state, simulator, [new["attacker"]], [*dfns, new["defender"]], f"iter{k:02d}_row", out)
            fill_cells(state, simulator, atts, [new["defender"]], f"iter{k:02d}_col", out)
            a_names, d_names = [m.name for m in atts], [m.name for m in dfns]
            ra = state.game.samples(a_names, d_names, "attacker_return")
            rd = state.game.samples(a_names, d_names, "defender_return")
            br_a = state.game.samples([new["attacker"].name], d_names, "attacker_return")[0]
            br_d = state.game.samples(a_names, [new["defender"].name], "defender_return")[:, 0]
            gain_a, best_a, ga_e = best_response_gain(ra, br_a, sigma_a, sigma_d)
            gain_d, best_d, gd_e = best_response_gain(rd.transpose(1, 0, 2), br_d, sigma_d, sigma_a)
            record = {
                "iteration": k,
                "attackers": a_names,
                "defenders": d_names,
                "attacker_meta": sigma_a.tolist(),
                "defender_meta": sigma_d.tolist(),
                "meta_values": {"attacker": float(sigma_a @ A @ sigma_d), "defender": float(sigma_a @ B @ sigma_d)},
                "meta_leakage_ssim": float(sigma_a @ state.game.means(a_names, d_names, "leakage_ssim") @ sigma_d),
                "attacker_gain": gain_a,
                "defender_gain": gain_d,
                "attacker_best_deviation": (a_names + [new["attacker"].name])[best_a],
                "defender_best_deviation": (d_names + [new["defender"].name])[best_d],
                "exploitability": _interval(ga_e + gd_e),
                "new_attacker": new["attacker"].name,
                "new_defender": new["defender"].name,
                "env_steps": state.env_steps - steps_before,
                "env_steps_total": state.env_steps,
                "wall_time_s": round(time.perf_counter() - it_start, 3),
            }
            # The iteration joins the state as one step: a Ctrl-C among these lines saved the new members both in
            # the populations and as pending, a state the resume refused (found in an audit); one arriving here
            # is raised after them.
            with _interrupts_held():
                state.populations["attacker"].append(new["attacker"])
                state.populations["defender"].append(new["defender"])
                state.iterations.append(record)
                state.pending = {}
                state.wall_time_s = time.perf_counter() - t0
            state.save(out)
            bar.update(1)
        stage = "the final table"
        sigma_a, sigma_d, A, B = solve(state, meta_solver_name)
        state.status = "finished"
        state.wall_time_s = time.perf_counter() - t0
        state.final = {"attackers": [m.name for m in state.populations["attacker"]],
                       "defenders": [m.name for m in state.populations["defender"]],
                       "attacker_meta": sigma_a.tolist(), "defender_meta": sigma_d.tolist(),
                       "meta_values": {"attacker": float(sigma_a @ A @ sigma_d),
                                       "defender": float(sigma_a @ B @ sigma_d)}}
        state.save(out)
    except KeyboardInterrupt:
        state.status = "interrupted"
        state.wall_time_s = time.perf_counter() - t0
        state.save(out)
        raise MetagameInterrupted(stage, out / STATE_FILE) from None
    finally:
        bar.close()
    return state


def halved(state: MetagameState) -> bool | None:
    """Whether the last iteration's exploitability is below half of the first's with non-overlapping
    95% intervals (the benchmark's target); None with fewer than 2 iterations or undefined intervals."""
    if len(state.iterations) < 2:
        return None
    first, last = state.iterations[0]["exploitability"], state.iterations[-1]["exploitability"]
    if not all(math.isfinite(v) for v in (first["ci95_low"], last["ci95_high"])):
        return None
    return bool(last["mean"] < first["mean"] / 2 and last["ci95_high"] < first["ci95_low"])


__all__ = [
    "CELL_METRICS",
    "PAYOFF_METRICS",
    "STATE_FILE",
    "STATUSES",
    "CellSamples",
    "EmpiricalGame",
    "Member",
    "MetagameInterrupted",
    "MetagameState",
    "Oracle",
    "Simulator",
    "best_response_gain",
    "fill_cells",
    "halved",
    "open_state",
    "policy_sha256",
    "run_psro",
    "solve",
]

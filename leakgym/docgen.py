"""The generated pages of the documentation site: ``docs/envs/``, ``docs/attacks.md``, ``docs/defenses.md``.

``python -m leakgym.docgen docs`` writes them all (``make docs-pages``); ``leakgym describe --write-docs
docs/envs`` writes the environment pages alone. ``tests/test_docs.py`` checks that the committed pages are
what this module generates, so they cannot drift from the scenario files and the registries.

* an environment page is :func:`leakgym.envs.describe.env_page` (description, action and observation
  spaces, rewards, episode end, arguments, version history) with a summary table and a rendered frame at
  the top, and the starting state and data requirements added (:func:`env_page_full`);
  ``docs/envs/index.md`` is the summary table of every id (:func:`environments_index`);
* the attack and defense pages come from :data:`leakgym.attacks.ATTACKS` and the defense registry, each
  entry with its paper (:data:`ATTACK_SOURCES`, :data:`DEFENSE_SOURCES`; a registered method without a
  source fails the docs test until it gets one).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

#: paper key -> full reference
PAPERS: dict[str, str] = {
    "dlg": 'Zhu, Liu and Han, "Deep Leakage from Gradients", NeurIPS 2019',
    "ig": 'Geiping, Bauermeister, Dröge and Moeller, "Inverting Gradients - How easy is it to break privacy in '
          'federated learning?", NeurIPS 2020',
    "gradinversion": 'Yin, Mallya, Vahdat, Alvarez, Kautz and Molchanov, "See through Gradients: Image Batch '
                     'Recovery via GradInversion", CVPR 2021',
    "dcs2": 'Wu, Hayat, Zhou and Harandi, "Concealing Sensitive Samples against Gradient Leakage in Federated '
            'Learning", AAAI 2024',
    "ppp": 'Scheliga, Mäder and Seeland, "PRECODE with Partial Perturbation" (Privacy Preserving Partial '
           'Perturbation), WACV 2023',
    "censor": 'Zhang et al., "CENSOR: Defense Against Gradient Inversion via Orthogonal Subspace Bayesian '
              'Sampling", NDSS 2025',
    "loda": 'Wan et al., "Defense Against Gradient Leakage Attacks via Learning to Obscure Data"',
    "oasis": 'Jeter et al., "OASIS: Offsetting Active Reconstruction Attacks in Federated Learning", ICDCS 2024',
    "rtf": 'Fowl, Geiping, Czaja, Goldblum and Goldstein, "Robbing the Fed: Directly Obtaining Private Data in '
           'Federated Learning with Modified Models", ICLR 2022',
    "trap": 'Boenisch et al., "When the Curious Abandon Honesty: Federated Learning Is Not Private", '
            'IEEE EuroS&P 2023 (arXiv 2021)',
    "instahide-attack": 'Carlini et al., "An Attack on InstaHide: Is Private Learning Possible with Instance '
                        'Encoding?", IEEE S&P 2021',
    "soteria": 'Sun et al., "Soteria: Provable Defense against Privacy Leakage in Federated Learning from '
               'Representation Perspective", CVPR 2021',
    "dp-sgd": 'Abadi et al., "Deep Learning with Differential Privacy", CCS 2016',
    "mixup": 'Zhang, Cisse, Dauphin and Lopez-Paz, "mixup: Beyond Empirical Risk Minimization", ICLR 2018',
    "instahide": 'Huang, Song, Li and Arora, "InstaHide: Instance-hiding Schemes for Private Distributed '
                 'Learning", ICML 2020',
}

#: paper key -> how the tables name it
SHORT: dict[str, str] = {
    "dlg": "DLG (Zhu et al. 2019)", "ig": "Geiping et al. 2020", "gradinversion": "Yin et al. 2021",
    "dcs2": "DCS² (Wu et al. 2024)", "ppp": "PPP (Scheliga et al. 2023)", "censor": "CENSOR (Zhang et al. 2025)",
    "loda": "LODA (Wan et al.)", "oasis": "OASIS (Jeter et al. 2024)", "rtf": "Fowl et al. 2022",
    "trap": "Boenisch et al. 2023", "instahide-attack": "Carlini et al. 2021", "soteria": "Sun et al. 2021",
    "dp-sgd": "Abadi et al. 2016", "mixup": "Zhang et al. 2018", "instahide": "Huang et al. 2020",
}

#: attack registry name -> (paper key, where in it)
ATTACK_SOURCES: dict[str, tuple[str, str]] = {
    "dlg": ("dlg", "the attack"),
    "inverting-gradients": ("ig", "the attack (GS)"),
    "gradinversion": ("gradinversion", "the attack, GradInversion-style"),
    "analytic": ("dcs2", "Eq. 3; PPP §3.1 for PRECODE's bottleneck input"),
    "layer-skipping": ("ppp", "§3.3"),
    "eot": ("censor", "§V-D"),
    "prior-init": ("dcs2", 'Table 4, "AvgImg" initialisation'),
    "loda-inversion": ("loda", "Eq. 6"),
    "mixup-decoding": ("instahide-attack", "demixing with the known mixing matrix (an upper bound)"),
    "imprint": ("rtf", "the imprint block"),
    "trap-weights": ("trap", "trap weights"),
}

#: defense registry name -> (paper key, where in it / in what role)
DEFENSE_SOURCES: dict[str, tuple[str, str]] = {
    "oasis": ("oasis", "§III-B, Eq. 7"),
    "loda": ("loda", "Eq. 4, Algorithm 1"),
    "mixup": ("mixup", "as a baseline of LODA"),
    "instahide": ("instahide", "as a baseline of LODA"),
    "dcs2": ("dcs2", "Algorithm 1, Eq. 9-12"),
    "censor": ("censor", "Algorithm 1, Eq. 11"),
    "ppp": ("ppp", "§3.4"),
    "soteria": ("soteria", "the defense; a baseline of DCS² and CENSOR"),
    "prune": ("dlg", "§5, gradient pruning; a baseline of DCS² and CENSOR"),
    "topk": ("censor", 'Table I, "Sparsification" baseline'),
    "clip": ("dp-sgd", "L2 clipping of the update"),
    "clip_value": ("censor", 'Table I, "Clipping" baseline'),
    "noise": ("dp-sgd", "Gaussian mechanism; a baseline of DCS² and CENSOR"),
}

STAGES = {"InputDefense": "input", "StepDefense": "per local step", "UpdateDefense": "update"}
_GENERATED = "This page is generated by `python -m leakgym.docgen docs` (`leakgym/docgen.py`); do not edit it."


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(cell(c) for c in row) + " |" for row in rows
    ]


def _first_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def cite(sources: dict[str, tuple[str, str]], name: str) -> str:
    """``"<full reference>: <where>"`` for a registered method; ``ValueError`` when it has no source yet."""
    if name not in sources:
        raise ValueError(f"{name!r} has no paper in leakgym/docgen.py; add it to the sources of its registry")
    key, where = sources[name]
    return f"{PAPERS[key]}: {where}"


def _short(sources: dict[str, tuple[str, str]], name: str) -> str:
    cite(sources, name)  # a method without a source is an error, not a "?"
    key, where = sources[name]
    return f"{SHORT[key]}, {where}"


# ------------------------------------------------------------------ environments
def _summary(gym_id: str) -> dict[str, str]:
    from leakgym.data.loading import disk_source
    from leakgym.envs.describe import describe
    from leakgym.game.scenario import load_scenario

    info = describe(gym_id)
    sc = load_scenario(info["scenario"])
    att, dfd = info["roles"]["attacker"], info["roles"]["defender"]
    return {
        "id": f"`{gym_id}`",
        "scenario": f"`{sc.name}` (`leakgym/game/scenarios/{sc.name}.toml`)",
        "make": f'`gym.make("{gym_id}", role="attacker" | "defender", opponent=...)`; '
                f'`leakgym.envs.parallel_env("{sc.name}")` (PettingZoo)',
        "agents": "`attacker`, `defender`",
        "attacker action": att["action_space"].replace(" or ", "; flat: ").replace(" with flat_actions=True", ""),
        "defender action": dfd["action_space"].replace(" or ", "; flat: ").replace(" with flat_actions=True", ""),
        "attacker observation": f"Box(0, 1, ({len(att['observation'])},), float32)",
        "defender observation": f"Box(0, 1, ({len(dfd['observation'])},), float32)",
        "data": f"{sc.dataset}, {sc.image_size or 'native'} px, batch {sc.batch_size}",
        "model": f"{sc.model}{' + PRECODE' if sc.precode else ''}",
        "server": sc.threat_model,
        "episode": f"{sc.rounds} rounds (termination)",
        "offline": "yes (bundled with scikit-learn)" if disk_source(sc.dataset) is None else "no: needs the dataset files",
    }


def environments_index() -> str:
    """``docs/envs/index.md``: one row per registered id."""
    from leakgym.envs.registration import registered_ids

    rows = []
    for gym_id in sorted(registered_ids()):
        s = _summary(gym_id)
        rows.append([f"[{gym_id}]({gym_id}.md)", s["data"], s["model"], s["server"], s["episode"],
                     s["attacker action"].split(";")[0], s["defender action"].split(";")[0],
                     s["attacker observation"].split(", (")[1].split(",)")[0] + " / "
                     + s["defender observation"].split(", (")[1].split(",)")[0], s["offline"].split(":")[0]])
    lines = ["# Environments", "", _GENERATED, "",
             ("One Gymnasium id per scenario file in `leakgym/game/scenarios/`. Each is a two-player game (PettingZoo "
             "`parallel_env`) and a single-agent view of either role (`gym.make(id, role=..., opponent=...)`); "
             "[The game](../game.md) explains rounds, menus, observations and rewards."), ""]
    lines += _table(["id", "data", "model", "server", "episode", "attacker action", "defender action",
                     "observation (attacker / defender)", "offline"], rows)
    return "\n".join(lines) + "\n"


def _starting_state(gym_id: str) -> list[str]:
    from leakgym.envs.describe import describe

    info = describe(gym_id)
    att = [o["name"] for o in info["roles"]["attacker"]["observation"]]
    dfd = [o["name"] for o in info["roles"]["defender"]["observation"]]
    return [
        "## Starting state",
        "",
        ("`reset(seed=s)` starts round 0 of a new game whose every draw comes from `s`: the federated split "
         "(public pool, the victim's and the benign clients' shards, the test split), the global model's "
         "initial parameters and each round's private batch. No update has been shared yet, so:"),
        "",
        f"* attacker: every entry is 0 ({', '.join(f'`{n}`' for n in att[:3])}, ...: nothing received yet);",
        ("* defender: `round_fraction` 0, `test_accuracy` and `test_loss_scaled` of the initial model, "
         "its last-action entries 0" + (", `audit_leakage` 0" if "audit_leakage" in dfd else "")
         + (", `fidelity_scaled` 1 (no defense applied yet)" if "fidelity_scaled" in dfd else "") + "."),
        "",
        ("Reset infos have every key of the step infos (the key set is fixed from `reset` on, numbers only: "
         "`leakgym.game.feedback`): `round` 0, the initial model's `accuracy` and `test_loss`, -1 for "
         "`strategy_index`, `diverged_round` and `matching_loss`, 0 for every other quantity."),
        "",
    ]


def _data_requirements(gym_id: str) -> list[str]:
    from leakgym.data.catalog import dataset_info
    from leakgym.data.loading import disk_source
    from leakgym.envs.describe import describe
    from leakgym.game.scenario import load_scenario

    sc = load_scenario(describe(gym_id)["scenario"])
    info = dataset_info(sc.dataset)
    lines = ["## Data requirements", "", (f"Dataset `{sc.dataset}`: {info.source}; {info.num_classes} classes, "
             f"{info.train_size:,} training images of {info.native_size}×{info.native_size} px, "
             f"{info.channels} channel(s).")]
    source = disk_source(sc.dataset)
    if source is None:
        lines += ["", "Works offline: the images ship with scikit-learn, nothing is downloaded."]
    elif source.downloadable:
        lines += ["", ("Not bundled. On first use the files are looked for under `root=` / `$LEAKGYM_DATA` / "
                       "`~/.cache/leakgym` and, when missing, downloaded and checked against their official "
                       "MD5 digests; without network access the environment raises `DatasetUnavailableError` "
                       f"saying where it looked. To provide them by hand: {source.layout_hint(Path('$LEAKGYM_DATA'))}.")]
    else:
        lines += ["", ("Not bundled, and not downloaded: the files are looked for under `root=` / `$LEAKGYM_DATA` / "
                       "`~/.cache/leakgym`; when missing, the environment raises `DatasetUnavailableError` saying "
                       f"where it looked. To provide them: {source.layout_hint(Path('$LEAKGYM_DATA'))}.")]
    return [*lines, ""]


def env_page_full(gym_id: str, frame: bool) -> str:
    """The environment page: summary table, frame (``frame``: ``<id>.png`` beside the page), then
    :func:`~leakgym.envs.describe.env_page` with the starting state and the data requirements added."""
    from leakgym.envs.describe import env_page

    body = env_page(gym_id)
    title, rest = body.split("\n", 1)
    head = [title, "", *_table(["", ""], [[k, v] for k, v in _summary(gym_id).items()]), ""]
    if frame:
        head += [f"![A rendered round of {gym_id}]({gym_id}.png)", "",
                 ("*`render_mode=\"rgb_array\"` after one round (seed 0; attacker action 0 = Inverting Gradients "
                  "at the smallest budget, no defense): the private images above their matched "
                  "reconstructions.*"), ""]
    else:
        head += [("No rendered frame here: rendering plays a round, which needs the dataset files "
                 "(see [Data requirements](#data-requirements))."), ""]
    before, after = rest.split("## Rewards", 1)
    after_rewards, history = after.split("## Version history", 1)
    text = "\n".join(head) + before + "\n".join(_starting_state(gym_id)) + "\n## Rewards" + after_rewards
    return text + "\n".join(_data_requirements(gym_id)) + "\n## Version history" + history


def render_frame(gym_id: str, path: Path) -> None:
    """One round of ``gym_id`` at seed 0 with both actions 0, rendered as ``rgb_array``, saved to ``path``."""
    import numpy as np
    from matplotlib.image import imsave

    from leakgym.envs import parallel_env
    from leakgym.envs.describe import describe

    env = parallel_env(describe(gym_id)["scenario"], render_mode="rgb_array")
    env.reset(seed=0)
    env.step({a: np.zeros(len(env.action_space(a).nvec), dtype=np.int64) for a in env.agents})
    imsave(path, env.render())
    env.close()


def offline(gym_id: str) -> bool:
    """Whether ``gym_id``'s dataset needs no files on disk (the bundled digits; not the downloadable or
    user-provided datasets of :data:`~leakgym.data.sources.SOURCES` and :data:`~leakgym.data.imagesets.IMAGE_SOURCES`)."""
    from leakgym.data.loading import disk_source
    from leakgym.envs.describe import describe
    from leakgym.game.scenario import load_scenario

    return disk_source(load_scenario(describe(gym_id)["scenario"]).dataset) is None


def write_env_pages(folder: str | Path, frames: bool = True) -> list[Path]:
    """Every environment page and ``index.md`` into ``folder`` (and, with ``frames``, each offline
    environment's rendered frame ``<id>.png``); returns the paths written."""
    from leakgym.envs.registration import registered_ids

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for gym_id in sorted(registered_ids()):
        has_frame = offline(gym_id)
        if frames and has_frame:
            render_frame(gym_id, out / f"{gym_id}.png")
            paths.append(out / f"{gym_id}.png")
        (out / f"{gym_id}.md").write_text(env_page_full(gym_id, has_frame))
        paths.append(out / f"{gym_id}.md")
    (out / "index.md").write_text(environments_index())
    return [*paths, out / "index.md"]


# ------------------------------------------------------------------ attacks and defenses
def attacks_page() -> str:
    """``docs/attacks.md`` from :data:`leakgym.attacks.ATTACKS`."""
    from leakgym.attacks import ATTACKS

    lines = ["# Attacks", "", _GENERATED, "",
             ("Every attack takes the shared update and the attacker's knowledge and returns reconstructions, "
              "inferred labels, its cost (iterations × restarts, plus a second stage's steps, wall time) and per-iteration "
              "statistics: "
              "`leakgym.attacks.build_attack(name, **overrides)`. A scenario offers attacks in its "
              "`attacker_menu.strategy`, and any of their config fields as attacker dimensions."), ""]
    lines += _table(["name", "attack", "server", "source"],
                    [[f"[`{n}`](#{n})", _first_line(cls), "malicious" if cls.malicious else "honest",
                      _short(ATTACK_SOURCES, n)] for n, cls in ATTACKS.items()])
    for name, cls in ATTACKS.items():
        lines += ["", f"## {name}", "", f"`{cls.__module__}.{cls.__name__}`: {_first_line(cls)}", "",
                  f"Source: {cite(ATTACK_SOURCES, name)}.", "", f"Options (`{cls.Config.__name__}`, defaults):", ""]
        rows = []
        for f in dataclasses.fields(cls.Config):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
            rows.append([f"`{f.name}`", f"`{default!r}`"])
        lines += _table(["option", "default"], rows)
    return "\n".join(lines) + "\n"


def _allowed(field) -> str:
    if field.kind == "choice":
        return ", ".join(f"`{c}`" for c in field.choices)
    low = "-inf" if field.low is None else f"{field.low:g}"
    high = "inf" if field.high is None else f"{field.high:g}"
    return f"{'(' if field.low_open else '['}{low}, {high}{')' if field.high_open else ']'}"


def defenses_page() -> str:
    """``docs/defenses.md`` from the defense registry (pipeline order)."""
    from leakgym.defenses.registry import defense_registry

    registry = defense_registry()

    def stage(d) -> str:
        return next(STAGES[c.__name__] for c in type(d).__mro__ if c.__name__ in STAGES)

    lines = ["# Defenses", "", _GENERATED, "",
             ("`apply_defense(model, x, y, DefenseConfig(...))` returns the shared update and a report (what was "
              "applied, the extra compute, and the update's fidelity = cosine to the clean update). Every defense "
              "is one registered object (`leakgym/defenses/registry.py`; the built-in list is "
              "`leakgym/defenses/catalog.py`) with its stage, fields and ranges, apply and cost model. The "
              "pipeline runs them in this order, any subset composing; `DefenseConfig()` is no defense. A "
              "defense's first field is its on/off switch (its default means off)."), ""]
    lines += _table(["order", "name", "stage", "fields", "source"],
                    [[i + 1, f"[`{n}`](#{n})", stage(d), ", ".join(f"`{f.name}`" for f in d.fields),
                      _short(DEFENSE_SOURCES, n)]
                     for i, (n, d) in enumerate(registry.items())])
    for name, d in registry.items():
        lines += ["", f"## {name}", "", (f"`{type(d).__module__}.{type(d).__name__}` ({stage(d)} stage): "
                  f"{_first_line(type(d))}"), "", f"Source: {cite(DEFENSE_SOURCES, name)}.", ""]
        lines += _table(["field", "kind", "default", "allowed", "meaning"],
                        [[f"`{f.name}`", f.kind, f"`{f.default!r}`", _allowed(f), f.doc] for f in d.fields])
    return "\n".join(lines) + "\n"


def write_pages(docs: str | Path, frames: bool = True) -> list[Path]:
    """Every generated page under ``docs`` (``envs/``, ``attacks.md``, ``defenses.md``)."""
    docs = Path(docs)
    paths = write_env_pages(docs / "envs", frames=frames)
    for name, page in (("attacks.md", attacks_page), ("defenses.md", defenses_page)):
        (docs / name).write_text(page())
        paths.append(docs / name)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m leakgym.docgen DOCS_FOLDER  (e.g. docs)", file=sys.stderr)
        return 2
    for path in write_pages(args[0]):
        print(path)
    return 0


__all__ = ["ATTACK_SOURCES", "DEFENSE_SOURCES", "PAPERS", "attacks_page", "cite", "defenses_page",
           "env_page_full", "environments_index", "write_env_pages", "write_pages"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The documentation site: generated pages current, every method cited, README short, strict build."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from leakgym import docgen

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
STALE = "is stale; run `python -m leakgym.docgen docs` (make docs-pages)"


def test_registry_pages_are_generated_from_the_registries():
    assert (DOCS / "attacks.md").read_text() == docgen.attacks_page(), f"docs/attacks.md {STALE}"
    assert (DOCS / "defenses.md").read_text() == docgen.defenses_page(), f"docs/defenses.md {STALE}"


def test_every_registered_method_has_its_paper():
    from leakgym.attacks import ATTACKS
    from leakgym.defenses.registry import defense_registry

    assert set(docgen.ATTACK_SOURCES) == set(ATTACKS)
    assert set(docgen.DEFENSE_SOURCES) == set(defense_registry())
    attacks, defenses = docgen.attacks_page(), docgen.defenses_page()
    assert "Source: " + docgen.PAPERS["ig"] in attacks and "Source: " + docgen.PAPERS["censor"] in defenses
    assert attacks.count("\nSource: ") == len(ATTACKS) and defenses.count("\nSource: ") == len(defense_registry())


def test_a_new_defense_without_a_paper_stops_the_page():
    from leakgym.defenses import registered

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from toy_defense import ToyScale
    finally:
        sys.path.remove(str(ROOT / "tests"))
    with registered(ToyScale()), pytest.raises(ValueError, match="'toy_scale' has no paper in leakgym/docgen.py"):
        docgen.defenses_page()


def test_env_pages_open_with_a_summary_and_a_frame_and_state_the_data_they_need():
    from matplotlib.image import imread

    digits = (DOCS / "envs" / "LeakGym-Digits-v0.md").read_text().split("\n")
    assert digits[0] == "# LeakGym-Digits-v0" and digits[2].startswith("|") and "| id | `LeakGym-Digits-v0` |" in digits
    assert "![A rendered round of LeakGym-Digits-v0](LeakGym-Digits-v0.png)" in digits
    text = "\n".join(digits)
    for heading in ("## Action space", "## Observation space", "## Starting state", "## Rewards", "## Episode end",
                    "## Arguments", "## Data requirements"):
        assert heading in text, heading
    assert "Works offline" in text
    frame = imread(DOCS / "envs" / "LeakGym-Digits-v0.png")
    assert frame.shape[:2] == (304, 512)  # the env's rgb_array frame
    cifar = (DOCS / "envs" / "LeakGym-CIFAR-v0.md").read_text()
    assert "Not bundled" in cifar and "cifar-10-python.tar.gz" in cifar and "No rendered frame here" in cifar
    assert not (DOCS / "envs" / "LeakGym-CIFAR-v0.png").exists()


def test_readme_is_short_and_starts_with_the_quick_start():
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 200
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Quick start"
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for needle in ("pip install .", "make demo", "make test", 'gym.make("LeakGym-Digits-v0"'):
        assert needle in quick, needle
    for target in re.findall(r"\]\(([^)#\s]+)\)", readme):  # every relative link points at a file
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def _nav_files(nav) -> list[str]:
    out = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            out += _nav_files(value) if isinstance(value, list) else [value]
    return out


def test_nav_names_existing_pages_and_every_page_is_in_it():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    files = _nav_files(config["nav"])
    assert all((DOCS / f).is_file() for f in files), [f for f in files if not (DOCS / f).is_file()]
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if not p.is_relative_to(DOCS / "results")}
    assert pages - set(files) == set()


def test_the_site_builds_strictly(tmp_path):
    """`make docs` (in .ci/run after `make test`): mkdocs --strict fails on a broken link, a missing page or a
    docstring the API reference cannot render."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for documented in ("envs.leakgym_env.parallel_env", "agents.experiments.evaluation.reporting.heatmap_figure",
                       "leakgym.defenses.pipeline.apply_defense", "leakgym.attacks.base.Attack"):
        assert f'id="{documented}"' in api, documented

"""The distribution ships all three import packages and their data files."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
    )
    (path,) = out.glob("leakgym-*.whl")
    return path


def test_wheel_contains_the_three_packages(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "leakgym/__init__.py",
        "leakgym/envs/__init__.py",
        "leakgym/envs/leakgym_env.py",
        "leakgym/envs/scenarios/digits.toml",
        "leakgym/agents/__init__.py",
        "leakgym/attacks/base.py",
        "leakgym/defenses/__init__.py",
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    assert not any(n.startswith(("envs/", "agents/")) for n in names), "top-level envs/agents leaked"


def test_console_script_declared(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (entry,) = [n for n in zf.namelist() if n.endswith("entry_points.txt")]
        assert "leakgym = leakgym.cli:main" in zf.read(entry).decode()


def test_import_registers_gym_ids():
    import gymnasium as gym

    import leakgym  # noqa: F401

    for gym_id in (
        "LeakGym-Digits-v0",
        "LeakGym-MNIST-v0",
        "LeakGym-FashionMNIST-v0",
        "LeakGym-CIFAR-v0",
        "LeakGym-CIFAR100-v0",
        "LeakGym-Digits-Malicious-v0",
    ):
        assert gym_id in gym.registry


def test_envs_never_import_agents():
    """The package boundary: environments take agent objects; resolving names lives in agents/."""
    import subprocess
    import sys

    code = ("import sys, leakgym.envs.leakgym_env, leakgym.envs.single_agent, leakgym.envs.vector, "
            "leakgym.envs.round, leakgym.envs.describe; "
            "print(sorted(m for m in sys.modules if m.startswith('leakgym.agents')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

"""The distribution ships all three import packages and their data files."""

import os
import subprocess
import sys
import sysconfig
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
        "leakgym/game/scenarios/digits.toml",
        "leakgym/agents/__init__.py",
        "leakgym/attacks/base.py",
        "leakgym/defenses/__init__.py",
        "leakgym/__main__.py",
        "leakgym/py.typed",
        "leakgym/agents/policies/gym_entry_points.py",
        "leakgym/agents/experiments/training/loop.py",
        "leakgym/agents/experiments/hyperparams/ppo.yml",
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    # every source package (a folder with __init__.py) is in pyproject's package list, so in the wheel
    mapping = {"leakgym": "leakgym", "envs": "leakgym/envs", "agents": "leakgym/agents"}
    for init in sorted(ROOT.glob("*/**/__init__.py")):
        top, *rest = init.relative_to(ROOT).parts
        if top in mapping:
            assert "/".join([mapping[top], *rest]) in names, f"{init.relative_to(ROOT)} missing from the wheel"
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
            "leakgym.game.round, leakgym.envs.describe; "
            "print(sorted(m for m in sys.modules if m.startswith('leakgym.agents')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (no editable install); its dependencies come from this venv.

    Offline: ``pip install --no-deps --no-index`` of the wheel alone, then a ``.pth`` line that appends this
    venv's site-packages (a plain directory entry: the editable install's own ``.pth`` there is not run).
    """
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", str(wheel)],
        check=True,
    )  # fmt: skip
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


MAKE_ENV = (
    "import sys, gymnasium as gym, leakgym, leakgym.envs, leakgym.agents\n"
    "env = gym.make('LeakGym-Digits-v0', rounds=1)\n"
    "obs, info = env.reset(seed=0)\n"
    "obs, reward, terminated, truncated, info = env.step(env.action_space.sample())\n"
    "print(leakgym.__file__, leakgym.envs.__file__, leakgym.agents.__file__, terminated or truncated)\n"
)


def _run_fresh(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [str(venv / "bin" / "python"), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_wheel_install_works_from_elsewhere(installed, tmp_path):
    """Outside the clone, everything comes from the installed wheel, data files included."""
    done = _run_fresh(installed, tmp_path, "-c", MAKE_ENV)
    assert done.returncode == 0, done.stderr
    files = done.stdout.split()
    assert all(f.startswith(str(installed)) for f in files[:3]), files
    assert files[3] == "True"  # one round: the episode ended
    typed = _run_fresh(installed, tmp_path, "-c", "import leakgym, pathlib; "
                       "print((pathlib.Path(leakgym.__file__).parent / 'py.typed').is_file())")  # fmt: skip
    assert typed.stdout.strip() == "True"


def test_wheel_install_works_from_the_clone_root(installed):
    """In the clone root ``./leakgym`` shadows the installed copy; its sibling folders provide envs/agents."""
    done = _run_fresh(installed, ROOT, "-c", MAKE_ENV)
    assert done.returncode == 0, done.stderr
    files = done.stdout.split()
    assert files[:3] == [str(ROOT / "leakgym" / "__init__.py"), str(ROOT / "envs" / "__init__.py"),
                         str(ROOT / "agents" / "__init__.py")]  # fmt: skip


def test_python_dash_m_leakgym(installed, tmp_path):
    done = _run_fresh(installed, tmp_path, "-m", "leakgym", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: leakgym ")
    script = subprocess.run([str(installed / "bin" / "leakgym"), "list"], cwd=tmp_path, capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert "LeakGym-Digits-v0" in script.stdout

"""The project's own modules import each other without cycles.

The graph is built from the source text alone (``ast``; nothing is imported): its nodes are the modules
of the three source folders, mapped as ``[tool.setuptools.package-dir]`` in ``pyproject.toml`` maps them
(``leakgym/`` -> ``leakgym``, ``envs/`` -> ``leakgym.envs``, ``agents/`` -> ``leakgym.agents``), a
package being its ``__init__.py``. Every import statement of a file is an edge -- at module level, under
``if TYPE_CHECKING:``, inside functions and ``try`` blocks alike: a lazy import only hides a cycle until
the function first runs, and a ``TYPE_CHECKING`` one is still a cycle for type checkers and readers.

Resolution of one import to its targets:

* relative imports are resolved against the importing module's package;
* ``import a.b.c`` and ``from a.b.c import x`` target ``a.b.c`` (a package: its ``__init__.py``);
  ``from a.b import c`` targets the submodule ``a.b.c`` where there is one, else ``a.b``;
* importing ``a.b.c`` also executes the packages ``a`` and ``a.b`` on the way, so those ``__init__.py``
  files are targets too -- except the importer's own enclosing packages, which are always initialised
  (or being initialised) before the importer runs (an explicit import of one, ``from . import name``
  for a name defined in the package's ``__init__.py``, is still an edge). This is what makes, say, a defense module that
  imports ``leakgym.attacks.engine.adam`` depend on ``leakgym/attacks/__init__.py``, which imports
  every attack.

A cycle is a strongly connected component of more than one module, or a module that imports itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: source folder (relative to the repository root) -> the import package it holds
PACKAGE_DIRS = {"leakgym": "leakgym", "envs": "leakgym.envs", "agents": "leakgym.agents"}


def module_files(root: Path, package_dirs: dict[str, str]) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under the package folders."""
    modules: dict[str, Path] = {}
    for folder, package in package_dirs.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _enclosing(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` itself or its longest prefix that is one of ``modules`` (None outside the project)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The project modules that ``module`` (source ``path``) imports, in any scope: each with the line of
    the first import statement that imports it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    own = set(_enclosing(module))
    targets: dict[str, int] = {}
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))),
                       key=lambda n: n.lineno):
        named: list[str] = []
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                named.append(sub if alias.name != "*" and sub in modules else source)
        for name in named:
            target = _known(name, modules)
            if target is None:
                continue
            # with the packages run on the way, less the importer's own, which run before it anyway
            for hit in [target, *(p for p in _enclosing(target) if p in modules and p != module and p not in own)]:
                targets.setdefault(hit, node.lineno)
    return targets


def import_graph(root: Path = ROOT, package_dirs: dict[str, str] = PACKAGE_DIRS) -> dict[str, dict[str, int]]:
    """Module -> the project modules it imports (-> the line that first imports each)."""
    modules = module_files(root, package_dirs)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module, and self-importing modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    for start in sorted(graph):
        if start in index:
            continue
        # iterative Tarjan: (node, iterator over its successors)
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return sorted(found)


def describe(component: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    """One cycle as its modules and the imports between them (file and line of each)."""
    members = set(component)
    edges = [f"    {a} -> {b}  ({modules[a].relative_to(ROOT)}:{graph[a][b]})"
             for a in component for b in sorted(graph[a].keys() & members)]
    return f"  cycle of {len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def test_no_import_cycles():
    graph = import_graph()
    assert "leakgym.defenses.registry" in graph and "leakgym.game.round" in graph and "leakgym.agents" in graph
    found = cycles(graph)
    modules = module_files(ROOT, PACKAGE_DIRS)
    assert not found, "import cycles between the project's modules:\n" + "\n".join(
        describe(c, graph, modules) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_checker_finds_cycles_in_a_synthetic_package(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.api import run\n",
            "pkg/api.py": "def run():\n    from . import engine  # lazy: still an edge\n    return engine\n",
            "pkg/engine.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .api import run\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/a.py": "import pkg.sub.b\n",
            "pkg/sub/b.py": "from ..sub import a\n",
            "pkg/self_loop.py": "import pkg.self_loop\n",
            "pkg/leaf.py": "import os\nfrom pkg import sub\n",
            "pkg/uses_init.py": "from pkg import run\n",
            "side/__init__.py": "",
            "side/x.py": "from pkg.sub.a import thing\n",
        },
    )
    graph = import_graph(tmp_path, {"pkg": "pkg", "side": "pkg.side"})
    assert graph["pkg.api"] == {"pkg.engine": 2}
    assert graph["pkg.leaf"] == {"pkg.sub": 2}
    assert graph["pkg.side.x"] == {"pkg.sub": 1, "pkg.sub.a": 1}  # pkg.sub runs first; pkg is side's own parent
    assert cycles(graph) == [
        ["pkg.api", "pkg.engine"],
        ["pkg.self_loop"],
        ["pkg.sub.a", "pkg.sub.b"],
    ]
    # a submodule importing its package's __init__, which imports it back, is a cycle too
    _write(tmp_path, {"pkg/__init__.py": "from pkg.uses_init import *\n"})
    assert ["pkg", "pkg.uses_init"] in cycles(import_graph(tmp_path, {"pkg": "pkg", "side": "pkg.side"}))
    # and without the cycles the checker reports none
    _write(tmp_path, {"pkg/engine.py": "", "pkg/sub/b.py": "", "pkg/self_loop.py": "", "pkg/__init__.py": ""})
    assert cycles(import_graph(tmp_path, {"pkg": "pkg", "side": "pkg.side"})) == []

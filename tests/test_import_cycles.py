"""The core's modules import one another without a cycle: read from the source (the imports a
module runs when it is imported), and proven by importing every module first in a fresh set of
the core's modules, so no order of imports finds one half made."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

CORE = REPO / "core" / "src"


def _module(path: Path) -> str:
    parts = list(path.relative_to(CORE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(path): path for path in sorted(CORE.rglob("*.py"))}


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _runs_on_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The import statements a module runs when it is imported: at its top level and in the
    blocks there (``try``, ``if``), not in functions, classes or ``if TYPE_CHECKING``."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                found += _runs_on_import(node.body)
            found += _runs_on_import(node.orelse)
        elif isinstance(node, ast.Try):
            found += _runs_on_import([*node.body, *node.orelse, *node.finalbody])
            for handler in node.handlers:
                found += _runs_on_import(handler.body)
    return found


def import_graph() -> dict[str, set[str]]:
    """Which core modules each core module imports as it is imported (``from package import
    module`` needs the module, not the package's other names)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets: set[str] = set()
        for node in _runs_on_import(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = _absolute(module, path, node)
            named = [f"{base}.{alias.name}" for alias in node.names]
            submodules = [name for name in named if name in MODULES]
            targets.update(submodules)
            if len(submodules) < len(named):
                targets.add(base)
        graph[module] = {target for target in targets if target in MODULES and target != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_core_module_imports_itself_back_as_it_is_imported() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle_and_names_its_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_imports_read_are_those_that_run_when_a_module_is_imported() -> None:
    body = ast.parse(
        "import a\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import b\n"
        "try:\n    import c\nexcept ImportError:\n    import d\n"
        "def f():\n    import e\n"
        "class C:\n    import g\n"
    ).body
    assert [ast.unparse(node) for node in _runs_on_import(body)] == [
        "import a", "from typing import TYPE_CHECKING", "import c", "import d"]


#: every core module imported first, the core's modules forgotten before each (the libraries
#: stay imported: what is tried is the order of the core's own imports)
EACH_FIRST = """
import importlib, pkgutil, sys
import worker_core
found = pkgutil.walk_packages(worker_core.__path__, "worker_core.")
names = ["worker_core", *sorted(module.name for module in found if not module.name.endswith("__main__"))]
failed = []
for name in names:
    for loaded in [module for module in sys.modules if module.partition(".")[0] == "worker_core"]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"importing {name} first: {type(exc).__name__}: {exc}")
print(len(names))
print("\\n".join(failed))
"""


def test_every_core_module_can_be_the_first_one_imported() -> None:
    out = subprocess.run([sys.executable, "-c", EACH_FIRST], capture_output=True, text=True, check=True,
                         cwd=REPO / "tests", timeout=300)
    count, _, failed = out.stdout.partition("\n")
    assert int(count) == len([name for name in MODULES if not name.endswith("__main__")])
    assert not failed.strip(), failed

"""How the core's modules depend on one another, read from the source: at their top (what a
function imports inside itself is kept for a reason, and few), and through what each module
makes public (no module reads a private name another one defines)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from conftest import REPO

CORE = REPO / "core" / "src"
FILES = sorted(CORE.rglob("*.py"))

#: the most function-level imports of core modules by core modules: each keeps a library out of
#: a start-up that does not need it or breaks a loop on purpose, and says so
MOST_FUNCTION_LEVEL_IMPORTS = 30

#: private names of libraries the core reads, and why
LIBRARY_NAMES = {
    "_raw": "a kombu virtual message's envelope, which the ParksMessages contract names",
    "_replace": "a named tuple's copy with fields replaced",
}


def _relative(path: Path, root: Path = CORE) -> str:
    return str(path.relative_to(root))


def _is_core(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").partition(".")[0] == "worker_core"
    return any(alias.name.partition(".")[0] == "worker_core" for alias in node.names)


def function_level_core_imports() -> list[str]:
    found = []
    for path in FILES:
        for function in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{_relative(path)}:{node.lineno}" for node in ast.walk(function)
                          if isinstance(node, (ast.Import, ast.ImportFrom)) and _is_core(node)]
    return sorted(set(found))


def test_the_core_imports_the_core_inside_functions_only_where_it_must() -> None:
    found = function_level_core_imports()
    assert len(found) <= MOST_FUNCTION_LEVEL_IMPORTS, (
        f"{len(found)} imports of core modules inside functions (at most {MOST_FUNCTION_LEVEL_IMPORTS}): "
        f"import at the module's top, or say why not:\n" + "\n".join(found))


def _private_names_defined(files: list[Path]) -> dict[str, set[Path]]:
    """Each private name (``_name``) and the modules that define it: as a function, a class, a
    module's name or an attribute set on an object."""
    defined: dict[str, set[Path]] = defaultdict(set)
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            if name and name.startswith("_") and not name.startswith("__"):
                defined[name].add(path)
    return defined


def _own(owner: ast.expr) -> bool:
    if isinstance(owner, ast.Name):
        return owner.id in ("self", "cls")
    return isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"


def private_reads(files: list[Path] = FILES, root: Path = CORE) -> list[str]:
    """Where a module reads (or imports) a private name that only other modules of ``files``
    define; what an object reads of itself (``self``, ``cls``, ``super()``) is its own."""
    defined = _private_names_defined(files)
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                names = [] if _own(node.value) else [node.attr]
            elif isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
            for name in names:
                if (name.startswith("_") and not name.startswith("__") and name not in LIBRARY_NAMES
                        and defined.get(name) and path not in defined[name]):
                    found.append(f"{_relative(path, root)}:{node.lineno}: {name} (defined in "
                                 f"{', '.join(_relative(where, root) for where in sorted(defined[name]))})")
    return found


def test_no_core_module_reads_what_another_keeps_private() -> None:
    found = private_reads()
    assert not found, "make it public on purpose, or ask its owner:\n" + "\n".join(found)


def test_the_private_check_finds_a_read_of_another_modules_private_name(tmp_path: Path) -> None:
    (tmp_path / "owner.py").write_text("_TABLE = 1\nclass Sig:\n    def __init__(self):\n"
                                       "        self._app = None\n"
                                       "    def same(self, other):\n        return other._app\n")
    (tmp_path / "reader.py").write_text("from owner import _TABLE\ndef app_of(sig):\n    return sig._app\n"
                                        "def fine(sig):\n    return sig.app, sig.__class__\n")
    assert private_reads(sorted(tmp_path.glob("*.py")), tmp_path) == [
        "reader.py:1: _TABLE (defined in owner.py)", "reader.py:3: _app (defined in owner.py)"]

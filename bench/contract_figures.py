"""Figures of the plugin contract, read from the source (nothing is imported or run).

    python bench/contract_figures.py            # one line per figure
    python bench/contract_figures.py --detail   # and what each figure counts

- core lines: lines of ``core/src`` against every distribution's ``src`` (Python files);
- largest import cycle: the biggest strongly connected set of core modules, counting every
  import (module level, in functions, under ``TYPE_CHECKING``);
- function-level imports: ``import`` statements of core modules inside core functions;
- modules storing an outcome: core modules (but the backends and the contract suites) that call
  a backend's ``store_result``;
- non-public imports by plugins: statements in ``plugins/*/src`` importing a core module or name
  outside the public list (the modules ``worker_core``'s docstring lists, their names pinned by
  tests/test_public_api.py);
- broker-name comparisons: ``driver_type`` compared to a string in the core.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "core" / "src"

#: where the public list is pinned: ``PUBLIC`` (what ``worker_core`` exports) and ``MODULES``
PUBLIC_API_TEST = REPO / "tests" / "test_public_api.py"
#: modules that implement a backend or check one: they do not store a worker's outcome
BACKEND_MODULES = ("worker_core.results.disabled", "worker_core.results.embedded",
                   "worker_core.results.rpc.backend")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def core_modules() -> dict[str, Path]:
    return {module_name(path, CORE): path for path in sorted(CORE.rglob("*.py"))}


def resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name ``from ... import`` reads in ``module`` (a file at ``path``)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports(module: str, path: Path) -> Iterator[tuple[ast.stmt, list[str], bool]]:
    """Each import statement of a file: the modules it names (a name that is a module counts as
    that module, not as its package) and whether it sits inside a function."""
    tree = ast.parse(path.read_text(), str(path))
    known = core_modules()

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.stmt, list[str], bool]]:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                yield child, [alias.name for alias in child.names], in_function
            elif isinstance(child, ast.ImportFrom):
                target = resolve(module, path, child)
                named = [f"{target}.{alias.name}" for alias in child.names]
                submodules = [name for name in named if name in known]
                # ``from package import module`` needs the module, not the package's other names
                yield child, [*([target] if len(submodules) < len(named) else []), *submodules], in_function
            yield from visit(child, inner)

    yield from visit(tree, False)


def import_graph() -> dict[str, set[str]]:
    known = core_modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for _, targets, _ in imports(name, path):
            for target in targets:
                if target in known and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return sorted(found, key=len, reverse=True)


def function_level_imports() -> list[str]:
    found = []
    for name, path in core_modules().items():
        for node, targets, in_function in imports(name, path):
            if in_function and any(is_core(target) for target in targets):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def calls(path: Path, attribute: str) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == attribute]


def outcome_storers() -> dict[str, list[int]]:
    found = {}
    for name, path in core_modules().items():
        if name in BACKEND_MODULES or name.startswith("worker_core.testing"):
            continue
        lines = calls(path, "store_result")
        if lines:
            found[name] = lines
    return found


def public_list() -> dict[str, set[str]]:
    """Each public core module and its names, as tests/test_public_api.py pins them."""
    pinned: dict[str, object] = {}
    for node in ast.parse(PUBLIC_API_TEST.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("PUBLIC", "MODULES"):
            pinned[target.id] = ast.literal_eval(node.value)  # type: ignore[attr-defined]
    modules: dict[str, list[str]] = pinned["MODULES"]  # type: ignore[assignment]
    found = {module: set(names) for module, names in modules.items() if is_core(module)}
    found["worker_core"] = set(pinned["PUBLIC"])  # type: ignore[call-overload]
    return found


def public_names(module: str) -> set[str] | None:
    """The public names of a core module, None for a module outside the public list."""
    return public_list().get(module)


def is_core(module: str) -> bool:
    return module.split(".")[0] == "worker_core"


def non_public_imports() -> list[str]:
    """Each import of a core module or name by a plugin that is outside the public list."""
    known = core_modules()
    found = []
    for path in sorted(REPO.glob("plugins/*/src/**/*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            wrong: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if is_core(alias.name) and public_names(alias.name) is None:
                        wrong.append(alias.name)
            elif isinstance(node, ast.ImportFrom) and not node.level and is_core(node.module or ""):
                assert node.module is not None
                allowed = public_names(node.module)
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    if submodule in known:
                        if public_names(submodule) is None:
                            wrong.append(submodule)
                    elif allowed is None or alias.name not in allowed:
                        wrong.append(f"{node.module}.{alias.name}")
            if wrong:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {', '.join(wrong)}")  # type: ignore[attr-defined]
    return found


def broker_name_comparisons() -> list[str]:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names_driver = any("driver_type" in ast.unparse(side) for side in sides)
            has_string = any(isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides)
            if names_driver and has_string:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def source_lines() -> tuple[int, int]:
    def count(paths: Iterator[Path]) -> int:
        return sum(len(path.read_text().splitlines()) for path in paths)

    core = count(CORE.rglob("*.py"))
    plugins = count(REPO.glob("plugins/*/src/**/*.py"))
    return core, core + plugins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detail", action="store_true", help="list what each figure counts")
    detail = parser.parse_args().detail

    core, total = source_lines()
    print(f"core lines: {core} of {total} ({100 * core / total:.0f} %)")
    found = cycles(import_graph())
    largest = found[0] if found else []
    print(f"modules in the largest import cycle: {len(largest)} ({len(found)} cycles)")
    if detail:
        for cycle in found:
            print("   ", len(cycle), " ".join(cycle))
    functions = function_level_imports()
    print(f"function-level imports of core by core: {len(functions)}")
    if detail:
        print("   ", "\n    ".join(functions))
    storers = outcome_storers()
    print(f"modules that call the backend to store an outcome: {len(storers)}")
    if detail:
        for name, lines in storers.items():
            print(f"    {name}: {lines}")
    plugin_imports = non_public_imports()
    print(f"non-public core imports by plugins: {len(plugin_imports)}")
    if detail:
        print("   ", "\n    ".join(plugin_imports))
    comparisons = broker_name_comparisons()
    print(f"broker-name comparisons in core: {len(comparisons)}")
    if detail:
        print("   ", "\n    ".join(comparisons))


if __name__ == "__main__":
    sys.exit(main())

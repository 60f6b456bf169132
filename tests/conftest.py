"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

# stevedore writes its entry-point cache under XDG_CACHE_HOME when first imported: keep the
# suite's caches out of the user's home.
os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="worker-tests-cache-"))

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


class FakeSite:
    """A directory on ``sys.path`` holding fake installed distributions with entry points.

    Real ``importlib.metadata`` (and so stevedore) finds them exactly as it finds pip-installed
    distributions, which lets tests install broken, conflicting or third-party plugins in-process.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: set[str] = set()

    def add(
        self,
        dist: str,
        entry_points: Mapping[str, Mapping[str, str]],
        modules: Mapping[str, str] | None = None,
        version: str = "1.0",
    ) -> None:
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = []
        for group, names in entry_points.items():
            lines.append(f"[{group}]")
            lines.extend(f"{name} = {target}" for name, target in names.items())
            lines.append("")
        (info / "entry_points.txt").write_text("\n".join(lines))
        for module, source in (modules or {}).items():
            path = self.root / (module.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in path.relative_to(self.root).parents:
                if str(parent) != ".":
                    (self.root / parent / "__init__.py").touch()
            path.write_text(textwrap.dedent(source))
            self.modules.add(module.split(".")[0])
        _forget_caches()


def _forget_caches() -> None:
    import importlib

    from worker_core.plugins.entrypoints import forget_distributions

    forget_distributions()
    importlib.invalidate_caches()
    from stevedore import _cache  # test-only: drop stevedore's in-memory scans
    from stevedore.extension import ExtensionManager

    _cache._c._internal.clear()
    ExtensionManager.ENTRY_POINT_CACHE.clear()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    fake = FakeSite(root)
    _forget_caches()
    yield fake
    for name in list(sys.modules):
        if name.split(".")[0] in fake.modules:
            del sys.modules[name]
    monkeypatch.undo()
    _forget_caches()

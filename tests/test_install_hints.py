"""Every install hint, in the code's errors and in every document, names a path in this
repository (``pip install ./plugins/celery_app``) and never a name on the package index that this
project has not published (``pip install worker-celery`` would fetch whatever claims it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import REPO

from worker_core.plugins.entrypoints import KNOWN_DISTRIBUTIONS, REPOSITORY_PATHS, install_hint

#: ``pip install`` and the words of its command (options, quoted or bare requirements)
PIP_INSTALL = re.compile(r"pip install((?:[ \t]+(?:-[-\w=]+|'[^'\n]*'|\"[^\"\n]*\"|[^\s`'\"()]+))+)")
WORD = re.compile(r"'[^']*'|\"[^\"]*\"|\S+")
#: a requirement naming one of this project's distributions (or the project) by name
OURS = re.compile(r"^worker(?:[-_][\w-]*)?(?:\[[\w,-]+\])?$", re.IGNORECASE)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    files = []
    for name in listed:
        path = REPO / name
        if path.suffix in {".so", ".png", ".svg", ".ico", ".db"} or not path.is_file():
            continue
        files.append(path)
    return files


def hints_naming_our_distributions(text: str) -> list[str]:
    found = []
    for match in PIP_INSTALL.finditer(text):
        for word in WORD.findall(match.group(1)):
            requirement = word.strip("'\"").rstrip(".,;:")
            if requirement.startswith("-") or "/" in requirement or requirement.startswith("{"):
                continue
            if OURS.match(requirement):
                found.append(match.group(0).strip())
    return found


def test_the_checker_finds_what_it_must_and_nothing_else() -> None:
    found = hints_naming_our_distributions("run `pip install worker-celery` first")
    assert found == ["pip install worker-celery"]
    assert hints_naming_our_distributions("pip install --force-reinstall worker-core")
    assert hints_naming_our_distributions("pip install 'worker-core[auth]'")
    assert hints_naming_our_distributions("pip install -U worker")
    assert not hints_naming_our_distributions("pip install ./plugins/celery_app (worker-celery, a clone)")
    assert not hints_naming_our_distributions("pip install './core[auth]' and pip install msgpack")
    assert not hints_naming_our_distributions("pip install -e ./core[test] -e ./plugins/pool_prefork")


def test_no_file_of_the_repository_tells_anyone_to_pip_install_a_name_nobody_published() -> None:
    offenders = []
    for path in tracked_text_files():
        if path == Path(__file__):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for hint in hints_naming_our_distributions(text):
            line = text[:text.index(hint)].count("\n") + 1
            offenders.append(f"{path.relative_to(REPO)}:{line}: {hint}")
    assert not offenders, "install hints must name a path in the repository:\n" + "\n".join(offenders)


def test_every_distribution_an_error_names_has_its_path_in_the_repository() -> None:
    for distribution in {*KNOWN_DISTRIBUTIONS.values(), "worker-core"}:
        path = REPOSITORY_PATHS[distribution]
        assert (REPO / path / "setup.cfg").read_text().count(f"name = {distribution}\n") == 1, distribution
        assert install_hint(distribution).startswith(f"pip install {path} ({distribution}")
    for distribution, path in REPOSITORY_PATHS.items():  # each path is where that distribution is
        assert re.search(rf"^name = {distribution}$", (REPO / path / "setup.cfg").read_text(), re.MULTILINE)

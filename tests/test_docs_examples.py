"""Every code block of the documentation that is a complete program or command runs here, so a
page cannot show code that no longer works (see ``docs_blocks`` for how a block says what it is).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AMQP_TEST_URL, REDIS_ADDRESS, REPO, empty_redis
from docs_blocks import Block, all_blocks, blocks, pages
from workers import wait_for

BLOCKS = all_blocks()
BIN = Path(sys.executable).parent


def test_every_code_block_says_how_it_is_tested():
    unmarked = [f"{b.where}: a ```{b.language} block" for b in BLOCKS if b.is_code and b.kind is None]
    assert not unmarked, (
        "these blocks do not say how they are tested: put <!-- run -->, <!-- bench -->, "
        "<!-- fragment --> or <!-- not run: REASON --> on the line before each, or include a file "
        "of examples/ (see tests/docs_blocks.py):\n" + "\n".join(unmarked))
    reasonless = [b.where for b in BLOCKS if b.kind == "not run" and not b.reason.strip()]
    assert not reasonless, f"<!-- not run: REASON --> needs its reason: {reasonless}"


def test_every_python_fragment_compiles():
    for block in BLOCKS:
        if block.language in ("python", "py") and block.kind in ("fragment", "not run"):
            try:
                compile(block.code, block.where, "exec")
            except SyntaxError as exc:
                pytest.fail(f"{block.where}: the Python block does not compile: {exc}")


INCLUDED = sorted({path for b in BLOCKS for path in b.includes})


@pytest.mark.parametrize("path", INCLUDED)
def test_every_included_file_is_an_example_that_runs(path: str, tmp_path: Path):
    file = REPO / path
    assert file.is_file(), f"a page includes {path}, which does not exist"
    assert file.is_relative_to(REPO / "examples"), f"included files live under examples/ (got {path})"
    if file.suffix != ".py":
        return
    source = file.read_text()
    environment = _environment(tmp_path)
    if 'if __name__ == "__main__"' in source:  # a program: it runs and ends well
        done = subprocess.run([sys.executable, str(file)], cwd=tmp_path, env=environment,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{path} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    else:  # a module (a tasks module, a plugin's): it imports
        module = ".".join(file.relative_to(_import_root(file)).with_suffix("").parts)
        done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=_import_root(file),
                              env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{path} does not import:\n{done.stderr}"


def _import_root(file: Path) -> Path:
    root = file.parent
    while (root / "__init__.py").exists():
        root = root.parent
    return root


BENCH = [b for b in BLOCKS if b.kind == "bench"]

_PARSE_ONLY = """
import argparse, runpy, sys

class Parsed(Exception):
    pass

parse = argparse.ArgumentParser.parse_args

def parse_and_stop(self, *args, **kwargs):
    parse(self, *args, **kwargs)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_and_stop
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rpartition("/")[0])
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except Parsed:
    sys.exit(0)
sys.exit("the script ran without parsing its arguments with argparse")
"""


@pytest.mark.parametrize("block", BENCH, ids=[b.where for b in BENCH])
def test_every_benchmark_command_is_accepted_by_its_script(block: Block):
    commands = [shlex.split(line, comments=True) for line in block.code.replace("\\\n", " ").splitlines()]
    for words in filter(None, commands):
        if words[:2] == ["make", "bench"]:
            assert "\nbench:" in (REPO / "Makefile").read_text()
            continue
        assert words[0] == "python" and words[1].startswith("bench/"), (
            f"{block.where}: a bench block holds commands of bench/ (got {' '.join(words)})")
        assert (REPO / words[1]).is_file(), f"{block.where}: {words[1]} does not exist"
        done = subprocess.run([sys.executable, "-c", _PARSE_ONLY, *words[1:]], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{block.where}: {' '.join(words)}\n{done.stderr}"


# -- the pages' run blocks, one session per page ---------------------------------------------

_URLS = [
    (re.compile(r"redis://(?:127\.0\.0\.1|localhost):6379/\d+"), lambda: f"redis://{REDIS_ADDRESS}/13"),
    (re.compile(r"amqp://guest:guest@(?:127\.0\.0\.1|localhost)(?::5672)?//"), lambda: AMQP_TEST_URL),
]


def _environment(home: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("WORKER_") or k in ("WORKER_TEST_REDIS", "WORKER_STOCK_KOMBU",
                                                           "WORKER_NO_EXTENSIONS")}
    environment.pop("PYTHONPATH", None)
    environment.update(PATH=f"{BIN}{os.pathsep}{environment.get('PATH', '')}", PYTHONUNBUFFERED="1",
                       HOME=str(home))
    return environment


def _with_test_brokers(code: str) -> str:
    for pattern, url in _URLS:
        code = pattern.sub(lambda _match, url=url: url(), code)
    return code


class Session:
    """Runs one page's blocks in order, in a folder of its own; background commands are stopped
    at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.environment = _environment(root)
        self.background: list[tuple[subprocess.Popen[bytes], Path, str]] = []

    def folder(self, block: Block) -> Path:
        if block.options.get("cwd") == "examples":
            target = self.root / "examples"
            if not target.exists():
                ignored = shutil.ignore_patterns(".worker", "__pycache__", "*.egg-info", "build")
                shutil.copytree(REPO / "examples", target, ignore=ignored)
            return target
        return self.root

    def run(self, block: Block) -> None:
        needs = block.options.get("needs")
        if needs and shutil.which(needs) is None:
            if os.environ.get("CI"):
                pytest.fail(f"{block.where} needs {needs}, which is not installed, and CI is set")
            pytest.skip(f"{block.where} needs {needs}")
        code = _with_test_brokers(block.code)
        if any(url in code for url in ("redis://",)):
            empty_redis(f"redis://{REDIS_ADDRESS}/13")
        folder = self.folder(block)
        if block.is_shell:
            command = ["bash", "-c", code] if "background" in block.options else \
                ["bash", "-euo", "pipefail", "-c", code]
        else:
            script = folder / f"block-{block.line}.py"
            script.write_text(code)
            command = [sys.executable, str(script)]
        if "background" in block.options:
            self._start(block, command, folder)
            return
        done = subprocess.run(command, cwd=folder, env=self.environment, capture_output=True, text=True,
                              timeout=180)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{block.where} exited with {done.returncode}:\n{output}{self.logs()}"
        expected = block.options.get("expect")
        if expected:
            assert expected in output, f"{block.where}: {expected!r} not in its output:\n{output}"

    def _start(self, block: Block, command: list[str], folder: Path) -> None:
        log = self.root / f"background-{block.line}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(command, cwd=folder,
                                       env=self.environment, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.background.append((process, log, block.where))
        until = block.options.get("until")
        if not until:
            return

        def shown() -> bool:
            if process.poll() is not None:
                pytest.fail(f"{block.where} exited with {process.returncode} before {until!r}:\n"
                            f"{log.read_text(errors='replace')}")
            return until in log.read_text(errors="replace")

        wait_for(shown, 60, interval=0.05,
                 message=lambda: f"{until!r} from {block.where}:\n{log.read_text(errors='replace')}")

    def logs(self) -> str:
        return "".join(f"\n--- {where} ---\n{log.read_text(errors='replace')[-5000:]}"
                       for _, log, where in self.background)

    def close(self) -> None:
        for process, _, _ in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process, _, _ in self.background:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


RUN_PAGES = [page for page in pages() if any(b.kind == "run" for b in blocks(page))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(REPO)) for p in RUN_PAGES])
def test_the_commands_of_the_page_run(page: Path, tmp_path: Path):
    session = Session(tmp_path)
    try:
        for block in blocks(page):
            if block.kind == "run":
                session.run(block)
    finally:
        session.close()

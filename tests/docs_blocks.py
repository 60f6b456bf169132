"""The code blocks of the documentation pages, and what each says about how it is tested.

Every ``python`` or shell block of a page (``docs/**/*.md``, ``README.md``) is one of:

- an include of a file under ``examples/`` (a line ``--8<-- "examples/..."``): the file is run or
  imported by ``tests/test_docs_examples.py``;
- marked ``<!-- run -->`` on the line before it: the test runs it (a shell block as one bash
  script, a Python block as a program) in the page's session, in order with the page's other run
  blocks; options after ``run:`` are ``background`` (started and left running until the page's
  last block ran), ``until=TEXT`` (with background: wait for TEXT in its output), ``expect=TEXT``
  (the output must hold TEXT), ``cwd=examples`` (run in a copy of ``examples/``) and
  ``needs=PROGRAM`` (skipped without it, unless CI is set);
- marked ``<!-- bench -->``: each command is a benchmark of ``bench/``; the test parses its
  arguments with the script's own parser (the benchmark itself runs in ``make bench``);
- marked ``<!-- fragment -->``: part of a program (Python blocks must still compile);
- marked ``<!-- not run: REASON -->``: a command the suite cannot run as written, with the
  reason (for example the test that does run it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parent.parent
CODE_LANGUAGES = frozenset({"python", "py", "sh", "bash", "shell", "console"})
KINDS = ("run", "bench", "fragment", "not run", "include")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>run|bench|fragment|not run)\s*(?::\s*(?P<options>.*?))?\s*-->\s*$")
_INCLUDE = re.compile(r'^\s*-{1,}8<-{1,}\s*"(?P<path>[^"]+)"')


@attrs.frozen
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    kind: str | None  # one of KINDS, None when unmarked
    options: dict[str, str]
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def is_code(self) -> bool:
        return self.language in CODE_LANGUAGES

    @property
    def is_shell(self) -> bool:
        return self.language in ("sh", "bash", "shell", "console")

    @property
    def includes(self) -> list[str]:
        return [m.group("path") for line in self.code.splitlines() if (m := _INCLUDE.match(line))]


def pages() -> list[Path]:
    return [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]


def _options(text: str | None) -> dict[str, str]:
    options: dict[str, str] = {}
    for token in shlex.split(text or ""):
        key, _, value = token.partition("=")
        options[key.strip()] = value
    return options


def blocks(page: Path) -> Iterator[Block]:
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence = match.group("indent"), match.group("fence")
        language = (match.group("info").split() or [""])[0].strip("{}.").lower()
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][len(indent):] if lines[index].startswith(indent) else lines[index])
            index += 1
        index += 1
        previous = start - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = _MARKER.match(lines[previous]) if previous >= 0 else None
        code = "\n".join(body) + "\n"
        kind = marker.group("kind") if marker else None
        options = _options(marker.group("options")) if marker and kind == "run" else {}
        reason = (marker.group("options") or "") if marker and kind == "not run" else ""
        if kind is None and any(_INCLUDE.match(line) for line in body):
            kind = "include"
        yield Block(page, start + 1, language, code, kind, options, reason)


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]

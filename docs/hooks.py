"""MkDocs build hooks (``hooks:`` in ``mkdocs.yml``): the generated reference tables and the
bootstep graph go into the pages as the site is built (see :mod:`reference`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- generated:" not in markdown:
        return markdown
    return reference.generate(markdown)

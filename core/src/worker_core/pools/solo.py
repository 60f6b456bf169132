"""The solo pool: runs each task inline in the worker's own thread, one at a time."""

from __future__ import annotations

from typing import Any, ClassVar


class SoloPool:
    is_process_pool: ClassVar[bool] = False

    def __init__(self, options: Any) -> None:
        self.options = options

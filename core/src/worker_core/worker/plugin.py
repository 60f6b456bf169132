"""The ``worker`` plugin of worker-core: contributes the worker blueprint's steps."""

from __future__ import annotations

from typing import Any

from ..bootsteps import Step
from ..hookspecs import hookimpl
from .steps import WORKER_STEPS


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    if blueprint != "worker":
        return []
    return list(WORKER_STEPS())

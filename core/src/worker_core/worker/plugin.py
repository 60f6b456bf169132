"""The ``worker`` plugin of worker-core: contributes the worker blueprint's steps."""

from __future__ import annotations

from typing import Any

from ..bootsteps import Step
from ..hookspecs import hookimpl


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    if blueprint != "worker":
        return []
    from .steps import WORKER_STEPS

    return list(WORKER_STEPS())

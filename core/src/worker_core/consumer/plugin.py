"""The ``consumer`` plugin of worker-core: contributes the consumer blueprint's steps."""

from __future__ import annotations

from typing import Any

from ..bootsteps import Step
from ..hookspecs import hookimpl


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    if blueprint != "consumer":
        return []
    from .steps import CONSUMER_STEPS

    return list(CONSUMER_STEPS())

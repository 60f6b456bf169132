"""The plugin's hooks: the ``workerctl postgres`` command (migrate, status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker_core.hookspecs import hookimpl

__all__ = ["workerctl_commands"]


@hookimpl
def workerctl_commands() -> Mapping[str, Any]:
    from .cli import postgres

    return {"postgres": postgres}

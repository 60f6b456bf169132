"""The tasks API: App, Task, AsyncResult and settings.

Internal to worker-core (see :mod:`worker_core` for the public API). Each name is imported when
first asked for: the modules of this package that canvas and results build on (the task context,
the result handles) are imported without the app itself.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import App
    from .result import AsyncResult
    from .settings import Settings
    from .task import Task

__all__ = ["App", "AsyncResult", "Settings", "Task"]

_HOME = {"App": "base", "AsyncResult": "result", "Settings": "settings", "Task": "task"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value

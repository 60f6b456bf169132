"""worker: a task-queue worker whose every moving part is a plugin."""

from typing import TYPE_CHECKING, Any

from .bootsteps import Condition, Step
from .hookspecs import hookimpl
from .options import OptionSpec, WorkerOptions

if TYPE_CHECKING:
    from .app import App, AsyncResult, Settings, Task

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncResult",
    "Condition",
    "OptionSpec",
    "Settings",
    "Step",
    "Task",
    "WorkerOptions",
    "hookimpl",
]

_LAZY = {"App", "AsyncResult", "Settings", "Task"}


def __getattr__(name: str) -> Any:
    # The tasks API pulls in kombu; plugins that only declare steps should not pay for it.
    if name in _LAZY:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'worker_core' has no attribute {name!r}")

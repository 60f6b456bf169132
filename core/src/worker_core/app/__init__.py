"""The tasks API: App, Task, AsyncResult and settings.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

from .base import App
from .result import AsyncResult
from .settings import Settings
from .task import Task

__all__ = ["App", "AsyncResult", "Settings", "Task"]

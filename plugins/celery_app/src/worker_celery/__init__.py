"""Runs an existing ``celery.Celery`` app's tasks with worker: ``workerctl worker -A proj``.

The app loader (:class:`CeleryLoader`) adapts the Celery app ``-A`` names (:class:`CeleryApp`);
each task runs in the pool's process through Celery's own tracer, and the worker's steps send
Celery's worker signals (see :mod:`worker_celery.plugin`).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import CeleryApp
    from .backend import CeleryResultBackend
    from .loader import CeleryLoader

__all__ = ["CeleryApp", "CeleryLoader", "CeleryResultBackend"]

# Each name is imported when first asked for: the hooks of .plugin are loaded by every workerctl
# worker, which must not import Celery unless it runs a Celery app.
_HOME = {"CeleryApp": "app", "CeleryLoader": "loader", "CeleryResultBackend": "backend"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'worker_celery' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

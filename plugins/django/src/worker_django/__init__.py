"""Django's task framework on this worker: :class:`WorkerBackend`, a ``django.tasks`` backend
(``TASKS = {"default": {"BACKEND": "worker_django.WorkerBackend", ...}}``) that sends each task as
a Celery protocol v2 message on any of the worker's transports, and the worker side
(``workerctl worker -A proj.settings``, ``manage.py worker``) that runs them with Django set up.

Add ``"worker_django"`` to ``INSTALLED_APPS`` for ``manage.py worker``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import DjangoApp
    from .backend import WorkerBackend
    from .loader import DjangoLoader

__all__ = ["DjangoApp", "DjangoLoader", "WorkerBackend"]

# Each name is imported when first asked for: the hooks of .plugin are loaded by every workerctl
# worker, which must not import Django unless it runs a Django project; and Django imports this
# package (an installed app) before it can import the backend.
_HOME = {"DjangoApp": "app", "DjangoLoader": "loader", "WorkerBackend": "backend"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'worker_django' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

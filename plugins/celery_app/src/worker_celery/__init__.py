"""Runs an existing ``celery.Celery`` app's tasks with worker: ``workerctl worker -A proj``.

The app loader (:class:`CeleryLoader`) adapts the Celery app ``-A`` names (:class:`CeleryApp`);
each task runs in the pool's process through Celery's own tracer, and the worker's steps send
Celery's worker signals (see :mod:`worker_celery.plugin`).
"""

from .app import CeleryApp
from .backend import CeleryResultBackend
from .loader import CeleryLoader

__all__ = ["CeleryApp", "CeleryLoader", "CeleryResultBackend"]

"""Django's task framework, whichever of the two a project runs: ``django.tasks`` (Django 6.0 and
later) when it is there, else the ``django-tasks`` backport (``django_tasks``, on Django 5.2)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["NAME", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError", "TaskResult",
           "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json", "signals", "task_backends"]


def _framework() -> tuple[str, ModuleType, ModuleType, ModuleType, ModuleType, Any]:
    try:
        from django.tasks import base, exceptions, signals
        from django.tasks.backends import base as backends
        from django.utils.json import normalize_json

        return "django.tasks", base, exceptions, signals, backends, normalize_json
    except ImportError:
        pass
    try:
        from django_tasks import base, exceptions, signals
        from django_tasks.backends import base as backends
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImportError(
            f"worker_django needs Django's task framework: Django 6.0 or later (django.tasks, on "
            f"Python 3.12 or later), or Django 5.2 with the django-tasks backport "
            f"(pip install 'django-tasks>=0.12,<0.13'); {exc}") from exc
    return "django_tasks", base, exceptions, signals, backends, normalize_json


#: the framework's package: ``"django.tasks"`` or ``"django_tasks"``
NAME, _base, _exceptions, signals, _backends, normalize_json = _framework()

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
#: ``InvalidTask`` (Django) or ``InvalidTaskError`` (the backport)
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError


def task_backends() -> Any:
    """The framework's handler of the ``TASKS`` setting (``task_backends``)."""
    from importlib import import_module

    return import_module(NAME).task_backends

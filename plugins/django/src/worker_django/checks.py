"""What ``manage.py check`` reports of a ``WorkerBackend``, in Django's check framework: its
``OPTIONS`` (unknown or wrong worker settings), a transport or result backend that is not
installed, its queues, the features it cannot honour with the transport it has, and the tasks of
the installed apps it would refuse (an unknown queue, a priority or ``run_after`` it does not
take), each found when the tasks modules are imported.

The worker runs the same checks as it starts: an error stops it, a warning is logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker_core.exceptions import WorkerError
from worker_core.options import scheme_of

from . import discovery, framework

if TYPE_CHECKING:
    from .backend import WorkerBackend

__all__ = ["check_backend", "errors_and_warnings"]


def _problems(backend: WorkerBackend) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """``(errors, warnings)``, each ``(id, message, hint)``."""
    errors: list[tuple[str, str, str]] = []
    warnings: list[tuple[str, str, str]] = []
    for problem in backend.problems:
        errors.append(("E001", problem, "OPTIONS hold worker settings: broker_url, result_backend, ..."))
    if errors:
        return errors, warnings
    app = backend.app
    try:
        app.plugins.slot("transport", scheme_of(app.broker_urls[0]))
        url = app.result_url()
        if scheme_of(url) != "disabled":
            app.plugins.slot("result_backend", scheme_of(url))
    except WorkerError as exc:
        errors.append(("E002", str(exc), "install the distribution it names, or use another URL"))
        return errors, warnings
    queues = backend.queues
    bad = sorted(repr(queue) for queue in queues if not isinstance(queue, str) or not queue.strip())
    if bad:
        errors.append(("E003", f"QUEUES names queues that cannot be a broker's: {', '.join(bad)}",
                       "give each queue a non-empty name"))
    declared = set(app.topology.queues) if app.settings.task_queues else None
    if declared is not None and not app.settings.task_create_missing_queues:
        unknown = sorted(str(queue) for queue in queues if queue not in declared)
        if unknown:
            errors.append(("E003", f"QUEUES names queues task_queues does not declare "
                                   f"({', '.join(unknown)}), and task_create_missing_queues is off",
                           "declare them in task_queues, or turn task_create_missing_queues on"))
    for module, reason in _refused_tasks():
        errors.append(("E004", f"{module}: {reason}",
                       "give the task a queue of QUEUES, or an option this backend supports"))
    if not queues:
        warnings.append(("W001", "QUEUES is empty: tasks may name any queue, and a worker started without -Q "
                                 "consumes only 'default'",
                         "list the queues in QUEUES, or start each worker with -Q"))
    if not backend.supports_get_result:
        warnings.append(("W002", f"results are not stored where other processes can read them "
                                 f"(result_backend {app.result_url()!r}): get_result() and refresh() are "
                                 f"not supported",
                         "set result_backend in OPTIONS (redis://, postgresql://, ...)"))
    transport, order, _ = backend.capabilities()
    if transport is not None and order is None:
        warnings.append(("W003", f"the transport of {scheme_of(app.broker_urls[0])}:// does not order "
                                 f"tasks by priority with these settings: supports_priority is False",
                         "on RabbitMQ, set task_queue_max_priority in OPTIONS (10, say)"))
    return errors, warnings


def _refused_tasks() -> list[tuple[str, str]]:
    """The tasks modules of the installed apps that fail to import because a task's backend
    refuses it (``InvalidTask``): its module and why."""
    refused = []
    for package in discovery.app_packages():
        try:
            discovery.tasks_module(package)
        except framework.InvalidTask as exc:
            refused.append((f"{package}.tasks", str(exc)))
    return refused


def errors_and_warnings(backend: WorkerBackend) -> tuple[list[str], list[str]]:
    """The checks' errors and warnings as lines (for the worker's start)."""
    errors, warnings = _problems(backend)
    return ([f"{message} ({hint})" for _, message, hint in errors],
            [f"{message} ({hint})" for _, message, hint in warnings])


def check_backend(backend: WorkerBackend) -> list[Any]:
    """Django's check messages for ``backend``."""
    from django.core import checks

    errors, warnings = _problems(backend)
    where = f"TASKS[{backend.alias!r}]"
    return ([checks.Error(f"{where}: {message}", hint=hint, id=f"worker_django.{code}")
             for code, message, hint in errors]
            + [checks.Warning(f"{where}: {message}", hint=hint, id=f"worker_django.{code}")
               for code, message, hint in warnings])

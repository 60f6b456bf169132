"""Running one Django task in the pool's process or thread, as Django's own backends run one: the
``TaskResult`` made RUNNING (stored, ``task_started`` sent), the function called (with its
``TaskContext`` when it ``takes_context``; an ``async def`` one run to completion), the outcome
stored (``return_value``, or the error with its exception's path and traceback) and
``task_finished`` sent, Django's connections tidied before and after.

:func:`execute` is what the worker hands the pool: a module-level function taking plain data (a
prefork child gets it by reference), returning the task's
:class:`~worker_core.results.Outcome` for the worker's main process to log and acknowledge.
"""

from __future__ import annotations

import logging
import os
import traceback as tracebacks
from collections.abc import Mapping
from time import monotonic
from typing import TYPE_CHECKING, Any

from worker_core.protocol import safe_repr
from worker_core.results import FAILURE, SUCCESS, Outcome

from . import connections, framework, records

if TYPE_CHECKING:
    from .app import DjangoApp

__all__ = ["error_of", "execute", "install", "installed", "is_pool_process", "store"]

logger = logging.getLogger("worker.django")

_app: DjangoApp | None = None
_hostname = ""
_main_pid = 0
#: (path, header's task options) -> the Task, once per process
_tasks: dict[tuple[str, Any], Any] = {}


def install(app: DjangoApp, hostname: str) -> None:
    """Tell executors which project's tasks they run and on which node (in the worker's main
    process, before the pool starts, so forked children inherit it)."""
    global _app, _hostname, _main_pid
    _app, _hostname, _main_pid = app, hostname, os.getpid()


def installed() -> DjangoApp | None:
    """The project this process runs the tasks of, if any."""
    return _app


def is_pool_process() -> bool:
    """Whether this process is a pool child rather than the worker's main process."""
    return _app is not None and os.getpid() != _main_pid


def error_of(exc: BaseException, text: str | None = None) -> Any:
    """Django's ``TaskError`` for ``exc``: its class's path and its traceback (``text`` when the
    exception was raised elsewhere, in a process that is gone)."""
    kind = type(exc)
    shown = text if text is not None else "".join(tracebacks.format_exception(exc))
    return framework.TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}", traceback=shown)


def store(backend: Any, result: Any) -> None:
    """Store ``result``'s record in the state matching its status; a failure is logged (the task's
    outcome still reaches the worker)."""
    try:
        backend.store_result(result.id, records.record_of(result), records.STATES[str(result.status)])
    except Exception as exc:
        logger.error("could not store the %s result of Django task %s[%s]: %s", result.status,
                     result.task.module_path, result.id, exc)


#: the task options ``using()`` changes, which the message's header carries
_OPTIONS = frozenset({"priority", "queue_name", "run_after", "backend"})


def _task(name: str, header: Mapping[str, Any]) -> Any:
    key = (name, tuple(sorted((k, v) for k, v in header.items() if k in _OPTIONS)))
    task = _tasks.get(key)
    if task is None:
        task = _tasks[key] = records.task_of(name, header)
    return task


def _previous(backend: Any, task_id: str) -> Any | None:
    """The record of an earlier attempt (a message delivered again after a lost worker)."""
    try:
        stored = records.read(backend.get_task_meta(task_id))
    except Exception as exc:
        logger.warning("could not read the earlier attempts of Django task %s: %s", task_id, exc)
        return None
    return stored.record if stored is not None else None


def execute(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any],
            header: Mapping[str, Any] | None, again: bool, log_result: bool) -> Outcome:
    """Run the Django task at ``name`` (its path) and report the outcome.

    :param header: the message's :data:`~worker_django.records.HEADER` (the task's options, when
        it was enqueued, whether its record is kept); None from a sender that is not Django's.
    :param again: the message was delivered before (its earlier attempts are read back).
    :param log_result: report the return value's repr as a success's value (for the worker's log).
    """
    from django.utils import timezone

    app = _app
    assert app is not None, "worker_django.execution.install() must run before tasks execute"
    header = header or {}
    begun = monotonic()
    task = _task(name, header)
    backend = app.backend
    keep = bool(header.get("results"))
    before = _previous(backend, task_id) if keep and again else None
    now = timezone.now()
    errors = []
    if before:
        errors = [framework.TaskError(**error) for error in before.get("errors") or []]
    enqueued = header.get("enqueued_at")
    result = framework.TaskResult(
        task=task, id=task_id, status=framework.TaskResultStatus.RUNNING,
        enqueued_at=records.when(enqueued), started_at=now, finished_at=None, last_attempted_at=now,
        args=args, kwargs=kwargs, backend=header.get("backend") or task.backend, errors=errors,
        worker_ids=[*(before.get("worker_ids") or [] if before else []), _hostname])
    sender = type(task.get_backend())
    connections.around_task()
    try:
        if keep:
            store(backend, result)
        framework.signals.task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(framework.TaskContext(task_result=result), *result.args, **result.kwargs)
            else:
                value = task.call(*result.args, **result.kwargs)
            value = framework.normalize_json(value)
        except (Exception, SystemExit) as exc:
            object.__setattr__(result, "finished_at", timezone.now())
            result.errors.append(error_of(exc))
            object.__setattr__(result, "status", framework.TaskResultStatus.FAILED)
            if keep:
                store(backend, result)
            # inside the handler, as Django sends it: its receivers see the exception
            framework.signals.task_finished.send(sender=sender, task_result=result)
            return Outcome(FAILURE, monotonic() - begun, exception=exc, traceback=result.errors[-1].traceback)
        object.__setattr__(result, "_return_value", value)
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "status", framework.TaskResultStatus.SUCCESSFUL)
        if keep:
            store(backend, result)
        framework.signals.task_finished.send(sender=sender, task_result=result)
        return Outcome(SUCCESS, monotonic() - begun, safe_repr(value, 200) if log_result else None)
    finally:
        connections.around_task()

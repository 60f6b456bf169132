"""A Django task's ``TaskResult`` as the result backend stores it: a record (plain JSON) under the
task's id, in the state of Celery's format that matches its status, so ``get_result(id)`` and
``refresh()`` read it from any process.

The record holds every field of ``TaskResult`` and what rebuilds its ``task`` (the function's
path and the options ``using()`` changed); the message carries its enqueue-time part (the
:data:`HEADER`), so the worker writes the record without reading it first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from worker_core.results import FAILURE, PENDING, STARTED, SUCCESS

from . import framework

__all__ = ["HEADER", "KEY", "STATES", "StoredResult", "header_of", "read", "record_of", "task_of", "when"]

#: the message header holding the task's enqueue-time fields (:func:`header_of`)
HEADER = "django_task"
#: the key that marks a stored result as a Django task's record
KEY = "django_task"

#: Django's status -> the state stored (what Celery's format and its readers know)
STATES: Mapping[str, str] = {"READY": PENDING, "RUNNING": STARTED, "SUCCESSFUL": SUCCESS, "FAILED": FAILURE}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def when(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def header_of(result: Any, results: bool) -> dict[str, Any]:
    """What the message carries of ``result`` (a ``TaskResult`` just enqueued): the task's
    options, when it was enqueued, and whether its record is kept (``results``)."""
    task = result.task
    return {"backend": result.backend, "priority": task.priority, "queue_name": task.queue_name,
            "run_after": _iso(task.run_after), "enqueued_at": _iso(result.enqueued_at), "results": results}


def record_of(result: Any) -> dict[str, Any]:
    """The record stored for ``result``."""
    task = result.task
    record = {
        KEY: 1,
        "task": {"path": task.module_path, "priority": task.priority, "queue_name": task.queue_name,
                 "run_after": _iso(task.run_after), "backend": task.backend},
        "backend": result.backend,
        "status": str(result.status),
        "args": result.args,
        "kwargs": result.kwargs,
        "enqueued_at": _iso(result.enqueued_at),
        "started_at": _iso(result.started_at),
        "finished_at": _iso(result.finished_at),
        "last_attempted_at": _iso(result.last_attempted_at),
        "worker_ids": list(result.worker_ids),
        "errors": [{"exception_class_path": error.exception_class_path, "traceback": error.traceback}
                   for error in result.errors],
    }
    if result.status == framework.TaskResultStatus.SUCCESSFUL:
        record["return_value"] = result._return_value
    return record


def task_of(path: str, options: Mapping[str, Any]) -> Any:
    """The ``Task`` at ``path`` (a module-level ``@task``), with the options ``using()`` gave it
    when it was enqueued (``priority``, ``queue_name``, ``run_after``, ``backend``)."""
    from django.utils.module_loading import import_string

    try:
        task = import_string(path)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"the task {path!r} cannot be imported here ({exc}): is its module on this "
                         f"process's path?") from exc
    if not isinstance(task, framework.Task):
        raise ValueError(f"{path!r} is not a task (got {type(task).__name__}): decorate it with @task")
    changes = {name: options[name] for name in ("priority", "queue_name", "backend")
               if name in options and options[name] != getattr(task, name)}
    run_after = when(options.get("run_after"))
    if run_after != task.run_after:
        changes["run_after"] = run_after
    if not changes:
        return task
    try:
        return dataclasses.replace(task, **changes)
    except framework.InvalidTask:
        return task  # options this process's backend refuses: the task as it is defined here


@dataclasses.dataclass
class StoredResult:
    """A record read back, with the pieces a ``TaskResult`` is built of."""

    record: Mapping[str, Any]

    def result(self, task_id: str, task: Any | None = None) -> Any:
        """The ``TaskResult`` (``task`` when the caller has it, else rebuilt from its path)."""
        record = self.record
        if task is None:
            task = task_of(record["task"]["path"], record["task"])
        result = framework.TaskResult(
            task=task, id=task_id, status=framework.TaskResultStatus(record["status"]),
            enqueued_at=when(record.get("enqueued_at")), started_at=when(record.get("started_at")),
            finished_at=when(record.get("finished_at")),
            last_attempted_at=when(record.get("last_attempted_at")),
            args=list(record.get("args") or []), kwargs=dict(record.get("kwargs") or {}),
            backend=record.get("backend") or task.backend,
            errors=[framework.TaskError(exception_class_path=error["exception_class_path"],
                                        traceback=error["traceback"])
                    for error in record.get("errors") or []],
            worker_ids=list(record.get("worker_ids") or []),
        )
        if "return_value" in record:
            object.__setattr__(result, "_return_value", record["return_value"])
        return result


def read(meta: Mapping[str, Any]) -> StoredResult | None:
    """The record in a stored meta (``get_task_meta``), or None when it holds none (nothing
    stored under that id, or a result that is not a Django task's)."""
    record = meta.get("result")
    if isinstance(record, Mapping) and record.get(KEY) == 1 and isinstance(record.get("task"), Mapping):
        return StoredResult(record)
    return None

"""What the worker's main process reads of each Celery task: a :class:`worker_core.Task` holding
the Celery task's worker-side options (acknowledgement, time limits, rate limit, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker_core.app.task import Task
from worker_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from celery.app.task import Task as CeleryTask

    from worker_core.app.base import App

__all__ = ["CeleryTaskView", "views_of"]


class CeleryTaskView(Task):
    """A Celery task as the worker sees it: the options it reads before and after the task runs
    (the task itself runs through Celery's tracer in the pool's process).

    Remote ``rate_limit`` and ``time_limit`` change this view, as ``celery worker`` changes the
    task: the worker applies them from the next task on.
    """

    def __init__(self, app: App, task: CeleryTask) -> None:
        super().__init__(
            app, task, name=task.name,
            acks_late=task.acks_late,
            ignore_result=task.ignore_result,
            max_retries=task.max_retries,
            time_limit=task.time_limit,
            soft_time_limit=task.soft_time_limit,
            reject_on_worker_lost=task.reject_on_worker_lost,
            acks_on_failure_or_timeout=getattr(task, "acks_on_failure_or_timeout", None),
            track_started=task.track_started,
            serializer=task.serializer,
            rate_limit=task.rate_limit,
        )
        #: the Celery task itself
        self.celery = task


def views_of(app: App, tasks: dict[str, Any]) -> dict[str, Task]:
    """A view of each of ``tasks`` (Celery's registry, built-in tasks included)."""
    views: dict[str, Task] = {}
    for name, task in sorted(tasks.items()):
        try:
            views[name] = CeleryTaskView(app, task)
        except ConfigurationError as exc:
            raise ConfigurationError(f"Celery task {name!r}: {exc}") from None
    return views

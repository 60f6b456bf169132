"""What the worker's main process reads of each Celery task: a :class:`worker_core.Task` holding
the Celery task's worker-side options (acknowledgement, time limits, rate limit, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker_core import Task
from worker_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from celery.app.task import Task as CeleryTask

    from worker_core import App

__all__ = ["CeleryTaskView", "register_views"]


class CeleryTaskView(Task):
    """A Celery task as the worker sees it: the options it reads before and after the task runs
    (the task itself runs through Celery's tracer in the pool's process; calling the view calls
    the Celery task).

    Remote ``rate_limit`` and ``time_limit`` change this view, as ``celery worker`` changes the
    task: the worker applies them from the next task on.
    """

    def __init__(self, task: CeleryTask) -> None:
        super().__init__()
        #: the Celery task itself
        self.celery = task

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.celery(*args, **kwargs)


def register_views(app: App, tasks: dict[str, CeleryTask]) -> None:
    """Register a view of each of ``tasks`` (Celery's registry, built-in tasks included) with
    ``app``, with the options the worker reads."""
    for name, task in sorted(tasks.items()):
        try:
            app.register_task(
                CeleryTaskView(task), name=name,
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
        except ConfigurationError as exc:
            raise ConfigurationError(f"Celery task {name!r}: {exc}") from None

"""What the worker's main process reads of each Celery task: a :class:`worker_core.Task` holding
the Celery task's worker-side options (acknowledgement, time limits, rate limit, ...)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from worker_core import Task
from worker_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from celery.app.task import Task as CeleryTask

    from worker_core import App

__all__ = ["CeleryTaskView", "register_views"]


#: the Celery task's options the view holds (remote rate_limit and time_limit change them)
VIEW_OPTIONS = frozenset({"acks_late", "ignore_result", "max_retries", "time_limit", "soft_time_limit",
                          "reject_on_worker_lost", "acks_on_failure_or_timeout", "track_started",
                          "serializer", "rate_limit"})


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

    def set_time_limits(self, soft: float | None, hard: float | None) -> None:
        """As Celery's remote ``time_limit``, a soft limit at or past the hard one is taken."""
        set_view_time_limits(self, soft, hard)

    @property
    def module(self) -> str:
        return str(self.celery.__module__)

    def info_item(self, name: str) -> Any:
        """The view's own options (those remote control changes) from the view, every other
        attribute from the Celery task, as ``celery worker``'s ``registered`` reads them."""
        if name in VIEW_OPTIONS:
            return super().info_item(name)
        try:
            value = getattr(self.celery, name, None)
        except Exception:
            return None
        return None if callable(value) else value


def set_view_time_limits(view: CeleryTaskView, soft: Any, hard: Any) -> None:
    """Both limits, a soft one at or past the hard one included: ``celery worker`` takes such a
    task, signals its soft limit at its time and kills it right after (the pools here do the
    same), where a task of this project's own is refused."""
    try:
        Task.set_time_limits(view, soft, hard)
    except ConfigurationError:
        if not (_number(soft) and _number(hard)):
            raise
        view._soft_time_limit, view._time_limit = soft, hard


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)


#: the Celery task options the worker reads, each with what it must be here
BOOL_OPTIONS = ("acks_late", "ignore_result", "reject_on_worker_lost", "acks_on_failure_or_timeout",
                "track_started")


def _options(name: str, task: CeleryTask) -> tuple[dict[str, Any], list[str]]:
    """The worker-side options of ``task``, each as this worker can honour it, and a line for each
    it takes otherwise than given (with the fix); ``celery worker`` runs such a task all the same."""
    notes: list[str] = []
    options: dict[str, Any] = {option: getattr(task, option, None) for option in BOOL_OPTIONS}
    for option in BOOL_OPTIONS:
        value = options[option]
        if value is not None and not isinstance(value, bool):
            options[option] = bool(value)
            notes.append(f"{name}: {option}={value!r} is taken as {bool(value)}, as Celery reads it; "
                         f"give True or False")
    retries = task.max_retries
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
        notes.append(f"{name}: max_retries={retries!r} is not a whole number, 0 or more: retries are not "
                     f"capped here; give a whole number or None")
        retries = None
    options["max_retries"] = retries
    soft, hard = task.soft_time_limit, task.time_limit
    for option, value in (("soft_time_limit", soft), ("time_limit", hard)):
        if value is not None and not _number(value):
            notes.append(f"{name}: {option}={value!r} is not a number of seconds above 0 and is not enforced "
                         f"here; give seconds, or None for no limit")
    soft = soft if _number(soft) else None
    hard = hard if _number(hard) else None
    if soft and hard and soft >= hard:
        notes.append(f"{name}: soft_time_limit ({soft:g}s) is not shorter than time_limit ({hard:g}s): as "
                     f"under celery worker, the soft limit is signalled at {soft:g}s and the task is killed "
                     f"right after it (TimeLimitExceeded); set soft_time_limit below time_limit")
    options.update(soft_time_limit=soft, time_limit=hard)
    serializer = task.serializer
    if serializer is not None and (not isinstance(serializer, str) or not serializer.strip()):
        notes.append(f"{name}: serializer={serializer!r} is not a serializer name; the app's "
                     f"task_serializer is used")
        serializer = None
    options["serializer"] = serializer
    rate = task.rate_limit
    try:
        Task().rate_limit = rate  # the check a task's rate limit passes
    except ConfigurationError as exc:
        notes.append(f"{name}: rate_limit={rate!r} is not a rate ({exc}); the task runs without a limit "
                     f"(celery worker stops at start on it); give a rate such as '10/m'")
        rate = None
    options["rate_limit"] = rate
    return options, notes


def register_views(app: App, tasks: dict[str, CeleryTask]) -> list[str]:
    """Register a view of each of ``tasks`` (Celery's registry, built-in tasks included) with
    ``app``, with the options the worker reads; returns a line for each option a task is given
    that the worker takes otherwise (no task is refused for one)."""
    notes: list[str] = []
    for name, task in sorted(tasks.items()):
        options, lines = _options(name, task)
        notes.extend(lines)
        view = CeleryTaskView(task)
        try:
            app.register_task(view, name=name, **{**options, "soft_time_limit": None, "time_limit": None})
            set_view_time_limits(view, options["soft_time_limit"], options["time_limit"])
        except ConfigurationError as exc:
            raise ConfigurationError(f"Celery task {name!r}: {exc}") from None
    return notes

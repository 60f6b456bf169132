"""A task's handlers (``before_start``, ``on_success``, ``on_failure``, ``on_retry``,
``after_return``): which ones a task overrides, decided once when it is registered, and calling
them where Celery calls them, a handler that raises logged without losing the task's outcome."""

from __future__ import annotations

import logging
import traceback as tracebacks
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from .context import TaskContext, pop, push

if TYPE_CHECKING:
    from .task import Task

__all__ = ["HANDLERS", "ExceptionInfo", "call_handler", "call_in_main_process", "overridden"]

logger = logging.getLogger("worker.execution")

#: The handlers a task class may override, with Celery's names and arguments.
HANDLERS = ("before_start", "on_success", "on_failure", "on_retry", "after_return")


def overridden(task: Task, base: type[Task], given: frozenset[str] = frozenset()) -> frozenset[str]:
    """The handlers ``task``'s class defines over ``base``'s (the do-nothing ones), and those
    given as task options (``given``)."""
    cls = type(task)
    return frozenset(name for name in HANDLERS
                     if name in given or getattr(cls, name) is not getattr(base, name))


@attrs.define(slots=True)
class ExceptionInfo:
    """The ``einfo`` argument of ``on_failure``/``on_retry``: the exception, its type and its
    traceback (``traceback`` is the formatted text, as ``str(einfo)``), as Celery passes them."""

    type: type[BaseException]
    exception: BaseException
    traceback: str
    tb: TracebackType | None = None
    internal: bool = False

    @classmethod
    def of(cls, exc: BaseException, text: str | None = None) -> ExceptionInfo:
        if text is None:
            text = "".join(tracebacks.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type(exc), exc, text, exc.__traceback__)

    def __str__(self) -> str:
        return self.traceback


def call_handler(task: Task, handler: str, label: str, *args: Any) -> None:
    """Call ``task.<handler>(*args)``; an exception it raises is logged, not raised: the task's
    outcome is stored already."""
    try:
        getattr(task, handler)(*args)
    except Exception as exc:
        logger.exception("Task %s %s handler raised: %r", label, handler, exc)


def call_in_main_process(task: Task, context: TaskContext, label: str,
                         calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Call handlers in the worker's main process, for an outcome only the worker sees (a hard
    time limit, a task cancelled after a lost connection), with ``task.request`` set, as Celery
    does: ``calls`` holds each handler's name and arguments."""
    push(context)
    try:
        for handler, args in calls:
            if handler in task.handlers:
                call_handler(task, handler, label, *args)
    finally:
        pop()

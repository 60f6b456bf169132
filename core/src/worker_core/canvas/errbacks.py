"""Calling a failed task's errbacks (``link_error``) as Celery's worker does
(``celery/backends/base.py``, ``_call_task_errbacks``): an errback whose task is registered
here and takes more than the task's id (``(request, exc, traceback)``) is called here and now;
any other is sent, all of them as one group, with the failed task's id as first argument."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Iterable
from typing import Any

from ..app.context import TaskContext
from .groups import group
from .interface import CanvasApp
from .signatures import Signature, maybe_signature

__all__ = ["call_errbacks", "takes_request"]

logger = logging.getLogger("worker.canvas")


def takes_request(app: CanvasApp, errback: Signature) -> bool:
    """Whether ``errback`` is called here with ``(request, exc, traceback)``: its task is
    registered in ``app``, is not bound (Celery sends bound errbacks as tasks, so they can
    retry), and its function takes more than one argument once the errback's own arguments are
    given (those of an immutable errback are not counted, as in Celery)."""
    task = app.tasks.get(errback.task)
    if task is None or task.bind:
        return False
    fun = task.fun
    try:
        if not errback.immutable and (errback.args or errback.kwargs):
            try:
                spec = inspect.getfullargspec(functools.partial(fun, *errback.args, **errback.kwargs))
            except (TypeError, ValueError):
                spec = inspect.getfullargspec(fun)
        else:
            spec = inspect.getfullargspec(fun)
    except TypeError:  # a callable whose signature cannot be read: sent as a task
        return False
    return bool(spec.varargs) or len(spec.args) > 1


def call_errbacks(app: CanvasApp, errbacks: Iterable[Any], request: TaskContext, exc: BaseException,
                  traceback: str | None) -> None:
    """Call or send the errbacks of the failed task ``request`` (its id, root id and errbacks
    are read from it). An errback called here that raises is logged; one sent carries the
    task's id, with it as parent."""
    sent: list[Signature] = []
    for item in errbacks:
        errback = maybe_signature(item, app=app)
        if takes_request(app, errback):
            try:
                errback(request, exc, traceback)
            except Exception:
                logger.exception("Errback %s of task %s[%s] raised an exception", errback.task, request.task,
                                 request.id)
        else:
            sent.append(errback)
    if sent:
        task_id = request.id
        group(sent, app=app).apply_async((task_id,), parent_id=task_id, root_id=request.root_id or task_id)

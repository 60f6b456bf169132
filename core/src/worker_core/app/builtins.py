"""The built-in tasks a Celery 5 client may send (``celery/app/builtins.py``), registered in
every app a worker runs (:func:`register_builtin_tasks`) unless the app has its own of that
name: ``celery.map``, ``celery.starmap``, ``celery.chunks`` (a task applied to many arguments in
one message), ``celery.chord_unlock`` (joining a chord by polling its header, for result
backends that do not count it), ``celery.accumulate`` (what ``Task.replace`` puts after a group),
``celery.backend_cleanup``, and the legacy ``celery.group``, ``celery.chain`` and
``celery.chord``. ``inspect registered`` lists them only when asked for built-ins, as Celery's.

The canvas they use is imported when they first run, not when a worker starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..canvas.chords import chord as chord_kind
from ..canvas.groups import group as group_kind
from ..canvas.joins import chord_error_from_stack, failed_culprit, send_chord_body
from ..canvas.maps import chunks as chunks_of
from ..canvas.signatures import maybe_signature
from ..exceptions import ChordError, NotRegistered, Retry
from .groupresult import GroupResult, result_from_tuple
from .task import Task

if TYPE_CHECKING:
    from .base import App
    from .task import Task

__all__ = ["BUILTIN_PREFIX", "builtin_names", "register_builtin_tasks"]

logger = logging.getLogger("worker.canvas")

#: The prefix of the built-in tasks' names (Celery's).
BUILTIN_PREFIX = "celery."


def register_builtin_tasks(app: App) -> None:
    """Register the built-in tasks in ``app``, each unless it has a task of that name already."""
    for name, (fun, options) in _builtins(app).items():
        if name not in app.tasks:
            task = Task()
            task.setup_for(app, name, fun, options)
            app.tasks[name] = task


def _task_of(app: App, sig: Any, builtin: str) -> Task:
    name = maybe_signature(sig, app=app).task
    task = app.tasks.get(name)
    if task is None:
        raise NotRegistered(f"{builtin} calls task {name!r}, which this worker does not have: it runs each "
                            f"call itself, so the task must be registered here")
    return task


def _builtins(app: App) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    def backend_cleanup() -> None:
        """Celery's daily clean-up of expired results: every result backend here expires its
        results itself (Redis keys expire, the embedded file and PostgreSQL's tables are pruned
        by the processes that store results), so nothing is left to do."""

    def accumulate(self: Task, *args: Any, **kwargs: Any) -> Any:
        index = kwargs.get("index")
        return args[index] if index is not None else args

    def xmap(task: Any, it: Iterable[Any]) -> list[Any]:
        fun = _task_of(app, task, "celery.map")
        return [fun(item) for item in it]

    def xstarmap(task: Any, it: Iterable[Any]) -> list[Any]:
        fun = _task_of(app, task, "celery.starmap")
        return [fun(*item) for item in it]

    def chunks(task: Any, it: Iterable[Any], n: int) -> Any:
        return chunks_of(task, it, n, app=app).apply_async().as_tuple()

    def unlock_chord(self: Task, group_id: str, callback: Any, interval: float | None = None,
                     max_retries: int | None = None, result: Any = None, **kwargs: Any) -> None:
        _unlock_chord(app, self, group_id, callback, interval, max_retries, result or [])

    def group(self: Task, tasks: Iterable[Any], result: Any, group_id: str, partial_args: Iterable[Any],
              add_to_parent: bool = True) -> Any:
        for task in tasks:
            sig = maybe_signature(task, app=app).clone(partial_args)
            sig.apply_async(group_id=group_id, add_to_parent=False)
        return result

    def chain(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("chain is not a real task")

    def chord(self: Task, header: Any, body: Any, partial_args: Iterable[Any] = (),
              interval: float | None = None, countdown: float = 1, max_retries: int | None = None,
              eager: bool = False, **kwargs: Any) -> Any:
        header = maybe_signature(header, app=app)
        tasks = header.tasks if isinstance(header, group_kind) else header
        header = group_kind([maybe_signature(task, app=app) for task in tasks], app=app)
        body = maybe_signature(body, app=app)
        sent = chord_kind(header, body, app=app).run(header, body, tuple(partial_args), app=app,
                                                     interval=interval, countdown=countdown,
                                                     max_retries=max_retries, **kwargs)
        return sent.as_tuple()

    bound: dict[str, Any] = {"bind": True}
    return {
        "celery.backend_cleanup": (backend_cleanup, {}),
        "celery.accumulate": (accumulate, bound),
        "celery.chord_unlock": (unlock_chord, {
            "bind": True, "max_retries": None, "ignore_result": True,
            "default_retry_delay": app.settings.result_chord_retry_interval}),
        "celery.map": (xmap, {}),
        "celery.starmap": (xstarmap, {}),
        "celery.chunks": (chunks, {}),
        "celery.group": (group, bound),
        "celery.chain": (chain, {}),
        "celery.chord": (chord, {"bind": True, "ignore_result": False}),
    }


def _unlock_chord(app: App, task: Task, group_id: str, callback: Any, interval: float | None,
                  max_retries: int | None, header: list[Any]) -> None:
    """``celery.chord_unlock``: look at the header's results; not all ready, look again after
    ``interval`` (a retry of this task); all ready, send the body with their values, or fail it
    with ``ChordError`` naming the first header task that failed."""
    if interval is None:
        interval = task.default_retry_delay
    results = GroupResult(group_id, [result_from_tuple(item, app) for item in header], app=app)
    body = maybe_signature(callback, app=app)
    try:
        ready = results.ready()
    except Exception as exc:
        try:
            raise task.retry(exc=exc, countdown=interval, max_retries=max_retries) from exc
        except Retry:
            raise
        except Exception as final:
            _cannot_retry(app, group_id, body, final)
            raise
    if not ready:
        try:
            raise task.retry(countdown=interval, max_retries=max_retries)
        except Retry:
            raise
        except Exception as final:
            _cannot_retry(app, group_id, body, final)
            raise
    try:
        values = results.join(timeout=app.settings.result_chord_join_timeout, propagate=True)
    except Exception as exc:
        culprit = next(failed_culprit(results), None)
        reason = f"Dependency {culprit.id} raised {exc!r}" if culprit is not None else repr(exc)
        logger.error("Chord %s raised: %r", group_id, exc)
        error = ChordError(reason)
        error.__cause__ = exc
        chord_error_from_stack(app, body, error)
        return
    send_chord_body(app, body, values, group_id)


def _cannot_retry(app: App, group_id: str, body: Any, exc: BaseException) -> None:
    """Nothing will look at the chord again (its retries are used up, or sending the retry
    failed): fail the body rather than leave it waiting for ever."""
    logger.error("Chord %s: chord_unlock could not be retried: %r", group_id, exc)
    cause = getattr(exc, "reason", None) or exc
    error = ChordError(f"chord_unlock could not be retried: {cause!r}")
    if isinstance(cause, BaseException):
        error.__cause__ = cause
    chord_error_from_stack(app, body, error)


def builtin_names(names: Iterable[str], builtins: bool) -> list[str]:
    """``names`` sorted, without the built-in tasks unless ``builtins`` (``inspect registered``)."""
    return sorted(name for name in names if builtins or not name.startswith(BUILTIN_PREFIX))


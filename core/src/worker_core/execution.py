"""Running one task inside an executor (inline, a thread, or a pool child) and storing its result.

:func:`execute` is what the worker hands to the pool: a module-level function taking plain data,
so a process pool can send it to a child. It never raises for a task's own errors; it stores
the result and returns a small outcome tuple for the worker's log and acknowledgement rules.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .app.context import MESSAGE_FIELDS, TaskContext, pop, push
from .exceptions import Ignore, Reject, ResultError, Retry
from .protocol import parse_iso, safe_repr, utcnow
from .results.meta import FAILURE, RETRY, STARTED, SUCCESS, encode_exception

if TYPE_CHECKING:
    from .app.base import App

__all__ = ["Outcome", "execute", "install", "process_initializer", "request_mapping"]

logger = logging.getLogger("worker.execution")

#: ``(kind, runtime, *details)``; kind is success, failure, retry, ignored or reject.
Outcome = tuple[Any, ...]

_app: App | None = None
_on_process_init: Callable[[int], None] | None = None


def install(app: App, on_process_init: Callable[[int], None] | None = None) -> None:
    """Tell executors which app's tasks to run (done before the pool starts, so forked
    children inherit it)."""
    global _app, _on_process_init
    _app = app
    _on_process_init = on_process_init


def process_initializer() -> None:
    """Run once in every new pool process or thread before it takes jobs."""
    if _on_process_init is not None:
        _on_process_init(os.getpid())


def request_mapping(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any],
                    fields: tuple[Any, ...]) -> dict[str, Any]:
    """The request as a result backend reads it: the message's fields (:data:`MESSAGE_FIELDS`)
    by name, with the task's name, id, args and kwargs (``result_extended`` stores them)."""
    mapping = dict(zip(MESSAGE_FIELDS, fields, strict=True))
    mapping.update(task=name, id=task_id, args=args, kwargs=kwargs)
    return mapping


def _store(
    app: App, task_id: str, result: Any, state: str, tb: str | None, request: Mapping[str, Any]
) -> None:
    app.backend.store_result(task_id, result, state, tb, request)


def execute(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any], fields: tuple[Any, ...],
            log_result: bool) -> Outcome:
    """Run task ``name`` with ``args``/``kwargs`` and store its state.

    :param fields: the request's message fields, in :data:`MESSAGE_FIELDS` order (retries, eta,
        root_id, delivery_info, ...).
    :param log_result: put the return value's repr in the outcome (for the worker's log).
    """
    app = _app
    assert app is not None, "worker_core.execution.install() must run before tasks execute"
    task = app.tasks[name]
    context = TaskContext(task_id, name, args, kwargs, *fields)  # positional: in the class's field order
    context.called_directly = False
    expires = context.expires
    if expires is not None and parse_iso(expires) <= utcnow():
        return ("expired",)  # it waited in the pool past its expiry: not run
    store = not (context.ignore_result or task.ignore_result)
    request = request_mapping(name, task_id, args, kwargs, fields) if store else {}
    started = perf_counter()
    if store and task.track_started:
        _store(app, task_id, {"pid": os.getpid(), "hostname": context.hostname}, STARTED, None, request)
    push(context)
    try:
        retval = task.run(*args, **kwargs)
    except Retry as exc:
        runtime = perf_counter() - started
        if store:
            reason = exc.exc if exc.exc is not None else exc
            _safe_store(app, task_id, encode_exception(reason), RETRY, _traceback(exc.exc), request)
        return ("retry", runtime, str(exc))
    except Ignore:
        return ("ignored", perf_counter() - started)
    except Reject as exc:
        return ("reject", perf_counter() - started, bool(exc.requeue), safe_repr(exc.reason, 200))
    except Exception as exc:
        runtime = perf_counter() - started
        text = traceback.format_exc()
        if store:
            _safe_store(app, task_id, encode_exception(exc), FAILURE, text, request)
        return ("failure", runtime, type(exc).__name__, safe_repr(exc, 500), text)
    finally:
        pop()
    runtime = perf_counter() - started
    if store:
        try:
            _store(app, task_id, retval, SUCCESS, None, request)
        except Exception as exc:  # the value could not be encoded, or the backend failed
            text = traceback.format_exc()
            error = ResultError(
                f"the task returned but its result could not be stored: {type(exc).__name__}: {exc}"
            )
            _safe_store(app, task_id, encode_exception(error), FAILURE, text, request)
            return ("failure", runtime, type(exc).__name__, safe_repr(error, 500), text)
    return ("success", runtime, safe_repr(retval, 300) if log_result else None)


def _safe_store(
    app: App, task_id: str, result: Any, state: str, tb: str | None, request: Mapping[str, Any]
) -> None:
    try:
        _store(app, task_id, result, state, tb, request)
    except Exception:
        logger.exception("could not store state %s for task %s", state, task_id)


def _traceback(exc: BaseException | None) -> str | None:
    if exc is None or exc.__traceback__ is None:
        return None
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

"""Running one Celery task in the pool's process through Celery's own tracer
(``celery.app.trace``), so its request context, result backend, canvas, handlers and task
signals behave as under ``celery worker``.

:func:`execute` is what the worker hands the pool for a Celery app's task: a module-level
function taking plain data (a prefork child gets it by reference). It returns the task's
:class:`~worker_core.results.Outcome`, from which the worker's main process logs, acknowledges and
calls the hooks, as for any task; the tracer has stored the result already.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from time import monotonic
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app import trace
from celery.exceptions import Reject

from worker_core.aio import run_coroutine
from worker_core.exceptions import Reject as RejectOutcome
from worker_core.exceptions import TaskRevokedError
from worker_core.protocol import parse_iso, safe_repr, utcnow
from worker_core.results import FAILURE, IGNORED, REJECTED, RETRY, REVOKED, SUCCESS, Outcome

from .results import atomic_backend_for

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["execute", "hostname", "install", "installed", "is_pool_process", "pool", "prepare_process"]

logger = logging.getLogger("worker.celery")

#: what a worker's log says itself: the tracer's lines of the same outcomes would repeat them
_LOGGED_BY_THE_WORKER = frozenset(
    line.strip() for line in (trace.LOG_SUCCESS, trace.LOG_FAILURE, trace.LOG_RETRY, trace.LOG_REJECTED)
)

_app: Celery | None = None
_hostname: str | None = None
_pool: str | None = None
_main_pid = 0
_prepared_pid = 0


def reject_reason(reason: object) -> str:
    """A ``Reject``'s reason as the main process gets it (stored with the FAILURE of a message
    rejected for good): the text given, else its repr, bounded."""
    return reason[:200] if isinstance(reason, str) else safe_repr(reason, 200)


def install(app: Celery, hostname: str, pool: str | None) -> None:
    """Tell executors which Celery app's tasks to run, on which node and pool (in the worker's
    main process, before the pool starts, so forked children inherit it)."""
    global _app, _hostname, _pool, _main_pid
    _app, _hostname, _pool, _main_pid = app, hostname, pool, os.getpid()
    logging.getLogger("celery.app.trace").addFilter(_TraceLines())


def hostname() -> str | None:
    """The worker's node name."""
    return _hostname


def pool() -> str | None:
    """The name of the worker's pool."""
    return _pool


def installed() -> Celery | None:
    """The Celery app this process runs tasks of, if any."""
    return _app


def is_pool_process() -> bool:
    """Whether this process is a pool child rather than the worker's main process."""
    return _app is not None and os.getpid() != _main_pid


def prepare_process() -> None:
    """Celery's set-up of a process that runs tasks: the app made current, its tasks' tracers
    built (once per process; a forked child builds its own), and the tasks that use the app's
    Redis result backend given its one-round-trip store (see :mod:`.results`)."""
    global _prepared_pid
    app = _app
    if app is None or _prepared_pid == os.getpid():
        return
    trace.setup_worker_optimizations(app, _hostname)
    atomic = atomic_backend_for(app)
    for name, task in app.tasks.items():
        if atomic is not None and task.backend is app.backend:  # not a task with a backend of its own
            task.backend = atomic
        task.__trace__ = _build_tracer(name, task, app)
    _prepared_pid = os.getpid()


def _build_tracer(name: str, task: Any, app: Celery) -> Any:
    """Celery's tracer of ``task``, once an ``async def`` task is made to run to completion."""
    _run_to_completion(task)
    return trace.build_tracer(name, task, app.loader, _hostname, app=app)


def _run_to_completion(task: Any) -> None:
    """In the process that runs tasks, an ``async def`` task's body becomes a function that runs
    its coroutine to completion on this thread's loop (:func:`worker_core.aio.run_coroutine`),
    so Celery's tracer stores, hands on and logs its value, not a coroutine. The body Celery's
    ``autoretry_for`` wraps (``_orig_run``) is the one made so, when there is one, so that the
    coroutine's exceptions reach the retry."""
    attribute = "_orig_run" if inspect.iscoroutinefunction(getattr(task, "_orig_run", None)) else "run"
    body = getattr(task, attribute)
    if not inspect.iscoroutinefunction(body):
        return

    @functools.wraps(body)
    def run_to_completion(*args: Any, **kwargs: Any) -> Any:
        return run_coroutine(body(*args, **kwargs))

    setattr(task, attribute, run_to_completion)


class _TraceLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.strip() in _LOGGED_BY_THE_WORKER)


def execute(name: str, task_id: str, request: dict[str, Any], args: list[Any], kwargs: dict[str, Any],
            embed: dict[str, Any] | None, log_result: bool) -> Outcome:
    """Run Celery task ``name`` through its tracer and report the outcome.

    :param request: the message's headers with Celery's request fields (``delivery_info``,
        ``reply_to``, ``correlation_id``, ``properties``, ...), as Celery's worker builds it.
    :param embed: the message's ``callbacks``/``errbacks``/``chain``/``chord``.
    :param log_result: report the return value's repr as a success's value (for the worker's log).
    """
    app = _app
    assert app is not None, "worker_celery.execution.install() must run before tasks execute"
    if _prepared_pid != os.getpid():
        prepare_process()
    expires = request.get("expires")
    if isinstance(expires, str) and parse_iso(expires) <= utcnow():
        # it waited in the pool past its expiry: not run (the worker stores REVOKED)
        return Outcome(REVOKED, exception=TaskRevokedError("expired"))
    task = app.tasks[name]
    request.update(args=args, kwargs=kwargs, hostname=_hostname, is_eager=False)
    if embed:
        request.update(embed)
    started = monotonic()
    tracer = task.__trace__
    try:
        if tracer is None:
            tracer = task.__trace__ = _build_tracer(name, task, app)
        retval, info, runtime, shown = tracer(task_id, args, kwargs, request)
    except Reject as exc:  # raised out of the tracer (a handler, or a redelivered duplicate)
        return _rejected(monotonic() - started, exc)
    runtime = runtime if runtime is not None else monotonic() - started
    if info is None:
        return Outcome(SUCCESS, runtime, shown if log_result else None)
    state = info.state
    if state == states.RETRY:
        return Outcome(RETRY, runtime, exception=info.retval)
    if state == states.REJECTED:
        return _rejected(runtime, info.retval)
    if state == states.IGNORED:
        return Outcome(IGNORED, runtime)
    text = getattr(retval, "traceback", None) or ""
    return Outcome(FAILURE, runtime, exception=info.retval, traceback=text)


def _rejected(runtime: float, reject: Any) -> Outcome:
    """A rejection, its reason as text (what it holds need not make the trip from a pool's process)."""
    rejection = RejectOutcome(reject_reason(getattr(reject, "reason", reject)),
                              requeue=bool(getattr(reject, "requeue", False)))
    return Outcome(REJECTED, runtime, exception=rejection)

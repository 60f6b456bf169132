"""Running one task inside an executor (inline, a thread, or a pool child) and storing its result.

:func:`execute` is what the worker hands to the pool: a module-level function taking plain data,
so a process pool can send it to a child. It never raises for a task's own errors; it stores
the result and returns the task's :class:`~worker_core.results.outcome.Outcome` for the worker's
log, hooks and acknowledgement rules.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

import attrs

from .aio import BlockingThreads, blocking_executor, register_async_form, run_coroutine
from .app.context import MESSAGE_FIELDS, TaskContext, pop, push
from .app.handlers import ExceptionInfo, call_handler
from .canvas.after import Workflow
from .exceptions import CanvasError, Ignore, Reject, ResultError, Retry, TaskRevokedError
from .protocol import parse_iso, safe_repr, shown, utcnow
from .results.meta import FAILURE, IGNORED, REJECTED, RETRY, REVOKED, STARTED, SUCCESS
from .results.outcome import Outcome, store_outcome

if TYPE_CHECKING:
    from .app.base import App
    from .canvas.after import Workflow
    from .plugins.hooks import Hooks

__all__ = ["LEASE_LOST", "admit_with", "aexecute", "execute", "install", "process_finalizer",
           "process_initializer", "reject_reason", "request_mapping"]

logger = logging.getLogger("worker.execution")

_app: App | None = None
_hooks: Hooks | None = None
#: the hooks someone implements (the hooks' own set, kept current): empty without hooks
_implemented: set[str] | frozenset[str] = frozenset()
#: asked with a task's id just before it starts in this process (an in-process pool): False when
#: the worker lost its message's lease meanwhile (see :mod:`worker_core.consumer.fence`)
_admit: Callable[[str], bool] | None = None
#: the state of an outcome of a task not run because its message's lease was lost before it
#: started (not a Celery state: never stored; its copy runs where the broker delivered it)
LEASE_LOST = "LEASE_LOST"


def admit_with(gate: Callable[[str], bool] | None) -> None:
    """Ask ``gate(task_id)`` before each task starts in this process (None: ask nothing). A forked
    child asks nothing: its parent's worker is not there."""
    global _admit
    _admit = gate


os.register_at_fork(after_in_child=lambda: admit_with(None))


def install(app: App, hooks: Hooks | None = None) -> None:
    """Tell executors which app's tasks to run and which hooks to call where they run (done
    before the pool starts, so forked children inherit both)."""
    global _app, _hooks, _implemented
    _app = app
    _hooks = hooks
    _implemented = hooks.implemented if hooks is not None else frozenset()


def process_initializer() -> None:
    """Run once in every new pool process or thread before it takes jobs."""
    if _hooks is not None:
        _hooks.notify("worker_process_init", pid=os.getpid())


def process_finalizer(exitcode: int = 0) -> None:
    """Run once in every pool process or thread that ends without being killed."""
    if _hooks is not None:
        _hooks.notify("worker_process_shutdown", pid=os.getpid(), exitcode=exitcode)


def _hook(name: str, **kwargs: Any) -> None:
    assert _hooks is not None
    _hooks.caller(name)(**kwargs)


def request_mapping(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any],
                    fields: tuple[Any, ...]) -> dict[str, Any]:
    """The request as a result backend reads it: the message's fields (:data:`MESSAGE_FIELDS`)
    by name, with the task's name, id, args and kwargs (``result_extended`` stores them)."""
    mapping = dict(zip(MESSAGE_FIELDS, fields, strict=True))
    mapping.update(task=name, id=task_id, args=args, kwargs=kwargs)
    return mapping


def execute(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any], fields: tuple[Any, ...],
            log_result: bool, embed: Mapping[str, Any] | None = None) -> Outcome:
    """Run task ``name`` with ``args``/``kwargs``, store its state, and do what follows it
    (:mod:`worker_core.canvas.after`). An ``async def`` task runs to completion on this
    thread's event loop (:func:`worker_core.aio.run_coroutine`).

    :param fields: the request's message fields, in :data:`MESSAGE_FIELDS` order (retries, eta,
        root_id, delivery_info, ...).
    :param log_result: report the return value's repr as a success's value (for the worker's
        log and the ``task_succeeded`` hook); None without.
    :param embed: the message's embed when it holds something to do after the task (callbacks,
        errbacks, a chain, a chord), with ``replaced_task_nesting`` when the task replaced
        another; None for a plain task.
    """
    steps = _steps(name, task_id, args, kwargs, fields, log_result, embed)
    step = _advance(steps)
    if step is _OFF_LOOP:
        step = _advance(steps)
    if not isinstance(step, _Await):
        done: Outcome = step
        return done
    try:
        value = run_coroutine(step.coroutine)
    except BaseException as exc:
        return _finish(steps, None, exc)
    return _finish(steps, value, None)


async def aexecute(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any], fields: tuple[Any, ...],
                   log_result: bool, embed: Mapping[str, Any] | None = None) -> Outcome:
    """:func:`execute` on a running event loop: an ``async def`` task is awaited there (its
    cancellation propagates: the pool that cancelled it reports the outcome), and what blocks
    around it (storing its states, sending what follows it, hooks and handlers) runs in a thread
    (:func:`worker_core.aio.set_blocking_executor`), so the loop never waits on a backend or a
    broker. It returns once its state is stored, as :func:`execute` does.

    The job's request and context variables live in one context of its own, in which the task's
    coroutine and every part of the work around it run, wherever they run."""
    context = contextvars.copy_context()
    steps = _steps(name, task_id, args, kwargs, fields, log_result, embed)
    step = context.run(_advance, steps)
    interrupted: BaseException | None = None
    if step is _OFF_LOOP:
        step, interrupted = await _off_loop(context, _advance, steps)
    if not isinstance(step, _Await):
        done: Outcome = step
        return done
    error: BaseException | None = None
    try:
        value = await _InContext(step.coroutine, context, interrupted)
    except BaseException as exc:
        value, error = None, exc
    if not step.blocks_after or not (error is None or isinstance(error, Exception)):
        return context.run(_finish, steps, value, error)  # (a cancellation stores nothing)
    # the task has ended: what interrupts it now comes too late to change its outcome
    outcome: Outcome = (await _off_loop(context, _finish, steps, value, error))[0]
    return outcome


def _awaits(name: str, *rest: Any, **more: Any) -> bool:
    """Whether the job of :func:`execute` for task ``name`` is an ``async def`` task's."""
    task = _app.tasks.get(name) if _app is not None else None
    return task is not None and task.is_async


register_async_form(execute, aexecute, _awaits)


#: the hooks called after a task ran
_TAIL_HOOKS = frozenset({"task_postrun", "task_success", "task_failure", "task_retry"})

#: what :func:`_steps` yields first when the work before the task blocks (storing STARTED, a hook,
#: a handler, a workflow's checks): :func:`aexecute` goes on in a thread, :func:`execute` as it is
_OFF_LOOP = object()


@attrs.frozen
class _Await:
    """What :func:`_steps` yields for an ``async def`` task: its coroutine to await, and whether
    what follows it blocks (a state to store, a workflow, hooks or handlers)."""

    coroutine: Coroutine[Any, Any, Any]
    blocks_after: bool


def _advance(steps: Generator[Any, Any, Outcome]) -> Any:
    """Run :func:`_steps` to what it yields next, or to the :class:`Outcome` it returns."""
    try:
        return next(steps)
    except StopIteration as done:
        return done.value


def _finish(steps: Generator[Any, Any, Outcome], value: Any, exc: BaseException | None) -> Outcome:
    """Give the task's coroutine's value (or exception) back to :func:`_steps`, which finishes."""
    try:
        if exc is None:
            steps.send(value)
        else:
            steps.throw(exc)
    except StopIteration as done:
        outcome: Outcome = done.value
        return outcome
    raise RuntimeError("the executor awaited a task twice")


async def _off_loop(context: contextvars.Context, fn: Callable[..., Any], *args: Any
                    ) -> tuple[Any, BaseException | None]:
    """``fn(*args)`` in ``context``, in a thread of the blocking executor: what it returns, and
    what interrupted the caller meanwhile (a cancellation, a soft time limit) or None. It waits
    for ``fn`` to end whatever comes: the task's steps cannot be left half run. What ``fn``
    raises is raised."""
    threads = blocking_executor()
    if isinstance(threads, BlockingThreads):
        future = threads.call(context.run, fn, *args)
    else:
        future = asyncio.get_running_loop().run_in_executor(threads, context.run, fn, *args)
    interrupted: BaseException | None = None
    while True:
        try:
            return await asyncio.shield(future), interrupted
        except BaseException as exc:
            if future.done():
                raise
            interrupted = exc


class _InContext:
    """Awaits ``coroutine`` with each of its steps run in ``context``; ``first`` (when given) is
    raised in it at its start (what interrupted the work before it)."""

    __slots__ = ("_context", "_coroutine", "_first")

    def __init__(self, coroutine: Awaitable[Any], context: contextvars.Context,
                 first: BaseException | None) -> None:
        self._coroutine = coroutine
        self._context = context
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        run, coro = self._context.run, self._coroutine.__await__()
        send: Any = None
        throw, self._first = self._first, None
        while True:
            try:
                yielded = run(coro.send, send) if throw is None else run(coro.throw, throw)
            except StopIteration as done:
                return done.value
            send, throw = None, None
            try:
                send = yield yielded
            except BaseException as exc:
                throw = exc


def _steps(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any], fields: tuple[Any, ...],
           log_result: bool, embed: Mapping[str, Any] | None) -> Generator[Any, Any, Outcome]:
    """What :func:`execute` and :func:`aexecute` do, as a generator: it yields an ``async def``
    task's coroutine once (an :class:`_Await`), to be awaited, and is given back its value (or
    its exception); before it, :data:`_OFF_LOOP` when what comes first blocks."""
    app = _app
    assert app is not None, "worker_core.execution.install() must run before tasks execute"
    if _admit is not None and not _admit(task_id):
        return Outcome(LEASE_LOST)
    task = app.tasks[name]
    context = TaskContext(task_id, name, args, kwargs, *fields)  # positional: in the class's field order
    context.called_directly = False
    expires = context.expires
    if expires is not None and parse_iso(expires) <= utcnow():
        # it waited in the pool past its expiry: not run (the worker stores REVOKED)
        return Outcome(REVOKED, exception=TaskRevokedError("expired"))
    store = not (context.ignore_result or task.ignore_result)
    request = request_mapping(name, task_id, args, kwargs, fields) if store else {}
    hooks = _implemented
    handlers = task.handlers  # empty unless the task's class overrides one (decided once)
    serializer = task.result_serializer
    started = perf_counter()
    workflow: Workflow | None = None
    if task.is_async and (embed is not None or (store and task.track_started) or "task_prerun" in hooks
                          or "before_start" in handlers):
        yield _OFF_LOOP
    if embed is not None:
        try:
            workflow = Workflow.read(app, embed, context)
        except CanvasError as exc:
            return _unusable_embed(app, context, exc, store, request, serializer)
    if store and task.track_started:
        store_outcome(app.backend, Outcome(STARTED, value={"pid": os.getpid(), "hostname": context.hostname},
                                           task_id=task_id, request=request), serializer)
    push(context)
    try:
        if workflow is not None and context.delivery_info.get("redelivered"):
            try:
                if workflow.already_succeeded(context):
                    return Outcome(IGNORED, perf_counter() - started)
            except Exception as exc:
                logger.exception("Task %s[%s] was delivered again and had succeeded, but what follows it "
                                 "could not be sent again: it goes back to the queue", name, task_id)
                return Outcome(REJECTED, perf_counter() - started,
                               exception=Reject(safe_repr(exc, 200), requeue=True))
        if "task_prerun" in hooks:
            _hook("task_prerun", task_id=task_id, task=task, args=args, kwargs=kwargs, request=context)
        try:
            if "before_start" in handlers:
                task.before_start(task_id, args, kwargs)
            retval = task(*args, **kwargs) if task.overrides_call else task.run(*args, **kwargs)
            if task.is_async:
                retval = yield _Await(retval, store or workflow is not None or bool(handlers)
                                      or not _TAIL_HOOKS.isdisjoint(hooks))
        except Retry as exc:
            runtime = perf_counter() - started
            reason = exc.exc if exc.exc is not None else exc
            outcome = Outcome(RETRY, runtime, exception=exc, traceback=_traceback(exc.exc), task_id=task_id,
                              request=request)
            if store:
                _safe_store(app, outcome, serializer)
            if "on_retry" in handlers:
                call_handler(task, "on_retry", _label(context), exc.exc, task_id, args, kwargs,
                             ExceptionInfo.of(exc))
            if "task_retry" in hooks:
                _hook("task_retry", task=task, task_id=task_id, request=context, reason=reason,
                      traceback=reason.__traceback__)
            _postrun(hooks, task, task_id, args, kwargs, exc, RETRY, context)
            return outcome
        except Ignore as exc:
            _postrun(hooks, task, task_id, args, kwargs, exc, IGNORED, context)
            return Outcome(IGNORED, perf_counter() - started)
        except Reject as exc:
            _postrun(hooks, task, task_id, args, kwargs, exc, REJECTED, context)
            # its reason as text: what it holds need not make the trip from a pool's process
            return Outcome(REJECTED, perf_counter() - started,
                           exception=Reject(reject_reason(exc.reason), requeue=bool(exc.requeue)))
        except Exception as exc:
            runtime = perf_counter() - started
            text = traceback.format_exc()
            outcome = Outcome(FAILURE, runtime, exception=exc, traceback=text, task_id=task_id,
                              request=request)
            if store:
                _safe_store(app, outcome, serializer)
            if workflow is not None:
                workflow.failed(context, exc, text)
            _failed(hooks, task, handlers, context, exc, text)
            _postrun(hooks, task, task_id, args, kwargs, exc, FAILURE, context)
            return outcome
        runtime = perf_counter() - started
        if workflow is not None:
            # sent before the result is stored, so that it lists them as its children
            try:
                workflow.succeeded(context, retval)
            except Exception as exc:
                error: Exception = CanvasError(f"the task returned but what follows it could not be sent: "
                                               f"{type(exc).__name__}: {exc}")
                return _failed_after(app, hooks, task, handlers, context, workflow, error, store, request,
                                     serializer, runtime)
        if store:
            if context.children:
                request["children"] = [child.as_tuple() for child in context.children]
            try:
                succeeded = Outcome(SUCCESS, runtime, retval, task_id=task_id, request=request)
                store_outcome(app.backend, succeeded, serializer)
            except Exception as exc:  # the value could not be encoded, or the backend failed
                error = ResultError(
                    f"the task returned but its result could not be stored: {type(exc).__name__}: {exc}"
                )
                return _failed_after(app, hooks, task, handlers, context, workflow, error, store, request,
                                     serializer, runtime)
        if workflow is not None:
            try:
                workflow.counted(context, SUCCESS, retval)
            except Exception:
                logger.exception("Task %s[%s] succeeded, and its chord could not count it", name, task_id)
        # Celery's order: the result stored (and counted for its chord), on_success, the
        # task_success signal, after_return, task_postrun
        if "on_success" in handlers:
            call_handler(task, "on_success", _label(context), retval, task_id, args, kwargs)
        if "task_success" in hooks:
            _hook("task_success", task=task, task_id=task_id, result=retval, request=context)
        if "after_return" in handlers:
            call_handler(task, "after_return", _label(context), SUCCESS, retval, task_id, args, kwargs, None)
        _postrun(hooks, task, task_id, args, kwargs, retval, SUCCESS, context)
        return Outcome(SUCCESS, runtime, safe_repr(retval, 300) if log_result else None)
    finally:
        pop()


def reject_reason(reason: object) -> str:
    """A ``Reject``'s reason as the worker's main process gets it: the text given, else its
    repr, bounded (it is stored with the FAILURE of a message rejected for good)."""
    return reason[:200] if isinstance(reason, str) else safe_repr(reason, 200)


def _label(context: TaskContext) -> str:
    """``name[id]`` for the log, with the shadow name when the sender gave one (as Celery logs),
    bounded: both come from the message."""
    return f"{shown(context.shadow or context.task or '')}[{shown(context.id or '', 100)}]"


def _failed(hooks: set[str] | frozenset[str], task: Any, handlers: frozenset[str], context: TaskContext,
            exc: BaseException, text: str) -> None:
    """After a failed task's FAILURE is stored (and its chord and errbacks told), in Celery's
    order: ``on_failure``, the ``task_failure`` hook, ``after_return``."""
    if "on_failure" in handlers:
        call_handler(task, "on_failure", _label(context), exc, context.id, context.args, context.kwargs,
                     ExceptionInfo.of(exc, text))
    if "task_failure" in hooks:
        _hook("task_failure", task=task, task_id=context.id, exception=exc, args=context.args,
              kwargs=context.kwargs, traceback=exc.__traceback__, request=context)
    if "after_return" in handlers:
        call_handler(task, "after_return", _label(context), FAILURE, exc, context.id, context.args,
                     context.kwargs, None)


def _failed_after(app: App, hooks: set[str] | frozenset[str], task: Any, handlers: frozenset[str],
                  context: TaskContext, workflow: Workflow | None, error: Exception, store: bool,
                  request: dict[str, Any], serializer: str | None, runtime: float) -> Outcome:
    """A task that returned but whose result could not be stored or whose next steps could not
    be sent: FAILURE with the reason, and what follows a failure."""
    text = traceback.format_exc()
    logger.error("Task %s: %s", _label(context), error)
    task_id = str(context.id)
    outcome = Outcome(FAILURE, runtime, exception=error, traceback=text, task_id=task_id, request=request)
    if store:
        _safe_store(app, outcome, serializer)
    if workflow is not None:
        workflow.failed(context, error, text)
    _failed(hooks, task, handlers, context, error, text)
    _postrun(hooks, task, task_id, context.args, context.kwargs, error, FAILURE, context)
    return outcome


def _unusable_embed(app: App, context: TaskContext, error: CanvasError, store: bool,
                    request: Mapping[str, Any], serializer: str | None) -> Outcome:
    """A message whose canvas this worker cannot honour: its task is not run, and its result is
    FAILURE with the reason, so no client waits for what would never come."""
    logger.error("Task %s not run: its message carries a canvas this worker cannot honour: %s",
                 _label(context), error)
    if store:
        _safe_store(app, Outcome(FAILURE, exception=error, task_id=str(context.id), request=request),
                    serializer)
    return Outcome(FAILURE, exception=error, traceback=f"{type(error).__name__}: {error}")


def _postrun(hooks: set[str] | frozenset[str], task: Any, task_id: str, args: list[Any],
             kwargs: dict[str, Any], retval: Any, state: str, context: TaskContext) -> None:
    if "task_postrun" in hooks:
        _hook("task_postrun", task_id=task_id, task=task, args=args, kwargs=kwargs, retval=retval,
              state=state, request=context)


def _safe_store(app: App, outcome: Outcome, serializer: str | None) -> None:
    try:
        store_outcome(app.backend, outcome, serializer)
    except Exception:
        logger.exception("could not store state %s for task %s", outcome.state, outcome.task_id)


def _traceback(exc: BaseException | None) -> str | None:
    if exc is None or exc.__traceback__ is None:
        return None
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

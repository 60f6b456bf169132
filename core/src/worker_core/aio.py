"""Running ``async def`` tasks: what the core's executors and pool plugins with an event loop use.

- A pool that runs jobs on an asyncio loop asks :func:`async_form` for the coroutine function
  that does a job there (the core's executor has one for the ``async def`` tasks; a plugin's
  executor may register its own with :func:`register_async_form`), and drives each job's coroutine through an
  :class:`Interruptible`, so a soft time limit raises ``SoftTimeLimitExceeded`` inside the task
  at its next ``await``.
- What is synchronous around such a job (storing its states, sending what follows it, the hooks
  and handlers around it) runs in a thread, so the loop never waits on a result backend or a
  broker: in the threads a pool sets for that in each of its processes
  (:func:`set_blocking_executor`, with :class:`BlockingThreads` or any executor), else in the
  running loop's default executor.
- A pool without a loop (prefork, threads, solo) runs an ``async def`` task to completion with
  :func:`run_coroutine`, on a loop of the running thread kept for the next one.

Part of the public API for plugin authors (see :mod:`worker_core`).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from .exceptions import SoftTimeLimitExceeded

__all__ = ["BlockingThreads", "Interruptible", "async_form", "blocking_executor", "register_async_form",
           "run_coroutine", "set_blocking_executor", "thread_loop"]

_forms: dict[Callable[..., Any], tuple[Callable[..., Awaitable[Any]], Callable[..., bool] | None]] = {}


def register_async_form(target: Callable[..., Any], form: Callable[..., Awaitable[Any]],
                        when: Callable[..., bool] | None = None) -> None:
    """Declare that ``form(*args, **kwargs)``, awaited on a running loop, does what
    ``target(*args, **kwargs)`` does (same arguments, same return value), awaiting an ``async
    def`` task there instead of blocking; ``when(*args, **kwargs)`` says for which jobs (None:
    all of them): the others are better run as the plain ``target`` in a thread. Done once,
    where ``target`` is defined."""
    _forms[target] = (form, when)


def async_form(target: Callable[..., Any], args: Sequence[Any] = (),
               kwargs: Mapping[str, Any] | None = None) -> Callable[..., Awaitable[Any]] | None:
    """The coroutine function to await for the job ``target(*args, **kwargs)`` on a loop, or
    None: the pool then runs the plain ``target`` in a thread, where it cannot block the loop."""
    found = _forms.get(target)
    if found is None:
        return None
    form, when = found
    if when is not None and not when(*args, **(kwargs or {})):
        return None
    return form


class BlockingThreads:
    """A few threads for the synchronous work around a loop's ``async def`` jobs, cheaper per
    call than an executor: :meth:`call` gives an asyncio future of the running loop, and the
    loop is woken once for each batch of calls that ended meanwhile, not once per call."""

    def __init__(self, threads: int, name: str) -> None:
        self.size = max(threads, 1)
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._ended: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._lock = threading.Lock()
        self._posted = False

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` in one of the threads; awaited on the running loop for what it returns
        (or raises). A cancelled future drops what ``fn`` returns: ``fn`` runs on regardless."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if len(self._threads) < self.size:
            name = f"{self.name}_{len(self._threads)}"
            thread = threading.Thread(target=self._work, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()
        self._queue.put((loop, future, fn, args))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, future, fn, args = item
            value: Any = None
            error: BaseException | None = None
            try:
                value = fn(*args)
            except BaseException as exc:
                error = exc
            with self._lock:
                self._ended.append((future, value, error))
                post, self._posted = not self._posted, True
            if post:
                try:
                    loop.call_soon_threadsafe(self._settle)
                except RuntimeError:  # the loop is closed: nobody awaits these any more
                    pass

    def _settle(self) -> None:
        with self._lock:
            ended, self._ended = self._ended, []
            self._posted = False
        for future, value, error in ended:
            if future.cancelled():
                continue
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    def shutdown(self, wait: bool = True) -> None:
        """End the threads once what was called has run (``wait``: and wait for them)."""
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


_blocking: Executor | BlockingThreads | None = None


def set_blocking_executor(executor: Executor | BlockingThreads | None) -> None:
    """Run the synchronous work around this process's ``async def`` jobs (storing their states,
    sending what follows them, their hooks and handlers) in ``executor``'s threads: a pool with
    a loop sets one of its own in each of its processes, where the threads its tasks start with
    ``asyncio.to_thread`` cannot crowd it out. None: the running loop's default executor."""
    global _blocking
    _blocking = executor


def blocking_executor() -> Executor | BlockingThreads | None:
    """The executor :func:`set_blocking_executor` set in this process, or None."""
    return _blocking


class Interruptible:
    """Awaits a coroutine (or any awaitable) step by step, so that another exception can be
    raised inside it.

    ``await Interruptible(coro)`` gives what ``await coro`` gives. :meth:`interrupt` (called from
    the loop's thread, while the coroutine waits) makes the ``await`` it is suspended at raise
    ``exc`` instead: the task it runs in is cancelled to wake it, and the cancellation is turned
    into ``exc`` before the coroutine sees it (and taken back, so ``asyncio.timeout`` and task
    groups inside it do not count it).
    """

    __slots__ = ("_coro", "_pending", "_task")

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro: Generator[Any, Any, Any] = coro.__await__()
        self._pending: BaseException | None = None
        self._task: asyncio.Task[Any] | None = None

    def interrupt(self, exc: BaseException) -> bool:
        """Raise ``exc`` in the coroutine at its next ``await``; False when it is not running
        (not started or finished), so nothing will be raised."""
        task = self._task
        if task is None or task.done():
            return False
        self._pending = exc
        task.cancel()
        return True

    def __await__(self) -> Generator[Any, Any, Any]:
        self._task = asyncio.current_task()
        coro = self._coro
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                yielded = coro.send(send) if throw is None else coro.throw(throw)
            except StopIteration as done:
                return done.value
            send, throw = None, None
            try:
                send = yield yielded
            except asyncio.CancelledError as exc:
                pending, self._pending = self._pending, None
                if pending is not None:
                    uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
                    if uncancel is not None:
                        uncancel()
                    throw = pending
                else:
                    throw = exc
            except BaseException as exc:
                throw = exc


# -- the loop of a thread, for pools without one ---------------------------------------------------

_local = threading.local()


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop for ``async def`` tasks, made on first use and kept (a forked
    child makes its own)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed() or _local.pid != os.getpid():
        loop = asyncio.new_event_loop()
        _local.loop = loop
        _local.pid = os.getpid()
    return loop


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on this thread's loop (:func:`thread_loop`) and return what it
    returns, or raise what it raises.

    A ``SoftTimeLimitExceeded`` raised by the pool's signal handler while the loop waits (not
    inside the coroutine's own code) is raised inside the coroutine at the ``await`` it waits at,
    as it would be in a plain function. Tasks the coroutine started and left running stay on the
    loop and go on while the thread's next ``async def`` task runs.
    """
    loop = thread_loop()
    if loop.is_running():
        raise RuntimeError("run_coroutine() was called from inside this thread's running event loop; "
                           "await the coroutine instead")
    driven = Interruptible(coro)

    async def main() -> Any:
        return await driven

    task = loop.create_task(main())
    while True:
        try:
            return loop.run_until_complete(task)
        except SoftTimeLimitExceeded as exc:
            if task.done() or not driven.interrupt(exc):
                raise

"""One thread of the pool: run the initializer, then take jobs from the shared queue until told
to stop, to retire (shrink) or to recycle itself (``max_tasks_per_child``)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, cast

from .jobs import Job, never_started

if TYPE_CHECKING:
    from .pool import ThreadPool

__all__ = ["RETIRE", "STOP", "Executor"]

logger = logging.getLogger("worker.pool")

#: Queue sentinels: STOP ends one thread after the jobs queued before it (warm stop); RETIRE ends
#: one thread for good, shrinking the pool.
STOP = object()
RETIRE = object()


class Executor:
    """A pool thread and its bookkeeping."""

    __slots__ = ("done", "number", "ok", "started", "thread")

    def __init__(self, pool: ThreadPool, number: int) -> None:
        self.number = number
        self.started = threading.Event()  # the initializer finished, well or not
        self.ok = False
        self.done = 0
        self.thread = threading.Thread(target=run, args=(pool, self), name=f"worker-thread-{number}",
                                       daemon=True)


def _call(callback: Callable[..., object], *args: object) -> None:
    try:
        callback(*args)
    except Exception:
        logger.exception("threads pool: callback %r raised; the pool carries on", callback)


def run(pool: ThreadPool, me: Executor) -> None:
    serve(pool, me)
    finalizer = pool.options.finalizer
    if me.ok and finalizer is not None:  # (a thread whose initializer failed never served)
        try:
            finalizer(0)
        except Exception:
            logger.exception("threads pool: the pool finalizer raised in %s", threading.current_thread().name)


def serve(pool: ThreadPool, me: Executor) -> None:
    """Run the initializer, then jobs until told to stop, to retire, or to be recycled."""
    initializer = pool.options.initializer
    if initializer is not None:
        try:
            initializer()
        except BaseException:
            logger.exception("threads pool: the pool initializer raised in %s; the thread exits",
                             threading.current_thread().name)
            with pool.lock:
                pool.idle -= 1
                pool.executor_exited(me)
            me.started.set()
            return
    me.ok = True
    me.started.set()
    pid = os.getpid()
    get = pool.queue.get
    lock = pool.lock
    running = pool.running
    max_tasks = pool.options.max_tasks_per_child
    # The pool counts this thread idle from its start; it is busy from taking a job until the
    # job's end.
    while True:
        item = get()
        with lock:
            if item is STOP or item is RETIRE:
                pool.idle -= 1
                if item is RETIRE:
                    pool.retiring -= 1
                pool.executor_exited(me)
                return
            job = cast(Job, item)
            # Taken off the queue just as the pool was terminated: it must not start now.
            cancelled = pool.terminated
            if not cancelled:
                pool.idle -= 1
                running[me.number] = job
        if cancelled:
            if job.error_callback is not None:
                _call(job.error_callback, never_started(job))
            continue
        if job.accept_callback is not None:
            _call(job.accept_callback, pid, monotonic())
        try:
            value = job.target(*job.args, **job.kwargs) if job.kwargs else job.target(*job.args)
        except Exception as exc:
            with lock:
                pool.idle += 1
                mine = running.pop(me.number, None) is job
            if mine and job.error_callback is not None:
                _call(job.error_callback, exc)
        else:
            with lock:
                pool.idle += 1
                mine = running.pop(me.number, None) is job
            if mine and job.callback is not None:
                _call(job.callback, value)
        me.done += 1
        if max_tasks is not None and me.done >= max_tasks and pool.recycle(me):
            return

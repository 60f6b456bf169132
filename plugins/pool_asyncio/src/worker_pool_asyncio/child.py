"""A loop process: one event loop running every job the worker sends it at once.

A job whose target has an async form (:func:`worker_core.aio.async_form`: an ``async def``
task) is awaited on the loop, driven through :class:`~worker_core.aio.Interruptible` so the
worker's soft limit raises ``SoftTimeLimitExceeded`` at its next ``await``; any other job runs in
one of a bounded number of threads, where it cannot block the loop. The worker never sends more
jobs than the process has room for (and sends plain ones only for a free thread), so every job
starts as it arrives. Time limits are the worker's: it sends the soft limit and the cancellation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import faulthandler
import logging
import os
import signal
import threading
import traceback
from collections.abc import Callable, Generator
from time import monotonic
from typing import Any

import attrs

from worker_core.aio import BlockingThreads, Interruptible, async_form, set_blocking_executor
from worker_core.exceptions import SoftTimeLimitExceeded

from . import frames
from .crashes import Marks
from .frames import FrameReader
from .process import prepare_child
from .stall import StallWatch

__all__ = ["ChildConfig", "child_main"]

logger = logging.getLogger("worker.pool")

_READ = 1 << 18


@attrs.frozen
class ChildConfig:
    name: str
    parent_pid: int
    job_fd: int
    result_fd: int
    close_fds: tuple[int, ...]
    threads: int
    io_threads: int
    loop: str  # "auto", "uvloop" or "asyncio"
    stall_after: float
    #: what each thread runs, for the worker to tell which job crashed the process
    marks: Marks = attrs.field(eq=False)
    #: where faulthandler writes its report when the process crashes
    crash_fd: int
    initializer: Callable[[], None] | None = attrs.field(default=None, eq=False)
    finalizer: Callable[[int], None] | None = attrs.field(default=None, eq=False)


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed (``auto``) or asked for, else asyncio's."""
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def child_main(config: ChildConfig) -> int:
    prepare_child(config.parent_pid, config.close_fds, config.name)
    faulthandler.enable(file=config.crash_fd, all_threads=True)
    os.set_blocking(config.result_fd, False)
    process = LoopProcess(config)
    if config.initializer is not None:
        try:
            config.initializer()
        except BaseException:
            process.send(frames.INIT_FAILED, 0, traceback.format_exc())
            process.flush_blocking()
            return 1
    return process.run()


class _Running:
    """A job running here: its asyncio task (or its thread), and how it is being stopped."""

    __slots__ = ("driven", "id", "label", "task", "thread")

    def __init__(self, job_id: int, label: str) -> None:
        self.id = job_id
        self.label = label
        self.task: asyncio.Task[Any] | None = None
        self.driven: Interruptible | None = None
        self.thread: int | None = None  # ident of the thread running a plain job


class LoopProcess:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.pid = os.getpid()
        self.loop = new_loop(config.loop)
        self.reader = FrameReader()
        self.jobs: dict[int, _Running] = {}
        self.by_task: dict[asyncio.Task[Any], _Running] = {}
        self._out = bytearray()
        self._out_lock = threading.Lock()
        self._flush_scheduled = False
        self._writing = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._blocking = BlockingThreads(config.io_threads, f"{config.name}-io")
        self._stopping = False
        self._done: asyncio.Future[int] | None = None
        self._loop_thread = threading.get_ident()

    # -- sending to the worker -------------------------------------------------------------------

    def send(self, kind: int, job_id: int = 0, payload: Any = None) -> None:
        try:
            data = frames.encode(kind, job_id, payload)
        except Exception as exc:  # an unpicklable value or exception: say what it was instead
            data = frames.encode(frames.ERROR, job_id, _unpicklable(kind, payload, exc))
        with self._out_lock:
            self._out += data
        if threading.get_ident() == self._loop_thread:
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush_from_loop)
        else:
            self.flush()

    def _flush_from_loop(self) -> None:
        self._flush_scheduled = False
        if not self.flush() and not self._writing:
            self._writing = True
            self.loop.add_writer(self.config.result_fd, self._on_writable)

    def _on_writable(self) -> None:
        if self.flush():
            self._writing = False
            self.loop.remove_writer(self.config.result_fd)

    def flush(self) -> bool:
        """Write what the pipe takes; True once nothing is left."""
        with self._out_lock:
            while self._out:
                try:
                    written = os.write(self.config.result_fd, self._out)
                except BlockingIOError:
                    return False
                except OSError:  # the worker is gone: the parent-death signal follows
                    self._out.clear()
                    return True
                del self._out[:written]
            return True

    def flush_blocking(self) -> None:
        os.set_blocking(self.config.result_fd, True)
        self.flush()

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        loop = self.loop
        asyncio.set_event_loop(loop)
        self.config.marks.loop_thread()
        set_blocking_executor(self._blocking)
        os.set_blocking(self.config.job_fd, False)
        watch = None
        if self.config.stall_after > 0:
            watch = StallWatch(loop, self.config.stall_after, self._label_of, self._stalled)
            watch.start()
        self._done = loop.create_future()
        loop.add_reader(self.config.job_fd, self._on_readable)
        self.send(frames.READY, 0, os.getpid())
        code = loop.run_until_complete(self._done)
        if watch is not None:
            watch.stop()
        self.flush_blocking()
        if self._executor is not None:
            self._executor.shutdown(wait=code == 0, cancel_futures=True)
        self._blocking.shutdown(wait=code == 0)
        if code == 0 and self.config.finalizer is not None:
            try:
                self.config.finalizer(0)
            except Exception:
                logger.exception("asyncio pool: the pool finalizer raised in %s", self.config.name)
        return code

    def _label_of(self, task: asyncio.Task[Any]) -> str | None:
        job = self.by_task.get(task)
        return None if job is None else f"{job.label} (job {job.id})"

    def _stalled(self, label: str | None, seconds: float, over: bool) -> None:
        self.send(frames.STALLED, 0, (label, seconds, over))

    def _on_readable(self) -> None:
        fd = self.config.job_fd
        while True:
            try:
                data = os.read(fd, _READ)
            except BlockingIOError:
                return
            if not data:  # the worker closed its end: it is gone, or it abandoned us
                self.loop.remove_reader(fd)
                self._terminate()
                return
            for kind, job_id, payload in self.reader.feed(data):
                self._handle(kind, job_id, payload)

    def _handle(self, kind: int, job_id: int, payload: Any) -> None:
        if kind == frames.JOB:
            self._start(job_id, *payload)
        elif kind == frames.CANCEL:
            self._cancel(job_id, payload)
        elif kind == frames.STOP:
            self._stopping = True
            self._maybe_done()
        elif kind == frames.TERMINATE:
            self._terminate()

    # -- jobs -----------------------------------------------------------------------------------

    def _start(self, job_id: int, target: Callable[..., Any], args: Any, kwargs: Any, label: str) -> None:
        job = _Running(job_id, label)
        self.jobs[job_id] = job
        form = async_form(target, args, kwargs)
        if form is None:
            self._threads().submit(self._run_plain, job, target, args, kwargs)
            return
        self.send(frames.ACCEPTED, job_id, monotonic())
        try:
            driven = Interruptible(form(*args, **(kwargs or {})))
        except BaseException as exc:
            self._finish(job, frames.ERROR, exc)
            return
        job.driven = driven
        task = self.loop.create_task(self._run_async(job, _Marked(driven, self.config.marks.words, job_id)))
        job.task = task
        self.by_task[task] = job

    async def _run_async(self, job: _Running, driven: _Marked) -> None:
        try:
            value = await driven
        except BaseException as exc:
            self._finish(job, frames.ERROR, exc)
        else:
            self._finish(job, frames.RESULT, value)

    def _run_plain(self, job: _Running, target: Callable[..., Any], args: Any, kwargs: Any) -> None:
        job.thread = threading.get_ident()
        marks = self.config.marks
        slot = marks.thread_slot()
        if slot >= 0:
            marks.words[2 * slot + 1] = job.id
        self.send(frames.ACCEPTED, job.id, monotonic())
        try:
            value = target(*args, **kwargs) if kwargs else target(*args)
        except BaseException as exc:
            kind, payload = frames.ERROR, exc
        else:
            kind, payload = frames.RESULT, value
        if slot >= 0:
            marks.words[2 * slot + 1] = 0
        job.thread = None
        self.loop.call_soon_threadsafe(self._finish, job, kind, payload)

    def _finish(self, job: _Running, kind: int, payload: Any) -> None:
        self.jobs.pop(job.id, None)
        if job.task is not None:
            self.by_task.pop(job.task, None)
        self.send(kind, job.id, payload)
        self._maybe_done()

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(self.config.threads, 1),
                thread_name_prefix=f"{self.config.name}-thread",
                initializer=self.config.initializer,
            )
        return self._executor

    def _cancel(self, job_id: int, signum: int | None) -> None:
        """Stop one job: SIGUSR1 raises ``SoftTimeLimitExceeded`` in it (the soft limit, or a
        revoke asking for it); any other signal cancels it."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        soft = signum == signal.SIGUSR1
        if job.driven is not None:
            if soft:
                job.driven.interrupt(SoftTimeLimitExceeded("soft time limit exceeded"))
            elif job.task is not None:
                job.task.cancel()
        elif job.thread is not None:
            # A thread cannot be cancelled: the exception is raised in it at its next bytecode
            # (not inside a blocking C call); the worker replaces the process if it runs on.
            error: type[BaseException] = SoftTimeLimitExceeded if soft else asyncio.CancelledError
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(job.thread), ctypes.py_object(error))

    def _maybe_done(self) -> None:
        if self._stopping and not self.jobs and self._done is not None and not self._done.done():
            self._done.set_result(0)

    def _terminate(self) -> None:
        """Cold: cancel every running coroutine, give them a moment to unwind, and exit."""
        if self._done is None or self._done.done():
            return
        for job in list(self.jobs.values()):
            if job.task is not None:
                job.task.cancel()
        self.loop.call_later(0.2, self._exit_now)

    def _exit_now(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(0 if not self.jobs else 3)


class _Marked:
    """Awaits ``driven``, with the job's id in the loop's mark while each of its steps runs (so
    that the worker can tell which job crashed the process)."""

    __slots__ = ("_driven", "_job", "_words")

    def __init__(self, driven: Interruptible, words: memoryview, job_id: int) -> None:
        self._driven = driven
        self._words = words
        self._job = job_id

    def __await__(self) -> Generator[Any, Any, Any]:
        words, job, steps = self._words, self._job, self._driven.__await__()
        send: Any = None
        throw: BaseException | None = None
        while True:
            words[1] = job
            try:
                yielded = steps.send(send) if throw is None else steps.throw(throw)
            except StopIteration as done:
                return done.value
            finally:
                words[1] = 0
            send, throw = None, None
            try:
                send = yield yielded
            except BaseException as exc:
                throw = exc


def _unpicklable(kind: int, payload: Any, exc: Exception) -> Exception:
    what = "return value" if kind == frames.RESULT else "exception" if kind == frames.ERROR else "message"
    return RuntimeError(
        f"the job's {what} could not be sent to the worker ({type(exc).__name__}: {exc}): {_short(payload)}"
    )


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = object.__repr__(value)
    return text if len(text) <= 300 else text[:300] + "..."

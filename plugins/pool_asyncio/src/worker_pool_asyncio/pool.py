"""The asyncio pool: up to ``concurrency`` jobs at once on the event loops of a few child
processes (one by default), each loop running its share.

- **Jobs**: an ``async def`` task is awaited on a loop (uvloop when installed); any other job
  runs in one of a bounded number of threads of its loop process, so it cannot block the loop.
  Every job takes one of the ``concurrency`` slots; jobs wait in the worker (and can be given
  back) until a process has a free slot and, for a plain function, a free thread.
- **Processes**: ``--asyncio-processes N`` (default 1) runs N loop processes to use N cores; the
  worker supervises them as prefork's children: a process that dies is replaced, its running
  jobs fail with ``WorkerLostError`` (sent again with ``acks_late`` and
  ``reject_on_worker_lost``, counted toward the poison cap).
- **Time limits**: the soft limit raises ``SoftTimeLimitExceeded`` inside the coroutine at its
  next ``await``; the hard limit fails the job with ``TimeLimitExceeded`` and cancels the
  coroutine, as :meth:`stop_job` (a revoke with ``terminate``) does. A job still running
  ``--asyncio-cancel-grace`` seconds after its cancellation (it swallows ``CancelledError``, or
  blocks its loop) is reported and its process replaced: the process takes no more jobs, and
  exits once its other jobs are done.
- **Off the loop**: what is synchronous around an ``async def`` task (storing its result,
  sending what follows it, hooks and handlers) runs in ``--asyncio-io-threads`` threads of its
  process (:func:`worker_core.aio.set_blocking_executor`); the job's outcome comes back once its
  result is stored, so the worker acknowledges after the store, as with every pool.
- **Stalls**: a loop that does not turn for ``--asyncio-stall-after`` seconds (a blocking call
  in a coroutine) is logged with the task that blocks it and for how long.
- **Threads and callbacks**: the pool runs one thread of its own (an asyncio loop over the
  processes' pipes) and calls every callback there; its methods may be called from any thread.

One module: the Pool protocol's methods, each a few lines over the :mod:`.engine`.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.aio import async_form
from worker_core.exceptions import ConfigurationError, JobWithdrawn, PoolError
from worker_core.slots import AcceptCallback, Pool, PoolOptions, SharesOneQueue, StopsOneJob, WithdrawsOneJob

from . import frames
from .engine import Engine, Job, _call
from .plugin import LOOPS

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

__all__ = ["AsyncioPool"]

logger = logging.getLogger("worker.pool")

_SCHEDULING = ("fair", "fcfs", "default", "fast")


def _positive(options: PoolOptions, name: str, value: Any, *, integer: bool, zero: bool = False) -> None:
    if value is None:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 or (value == 0 and not zero):
        need = ("a positive integer" if integer else "a number of seconds") + (" or 0" if zero else "")
        raise ConfigurationError(
            f"asyncio pool: {name} must be {need} (got {value!r} that is a {type(value).__name__})"
        )


class AsyncioPool:
    """Runs jobs on the event loops of its child processes; see the module docstring."""

    is_process_pool: ClassVar[bool] = True
    #: The worker hands the pool every task it receives; jobs wait here for a free slot, and
    #: :meth:`withdraw_queued` gives back those not started.
    shared_queue: ClassVar[bool] = True

    @classmethod
    def check_options(cls, options: PoolOptions) -> None:
        if not hasattr(os, "fork"):
            raise ConfigurationError(
                "the asyncio pool needs fork(), which this platform lacks; use -P threads"
            )
        _positive(options, "concurrency", options.concurrency, integer=True, zero=True)
        for name in ("soft_time_limit", "time_limit"):
            _positive(options, name, getattr(options, name), integer=False)
        _positive(options, "max_tasks_per_child", options.max_tasks_per_child, integer=True)
        if options.max_memory_per_child:
            raise ConfigurationError(
                f"the asyncio pool cannot honour max_memory_per_child={options.max_memory_per_child!r}: "
                "every task of a loop process shares its memory; use --max-tasks-per-child to recycle the "
                "processes, or -P prefork"
            )
        if options.scheduling not in _SCHEDULING:
            raise ConfigurationError(
                f"asyncio pool: scheduling must be 'fair' or 'fcfs' (got "
                f"{options.scheduling!r}); both behave the same in this pool"
            )
        extra = options.extra
        _positive(options, "asyncio_processes", extra.get("asyncio_processes", 1), integer=True)
        _positive(options, "asyncio_threads", extra.get("asyncio_threads"), integer=True)
        _positive(options, "asyncio_io_threads", extra.get("asyncio_io_threads", 4), integer=True)
        _positive(
            options, "asyncio_stall_after", extra.get("asyncio_stall_after", 0.5), integer=False, zero=True
        )
        _positive(options, "asyncio_cancel_grace", extra.get("asyncio_cancel_grace", 2.0), integer=False)
        loop = extra.get("asyncio_loop", "auto")
        if loop not in LOOPS:
            raise ConfigurationError(
                f"asyncio pool: asyncio_loop must be one of {', '.join(LOOPS)} (got {loop!r})"
            )
        if loop == "uvloop":
            try:
                import uvloop  # noqa: F401
            except ImportError:
                raise ConfigurationError(
                    "asyncio pool: --asyncio-loop uvloop, but uvloop is not installed: "
                    "pip install './plugins/pool_asyncio[uvloop]'"
                ) from None

    def __init__(self, options: PoolOptions, *, start_timeout: float = 10.0) -> None:
        self.check_options(options)
        self.options = options
        self.start_timeout = start_timeout
        extra = options.extra
        self._engine = Engine(
            concurrency=options.concurrency,
            processes=extra.get("asyncio_processes", 1),
            threads=extra.get("asyncio_threads"),
            io_threads=extra.get("asyncio_io_threads", 4),
            loop=extra.get("asyncio_loop", "auto"),
            stall_after=extra.get("asyncio_stall_after", 0.5),
            cancel_grace=extra.get("asyncio_cancel_grace", 2.0),
            max_tasks=options.max_tasks_per_child,
            initializer=options.initializer,
            finalizer=options.finalizer,
        )
        self._ids = itertools.count(1)
        self._state = "new"
        self._started_ok = False

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._state != "new":
            raise PoolError(f"the asyncio pool was already started (it is {self._state})")
        engine = self._engine
        engine.start_thread()
        self._state = "running"
        initial = engine.call(self._spawn_initial)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if engine.call(lambda: all(child.ready or child.dead for child in initial)):
                break
            time.sleep(0.005)
        self._started_ok = engine.call(lambda: all(child.ready for child in initial))
        if not self._started_ok:
            logger.error(
                "asyncio pool: only %d of %d loop processes started within %gs (see the errors above)",
                sum(child.ready for child in initial),
                len(initial),
                self.start_timeout,
            )

    def _spawn_initial(self) -> list[Any]:
        engine = self._engine
        for _ in range(engine.processes):
            engine.spawn()
        return list(engine.children)

    def did_start_ok(self) -> bool:
        return self._started_ok

    def stop(self) -> None:
        """Warm: jobs waiting here and running ones finish, then every loop process exits."""
        self._close(self._engine.begin_stop)

    def terminate(self) -> None:
        """Cold: running coroutines are cancelled (their jobs fail with ``WorkerLostError``) and
        the processes exit, killed after a second if they do not."""
        self._close(self._engine.begin_terminate)

    def _close(self, begin: Callable[[], None]) -> None:
        if self._state == "new":
            self._state = "stopped"
            return
        if self._state == "stopped":
            if begin == self._engine.begin_terminate and not self._engine.finished.is_set():
                self._engine.soon(begin)
            return
        self._state = "closing"
        engine = self._engine
        engine.call(begin)
        if not engine.in_thread():
            engine.finished.wait()
            self._end_thread()
        self._state = "stopped"

    def _end_thread(self) -> None:
        engine = self._engine
        if engine.loop is not None and not engine.loop.is_closed():
            engine.loop.call_soon_threadsafe(engine.loop.stop)
        if engine.thread is not None:
            engine.thread.join(5.0)

    def register_with_event_loop(self, hub: Hub) -> None:
        """Nothing to register: the pool's own thread reads the loop processes' pipes."""

    # -- jobs ---------------------------------------------------------------------------------

    def apply_async(
        self,
        target: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        callback: Callable[[Any], None] | None = None,
        error_callback: Callable[[BaseException], None] | None = None,
        accept_callback: AcceptCallback | None = None,
        timeout_callback: Callable[[bool, float], None] | None = None,
        soft_timeout: float | None = None,
        timeout: float | None = None,
        name: str | None = None,
    ) -> Job | None:
        if self._state != "running" or self._engine.closed:
            raise PoolError("the asyncio pool is stopped and takes no more jobs")
        options = self.options
        soft = options.soft_time_limit if soft_timeout is None else soft_timeout or None
        hard = options.time_limit if timeout is None else timeout or None
        label = name or f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
        job_id = next(self._ids)
        try:
            frame = frames.encode(frames.JOB, job_id, (target, args, kwargs, label))
        except Exception as exc:
            _call(
                error_callback,
                PoolError(
                    f"asyncio pool: the job {label} cannot be sent to a loop process: "
                    f"{type(exc).__name__}: {exc}"
                ),
            )
            return None
        plain = async_form(target, args, kwargs) is None
        job = Job(
            job_id,
            frame,
            label,
            plain,
            callback,
            error_callback,
            accept_callback,
            timeout_callback,
            soft,
            hard,
        )
        self._engine.submit(job)
        return job

    def withdraw_job(self, handle: Any) -> bool:
        """Take back the job ``apply_async`` returned ``handle`` for, if it still waits for a free
        slot; its callbacks are then never called."""
        if not isinstance(handle, Job):
            return False
        return bool(self._engine.call(self._engine.withdraw, handle))

    def withdraw_queued(self) -> int:
        """Give back every job waiting for a free slot (``JobWithdrawn``); returns how many."""
        jobs: list[Job] = self._engine.call(self._engine.withdraw_all)
        for job in jobs:
            _call(
                job.error_callback,
                JobWithdrawn(f"Job {job.id} was given back before a loop process started it."),
            )
        return len(jobs)

    def stop_job(self, handle: Any, signal: int | None = None) -> None:
        """Cancel the running job ``handle`` (SIGUSR1 raises ``SoftTimeLimitExceeded`` in it
        instead; any other signal cancels it). A plain function in a thread gets the exception
        at its next bytecode. A job still running ``--asyncio-cancel-grace`` seconds later has
        its process replaced."""
        if not isinstance(handle, Job):
            raise PoolError(f"stop_job: {handle!r} is not a job of this asyncio pool")
        self._engine.call(self._engine.cancel, handle, signal)

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Stop a loop process with every job it runs: ``SIGKILL`` it (its jobs fail with
        ``WorkerLostError``; it is replaced). The worker stops one task with :meth:`stop_job`."""
        engine = self._engine

        def kill() -> None:
            child = next((c for c in engine.children if c.pid == pid and not c.dead), None)
            if child is None:
                raise PoolError(
                    f"terminate_job: no loop process with pid {pid} in this asyncio pool (its "
                    f"processes are {[c.pid for c in engine.children]})"
                )
            engine._kill(child)

        engine.call(kill)

    # -- size ---------------------------------------------------------------------------------

    @property
    def num_processes(self) -> int:
        """The concurrency: how many jobs may run at once (every process's slots together)."""
        return self._engine.concurrency

    def grow(self, n: int = 1) -> None:
        if n < 0:
            raise PoolError(f"grow: n must be >= 0 (got {n!r}); use shrink() to remove slots")
        engine = self._engine
        if engine.closed:
            raise PoolError("grow: the asyncio pool is stopped")

        def grow() -> None:
            engine.concurrency += n
            engine.share()
            engine.dispatch()

        engine.call(grow)

    def shrink(self, n: int = 1) -> None:
        """Remove up to ``n`` free slots; raise ``PoolError`` when every slot runs a job."""
        if n < 0:
            raise PoolError(f"shrink: n must be >= 0 (got {n!r}); use grow() to add slots")
        engine = self._engine

        def shrink() -> None:
            if n == 0:
                return
            free = engine.concurrency - engine.running
            if free <= 0:
                raise PoolError(
                    f"cannot shrink the asyncio pool: all {engine.concurrency} slots are busy; try "
                    "again when a task finishes"
                )
            engine.concurrency -= min(n, free)
            engine.share()

        engine.call(shrink)

    def maintain_pool(self) -> None:
        if self._state == "running":
            self._engine.soon(self._engine.maintain)

    # -- statistics ---------------------------------------------------------------------------

    def info(self) -> Mapping[str, Any]:
        engine = self._engine
        options = self.options

        def read() -> dict[str, Any]:
            return {
                "implementation": f"{type(self).__module__}:{type(self).__qualname__}",
                "max-concurrency": engine.concurrency,
                "processes": [child.pid for child in engine.children if not child.dead],
                "max-tasks-per-child": options.max_tasks_per_child,
                "max-memory-per-child": None,
                "timeouts": [options.soft_time_limit or 0, options.time_limit or 0],
                "loop": engine.loop_kind,
                "threads-per-process": [child.threads for child in engine.children],
                "running": engine.running,
                "queued": len(engine.waiting) + len(engine.waiting_plain),
                "forks": engine.forks,
            }

        result: dict[str, Any] = engine.call(read)
        return result


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _POOL: type[Pool] = AsyncioPool
    _SHARED: type[SharesOneQueue] = AsyncioPool
    _WITHDRAWS: type[WithdrawsOneJob] = AsyncioPool
    _STOPS: type[StopsOneJob] = AsyncioPool

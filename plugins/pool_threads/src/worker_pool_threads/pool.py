"""The threads pool: jobs run in threads of the worker's process, taken from one shared queue.

- **Scheduling**: ``fair`` and ``fcfs`` mean nothing here and are accepted for compatibility:
  all threads take jobs from one queue, so an idle thread always takes the next job and a long
  task never holds up others while a thread is free (``shared_queue``: the worker hands the
  pool every task it received, and a thread that finishes one starts the next without waiting
  for the event loop). ``withdraw_queued()`` gives the jobs not started yet back.
- **Time limits** cannot be enforced: a thread can be neither interrupted nor killed. The pool
  refuses ``time_limit``/``soft_time_limit`` at start-up; a per-job limit (a task's own) is
  logged once per task name as ignored, and the job runs without it.
- **Recycling**: ``max_tasks_per_child`` replaces a thread after N jobs (its initializer runs
  again in the new thread, so per-thread resources are renewed); ``max_memory_per_child`` is
  refused, since memory is shared by every thread of the process.
- **Callbacks** run in the pool's threads (any of them), never under a lock of the pool.
- **terminate()** fails every queued job with ``WorkerLostError`` at once, and every running job
  too, since a running thread cannot be stopped: it is abandoned (a daemon thread), its late
  result ignored, and ``terminate()`` returns without waiting for it.

One module: the pool's size, queue and recycling share one lock; the thread's own loop is
:mod:`.executor`.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from queue import Empty, SimpleQueue
from time import monotonic
from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import ConfigurationError, PoolError
from worker_core.slots import AcceptCallback, Pool, PoolOptions, SharesOneQueue, WithdrawsOneJob

from .executor import RETIRE, STOP, Executor
from .jobs import Job, abandoned, never_started, withdrawn_unstarted

__all__ = ["ThreadPool"]

logger = logging.getLogger("worker.pool")

_SCHEDULING = ("fair", "fcfs", "default", "fast")


class ThreadPool:
    """Runs each job in one of ``concurrency`` threads; grows and shrinks at run time."""

    is_process_pool: ClassVar[bool] = False
    shared_queue: ClassVar[bool] = True

    @classmethod
    def check_options(cls, options: PoolOptions) -> None:
        limits = {name: getattr(options, name) for name in ("time_limit", "soft_time_limit")
                  if getattr(options, name)}
        if limits:
            given = ", ".join(f"{name}={value!r}" for name, value in limits.items())
            raise ConfigurationError(
                f"the threads pool cannot enforce time limits (got {given}): a running thread can be "
                "neither interrupted nor killed; use -P prefork, or drop --time-limit/--soft-time-limit")
        if options.max_memory_per_child:
            raise ConfigurationError(
                f"the threads pool cannot honour max_memory_per_child={options.max_memory_per_child!r}: "
                "memory is shared by every thread of the process; use -P prefork to recycle by memory")
        concurrency = options.concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0:
            raise ConfigurationError(
                f"threads pool: concurrency must be an integer >= 0 (got {concurrency!r} that is a "
                f"{type(concurrency).__name__})")
        max_tasks = options.max_tasks_per_child
        if max_tasks is not None and (isinstance(max_tasks, bool) or not isinstance(max_tasks, int)
                                      or max_tasks < 1):
            raise ConfigurationError(
                f"threads pool: max_tasks_per_child must be a positive integer or None (got {max_tasks!r})")
        if options.scheduling not in _SCHEDULING:
            raise ConfigurationError(
                f"threads pool: scheduling must be 'fair' or 'fcfs' (got {options.scheduling!r}); both "
                "behave the same in this pool")

    def __init__(self, options: PoolOptions, *, start_timeout: float = 10.0) -> None:
        self.check_options(options)
        self.options = options
        self.start_timeout = start_timeout
        self.queue: SimpleQueue[object] = SimpleQueue()
        self.lock = threading.Lock()
        #: Jobs running now, by executor number; a job is reported by whoever pops it first.
        self.running: dict[int, Job] = {}
        self.executors: dict[int, Executor] = {}
        self.idle = 0  # threads not running a job: starting, or waiting on the queue
        self.retiring = 0  # RETIRE sentinels queued and not taken yet
        self.terminated = False
        self._size = options.concurrency
        self._numbers = itertools.count(1)
        self._ids = itertools.count(1)
        self._closed = False
        self._state = "new"
        self._started_ok = False
        self._warned: set[str] = set()
        self._pid = os.getpid()

    # -- executors ----------------------------------------------------------------------------

    def _spawn(self) -> Executor:
        """Start one thread (lock held)."""
        executor = Executor(self, next(self._numbers))
        self.executors[executor.number] = executor
        executor.thread.start()
        # Idle from its start (it takes the lock we hold before it changes the count), so a shrink
        # right after a grow can retire threads that are still starting.
        self.idle += 1
        return executor

    def executor_exited(self, executor: Executor) -> None:
        """Called by a thread as it ends (lock held)."""
        self.executors.pop(executor.number, None)

    def recycle(self, executor: Executor) -> bool:
        """Replace a thread that did its ``max_tasks_per_child`` jobs; False to keep it."""
        with self.lock:
            if self._closed and self.terminated:
                return False
            self.executors.pop(executor.number, None)
            self.idle -= 1  # it counted idle again when its last job ended
            # The replacement also takes over the STOP sentinel a warm stop queued for this one.
            self._spawn()
            return True

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._state != "new":
            raise PoolError(f"the threads pool was already started (it is {self._state})")
        with self.lock:
            initial = [self._spawn() for _ in range(self._size)]
        self._state = "running"
        for executor in initial:
            executor.started.wait(self.start_timeout)
        self._started_ok = all(executor.ok for executor in initial)
        if not self._started_ok:
            logger.error("threads pool: %d of %d threads failed to start (see the errors above)",
                         sum(not executor.ok for executor in initial), len(initial))

    def did_start_ok(self) -> bool:
        return self._started_ok

    def stop(self) -> None:
        """Warm: queued and running jobs finish, then every thread ends and is joined."""
        with self.lock:
            self._closed = True
            if self._state != "running":
                self._state = "stopped"
                return
            for _ in range(len(self.executors)):
                self.queue.put(STOP)
        self._join(None)
        self._state = "stopped"

    def terminate(self) -> None:
        """Cold: queued and running jobs fail now; threads stuck in a job are abandoned."""
        lost: list[tuple[Job, BaseException]] = []
        with self.lock:
            self._closed = True
            self.terminated = True
            if self._state != "running":
                self._state = "stopped"
                return
            lost.extend((job, never_started(job)) for job in self._take_queued())
            lost.extend((job, abandoned(job)) for job in self.running.values())
            self.running.clear()
            for _ in range(len(self.executors)):
                self.queue.put(STOP)
        _fail(lost)
        self._join(0.2)
        self._state = "stopped"

    def _join(self, timeout: float | None) -> None:
        """Join every thread (replacements started meanwhile too); with ``timeout``, give up on
        the ones still busy after that many seconds in total."""
        deadline = None if timeout is None else monotonic() + timeout
        me = threading.current_thread()
        while True:
            with self.lock:
                threads = [e.thread for e in self.executors.values() if e.thread is not me]
            if not threads:
                return
            for thread in threads:
                thread.join(None if deadline is None else max(deadline - monotonic(), 0.0))
            if deadline is not None and monotonic() >= deadline:
                alive = [thread.name for thread in threads if thread.is_alive()]
                if alive:
                    logger.warning("threads pool: abandoning %d thread(s) still running a task: %s",
                                   len(alive), ", ".join(alive))
                return

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
    ) -> Job:
        if self._closed:
            raise PoolError("the threads pool is stopped and takes no more jobs")
        if soft_timeout or timeout:
            label = name or f"{target.__module__}.{target.__qualname__}"
            self._warn_ignored_limits(label, soft_timeout, timeout)
        job = Job(next(self._ids), target, args, kwargs, callback, error_callback, accept_callback)
        self.queue.put(job)
        return job

    def withdraw_job(self, handle: Any) -> bool:
        """Take back the job ``apply_async`` returned ``handle`` for, if no thread has taken it
        yet; its callbacks are then never called."""
        found = False
        with self.lock:
            items: list[object] = []
            while True:
                try:
                    items.append(self.queue.get_nowait())
                except Empty:
                    break
            for item in items:  # everything else goes back in its order
                if item is handle:
                    found = True
                else:
                    self.queue.put(item)
        return found

    def withdraw_queued(self) -> int:
        """Give back every job no thread has taken yet (``JobWithdrawn``); returns how many."""
        with self.lock:
            withdrawn = self._take_queued()
        _fail([(job, withdrawn_unstarted(job)) for job in withdrawn])
        return len(withdrawn)

    def _take_queued(self) -> list[Job]:
        """Take the jobs no thread has taken yet off the queue (lock held); the STOP and RETIRE
        sentinels stay, in their order."""
        jobs: list[Job] = []
        kept: list[object] = []
        while True:
            try:
                item = self.queue.get_nowait()
            except Empty:
                break
            if isinstance(item, Job):
                jobs.append(item)
            else:
                kept.append(item)
        for item in kept:
            self.queue.put(item)
        return jobs

    def _warn_ignored_limits(self, label: str, soft: float | None, hard: float | None) -> None:
        with self.lock:
            if label in self._warned:
                return
            self._warned.add(label)
        logger.warning("threads pool: the time limits of %s (soft=%r, hard=%r) are ignored: threads cannot "
                       "be interrupted; use -P prefork to enforce them", label, soft, hard)

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        raise PoolError("the threads pool cannot stop a running task: threads can be neither interrupted "
                        "nor killed; use -P prefork to terminate tasks")

    # -- size ---------------------------------------------------------------------------------

    @property
    def num_processes(self) -> int:
        return self._size

    def grow(self, n: int = 1) -> None:
        if n < 0:
            raise PoolError(f"grow: n must be >= 0 (got {n!r}); use shrink() to remove threads")
        with self.lock:
            if self._closed:
                raise PoolError("grow: the threads pool is stopped")
            self._size += n
            if self._state == "running":
                for _ in range(n):
                    self._spawn()

    def shrink(self, n: int = 1) -> None:
        """Retire up to ``n`` idle threads; raise ``PoolError`` when every thread is busy."""
        if n < 0:
            raise PoolError(f"shrink: n must be >= 0 (got {n!r}); use grow() to add threads")
        with self.lock:
            if n == 0:
                return
            if self._state != "running":
                self._size = max(self._size - n, 0)
                return
            available = self.idle - self.retiring
            if available <= 0:
                raise PoolError(f"cannot shrink the threads pool: all {len(self.executors)} threads are "
                                "busy; try again when a task finishes")
            count = min(n, available)
            self.retiring += count
            self._size -= count
            for _ in range(count):
                self.queue.put(RETIRE)

    def maintain_pool(self) -> None:
        """Start threads to replace those whose initializer failed."""
        with self.lock:
            if self._state != "running" or self._closed:
                return
            for _ in range(self._size - len(self.executors) + self.retiring):
                self._spawn()

    def register_with_event_loop(self, hub: Any) -> None:
        """Nothing to register: the threads deliver their callbacks themselves."""

    # -- statistics ---------------------------------------------------------------------------

    def info(self) -> Mapping[str, Any]:
        with self.lock:
            return {
                "implementation": f"{type(self).__module__}:{type(self).__qualname__}",
                "max-concurrency": self._size,
                "processes": [self._pid],
                "threads": len(self.executors),
                "max-tasks-per-child": self.options.max_tasks_per_child,
                "max-memory-per-child": None,
                "timeouts": [0, 0],
                "scheduling": "shared queue (fair and fcfs behave the same)",
                "running": len(self.running),
                "idle": self.idle,
                "queued": self.queue.qsize(),
            }


def _fail(lost: list[tuple[Job, BaseException]]) -> None:
    """Report jobs that will not run through their error callbacks (no lock held)."""
    for job, exc in lost:
        if job.error_callback is not None:
            try:
                job.error_callback(exc)
            except Exception:
                logger.exception("threads pool: error callback %r raised", job.error_callback)


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _POOL: type[Pool] = ThreadPool
    _SHARED: type[SharesOneQueue] = ThreadPool
    _WITHDRAWS: type[WithdrawsOneJob] = ThreadPool

"""The solo pool: runs each job inline in the worker's own thread, one at a time.

Time limits use ``SIGALRM`` (so they apply when the worker runs in the main thread, as
``workerctl worker`` does): the soft limit raises ``SoftTimeLimitExceeded`` inside the task; the
hard limit interrupts it and the job fails with ``TimeLimitExceeded``. Solo cannot kill a task
stuck in C code; use the prefork pool for that.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from time import monotonic
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import PoolError, SoftTimeLimitExceeded, TimeLimitExceeded, WorkerTerminate
from ..slots import AcceptCallback, FixedConcurrency, Pool, PoolOptions

__all__ = ["SoloPool", "interrupt_inline_job"]

logger = logging.getLogger("worker.pool")


_running_here = threading.local()

#: what a job without time limits runs in (cheaper to enter than the limits' generator)
_NO_LIMITS = nullcontext()


def interrupt_inline_job() -> None:
    """Abandon the job a solo pool is running in this thread (cold shutdown from a signal
    handler): raises :class:`WorkerTerminate` into it. Does nothing if no job runs here."""
    if getattr(_running_here, "active", False):
        raise WorkerTerminate("cold shutdown: the running task was abandoned")


class _HardLimit(BaseException):
    """Interrupts a job at its hard limit; not an Exception, so task code does not catch it."""


class SoloPool:
    """One executor: the worker's own thread."""

    is_process_pool: ClassVar[bool] = False
    fixed_concurrency: ClassVar[int] = 1

    @classmethod
    def check_options(cls, options: PoolOptions) -> None:
        """Solo honours every option: time limits through SIGALRM."""

    def __init__(self, options: PoolOptions) -> None:
        self.check_options(options)
        self.options = options
        self.pid = os.getpid()
        self._running = False
        self._started = False
        self._closed = False
        self._accepted = 0
        self._warned_limits = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self.options.initializer is not None:
            self.options.initializer()
        self._started = True

    def stop(self) -> None:
        if not self._closed and self._started and self.options.finalizer is not None:
            self.options.finalizer(0)
        self._closed = True

    def terminate(self) -> None:
        self._closed = True

    def did_start_ok(self) -> bool:
        return self._started

    # -- jobs --------------------------------------------------------------------------------

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
    ) -> None:
        if self._closed:
            raise PoolError("the solo pool is stopped and takes no more jobs")
        soft = soft_timeout if soft_timeout is not None else self.options.soft_time_limit
        hard = timeout if timeout is not None else self.options.time_limit
        self._running = True
        self._accepted += 1
        _running_here.active = True
        try:
            if accept_callback is not None:
                accept_callback(self.pid, monotonic())
            try:
                with self._limits(soft, hard, timeout_callback) if soft or hard else _NO_LIMITS:
                    retval = target(*args, **(kwargs or {}))
            except _HardLimit:
                if error_callback is not None:
                    error_callback(TimeLimitExceeded(hard))
                return
            except Exception as exc:
                if error_callback is not None:
                    error_callback(exc)
                return
            if callback is not None:
                callback(retval)
        finally:
            self._running = False
            _running_here.active = False

    @contextmanager
    def _limits(self, soft: float | None, hard: float | None,
                timeout_callback: Callable[[bool, float], None] | None) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            if not self._warned_limits:
                logger.warning("solo pool: time limits need the main thread; running without them")
                self._warned_limits = True
            yield
            return
        # (soft?, when, the limit it reports): a hard limit at or before the soft one comes
        # right after the soft one, as in Celery's prefork pool
        stages: list[tuple[bool, float, float]] = []
        if soft:
            stages.append((True, soft, soft))
        if hard:
            stages.append((False, max(hard, soft or 0), hard))
        elapsed = 0.0

        def arm() -> None:
            nonlocal elapsed
            _is_soft, at, _limit = stages[0]
            signal.setitimer(signal.ITIMER_REAL, max(at - elapsed, 0.001))
            elapsed = at

        def on_alarm(signum: int, frame: Any) -> None:
            is_soft, at, limit = stages.pop(0)
            if timeout_callback is not None:
                timeout_callback(is_soft, limit)
            if stages:
                arm()
            if is_soft:
                raise SoftTimeLimitExceeded(at)
            raise _HardLimit()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        arm()
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    # -- size ----------------------------------------------------------------------------------

    @property
    def num_processes(self) -> int:
        return 1

    def grow(self, n: int = 1) -> None:
        raise PoolError(
            "the solo pool has exactly one executor and cannot grow; use -P threads or -P prefork"
        )

    def shrink(self, n: int = 1) -> None:
        raise PoolError("the solo pool has exactly one executor and cannot shrink")

    def maintain_pool(self) -> None:
        """Nothing to maintain: the executor is this thread."""

    def register_with_event_loop(self, hub: Any) -> None:
        """Jobs run inline in the loop's thread; there is no I/O to register."""

    def terminate_job(self, pid: int, signal_number: int | None = None) -> None:
        raise PoolError("the solo pool cannot stop a running task without stopping the worker")

    def info(self) -> Mapping[str, Any]:
        return {
            "implementation": f"{type(self).__module__}:{type(self).__qualname__}",
            "max-concurrency": 1,
            "processes": [self.pid],
            "max-tasks-per-child": None,
            "timeouts": [self.options.soft_time_limit or 0, self.options.time_limit or 0],
            "running": int(self._running),
            "accepted": self._accepted,
        }


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _POOL: type[Pool] = SoloPool
    _FIXED: type[FixedConcurrency] = SoloPool

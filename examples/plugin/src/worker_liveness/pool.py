"""TimedPool: runs jobs inline, one at a time, and reports how long they took.

A complete (if simple) pool: it implements the pool contract of ``worker_core.slots.Pool`` and
passes the contract suite in ``worker_core.testing``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from time import monotonic
from typing import Any, ClassVar

from worker_core.exceptions import ConfigurationError, PoolError
from worker_core.slots import PoolOptions


class TimedPool:
    is_process_pool: ClassVar[bool] = False
    fixed_concurrency: ClassVar[int] = 1

    @classmethod
    def check_options(cls, options: PoolOptions) -> None:
        if options.time_limit or options.soft_time_limit:
            raise ConfigurationError("the timed pool cannot enforce time limits; use -P prefork")

    def __init__(self, options: PoolOptions) -> None:
        self.options = options
        self.started = False
        self.closed = False
        self.jobs = 0
        self.busiest = 0.0

    def start(self) -> None:
        if self.options.initializer is not None:
            self.options.initializer()
        self.started = True

    def stop(self) -> None:
        self.closed = True

    def terminate(self) -> None:
        self.closed = True

    def did_start_ok(self) -> bool:
        return self.started

    def apply_async(
        self,
        target: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        callback: Callable[[Any], None] | None = None,
        error_callback: Callable[[BaseException], None] | None = None,
        accept_callback: Callable[[int, float], None] | None = None,
        timeout_callback: Callable[[bool, float], None] | None = None,
        soft_timeout: float | None = None,
        timeout: float | None = None,
        name: str | None = None,
    ) -> None:
        if self.closed:
            raise PoolError("the timed pool is stopped")
        begun = monotonic()
        if accept_callback is not None:
            accept_callback(os.getpid(), begun)
        try:
            retval = target(*args, **(kwargs or {}))
        except Exception as exc:
            if error_callback is not None:
                error_callback(exc)
            return
        finally:
            self.jobs += 1
            self.busiest = max(self.busiest, monotonic() - begun)
        if callback is not None:
            callback(retval)

    @property
    def num_processes(self) -> int:
        return 1

    def grow(self, n: int = 1) -> None:
        raise PoolError("the timed pool has one executor and cannot grow")

    def shrink(self, n: int = 1) -> None:
        raise PoolError("the timed pool has one executor and cannot shrink")

    def maintain_pool(self) -> None:
        pass

    def register_with_event_loop(self, hub: Any) -> None:
        pass

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        raise PoolError("the timed pool cannot stop a running job")

    def info(self) -> Mapping[str, Any]:
        return {"implementation": "worker_liveness.pool:TimedPool", "max-concurrency": 1,
                "processes": [os.getpid()], "max-tasks-per-child": None, "timeouts": [0, 0],
                "jobs": self.jobs, "longest-job": round(self.busiest, 6)}

"""Reporting a job's outcome to its callbacks, after the pool's lock is released.

Handlers collect what they owe into an :data:`Events` list while holding the lock and run it
afterwards, so a callback may call back into the pool from any thread without deadlocking, and
unpickling a large result does not hold up other threads.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

from worker_core.exceptions import PoolError

from .jobs import Job

__all__ = ["Events", "deliver_error", "deliver_result", "fail", "run_events"]

logger = logging.getLogger("worker.pool")

#: Callbacks owed: ``[(function, args), ...]``.
Events = list[tuple[Callable[..., Any], tuple[Any, ...]]]

_loads = pickle.loads


def run_events(events: Events) -> None:
    for function, args in events:
        try:
            function(*args)
        except Exception:
            logger.exception("prefork pool: callback %r raised; the pool carries on", function)


def fail(job: Job, exc: BaseException) -> None:
    if job.error_callback is not None:
        job.error_callback(exc)


def deliver_result(job: Job, payload: bytes) -> None:
    callback = job.callback
    if callback is None:
        return
    try:
        value = _loads(payload)
    except Exception as exc:
        fail(job, PoolError(f"the result of job {job.id} cannot be unpickled in the worker: {exc!r}; "
                            "return plain data, or make its classes importable in the worker"))
        return
    callback(value)


def deliver_error(job: Job, payload: bytes) -> None:
    try:
        exc = _loads(payload)
    except Exception as error:
        exc = PoolError(f"job {job.id} raised an exception the worker cannot unpickle: {error!r}")
    fail(job, exc)

"""Redis refusing work without losing the connection: out of memory (``OOM``, ``maxmemory`` reached
under ``noeviction``), a read-only replica (``READONLY``), a script running too long (``BUSY``),
loading its data set after a restart (``LOADING``). Each is an error reply on a connection that
still works: the worker backs off and tries again on it (:class:`Backoff`), where taking it for a
lost connection made it reconnect in a loop."""

from __future__ import annotations

import random
import time

__all__ = ["Backoff", "refusal"]

#: the error code a refusal starts with -> what it means, for the log
_MEANINGS = {
    "OOM": "out of memory (used memory > maxmemory)",
    "READONLY": "it is a read-only replica",
    "BUSY": "it is busy running a script",
    "LOADING": "it is loading its data set",
    "MASTERDOWN": "its replica lost its master",
}


def refusal(exc: BaseException) -> str | None:
    """What a Redis refusal means (``out of memory (...)``), or None when ``exc`` is no refusal."""
    from redis.exceptions import (
        BusyLoadingError,
        MasterDownError,
        OutOfMemoryError,
        ReadOnlyError,
        ResponseError,
    )

    if isinstance(exc, MasterDownError):
        return _MEANINGS["MASTERDOWN"]
    if isinstance(exc, OutOfMemoryError):
        return _MEANINGS["OOM"]
    if isinstance(exc, ReadOnlyError):
        return _MEANINGS["READONLY"]
    if isinstance(exc, BusyLoadingError):
        return _MEANINGS["LOADING"]
    if isinstance(exc, ResponseError):
        code = str(exc).split(" ", 1)[0]
        if code in _MEANINGS:
            return _MEANINGS[code]
        # redis-py names a pipeline's command first: "Command # 1 (...) of pipeline caused error: OOM ..."
        text = str(exc).partition("caused error: ")[2]
        code = text.split(" ", 1)[0]
        if code in _MEANINGS:
            return _MEANINGS[code]
    return None


class Backoff:
    """When to try again: after 0.2 s, then twice as long each time up to ``cap`` seconds, each
    delay drawn at random between half and all of that (so workers refused together do not come
    back together)."""

    def __init__(self, first: float = 0.2, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.attempts = 0
        self.due = 0.0

    def failed(self) -> float:
        """One more refusal: the delay until the next try (seconds), which is also made due."""
        delay = min(self.cap, self.first * 2.0 ** min(self.attempts, 30))
        delay *= random.uniform(0.5, 1.0)
        self.attempts += 1
        self.due = time.monotonic() + delay
        return delay

    def is_due(self) -> bool:
        return time.monotonic() >= self.due

    def reset(self) -> None:
        self.attempts = 0
        self.due = 0.0

"""Task rate limits (``@app.task(rate_limit="10/m")``), as Celery's worker applies them: one
token bucket per task name in each worker, holding one token, so a limited task starts at most
once per ``1 / rate`` seconds here. Messages waiting for a token stay unacknowledged and count
in the prefetch window, as in Celery."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

from kombu.utils.limits import TokenBucket

if TYPE_CHECKING:
    from ..request import Request

__all__ = ["RateLimits"]


class RateLimits:
    """The buckets of one consumer and the requests waiting in them."""

    def __init__(self, timer: Any, release: Callable[[Request], None]) -> None:
        self.timer = timer
        #: what a request whose token came goes on to (the consumer's reservation)
        self.release = release
        self.buckets: dict[str, TokenBucket] = {}
        self._timers: dict[str, Any] = {}

    def hold(self, request: Request, rate: float) -> None:
        """Queue ``request`` behind its task's bucket; released now if a token is there."""
        name = request.name
        bucket = self.buckets.get(name)
        if bucket is None or bucket.fill_rate != rate:
            bucket = self._replace(name, rate)
        bucket.contents.append(request)
        if name not in self._timers:
            self._drain(name)

    def set_rate(self, name: str, rate: float) -> None:
        """A new rate for ``name`` (0: none): the waiting requests follow the new one."""
        if rate:
            self._replace(name, rate)
            self._drain(name)
            return
        bucket = self.buckets.pop(name, None)
        self._cancel(name)
        for request in bucket.contents if bucket is not None else ():
            self.release(request)

    def waiting(self) -> Iterator[Request]:
        for bucket in list(self.buckets.values()):
            yield from bucket.contents

    def discard(self, task_ids: Collection[str]) -> list[Request]:
        """Take the waiting requests with these ids out (revoked). Returns them."""
        found = []
        for bucket in self.buckets.values():
            for request in [r for r in bucket.contents if r.id in task_ids]:
                bucket.contents.remove(request)
                found.append(request)
        return found

    def forget(self) -> list[Request]:
        """Drop every waiting request (their messages go back to the broker). Returns them."""
        dropped: list[Request] = []
        for name, bucket in self.buckets.items():
            self._cancel(name)
            dropped.extend(bucket.contents)
            bucket.contents.clear()
        return dropped

    def _replace(self, name: str, rate: float) -> TokenBucket:
        old = self.buckets.get(name)
        bucket = self.buckets[name] = TokenBucket(rate, capacity=1)
        if old is not None:
            bucket.contents.extend(old.contents)
            self._cancel(name)
        return bucket

    def _drain(self, name: str) -> None:
        self._timers.pop(name, None)
        bucket = self.buckets.get(name)
        if bucket is None:
            return
        contents = bucket.contents
        while contents:
            if not bucket.can_consume(1):
                self._timers[name] = self.timer.call_after(bucket.expected_time(1), self._drain, (name,))
                return
            self.release(contents.popleft())

    def _cancel(self, name: str) -> None:
        entry = self._timers.pop(name, None)
        if entry is not None:
            entry.cancel()

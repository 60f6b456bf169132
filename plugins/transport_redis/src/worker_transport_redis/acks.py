"""Acknowledgements waiting to be written to Redis.

A channel buffers the delivery tags it acknowledges and writes them in batches (with its next
fetch, or in one pipeline at the end of the loop turn). Tags a closing channel could not write
(Redis unreachable) are kept per Redis location, and the next channel there writes them, so an
acknowledgement made during an outage does not turn into a redelivery after it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Iterable

__all__ = ["AckBuffer", "owe", "owes", "take_owed"]

_debts: dict[Hashable, deque[str]] = {}
_debts_lock = threading.Lock()


def owe(location: Hashable, tags: Iterable[str]) -> None:
    """Keep ``tags`` for the next channel that writes acknowledgements to ``location``."""
    with _debts_lock:
        _debts.setdefault(location, deque()).extend(tags)


def owes(location: Hashable) -> bool:
    """Whether acknowledgements are owed to ``location``."""
    return bool(_debts.get(location))


def take_owed(location: Hashable) -> list[str]:
    """The tags owed to ``location``, taken (to be written now)."""
    with _debts_lock:
        return list(_debts.pop(location, ()))


class AckBuffer:
    """Delivery tags acknowledged on one channel and not yet written. Thread-safe: the pool's
    threads may acknowledge while the loop's thread takes a batch."""

    def __init__(self, location: Hashable) -> None:
        self.location = location
        self._tags: deque[str] = deque()

    def __len__(self) -> int:
        return len(self._tags) + len(_debts.get(self.location) or ())

    def add(self, tag: str) -> None:
        self._tags.append(tag)

    def take(self) -> list[str]:
        """Every tag to write now (this channel's and those owed to its location)."""
        tags: list[str] = []
        pop = self._tags.popleft
        try:
            while True:
                tags.append(pop())
        except IndexError:
            pass
        if self.location in _debts:
            with _debts_lock:
                owed = _debts.pop(self.location, None)
            if owed:
                tags.extend(owed)
        return tags

    def put_back(self, tags: Iterable[str]) -> None:
        """Tags whose write failed or is uncertain: written again later (ZREM/HDEL are idempotent)."""
        self._tags.extend(tags)

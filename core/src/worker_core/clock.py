"""The worker's logical clock: a Lamport clock, as Celery's ``app.clock``.

It moves forward at every event the worker sends and every remote-control request it receives,
and jumps past any value another node reports to it (``adjust``), so events and replies order
across the cluster as Celery's do. ``inspect clock`` reads it, ``inspect stats`` shows it, and
with ``--statedb`` its value is kept across restarts (the next start adjusts to it).
"""

from __future__ import annotations

import threading

__all__ = ["LogicalClock"]


class LogicalClock:
    """A Lamport clock, safe to move from any thread."""

    def __init__(self, value: int = 0) -> None:
        self._value = value
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def forward(self) -> int:
        """Count a local event (a message sent or received); returns the new value."""
        with self._lock:
            self._value += 1
            return self._value

    def adjust(self, other: object) -> int:
        """Count a message stamped ``other`` by another node: the clock moves past the later of
        the two. A value that is not a whole number (a client that sends none) only moves it on."""
        seen = other if isinstance(other, int) and not isinstance(other, bool) else 0
        with self._lock:
            self._value = max(self._value, seen) + 1
            return self._value

    def __str__(self) -> str:
        return str(self._value)

    def __repr__(self) -> str:
        return f"<LogicalClock: {self._value}>"

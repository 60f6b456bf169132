"""Restart-storm control: children that die before they are ready delay the next fork."""

from __future__ import annotations

from time import monotonic

__all__ = ["RestartBackoff"]


class RestartBackoff:
    """Exponential delay between forks while new children keep failing to start.

    A child that reports ready resets it. The delay doubles from ``initial`` up to ``maximum``
    and forking never stops for good: an initializer that fails because a database is down
    recovers by itself once it is back.
    """

    def __init__(self, initial: float = 0.1, maximum: float = 10.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        self._not_before = 0.0

    def failed(self) -> float:
        """Record a failed start; return the delay before the next fork."""
        delay = min(self.initial * 2.0 ** self.failures, self.maximum)
        self.failures += 1
        self._not_before = monotonic() + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self._not_before = 0.0

    def remaining(self) -> float:
        """Seconds to wait before the next fork (0 when forking is allowed now)."""
        return max(self._not_before - monotonic(), 0.0) if self.failures else 0.0

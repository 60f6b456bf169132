"""The small interface the pool needs from an event loop: fd readiness callbacks and timers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Driver", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled call that can be called off (cancelling one that already ran is harmless)."""

    def cancel(self) -> None: ...


class Driver(Protocol):
    """Dispatches readiness of file descriptors and timers to the pool's handlers.

    Each fd is either read or written, never both (one pipe end each), so readers and writers
    are registered and removed separately. Handlers run in the driver's thread.
    """

    def add_reader(self, fd: int, callback: Callable[..., None], *args: Any) -> None: ...

    def add_writer(self, fd: int, callback: Callable[..., None], *args: Any) -> None: ...

    def remove_reader(self, fd: int) -> None: ...

    def remove_writer(self, fd: int) -> None: ...

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> TimerHandle: ...

    def call_repeatedly(self, interval: float, callback: Callable[[], None]) -> TimerHandle: ...

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` in the driver's thread; callable from any thread."""

    def in_driver_thread(self) -> bool:
        """Whether the calling thread is the one that runs the handlers."""

    def close(self) -> None:
        """Forget every registration; the pool's fds stay open (the pool closes them)."""

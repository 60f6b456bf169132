"""The event loop's inbox: work that pool threads and signal handlers hand to the loop's thread,
and the pipe that wakes a hub waiting in poll when they do."""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

__all__ = ["Inbox"]

logger = logging.getLogger("worker.consumer")


class Inbox:
    """Calls to run in the event loop's thread, in the order they came.

    Only the loop's thread touches the broker; a pool thread reporting a job's result, or the
    autoscaler's thread moving the prefetch, goes through :meth:`call`.
    """

    def __init__(self) -> None:
        self._pending: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._loop_ident = threading.get_ident()
        self._waker: tuple[int, int] | None = None
        self._wake_sent = False
        self._hub: Hub | None = None
        #: held while the pipe is written to or closed
        self._closing = threading.Lock()

    @property
    def pending(self) -> bool:
        """Whether calls are waiting (a blocking drain then must not wait)."""
        return bool(self._pending)

    def bind_to_current_thread(self) -> None:
        """The calling thread is the loop's from now on (the consumer's start)."""
        self._loop_ident = threading.get_ident()

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` in the loop's thread (now, if this is that thread)."""
        if threading.get_ident() == self._loop_ident:
            fn(*args)
            return
        self._pending.append((fn, args))
        if not self._wake_sent:
            with self._closing:
                self._write_wake()

    def wake(self) -> None:
        """Interrupt a hub waiting in poll (safe from a signal handler: it does not wait for the
        lock; a close in progress needs no wake-up)."""
        if self._closing.acquire(blocking=False):
            try:
                self._write_wake()
            finally:
                self._closing.release()

    def _write_wake(self) -> None:
        # Called holding the lock close() frees the pipe under: once closed, the pipe's number
        # may be another file's (a broker's socket) and nothing may be written to it.
        if self._waker is None:
            return
        self._wake_sent = True
        try:
            os.write(self._waker[1], b"\0")
        except OSError:
            pass

    def run_pending(self) -> None:
        """Run the waiting calls (in the loop's thread); one that raises is logged."""
        pending = self._pending
        while pending:
            fn, args = pending.popleft()
            try:
                fn(*args)
            except Exception:
                logger.exception("error in a callback from the pool")

    def install(self, hub: Hub) -> None:
        """Listen for wake-ups on ``hub`` (again after it was reset)."""
        if self._waker is None:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            self._waker = (read_fd, write_fd)
        self._hub = hub
        hub.add_reader(self._waker[0], self._on_wake)

    def _on_wake(self, *_: Any) -> None:
        assert self._waker is not None
        # Drain before clearing the flag: clearing first lets a wake-up written in between be
        # drained here with the flag left set, and every later wake-up would be skipped.
        try:
            while os.read(self._waker[0], 4096):
                pass
        except BlockingIOError:
            pass
        self._wake_sent = False
        self.run_pending()

    def close(self) -> None:
        if self._waker is None:
            return
        if self._hub is not None:
            try:
                self._hub.remove(self._waker[0])
            except Exception:
                pass
        with self._closing:
            waker, self._waker = self._waker, None
            for fd in waker:
                try:
                    os.close(fd)
                except OSError:
                    pass

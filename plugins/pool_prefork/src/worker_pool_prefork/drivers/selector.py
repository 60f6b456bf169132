"""Driving the pool without kombu: a ``selectors`` loop, run in a background thread (sync loop) or
in the caller's thread while ``start()``/``stop()`` wait.

Registrations and timers may be added from any thread: from a thread other than the loop's they
are queued and the loop is woken through a self-pipe, so the selector itself is only ever
touched by the loop's thread.
"""

from __future__ import annotations

import heapq
import logging
import os
import selectors
import threading
from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import Any

from .base import TimerHandle

__all__ = ["SelectorDriver"]

logger = logging.getLogger("worker.pool")


class _Timer:
    __slots__ = ("args", "callback", "cancelled", "interval", "when")

    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...],
                 interval: float | None = None) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False
        self.interval = interval

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _Timer) -> bool:
        return self.when < other.when


class SelectorDriver:
    """A minimal event loop: fd callbacks, timers, and calls handed over from other threads."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._timers: list[_Timer] = []
        self._calls: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._woken = False
        self._owner: int | None = None
        self._thread: threading.Thread | None = None
        self._stop_requested = False
        self._loop_exited = threading.Event()
        self._closed = False

    # -- registrations ---------------------------------------------------------------------

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        if self._owner is None or self._owner == threading.get_ident():
            fn(*args)
        else:
            self.call_soon(fn, *args)

    def _register(self, fd: int, events: int, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        data = (callback, args)
        try:
            self._selector.register(fd, events, data)
        except KeyError:
            self._selector.modify(fd, events, data)

    def _unregister(self, fd: int) -> None:
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def add_reader(self, fd: int, callback: Callable[..., None], *args: Any) -> None:
        self._submit(self._register, fd, selectors.EVENT_READ, callback, args)

    def add_writer(self, fd: int, callback: Callable[..., None], *args: Any) -> None:
        self._submit(self._register, fd, selectors.EVENT_WRITE, callback, args)

    def remove_reader(self, fd: int) -> None:
        self._submit(self._unregister, fd)

    def remove_writer(self, fd: int) -> None:
        self._submit(self._unregister, fd)

    # -- timers and calls --------------------------------------------------------------------

    def _push(self, timer: _Timer) -> _Timer:
        with self._lock:
            heapq.heappush(self._timers, timer)
            first = self._timers[0] is timer
        if first and self._owner is not None and self._owner != threading.get_ident():
            self._wake()
        return timer

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> TimerHandle:
        return self._push(_Timer(monotonic() + max(delay, 0.0), callback, args))

    def call_repeatedly(self, interval: float, callback: Callable[[], None]) -> TimerHandle:
        return self._push(_Timer(monotonic() + interval, callback, (), interval))

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._calls.append((callback, args))
        if self._owner != threading.get_ident():
            self._wake()

    def _wake(self) -> None:
        # Under the lock, so that close() cannot free the pipe's number between the check and the
        # write: once closed, the number may be another file's (a broker's socket) by now.
        with self._lock:
            if self._woken or self._closed:
                return
            self._woken = True
            try:
                os.write(self._wake_w, b"\0")
            except (BlockingIOError, OSError):
                pass

    def in_driver_thread(self) -> bool:
        return self._owner is None or self._owner == threading.get_ident()

    # -- the loop ----------------------------------------------------------------------------

    def run_once(self, timeout: float) -> None:
        with self._lock:
            if self._calls:
                timeout = 0.0
            elif self._timers:
                timeout = min(timeout, max(self._timers[0].when - monotonic(), 0.0))
        for key, _mask in self._selector.select(timeout):
            data = key.data
            if data is None:
                self._drain_wake()
                continue
            callback, args = data
            self._run(callback, args)
        self._run_timers()
        self._run_calls()

    def _drain_wake(self) -> None:
        with self._lock:
            self._woken = False
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run(self, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            callback(*args)
        except Exception:
            logger.exception("prefork pool: handler %r failed; the pool carries on", callback)

    def _run_timers(self) -> None:
        now = monotonic()
        timers = self._timers
        while True:
            with self._lock:
                if not timers or timers[0].when > now:
                    return
                timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            self._run(timer.callback, timer.args)
            if timer.interval is not None and not timer.cancelled:
                timer.when = monotonic() + timer.interval
                with self._lock:
                    heapq.heappush(timers, timer)

    def _run_calls(self) -> None:
        calls = self._calls
        while True:
            with self._lock:
                if not calls:
                    return
                callback, args = calls.popleft()
            self._run(callback, args)

    def run_until(self, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Run the loop in this thread until ``done()`` (True) or ``timeout`` seconds (False)."""
        previous = self._owner
        self._owner = threading.get_ident()
        deadline = None if timeout is None else monotonic() + timeout
        try:
            while not done():
                if deadline is None:
                    wait = 1.0
                else:
                    wait = deadline - monotonic()
                    if wait <= 0:
                        return False
                    wait = min(wait, 1.0)
                self.run_once(wait)
            return True
        finally:
            self._owner = previous

    # -- background thread -------------------------------------------------------------------

    def start_thread(self, name: str, after: Callable[[], None] | None = None) -> None:
        """Run the loop in a daemon thread until :meth:`request_stop`; then call ``after``."""
        self._stop_requested = False
        self._loop_exited.clear()
        running = threading.Event()

        def main() -> None:
            self._owner = threading.get_ident()
            running.set()
            try:
                self.run_until(lambda: self._stop_requested)
            finally:
                self._owner = None
                self._loop_exited.set()
            if after is not None:
                after()

        self._thread = threading.Thread(target=main, name=name, daemon=True)
        self._thread.start()
        # From here on other threads must hand registrations over instead of touching the selector.
        running.wait()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def request_stop(self) -> None:
        self._stop_requested = True
        self._wake()

    def wait_loop_exit(self, timeout: float) -> bool:
        """Wait until the background thread left its loop (it may still run ``after``)."""
        return self._loop_exited.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._selector.close()
        with self._lock:
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._timers.clear()
            self._calls.clear()

"""Driving the pool from kombu's hub (the async loop): no threads, handlers run in the hub's thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import TimerHandle

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

__all__ = ["HubDriver"]


class HubDriver:
    """Registers the pool's pipe ends and timers with a ``kombu.asynchronous.Hub``.

    The hub is single-threaded: the pool's methods are called from the hub's thread, so this
    driver is always "in" its thread. When the hub closes (the worker's loop ended) its
    registrations are gone; removals after that are no-ops.
    """

    def __init__(self, hub: Hub) -> None:
        # kombu's hub is only partly annotated: treat it as Any rather than silence every call.
        self.hub: Any = hub
        self._fds: set[int] = set()
        self._closed = False
        hub.on_close.add(self._on_hub_close)

    @property
    def closed(self) -> bool:
        """The hub was closed or reset since registration: nothing is registered any more."""
        return self._closed

    def _on_hub_close(self, hub: Hub) -> None:
        self._closed = True
        self._fds.clear()

    def add_reader(self, fd: int, callback: Callable[..., None], *args: Any) -> None:
        self.hub.add_reader(fd, callback, *args)
        self._fds.add(fd)

    def add_writer(self, fd: int, callback: Callable[..., None], *args: Any) -> None:
        self.hub.add_writer(fd, callback, *args)
        self._fds.add(fd)

    def _remove(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.discard(fd)
            if not self._closed:
                self.hub.remove(fd)

    def remove_reader(self, fd: int) -> None:
        self._remove(fd)

    def remove_writer(self, fd: int) -> None:
        self._remove(fd)

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> TimerHandle:
        handle: TimerHandle = self.hub.call_later(max(delay, 0.0), callback, *args)
        return handle

    def call_repeatedly(self, interval: float, callback: Callable[[], None]) -> TimerHandle:
        handle: TimerHandle = self.hub.call_repeatedly(interval, callback)
        return handle

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        self.hub.call_soon(callback, *args)

    def in_driver_thread(self) -> bool:
        return True

    def close(self) -> None:
        for fd in list(self._fds):
            self._remove(fd)
        self.hub.on_close.discard(self._on_hub_close)

"""Waiting for task results: one channel per task, named like its key (so with sharded pub/sub it
lives on the primary of the key's slot), subscribed before the task is sent, left once its result is
ready. A thread of the process's own holds the subscriptions (one connection per primary serving
them) and hands each ready result to the threads waiting for it.

A waiter reads the key when it starts, again when the server confirms its subscription (a PUBLISH
before that reached nobody), and again every ``interval`` seconds while it waits: a result
published while a connection was down, or on a primary that failed over, is read from its key.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from worker_core.exceptions import ResultTimeout
from worker_core.results import READY_STATES

from .cluster import Router
from .subscriber import Subscriber

__all__ = ["ResultListener"]

logger = logging.getLogger(__name__)

#: Subscriptions made before sending tasks that nobody waits for yet: the oldest beyond this are
#: dropped (a later wait subscribes again and reads the key).
MAX_EARLY = 10_000
#: The longest the thread waits on its sockets before it looks at its subscriptions again.
TURN = 0.5

Decode = Callable[[bytes | str], dict[str, Any]]


class ResultListener:
    """The subscriptions and waits of one process (make another after a fork)."""

    def __init__(self, router: Router, sharded: bool, decode: Decode) -> None:
        self._decode = decode
        self._subscriber = Subscriber(router, sharded, self._on_event)
        self._state = threading.Condition()
        self._waiters: Counter[str] = Counter()
        self._early: OrderedDict[str, None] = OrderedDict()
        self._ready: dict[str, dict[str, Any]] = {}
        self._confirmed: set[str] = set()
        self._changed = False
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        #: held while the wake-up pipe is written to or closed (its numbers are -1 once closed:
        #: a closed descriptor's number may be another file's by then)
        self._pipe = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- subscriptions ---------------------------------------------------------------------------

    def _channels(self) -> set[str]:
        return set(self._waiters) | set(self._early)

    def subscribe(self, key: str, early: bool = False) -> None:
        """Subscribe to ``key``'s channel (``early``: before its task is sent, with no waiter)."""
        with self._state:
            if early:
                self._early[key] = None
                while len(self._early) > MAX_EARLY:
                    self._early.popitem(last=False)
            self._changed = True
        self._poke()

    def _poke(self) -> None:
        if self._closed:
            return
        if self._thread is None:
            with self._state:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(
                        target=self._run, name="redis-cluster-results", daemon=True
                    )
                    self._thread.start()
        self._wake()

    def _wake(self) -> None:
        with self._pipe:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _close_pipe(self) -> None:
        with self._pipe:
            fds, (self._wake_r, self._wake_w) = (self._wake_r, self._wake_w), (-1, -1)
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # -- waiting ---------------------------------------------------------------------------------

    def wait(
        self, key: str, timeout: float | None, read: Callable[[str], dict[str, Any] | None], interval: float
    ) -> dict[str, Any]:
        """The ready meta of ``key``; ``read(key)`` gets the stored one (None while not ready).
        Raises ``ResultTimeout`` after ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = max(interval, 0.05)
        with self._state:
            self._waiters[key] += 1
            self._early.pop(key, None)
            self._changed = True
        self._poke()
        meta: dict[str, Any] | None = None
        try:
            while True:
                meta = read(key)
                if meta is not None:
                    return meta
                with self._state:
                    next_read = time.monotonic() + interval
                    while key not in self._ready and key not in self._confirmed:
                        now = time.monotonic()
                        if deadline is not None and now >= deadline:
                            raise ResultTimeout(f"no result in {key!r} within the timeout")
                        if now >= next_read:
                            break
                        limit = next_read if deadline is None else min(next_read, deadline)
                        self._state.wait(limit - now)
                    found = self._ready.get(key)
                    self._confirmed.discard(key)
                if found is not None:
                    meta = found
                    return found
        finally:
            with self._state:
                self._waiters[key] -= 1
                if not self._waiters[key]:
                    del self._waiters[key]
                    self._ready.pop(key, None)
                    self._confirmed.discard(key)
                    if meta is None:
                        # a pending one stays subscribed, so a later wait does not miss its PUBLISH
                        self._early[key] = None
                    self._changed = True
            self._poke()

    # -- the thread ------------------------------------------------------------------------------

    def _on_event(self, kind: str, channel: str, data: bytes) -> None:
        with self._state:
            if kind == "subscribed":
                if channel in self._waiters:
                    self._confirmed.add(channel)
                    self._state.notify_all()
                return
            if channel not in self._waiters:
                return
        try:
            meta = self._decode(data)
        except ValueError as exc:
            logger.warning("ignored an undecodable result published on %s: %r", channel, exc)
            return
        if meta.get("status") not in READY_STATES:
            return
        with self._state:
            self._ready[channel] = meta
            self._state.notify_all()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            # whichever of this thread and close() ends last closes the pipe (close() leaves it
            # to a thread it gave up waiting for); the other finds it closed
            if self._closed:
                self._close_pipe()

    def _loop(self) -> None:
        subscriber = self._subscriber
        while not self._closed:
            try:
                with self._state:
                    changed, self._changed = self._changed, False
                    channels = self._channels()
                if changed:
                    subscriber.set_channels(channels)
                if subscriber.due:
                    subscriber.reconcile()
                fds = subscriber.fds()
                ready, _, _ = select.select([self._wake_r, *fds], [], [], TURN)
                if self._wake_r in ready:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                for fd in ready:
                    if fd in fds:
                        subscriber.read(fds[fd])
            except Exception as exc:
                logger.debug("the result subscriptions failed (%r); trying again", exc)
                subscriber.stale = True
                time.sleep(TURN)  # the pause is the point: the cluster is failing over or down

    def close(self) -> None:
        """Stop the thread and the subscriptions (once: a second call does nothing)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
        self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        try:
            self._subscriber.close()
        except Exception as exc:
            logger.debug("error while closing the result subscriptions: %r", exc)
        if thread is None or not thread.is_alive():
            self._close_pipe()

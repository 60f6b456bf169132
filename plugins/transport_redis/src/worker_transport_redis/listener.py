"""Waiting for task results on Redis pub/sub, as Celery's client does: one channel per task
(named like its key), subscribed before the task is sent, unsubscribed once its result is ready.

Threads share one subscriber connection. One waiting thread at a time reads it (the others sleep
on a condition until it hands over what arrived or gives the reading up), commands and parsing
take a lock, and the blocking wait on the socket is done outside that lock, so a thread sending
a task subscribes without waiting for a reader (with that fast path off, see :mod:`.internals`,
the reader waits in redis-py's ``get_message`` under the lock, :data:`LOCKED_WAIT` at a time).
After a reconnect, the results of every waited task are read again (MGET): a PUBLISH sent while
the connection was down is lost. So is one sent before the server took a subscription made for a
wait (not before the task was sent): redis-py does not wait for the confirmation, so the waiter's
first read may run first; once the confirmation arrives, that key is read again.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from kombu.utils import encoding as _encoding

from worker_core.exceptions import ResultTimeout
from worker_core.results import READY_STATES

from . import internals

__all__ = ["ResultListener"]

logger = logging.getLogger(__name__)

# kombu is not annotated.
bytes_to_str: Callable[[Any], str] = _encoding.bytes_to_str

#: The longest a reader blocks on the socket before looking at its deadline again.
MAX_BLOCK = 1.0
#: The longest a reader waits holding the lock, when it cannot wait on the socket without it.
LOCKED_WAIT = 0.05
#: Pause between attempts to reach a Redis server that is down.
RECONNECT_PAUSE = 0.2
#: Subscriptions made before sending tasks that nobody waits for yet: the oldest beyond this
#: are dropped (a later wait subscribes again and reads the key), so a producer that never
#: asks for its results does not grow its subscriptions without end.
MAX_EARLY = 10_000

Decode = Callable[[bytes | str], dict[str, Any]]


class ResultListener:
    """Subscriptions and waits of one process (create another after a fork)."""

    def __init__(self, client: Any, decode: Decode) -> None:
        self._client = client
        self._decode = decode
        self._pubsub = client.pubsub()
        self._io = threading.Lock()  # the subscriber connection: one command or parse at a time
        self._state = threading.Condition()  # what follows, and the reader's turn
        self._reading = False
        self._waiters: Counter[str] = Counter()
        self._ready: dict[str, dict[str, Any]] = {}
        self._subscribed: set[str] = set()
        self._early: OrderedDict[str, None] = OrderedDict()
        #: subscribed for a waiter, the server's confirmation not read yet (guarded by ``_io``)
        self._unconfirmed: set[str] = set()
        self._hooked: Any = None
        self._stale = False
        #: whether the reader may wait on the subscriber's socket outside the lock
        self._selects = "listener" in internals.current()

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, key: str, early: bool = False) -> None:
        """Subscribe to ``key``'s channel; ``early``: before the task is sent, with no waiter."""
        dropped = None
        with self._io:
            if key in self._subscribed:
                if not early:
                    self._early.pop(key, None)
                return
            self._pubsub.subscribe(key)
            self._subscribed.add(key)
            self._hook_reconnects()
            if early:
                self._early[key] = None
                if len(self._early) > MAX_EARLY:
                    dropped = self._early.popitem(last=False)[0]
            else:
                self._unconfirmed.add(key)
        if dropped is not None:
            self.unsubscribe(dropped)

    def unsubscribe(self, key: str) -> None:
        with self._io:
            self._early.pop(key, None)
            self._unconfirmed.discard(key)
            if key not in self._subscribed:
                return
            self._subscribed.discard(key)
            try:
                self._pubsub.unsubscribe(key)
            except Exception as exc:  # gone with the connection anyway; redis-py forgets it
                logger.debug("could not unsubscribe from %s: %r", key, exc)

    def _hook_reconnects(self) -> None:
        connection = self._pubsub.connection
        if connection is not None and connection is not self._hooked:
            connection.register_connect_callback(self._on_reconnect)
            self._hooked = connection

    def _on_reconnect(self, connection: Any) -> None:
        # redis-py subscribes again by itself; what was published meanwhile is read with MGET.
        self._stale = True

    # -- waiting ---------------------------------------------------------------------------------

    def wait(
        self, key: str, timeout: float | None, read: Callable[[str], dict[str, Any] | None]
    ) -> dict[str, Any]:
        """The ready meta of ``key``; ``read(key)`` gets the stored one (None if not ready).

        Raises ``ResultTimeout`` after ``timeout`` seconds (None: no limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        meta: dict[str, Any] | None = None
        with self._state:
            self._waiters[key] += 1
        try:
            self._subscribe_until(key, deadline)
            meta = read(key)  # it may have been stored before the subscription
            if meta is not None:
                return meta
            meta = self._wait_ready(key, deadline)
            return meta
        finally:
            with self._state:
                self._waiters[key] -= 1
                last = not self._waiters[key]
                if last:
                    del self._waiters[key]
                    done = self._ready.pop(key, None) is not None
            if last and (done or meta is not None):
                # Celery's client unsubscribes once the result is ready; a pending one stays
                # subscribed, so a later wait does not miss its PUBLISH.
                self.unsubscribe(key)

    def _subscribe_until(self, key: str, deadline: float | None) -> None:
        while True:
            try:
                self.subscribe(key)
                return
            except self._connection_errors() as exc:
                self._pause_or_time_out(key, deadline, exc)

    def _wait_ready(self, key: str, deadline: float | None) -> dict[str, Any]:
        with self._state:
            while True:
                meta = self._ready.get(key)
                if meta is not None:
                    return meta
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ResultTimeout(f"no result in {key!r} within the timeout")
                if self._reading:
                    self._state.wait(left)
                    continue
                self._reading = True
                self._state.release()
                try:
                    self._read(MAX_BLOCK if left is None else min(left, MAX_BLOCK), key, deadline)
                finally:
                    self._state.acquire()
                    self._reading = False
                    self._state.notify_all()

    # -- reading (one thread at a time) ------------------------------------------------------------

    def _read(self, block: float, key: str, deadline: float | None) -> None:
        try:
            messages, confirmed = self._drain()
            if not messages and not confirmed and not self._stale:
                if self._selects:
                    self._block(block)
                    messages, confirmed = self._drain()
                else:
                    messages, confirmed = self._drain(min(block, LOCKED_WAIT))
            unwanted = self._hand_over(messages)
            if self._stale:
                self._reread()
            elif confirmed:
                self._reread(confirmed)  # a PUBLISH before the subscription reached nobody
        except self._connection_errors() as exc:
            self._stale = True
            self._pause_or_time_out(key, deadline, exc)
            return
        for each in unwanted:
            self.unsubscribe(each)

    def _drain(self, wait: float = 0) -> tuple[list[Mapping[str, Any]], list[str]]:
        """What has arrived, and the keys whose subscription for a waiter the server confirmed;
        ``wait``: seconds the first message may take to come."""
        messages, confirmed = [], []
        with self._io:
            connection = self._pubsub.connection
            if self._selects and connection is not None and internals.socket_of(connection) is None:
                connection.connect()  # back after an outage: redis-py subscribes again
            while True:
                message = self._pubsub.get_message(timeout=wait)
                if message is None:
                    break
                wait = 0
                if message.get("type") == "subscribe":
                    key = bytes_to_str(message["channel"])
                    if key in self._unconfirmed:
                        self._unconfirmed.discard(key)
                        confirmed.append(key)
                else:
                    messages.append(message)
        return messages, confirmed

    def _block(self, seconds: float) -> None:
        connection = self._pubsub.connection
        sock = None if connection is None else internals.socket_of(connection)
        if sock is None:
            return
        pending = getattr(sock, "pending", None)  # TLS: decrypted bytes select() cannot see
        if pending is not None and pending():
            return
        select.select([sock], [], [], seconds)

    def _hand_over(self, messages: list[Mapping[str, Any]]) -> list[str]:
        """Hand ready results to their waiters; return the keys nobody waits for."""
        unwanted = []
        with self._state:
            for message in messages:
                if message.get("type") != "message":
                    continue
                key = bytes_to_str(message["channel"])
                try:
                    meta = self._decode(message["data"])
                except ValueError as exc:
                    logger.warning("ignored an undecodable result published on %s: %r", key, exc)
                    continue
                if meta.get("status") not in READY_STATES:
                    continue
                if self._waiters[key]:
                    self._ready[key] = meta
                else:
                    unwanted.append(key)
        return unwanted

    def _reread(self, among: list[str] | None = None) -> None:
        """Read again the results waited for (``among`` these keys; None: all of them, and the
        connection is no longer stale)."""
        if among is None:
            self._stale = False
        with self._state:
            keys = [key for key, count in self._waiters.items() if count and (among is None or key in among)]
        if not keys:
            return
        values = self._client.mget(keys)
        with self._state:
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    continue
                meta = self._decode(value)
                if meta.get("status") in READY_STATES:
                    self._ready[key] = meta

    def _pause_or_time_out(self, key: str, deadline: float | None, exc: BaseException) -> None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ResultTimeout(
                f"no result in {key!r} within the timeout: Redis is unreachable ({exc})"
            ) from exc
        logger.debug("waiting for Redis to come back: %r", exc)
        time.sleep(RECONNECT_PAUSE if left is None else min(left, RECONNECT_PAUSE))

    @staticmethod
    def _connection_errors() -> tuple[type[BaseException], ...]:
        from redis.exceptions import ConnectionError, TimeoutError

        return (ConnectionError, TimeoutError, OSError)

    def close(self) -> None:
        with self._io:
            try:
                self._pubsub.close()
            except Exception as exc:
                logger.debug("error while closing the result subscriber: %r", exc)

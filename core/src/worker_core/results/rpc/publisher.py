"""Sending results as messages (the worker's side of ``rpc://``): producers on connections of
their own, reused from one result to the next, one per thread sending at the same moment."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kombu.connection import Connection

__all__ = ["Publisher"]


class Publisher:
    """The result producers of one process.

    A sender takes an idle producer (or makes one, on a new connection), publishes, and gives
    it back: kombu connections are not safe to share between threads, so threads storing at
    once (the threads pool) each get one, and a process never opens more connections than the
    most threads that ever sent at once. A producer whose publish failed is dropped with its
    connection. Made for one process: the backend makes another in a forked child.

    :param connect: a new (not yet connected) kombu connection to the broker.
    :param retry_policy: kombu's ``retry_policy`` for each publish (reconnecting in between).
    """

    def __init__(self, connect: Callable[[], Connection], retry_policy: Mapping[str, Any]) -> None:
        self.pid = os.getpid()
        self._connect = connect
        self._retry_policy = dict(retry_policy)
        # list.pop and list.append are atomic: taking and giving back needs no lock
        self._idle: list[Any] = []
        self._connections: list[Connection] = []
        self._lock = threading.Lock()

    def publish(self, body: str | bytes, routing_key: str, correlation_id: str, content_type: str,
                content_encoding: str, delivery_mode: int) -> None:
        """Publish ``body`` to the queue ``routing_key`` through the default exchange, as
        Celery's RPC backend publishes a result; raise kombu's error once the retries are spent."""
        try:
            producer = self._idle.pop()
        except IndexError:
            producer = self._new_producer()
        try:
            producer.publish(body, exchange="", routing_key=routing_key, correlation_id=correlation_id,
                             content_type=content_type, content_encoding=content_encoding,
                             delivery_mode=delivery_mode, retry=True, retry_policy=self._retry_policy)
        except BaseException:
            self._drop(producer)
            raise
        self._idle.append(producer)

    def close(self) -> None:
        """Close every connection this process opened (a producer in use is closed too, and its
        sender fails); the publisher makes new ones when used again."""
        if self.pid != os.getpid():
            return  # the parent's sockets: leave them to the parent
        with self._lock:
            connections, self._connections = self._connections, []
            self._idle.clear()
        for connection in connections:
            _release(connection)

    def _new_producer(self) -> Any:
        import kombu

        connection = self._connect()
        with self._lock:
            self._connections.append(connection)
        return kombu.Producer(connection, auto_declare=False)  # type: ignore[attr-defined,no-untyped-call]

    def _drop(self, producer: Any) -> None:
        connection = producer.connection
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
        _release(connection)


def _release(connection: Any) -> None:
    try:
        connection.release()
    except Exception:  # closing a broken connection: nothing more to do with it
        pass

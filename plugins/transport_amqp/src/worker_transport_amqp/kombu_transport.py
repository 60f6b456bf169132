"""The kombu transport classes handed to ``kombu.Connection(transport=...)``: kombu's py-amqp
transports, except that a missed heartbeat also drops the socket.

py-amqp raises ``ConnectionForced`` for a missed heartbeat but keeps the socket, so whatever
closes the connection afterwards (a channel's close, the connection's) waits forever for the
broker's close-ok on a link that no longer carries anything. Dropping the socket first makes
those closes return at once, and the worker reconnects.
"""

from __future__ import annotations

from typing import Any

from amqp.exceptions import ConnectionForced
from kombu.transport import pyamqp as _pyamqp

__all__ = ["SSLTransport", "Transport"]

# kombu is not annotated: its module is typed as Any here, once.
pyamqp: Any = _pyamqp


class Transport(pyamqp.Transport):  # type: ignore[misc]
    """kombu's py-amqp transport; a missed heartbeat drops the connection's socket."""

    def heartbeat_check(self, connection: Any, rate: int = 2) -> Any:
        try:
            return connection.heartbeat_tick(rate=rate)
        except ConnectionForced:
            connection.collect()
            raise


class SSLTransport(Transport):
    """The same over TLS (``amqps://``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.client.ssl:  # kombu's SSLTransport: TLS with default settings
            self.client.ssl = True

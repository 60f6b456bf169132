"""The kombu transport classes handed to ``kombu.Connection(transport=...)``: kombu's py-amqp
transports, except that a missed heartbeat also drops the socket, and with the fast paths that
are on (:mod:`.internals`) every frame that has arrived is handled per readable event and acks
are batched.

py-amqp raises ``ConnectionForced`` for a missed heartbeat but keeps the socket, so whatever
closes the connection afterwards (a channel's close, the connection's) waits forever for the
broker's close-ok on a link that no longer carries anything. Dropping the socket first makes
those closes return at once, and the worker reconnects.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

from amqp.exceptions import ConnectionForced, RecoverableConnectionError
from kombu.transport import pyamqp as _pyamqp

from worker_core.exceptions import ConfigurationError

from . import internals
from .channel import ACK_HOLD, StockConnection, connection_class
from .reading import BufferedTCPTransport, dispatch_arrived

if TYPE_CHECKING:
    from worker_core.slots import BrokerStatus

__all__ = ["BLOCKED", "SSLTransport", "Transport"]

# kombu is not annotated: its module is typed as Any here, once.
pyamqp: Any = _pyamqp


#: what the worker's broker status is told while RabbitMQ blocks the connection (py-amqp does
#: not pass on the reason RabbitMQ gives: low on memory, or on disk)
BLOCKED = "RabbitMQ blocks the connection (a memory or disk alarm: see the broker's log)"


class Transport(pyamqp.Transport):  # type: ignore[misc]
    """kombu's py-amqp transport; a missed heartbeat drops the connection's socket, and
    acknowledgements go out in batches (see :mod:`.channel`) between loop turns. RabbitMQ's
    ``connection.blocked`` and ``connection.unblocked`` go to the worker's broker status."""

    Connection = StockConnection
    #: the worker's broker status (set by ``AmqpTransport.watch_refusals``)
    broker_status: BrokerStatus | None = None

    #: frames read per readable event before letting the rest of the loop run
    frames_per_turn = 256

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.Connection = connection_class()
        decision = internals.current()
        self._reads_all = "reader" in decision
        self._batches_acks = "acks" in decision

    def establish_connection(self) -> Any:
        connection = super().establish_connection()
        status = self.broker_status
        if status is not None:
            connection.on_blocked = lambda reason: status.refused(BLOCKED)
            connection.on_unblocked = status.accepted
            status.accepted()  # (a new connection is not blocked: one lost while blocked was)
        return connection

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        if self._reads_all and isinstance(connection.transport, BufferedTCPTransport):
            loop.on_tick.add(connection.dispatch_buffered)
        if not self._batches_acks:
            return
        timer = None  # sends held acknowledgements if no batch completes before it fires

        def flush_held() -> None:
            nonlocal timer
            timer = None
            if connection.connected:
                connection.flush_acks()

        def on_ack_held() -> None:
            # armed while handling events, so the loop's next poll waits no longer than this
            nonlocal timer
            if timer is None:
                timer = loop.call_later(ACK_HOLD, flush_held)

        connection.on_ack_held = on_ack_held
        loop.on_tick.add(connection.flush_acks_due)

    def on_readable(self, connection: Any, loop: Any) -> None:
        """Handle every frame that has arrived, not one per loop turn as kombu does (a message
        is three frames); with the buffered reader off, one frame per turn, as kombu's reader
        does. The socket stays in blocking mode: a callback may make a blocking call on the same
        connection (a remote-control reply declares its exchange)."""
        if connection.channels is None:
            return  # closed by the worker: a read queued before (closing the hub runs it) is moot
        if not connection.connected:
            raise RecoverableConnectionError("Socket was disconnected")
        if self._reads_all and isinstance(connection.transport, BufferedTCPTransport):
            if dispatch_arrived(connection, self.frames_per_turn):
                loop.call_soon(self.on_readable, connection, loop)
            return
        # py-amqp's reads (TLS, or the buffered reader off), each with its own timeout
        for _ in range(self.frames_per_turn if self._reads_all else 1):
            try:
                connection.drain_events(timeout=0)
            except TimeoutError:
                return
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    return
                raise
        loop.call_soon(self.on_readable, connection, loop)

    def drain_events(self, connection: Any, **kwargs: Any) -> Any:
        if self._batches_acks:
            connection.flush_acks()
        return connection.drain_events(**kwargs)

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
        if isinstance(self.client.ssl, dict):
            problem = internals.ssl_arguments_problem(self.client.ssl)
            if problem is not None:
                raise ConfigurationError(f"cannot connect to RabbitMQ over TLS: {problem}; install a "
                                         f"py-amqp within those versions")

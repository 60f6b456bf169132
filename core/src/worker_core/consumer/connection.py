"""The consumer's broker connection: opened through the :class:`~.connect.Connector` (retries and
failover), closed without waiting for a broker that is gone, and, with several brokers, moved
back to the preferred one once it answers again (failover ``priority``, the Failback step)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..health.state import BROKER_DISCONNECTED
from ..options import scheme_of
from ..redaction import redact_url
from ..slots import AcksSurviveReconnect, ReportsRefusals
from .connect import Connector

if TYPE_CHECKING:
    from kombu.connection import Connection

    from ..app.settings import Settings
    from ..options import WorkerOptions
    from ..plugins.manager import PluginManager
    from ..slots import Transport
    from .brokerstate import BrokerState
    from .clock import Clock
    from .inbox import Inbox

__all__ = ["BrokerConnection"]

logger = logging.getLogger("worker.consumer")


class BrokerConnection:
    """The current connection to the broker, and what its loss means."""

    def __init__(self, plugins: PluginManager, settings: Settings, options: WorkerOptions, *,
                 stopping: Callable[[], bool], health: Any, inbox: Inbox, clock: Clock,
                 broker_state: BrokerState, on_disconnect: Callable[[], None],
                 forget_unstarted: Callable[[], int]) -> None:
        """``stopping()`` says whether the worker stops; ``on_disconnect`` forgets what the
        connection held (the task consumer and its window), ``forget_unstarted()`` the requests
        received and not started (a new broker cannot acknowledge them): how many."""
        self.plugins = plugins
        self.stopping = stopping
        self.health = health
        self.inbox = inbox
        self.clock = clock
        self.broker_state = broker_state
        self.on_disconnect = on_disconnect
        self.forget_unstarted = forget_unstarted
        heartbeat = {"heartbeat": settings.broker_heartbeat} if settings.broker_heartbeat else {}
        self.connector = Connector(
            plugins, settings, options.brokers, options.failover,
            should_continue=lambda: not stopping(), connection_options=heartbeat,
        )
        self.connection: Connection | None = None
        #: the broker went away: stopping must not wait for it
        self.lost = False
        #: the broker that the requests kept across a lost connection came from
        self.received_from: str | None = None
        #: the broker to move back to once the running tasks are done there (failover priority)
        self.switch_to: str | None = None
        self._errors: tuple[type[BaseException], ...] = ()

    @property
    def current(self) -> str | None:
        """The URL connected to (or last connected to)."""
        return self.connector.current

    @property
    def transport(self) -> Transport:
        """The transport plugin object of the connection (or of the last one): what the worker
        asks about the broker's capabilities."""
        transport = self.connector.transport
        if transport is None:
            raise RuntimeError("no broker connection was made yet")
        return transport

    def is_connection_error(self, exc: BaseException) -> bool:
        # The connection is already released when a failed start unwinds, so its error classes
        # are remembered from when it was opened.
        return isinstance(exc, (OSError, *self._errors))

    def refusal(self, exc: BaseException) -> str | None:
        """What ``exc`` means when it is the broker refusing work on a connection that still works
        (see :class:`~worker_core.slots.ReportsRefusals`), else None."""
        transport = self._transport()
        if not isinstance(transport, ReportsRefusals):
            return None
        try:
            return transport.refusal(exc)
        except Exception:  # a transport that cannot tell: taken for what it looks like
            return None

    def _transport(self) -> object:
        url = self.connector.current
        return self.plugins.slot("transport", scheme_of(url)) if url is not None else None

    def _watch(self, connection: Connection, url: str) -> None:
        """Before ``connection`` connects: its refusals go to the consumer's broker state."""
        transport: object = self.plugins.slot("transport", scheme_of(url))
        if isinstance(transport, ReportsRefusals):
            transport.watch_refusals(connection, self.broker_state)

    def acks_survive_reconnect(self) -> bool:
        """Whether messages received on the lost connection can be acknowledged on the next one
        (Redis: yes; AMQP: delivery tags belong to the channel they came on)."""
        url = self.connector.current
        if url is None:
            return False
        transport: object = self.plugins.slot("transport", scheme_of(url))
        return isinstance(transport, AcksSurviveReconnect) and transport.acks_survive_reconnect

    def connect(self) -> None:
        self.lost = False
        self.connection = self.connector.connect(on_wait=self._waiting, before=self._watch)
        if self.connector.current is not None:
            self.clock.measure(self.connection, self.connector.current)
        if self.received_from not in (None, self.connector.current):
            # Requests kept across the lost connection belong to the broker left behind: it
            # gives their messages back; this one cannot acknowledge them.
            dropped = self.forget_unstarted()
            if dropped:
                logger.warning("Dropped %d task(s) received from %s before switching brokers: that "
                               "broker delivers them again", dropped, redact_url(self.received_from))
        self.received_from = None
        self._errors = (
            *self.connection.recoverable_connection_errors, *self.connection.recoverable_channel_errors
        )

    def _waiting(self) -> None:
        """Between two connection attempts: the worker is alive, and not ready."""
        self.health.beat()
        self.health.hold(BROKER_DISCONNECTED)
        self.inbox.run_pending()

    def disconnect(self) -> None:
        connection, self.connection = self.connection, None
        self.on_disconnect()
        if connection is None:
            return
        try:
            if self.lost:
                # Closing politely would wait for a broker that is gone (forever, if the network
                # hangs): only drop what is ours. The broker gives unacknowledged messages back.
                connection.collect()
            else:
                connection.release()
        except Exception as exc:
            logger.debug("error while closing the broker connection: %r", exc)

    # -- moving back to a preferred broker (failover strategy "priority"; the Failback step) -----

    def check_preferred_broker(self) -> None:
        """Plan a move to the broker the failover strategy prefers, if it answers again."""
        current = self.connector.current
        if current is None or self.switch_to is not None or self.stopping():
            return
        preferred = self.connector.strategy.preferred(current)
        if preferred is None or preferred == current:
            return
        if self.connector.answers(preferred):
            logger.warning("consumer: broker %s answers again; moving back to it from %s",
                           redact_url(preferred), redact_url(current))
            self.switch_to = preferred

    def switch(self) -> None:
        """Connect to the broker chosen by :meth:`check_preferred_broker` at the next start."""
        target, self.switch_to = self.switch_to, None
        self.connector.current = target

"""The kombu transport classes handed to ``kombu.Connection(transport=...)``: kombu's Redis
transports with the channel the fast paths allow (:mod:`.internals`), and a poller that writes
buffered acknowledgements at the start of every loop turn (every hub tick, every
``drain_events`` poll)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as _redis

from . import internals
from .acking import AckingChannel, AckingSentinelChannel
from .channel import Channel, SentinelChannel
from .stock import StockChannel, StockSentinelChannel

if TYPE_CHECKING:
    from worker_core.slots import BrokerStatus

__all__ = ["MultiChannelPoller", "SentinelTransport", "Transport", "channel_class"]

logger = logging.getLogger(__name__)

# kombu is not annotated: its module is typed as Any here, once.
redis: Any = _redis


def channel_class(sentinel: bool = False) -> type[StockChannel]:
    """The channel the fast paths on in this process allow."""
    decision = internals.current()
    if "fetch" in decision:
        return SentinelChannel if sentinel else Channel
    if "acks" in decision:
        return AckingSentinelChannel if sentinel else AckingChannel
    return StockSentinelChannel if sentinel else StockChannel


class MultiChannelPoller(redis.MultiChannelPoller):  # type: ignore[misc]
    """kombu's poller; each turn also writes the acknowledgements the last turn buffered."""

    def on_poll_start(self) -> None:
        # Starting a fetch takes the buffered acks along; what is left is written here, unless
        # a fetch that will be read within a round trip is in flight (the next one carries them).
        super().on_poll_start()
        for channel in internals.channels_of(self):
            if channel.acks and not self._fetch_carries_acks(channel):
                channel.flush_acks()

    def _fetch_carries_acks(self, channel: Channel) -> bool:
        if not channel.fetch_in_flight:
            return False
        if channel.recording_in_flight:
            return True
        sock = internals.brpop_socket(self, channel)
        # A paused reply (no prefetch room) is not read soon: its acks must not wait for it.
        return sock is not None and not internals.paused(self, sock.fileno())


class Transport(redis.Transport):  # type: ignore[misc]
    """kombu's Redis transport with the batched channels when their fast paths are on."""

    Channel = StockChannel
    sentinel = False
    #: the worker's broker status, told of Redis's refusals (set by ``RedisTransport.watch_refusals``)
    broker_status: BrokerStatus | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.Channel = channel_class(self.sentinel)
        if issubclass(self.Channel, AckingChannel):
            self.cycle = MultiChannelPoller()
        # The TLS arguments the worker resolved from every source (RedisTransport): kombu keeps
        # only the URL's ssl_* parameters when there are any.
        resolved = self.client.transport_options.get("ssl")
        if resolved is not None:
            self.client.ssl = dict(resolved)

    def _collect(self, connection: Any) -> None:
        """kombu's ``Connection.collect`` (the worker's lost connection): close the channels
        without restoring the messages the worker holds. It keeps them, acknowledges them on its
        next connection, and their leases are renewed through it (:mod:`.leases`); restored now,
        they would run twice. A worker that stops instead leaves them to the visibility timeout."""
        channels = list(self.channels)
        for channel in channels:
            channel.keep_held()
        # One by one: a channel whose close fails must not leave the others open (an open channel
        # would keep buffering the acknowledgements of the messages it delivered, never written).
        for channel in channels:
            try:
                channel.close()
            except Exception as exc:
                logger.warning("Could not close a channel of the lost Redis connection (%s: %s)",
                               type(exc).__name__, exc)
        try:
            self.close_connection(connection)
        except (*self.connection_errors, AttributeError, OSError) as exc:
            logger.debug("error while closing the lost connection's channels: %r", exc)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """kombu's registration, except that each loop turn adds the Redis sockets to the hub
        only when they are not there yet: kombu adds every one at every turn, and the poller
        answers each with a failed ``epoll_ctl`` (already registered) and an exception."""
        super().register_with_event_loop(connection, loop)
        kombus = internals.kombus_poll_start(loop) if "hub" in internals.current() else None
        if kombus is None:
            return  # kombu's own (reported once, as the fast path that is off)
        loop.on_tick.discard(kombus)
        cycle, on_readable, readers, add_reader = self.cycle, self.on_readable, loop.readers, loop.add_reader

        def on_poll_start() -> None:
            cycle.on_poll_start()
            for fd in cycle.fds:
                if readers.get(fd) != (on_readable, (fd,)):
                    add_reader(fd, on_readable, fd)

        loop.on_tick.add(on_poll_start)


class SentinelTransport(Transport):
    """The same through Redis Sentinel (``sentinel://`` URLs, ``master_name`` option)."""

    default_port = 26379
    Channel = StockSentinelChannel
    sentinel = True

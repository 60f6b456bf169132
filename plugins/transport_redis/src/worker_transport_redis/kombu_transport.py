"""The kombu transport classes handed to ``kombu.Connection(transport=...)``: kombu's Redis
transports with the batched channels, and a poller that writes buffered acknowledgements at the
start of every loop turn (every hub tick, every ``drain_events`` poll)."""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as _redis

from .channel import Channel, SentinelChannel

__all__ = ["MultiChannelPoller", "SentinelTransport", "Transport"]

# kombu is not annotated: its module is typed as Any here, once.
redis: Any = _redis


class MultiChannelPoller(redis.MultiChannelPoller):  # type: ignore[misc]
    """kombu's poller; each turn also writes the acknowledgements the last turn buffered."""

    def on_poll_start(self) -> None:
        # Starting a fetch takes the buffered acks along; what is left is written here, unless
        # a fetch that will be read within a round trip is in flight (the next one carries them).
        super().on_poll_start()
        for channel in self._channels:
            if channel.acks and not self._fetch_carries_acks(channel):
                channel.flush_acks()

    def _fetch_carries_acks(self, channel: Channel) -> bool:
        if not channel.fetch_in_flight:
            return False
        if channel.recording_in_flight:
            return True
        sock = self._chan_to_sock.get((channel, channel.client, "BRPOP"))
        # A paused reply (no prefetch room) is not read soon: its acks must not wait for it.
        return sock is not None and sock.fileno() not in self._paused_brpop


#: how kombu's per-turn callback is named (registered by its ``register_with_event_loop``)
_KOMBUS_POLL_START = "register_with_event_loop.<locals>.on_poll_start"


class Transport(redis.Transport):  # type: ignore[misc]
    """kombu's Redis transport with batched fetches and acknowledgements."""

    Channel = Channel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cycle = MultiChannelPoller()
        # The TLS arguments the worker resolved from every source (RedisTransport): kombu keeps
        # only the URL's ssl_* parameters when there are any.
        resolved = self.client.transport_options.get("ssl")
        if resolved is not None:
            self.client.ssl = dict(resolved)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """kombu's registration, except that each loop turn adds the Redis sockets to the hub
        only when they are not there yet: kombu adds every one at every turn, and the poller
        answers each with a failed ``epoll_ctl`` (already registered) and an exception."""
        super().register_with_event_loop(connection, loop)
        kombus = [tick for tick in loop.on_tick
                  if getattr(tick, "__qualname__", "").endswith(_KOMBUS_POLL_START)]
        if len(kombus) != 1:
            return  # a kombu that registers differently: keep its own
        loop.on_tick.discard(kombus[0])
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
    Channel = SentinelChannel

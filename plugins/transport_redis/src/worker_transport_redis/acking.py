"""kombu's Redis channel with acknowledgements written in batches, on one client.

kombu writes each acknowledgement at once (ZREM and HDEL, a round trip) on a client it builds for
the call. Here, while something drives the channel, acknowledged tags wait in an
:class:`~.acks.AckBuffer` and go out together: with the next fetch (:mod:`.channel`), or in one
pipeline at the start of the next loop turn (:class:`~.kombu_transport.MultiChannelPoller`), and
before the channel closes. Messages are still taken and recorded by kombu's own BRPOP path unless
the batched fetch is on too.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as _redis

from . import internals
from .acks import AckBuffer, owe
from .qos import AckingQoS
from .refusals import refusal
from .stock import StockChannel

__all__ = ["AckingChannel", "AckingSentinelChannel"]

logger = logging.getLogger(__name__)

# kombu is not annotated: its module is typed as Any here, once.
redis: Any = _redis


class AckingChannel(StockChannel):
    """A Redis channel that writes acknowledgements in batches (see the module docstring)."""

    QoS = AckingQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: set when the channel starts closing: acknowledgements are then written at once
        self.closing = False
        self.ack_location: Hashable = self.location
        self.acks = AckBuffer(self.ack_location)
        self._pooled_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        # kombu builds a new redis.Redis per call (per publish, ack and unacked write), which
        # costs more than the round trip with redis-py 8; one client on the pool is thread-safe.
        if client is None:
            pool = self.pool
            client = self._pooled_client
            if client is None or client.connection_pool is not pool:
                client = self._pooled_client = internals.new_client(self)
        yield client

    def write_owed(self) -> None:
        """Nothing now: the acknowledgements owed to this Redis go with this channel's first batch."""

    @property
    def buffers_acks(self) -> bool:
        """Acks wait for the next flush only while something drives the channel (a consumer
        drained by the loop, or a record in flight that must reach Redis first); otherwise, and
        while closing, they are written at once."""
        if self.closed or self.closing:
            return False
        return internals.has_consumers(self) or self.recording_in_flight

    @property
    def fetch_in_flight(self) -> bool:
        """Whether a fetch script's reply is awaited (never here: kombu's BRPOP takes messages)."""
        return False

    @property
    def recording_in_flight(self) -> bool:
        """Whether acks written on another connection now could reach Redis before the records
        they remove (never here: kombu records a message before delivering it)."""
        return False

    def recording(self, delivery_tag: str) -> bool:
        """Whether the unacked record of this delivered message is still on its way to Redis."""
        return False

    def flush_acks(self, *, now: bool = False) -> None:
        """Write the buffered acknowledgements in one round trip. While Redis refuses writes they
        wait, tried again as the refusal's delay allows (``now``: at once); out of memory, Redis
        still takes them."""
        if self.leases.refusing() and not (now or self.leases.may_retry()):
            return
        tags = self.acks.take()
        if not tags:
            return
        try:
            self.remove_records(tags)
        except Exception as exc:
            self.acks.put_back(tags)
            reason = refusal(exc)
            if reason is None:
                raise
            self.leases.refused(reason)
        except BaseException:
            self.acks.put_back(tags)
            raise

    def before_restore(self) -> None:
        """Called by the QoS just before it restores unacknowledged messages (on close): the
        acknowledged ones leave ``unacked`` first, so they are not restored."""
        self.flush_acks_or_owe()

    def close(self) -> None:
        if not self.closed and not self.closing:
            self.closing = True
            self.before_close()
            self.flush_acks_or_owe()
        super().close()

    def before_close(self) -> None:
        """What the channel finishes before its last acknowledgements are written (nothing here)."""

    def flush_acks_or_owe(self) -> None:
        try:
            self.flush_acks(now=True)
        except Exception as exc:
            tags = self.acks.take()
            owe(self.ack_location, tags)
            logger.warning("Could not write %d acknowledgement(s) to Redis before closing (%r); the "
                           "next connection to it writes them", len(tags), exc)
            return
        left = self.acks.take()
        if left:  # Redis refused them (not logged again: the refusal is)
            owe(self.ack_location, left)


class AckingSentinelChannel(AckingChannel, redis.SentinelChannel):  # type: ignore[misc]
    """The same, finding the master through Redis Sentinel."""

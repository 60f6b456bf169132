"""Ack emulation: kombu's Redis QoS (same ``unacked`` keys), holding a lease on each message it
counts (:class:`LeasingQoS`, on every path); for the batched channels, acknowledgements are also
buffered and written in batches by the channel (:class:`AckingQoS`), and messages the fetch
script already recorded are not written again (:class:`FetchingQoS`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as _redis
from kombu.transport import virtual as _virtual

from . import internals
from .acks import owe, owes
from .parked import Parked

if TYPE_CHECKING:
    from .channel import Channel
    from .leases import Leases
    from .stock import StockChannel

__all__ = ["AckingQoS", "FetchingQoS", "LeasingQoS"]

logger = logging.getLogger(__name__)

# kombu is not annotated: its modules are typed as Any here, once.
redis: Any = _redis
virtual: Any = _virtual


class LeasingQoS(redis.QoS):  # type: ignore[misc]
    """kombu's Redis QoS, whose messages stay leased while it holds them (see :mod:`.leases`).

    A message delivered again while this process still holds it (its lease lapsed: the process
    stood still longer than the visibility timeout, or something restored it) is a copy: it is
    recorded in ``unacked`` again, under its tag, so the original keeps a record, but it is not
    counted in the prefetch window and the channel does not hand it to the consumer.

    When the channel closes because its connection was lost (:meth:`StockChannel.keep_held
    <.stock.StockChannel.keep_held>`), the worker keeps the messages it holds and acknowledges them
    on its next connection: they are not restored, and stay leased.
    """

    channel: StockChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._copies: set[str] = set()
        self._gave_up = False
        #: messages counted for the restore at close only (fetched, never handed to the consumer)
        self.unhanded: set[str] = set()

    @property
    def leases(self) -> Leases:
        return self.channel.leases

    def append(self, message: Any, delivery_tag: str) -> None:
        owner = self.leases.owner(delivery_tag)
        self.record(message, delivery_tag)
        if owner is None:
            self.leases.hold(delivery_tag, self)
            return
        self._copies.add(delivery_tag)
        if owner is not self:
            # the original is counted by the QoS of an earlier channel (kept across a reconnect)
            virtual.QoS.ack(self, delivery_tag)

    def record(self, message: Any, delivery_tag: str) -> None:
        """Record the message in ``unacked`` and count it (kombu's ``append``)."""
        super().append(message, delivery_tag)

    def park(self, delivery_tag: str, envelope: bytes) -> None:
        """Keep the message counted under ``delivery_tag`` packed (see :mod:`.parked`)."""
        internals.replace_delivered(self, delivery_tag, Parked(envelope))

    def take_copy(self, delivery_tag: str) -> bool:
        """Whether the message just delivered under ``delivery_tag`` is a copy of a held one."""
        if delivery_tag in self._copies:
            self._copies.discard(delivery_tag)
            return True
        return False

    def ack(self, delivery_tag: str) -> None:
        self.leases.release(delivery_tag)
        if self.channel.closed:
            self.ack_elsewhere(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
            return
        try:
            super().ack(delivery_tag)
        except self.channel.connection_errors as exc:
            # The connection is being lost (a cut the loop has not seen yet): the next channel to
            # this Redis writes it, so the task does not run again after the visibility timeout.
            owe(self.channel.location, [delivery_tag])
            virtual.QoS.ack(self, delivery_tag)
            logger.warning("could not acknowledge message %s in Redis now (%s: %s); it is written by "
                           "the next connection", delivery_tag, type(exc).__name__, exc)
            return
        if owes(self.channel.location):
            self.channel.write_owed()

    def ack_elsewhere(self, delivery_tag: str) -> None:
        """Acknowledge a message kept across a lost connection (its channel is closed) through
        the channel open to the same Redis now."""
        channel = self.leases.channel()
        try:
            if channel is None:
                raise ConnectionError("no connection to this Redis is open")
            channel.remove_records([delivery_tag])
        except Exception as exc:
            owe(self.channel.location, [delivery_tag])
            logger.warning("could not acknowledge message %s in Redis now (%r); it is written by "
                           "the next connection", delivery_tag, exc)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.leases.release(delivery_tag)
        super().reject(delivery_tag, requeue)

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        if self._gave_up:
            return None
        if self.channel.keeps_held:
            self._restore_unhanded()
            return None
        held = self.leases.held_by(self) + len(self.unhanded)
        if held:
            problem = self._unreachable()
            if problem is not None:
                # kombu would announce the restore, then fail on the first message.
                self._gave_up = True
                logger.warning(
                    "Did not restore %d unacknowledged message(s): Redis is unreachable (%s). Their "
                    "records stay in Redis: they come back to a worker after the visibility timeout "
                    "(%gs), unless this worker reconnects while it still holds them",
                    held, problem, float(self.channel.visibility_timeout))
                return None
        restored = super().restore_unacked_once(stderr)
        self.leases.release_all(self)
        return restored

    def _restore_unhanded(self) -> None:
        """Restore only the messages no one here will acknowledge (the held ones are kept)."""
        tags, self.unhanded = self.unhanded, set()
        try:
            for tag in tags:
                self.restore_by_tag(tag)
        except Exception as exc:
            logger.warning(
                "Did not restore %d fetched message(s) the consumer never saw (%r): they come back "
                "to a worker after the visibility timeout (%gs)",
                len(tags), exc, float(self.channel.visibility_timeout))

    def _unreachable(self) -> str | None:
        """Why Redis cannot be reached now, or None when it answers."""
        try:
            with self.channel.conn_or_acquire() as client:
                client.ping()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None


class AckingQoS(LeasingQoS):
    """kombu's Redis QoS with buffered acknowledgements."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        self.leases.release(delivery_tag)
        if self.channel.buffers_acks:
            self.channel.acks.add(delivery_tag)
        else:
            self._write_now(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            super().reject(delivery_tag, requeue=True)
        else:
            # Dropping a message leaves Redis exactly as acknowledging it does.
            self.ack(delivery_tag)

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        try:
            self.channel.before_restore()
        except Exception as exc:
            logger.warning("could not prepare the restore of unacknowledged messages: %r", exc)
        return super().restore_unacked_once(stderr)

    def _write_now(self, delivery_tag: str) -> None:
        if self.channel.closed and self.leases.attached():
            # A message kept across a lost connection: the channel open there writes it at the
            # start of its next loop turn.
            owe(self.channel.ack_location, [delivery_tag])
            return
        try:
            internals.remove_record(self, delivery_tag)
        except Exception as exc:
            # The channel is closed or Redis is unreachable: the next channel to this Redis
            # writes it, so the message is not delivered again after its visibility timeout.
            owe(self.channel.ack_location, [delivery_tag])
            logger.warning("could not acknowledge message %s in Redis now (%r); it is written by "
                           "the next connection", delivery_tag, exc)


class FetchingQoS(AckingQoS):
    """The same, for messages the fetch script recorded as unacked as it took them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The tag of the message being delivered whose unacked entry the fetch script wrote.
        self.prebooked: str | None = None

    def record(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag == self.prebooked:
            self.prebooked = None
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().record(message, delivery_tag)

    def track(self, message: Any) -> None:
        """Count ``message`` (fetched, never handed to the consumer) with those the restore at close
        puts back; its unacked entry is already in Redis. It is not leased: no one here will
        acknowledge it, so if the restore cannot run it comes back after the visibility timeout."""
        virtual.QoS.append(self, message, message.delivery_tag)
        self.unhanded.add(message.delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue and self.channel.recording(delivery_tag):
            # Its unacked record is still on its way (sent with the fetch that follows BRPOP):
            # kombu's requeue would find no record to move. Put a copy back now, and drop the
            # record after it, on the same connection, as an acknowledgement.
            self.channel.requeue_copy(self.get(delivery_tag))
            self.ack(delivery_tag)
        else:
            super().reject(delivery_tag, requeue)

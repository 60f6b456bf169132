"""Ack emulation: kombu's Redis QoS (same ``unacked`` keys), holding a lease on each message it
counts (:class:`LeasingQoS`, on every path); for the batched channels, acknowledgements are also
buffered and written in batches by the channel (:class:`AckingQoS`), and messages the fetch
script already recorded are not written again (:class:`FetchingQoS`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as _redis
from kombu.transport import virtual as _virtual
from kombu.utils.encoding import bytes_to_str

from worker_core.protocol.fastjson import dumps

from . import internals
from .acks import owe, owes
from .parked import Parked
from .refusals import refusal
from .scripts import RECORD, STALE, run

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

    A message whose lease this process lost (:meth:`.leases.Leases.lost_leases`) is acknowledged
    or rejected here only: its record in Redis, if any, is another consumer's copy now. Records
    are written at Redis's time (:data:`~.scripts.RECORD`), and :meth:`restore_visible` judges
    leases by Redis's clock too, and never restores a message this process holds (it renews it).
    While Redis refuses writes, :meth:`can_consume` is false: no message is taken that could not
    be recorded.
    """

    channel: StockChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._copies: set[str] = set()
        self._gave_up = False
        self._restores = 0
        #: records Redis refused, written once it takes writes again: (delivery tag, record)
        self._unwritten: list[tuple[str, str]] = []
        #: messages counted for the restore at close only (fetched, never handed to the consumer)
        self.unhanded: set[str] = set()

    @property
    def leases(self) -> Leases:
        return self.channel.leases

    def append(self, message: Any, delivery_tag: str) -> None:
        owner = self.leases.owner(delivery_tag)
        score = self.record(message, delivery_tag)
        if owner is None:
            self.leases.hold(delivery_tag, self, score)
            return
        self._copies.add(delivery_tag)
        self.leases.regain(delivery_tag, score)  # its record in Redis is this copy's: ours again
        if owner is not self:
            # the original is counted by the QoS of an earlier channel (kept across a reconnect)
            virtual.QoS.ack(self, delivery_tag)

    def record(self, message: Any, delivery_tag: str) -> str | None:
        """Record the message in ``unacked`` at Redis's time and count it (kombu's ``append``);
        the record's score, or None while it is not in Redis. One Redis refused (out of memory:
        BRPOP took the message, but its record may not grow Redis) is written once Redis takes
        writes again."""
        info = message.delivery_info
        entry = dumps([internals.envelope_of(message), info["exchange"], info["routing_key"]])
        channel = self.channel
        prefix = channel.global_keyprefix
        score: str | None = None
        try:
            with channel.conn_or_acquire() as client:
                score = bytes_to_str(run(client, RECORD, [prefix + channel.unacked_key,
                                                          prefix + channel.unacked_index_key],
                                         [delivery_tag, entry]))
        except Exception as exc:
            reason = refusal(exc)
            if reason is None:
                raise
            self._unwritten.append((delivery_tag, entry))
            self.leases.refused(reason)
        virtual.QoS.append(self, message, delivery_tag)
        return score

    def can_consume(self) -> bool:
        """kombu's, and false while Redis refuses writes (nothing is taken meanwhile)."""
        if self.leases.refusing():
            return False
        if self._unwritten:
            self._write_unwritten()
        if owes(self.channel.location):
            self.channel.write_owed()
        return bool(super().can_consume())

    def _write_unwritten(self) -> None:
        entries, self._unwritten = self._unwritten, []
        channel = self.channel
        prefix = channel.global_keyprefix
        try:
            with channel.conn_or_acquire() as client:
                score = bytes_to_str(run(client, RECORD, [prefix + channel.unacked_key,
                                                          prefix + channel.unacked_index_key],
                                         [part for entry in entries for part in entry]))
        except Exception as exc:
            self._unwritten = entries + self._unwritten
            reason = refusal(exc)
            if reason is not None:
                self.leases.refused(reason)
                return
            logger.warning("could not record %d message(s) as unacknowledged in Redis (%r); trying "
                           "again", len(entries), exc)
            return
        self.leases.recorded((tag for tag, _ in entries), score)

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """kombu's restore of messages whose lease is older than the visibility timeout, judged by
        Redis's clock (:data:`~.scripts.STALE`), under kombu's mutex (``unacked_mutex``), skipping
        those this process holds (renewed instead: this process stood still, or could not renew)."""
        self._restores += 1
        if (self._restores - 1) % (interval or 1) or self.leases.refusing():
            return
        channel = self.channel
        prefix = channel.global_keyprefix
        try:
            if not self._acks_written():
                return  # (next time: a message acknowledged here must not be restored)
            with channel.conn_or_acquire() as client:
                lock = client.lock(channel.unacked_mutex_key, timeout=channel.unacked_mutex_expire)
                if not lock.acquire(blocking=False):
                    return
                try:
                    stale = run(client, STALE, [prefix + channel.unacked_index_key],
                                [float(channel.visibility_timeout), (num and start) or 0,
                                 -1 if num is None else num])
                    for raw in stale or ():
                        tag = bytes_to_str(raw)
                        if self.leases.owner(tag) is None:
                            self.restore_by_tag(tag, client)
                finally:
                    try:
                        lock.release()
                    except Exception as exc:  # it expired meanwhile
                        logger.debug("the restore mutex was gone at its release: %r", exc)
        except Exception as exc:
            reason = refusal(exc)
            if reason is None:
                raise
            self.leases.refused(reason)

    def park(self, delivery_tag: str, envelope: bytes) -> None:
        """Keep the message counted under ``delivery_tag`` packed (see :mod:`.parked`)."""
        internals.replace_delivered(self, delivery_tag, Parked(envelope))

    def take_copy(self, delivery_tag: str) -> bool:
        """Whether the message just delivered under ``delivery_tag`` is a copy of a held one."""
        if delivery_tag in self._copies:
            self._copies.discard(delivery_tag)
            return True
        return False

    def _acks_written(self) -> bool:
        """Whether every acknowledgement made here reached Redis (written at once here; see
        :class:`AckingQoS`)."""
        return True

    def ack(self, delivery_tag: str) -> None:
        if self.leases.forget_lost(delivery_tag):  # its record is another consumer's
            virtual.QoS.ack(self, delivery_tag)
            return
        self.leases.release(delivery_tag)
        if self.channel.closed:
            self.ack_elsewhere(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
            return
        try:
            self.channel.remove_records([delivery_tag])
            virtual.QoS.ack(self, delivery_tag)
        except Exception as exc:
            reason = refusal(exc)
            if reason is not None:  # written once Redis takes writes again
                owe(self.channel.location, [delivery_tag])
                virtual.QoS.ack(self, delivery_tag)
                self.leases.refused(reason)
                return
            if not isinstance(exc, self.channel.connection_errors):
                raise
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
        if self.leases.forget_lost(delivery_tag):  # its record is another consumer's
            virtual.QoS.ack(self, delivery_tag)
            return
        self.leases.release(delivery_tag)
        super().reject(delivery_tag, requeue)

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        if self._gave_up:
            return None
        for tag in self.leases.lost_held_by(self):  # not ours to restore: another consumer's now
            self.leases.forget_lost(tag)
            virtual.QoS.ack(self, tag)
        if self._unwritten and not self.channel.keeps_held:
            try:
                self._write_unwritten()
            except Exception as exc:
                logger.debug("could not record the unrecorded before restoring: %r", exc)
            if self._unwritten:
                logger.error("%d message(s) taken while Redis refused to record them cannot be restored: "
                             "they are lost with this channel", len(self._unwritten))
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
        if self.leases.forget_lost(delivery_tag):  # its record is another consumer's
            virtual.QoS.ack(self, delivery_tag)
            return
        self.leases.release(delivery_tag)
        if self.channel.buffers_acks:
            self.channel.acks.add(delivery_tag)
        else:
            self._write_now(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def _acks_written(self) -> bool:
        """Write the buffered acknowledgements first: a message acknowledged here and not yet
        written is not held any more, and a restore would take it for stale. Not while a fetch's
        records are on their way (acknowledgements must follow them): False then."""
        channel = self.channel
        if not channel.acks:
            return True
        if channel.recording_in_flight:
            return False
        channel.flush_acks(now=True)
        return not channel.acks

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue or self.leases.is_lost(delivery_tag):
            super().reject(delivery_tag, requeue=requeue)
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
            self.channel.remove_records([delivery_tag])
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
        #: the score of that entry (None: it is still on its way, BRPOP took it and the next fetch
        #: records it, or none will be written, for an unreadable message rejected at once)
        self.prebooked_score: str | None = None

    def record(self, message: Any, delivery_tag: str) -> str | None:
        if delivery_tag == self.prebooked:
            self.prebooked = None
            virtual.QoS.append(self, message, delivery_tag)
            score, self.prebooked_score = self.prebooked_score, None
            return score
        return super().record(message, delivery_tag)

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

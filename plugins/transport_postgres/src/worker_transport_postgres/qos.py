"""Prefetch accounting for PostgreSQL channels: kombu's, with each delivered message held (and
its lease renewed) in this process's :class:`~.location.Location` until it is acknowledged,
rejected or given back, and acknowledgements written in batches."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual as _virtual

from .database import connection_errors

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["QoS"]

logger = logging.getLogger(__name__)

virtual: Any = _virtual


class QoS(virtual.QoS):  # type: ignore[misc]
    """kombu's prefetch window; acknowledgements are kept and written with the next fetch (or at
    the start of the next loop turn), a reject or requeue is written at once."""

    channel: Channel
    #: set when the connection was lost: what this channel holds stays held (acknowledged or
    #: given back through the next connection), nothing is given back on close
    kept = False

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        self.channel.location.hold(delivery_tag, self)

    def ack(self, delivery_tag: str) -> None:
        self.channel.location.ack(delivery_tag)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        location = self.channel.location
        if not requeue:
            self.ack(delivery_tag)
            return
        try:
            location.requeue(self.channel.connection.db(), [delivery_tag])
        except connection_errors():
            location.requeue_later([delivery_tag])
        # Not super().reject(): kombu's requeue publishes a second copy; the row went back already.
        super().ack(delivery_tag)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give back, in one statement, every message delivered on this channel and not settled;
        one that cannot be given back now (the database is gone) comes back when its lease lapses."""
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        location = self.channel.location
        if self.kept or not tags:
            return []
        held = [tag for tag in tags if location.owner_of(tag) is self]
        if not held:
            return []
        connection = self.channel.connection
        try:
            count = location.requeue(connection.db(), held)
        except connection_errors() as exc:
            for tag in held:
                location.release(tag)
            logger.warning(
                "%d unacknowledged message(s) could not be given back to their queues (%s): they come back "
                "when their lease lapses (visibility_timeout=%gs)",
                len(held),
                str(exc).strip(),
                location.visibility_timeout,
            )
        else:
            logger.info("Restored %d unacknowledged message(s) to their queues", count)
        return []

    def restore_unacked_once(self, stderr: Any = None) -> None:
        """kombu's, without its "Restoring N unacknowledged message(s)" line, logged before it
        knows whether the restore works: :meth:`restore_unacked` says what happened."""
        on_collect = getattr(self, "_on_collect", None)
        if on_collect is not None:
            on_collect.cancel()
        state = self._delivered
        if not self.restore_at_shutdown or not self.channel.do_restore:
            return
        if getattr(state, "restored", None):
            return
        try:
            self.restore_unacked()
        finally:
            state.restored = True

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """Give back the messages of lapsed leases (kombu's visibility-timeout hook)."""
        connection = self.channel.connection
        if connection is not None:
            connection.maintain(force=True)

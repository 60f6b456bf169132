"""Prefetch accounting for embedded channels: kombu's, with acks, rejects and restores written to
the file, where a delivered message stays (reserved) until it is acked. A write that fails (a
full disk) is kept and made at the next chance, so nothing is dumped or run twice."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual as _virtual

from ...exceptions import BrokerStorageError

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["QoS"]

logger = logging.getLogger(__name__)

# kombu's virtual transport is not annotated: it is typed as Any here, once, not call by call.
virtual: Any = _virtual


class QoS(virtual.QoS):  # type: ignore[misc]
    """Prefetch accounting as kombu does it, with every ack and reject also written to the file."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        try:
            self.channel.store.ack(delivery_tag)
        except BrokerStorageError:
            # The task goes on; its row is deleted once the file can be written again.
            self.channel.store.ack_later([delivery_tag])
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        store = self.channel.store
        try:
            if requeue:
                store.requeue([delivery_tag])
            else:
                store.ack(delivery_tag)
        except BrokerStorageError:
            (store.requeue_later if requeue else store.ack_later)([delivery_tag])
        # Not super().reject(): kombu's requeue publishes a second copy; the row already went back.
        super().ack(delivery_tag)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Requeue, in one transaction, every message delivered on this channel and not acked.

        Nothing is returned for kombu to dump: a message that cannot be requeued now (a full
        disk) stays in the file, reserved by this process, and is requeued at the next write
        (a new connection, or the next maintenance), or by any consumer once this process is gone.
        """
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        if not tags:
            return []
        store = self.channel.store
        try:
            store.requeue(tags)
        except BrokerStorageError as exc:
            store.requeue_later(tags)
            logger.warning(
                "%d unacknowledged message(s) could not go back to their queues: %s. They stay in "
                "the file, reserved by this process, and go back as soon as it can be written "
                "(or when this process ends, to whichever consumer opens the file next)",
                len(tags), exc,
            )
        else:
            logger.info("Restored %d unacknowledged message(s) to their queues in %s", len(tags),
                        store.db.path)
        return []

    def restore_unacked_once(self, stderr: Any = None) -> None:
        """kombu's, without its "Restoring N unacknowledged message(s)" line, logged before it
        knows whether the restore works: :meth:`restore_unacked` says what happened."""
        on_collect = getattr(self, "_on_collect", None)  # kombu's exit hook, calling this once
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
        """Requeue messages reserved by consumers that are gone (kombu's visibility-timeout hook)."""
        self.channel.maintain(force=True)

"""Ack emulation for the batched channels: kombu's Redis QoS (same ``unacked`` keys), except that
acknowledgements are buffered and written in batches by the channel (:class:`AckingQoS`), and
that messages the fetch script already recorded are not written again (:class:`FetchingQoS`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as _redis
from kombu.transport import virtual as _virtual

from . import internals
from .acks import owe

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["AckingQoS", "FetchingQoS"]

logger = logging.getLogger(__name__)

# kombu is not annotated: its modules are typed as Any here, once.
redis: Any = _redis
virtual: Any = _virtual


class AckingQoS(redis.QoS):  # type: ignore[misc]
    """kombu's Redis QoS with buffered acknowledgements."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
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

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag == self.prebooked:
            self.prebooked = None
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def track(self, message: Any) -> None:
        """Count ``message`` as delivered and unacked; its unacked entry is already in Redis."""
        virtual.QoS.append(self, message, message.delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue and self.channel.recording(delivery_tag):
            # Its unacked record is still on its way (sent with the fetch that follows BRPOP):
            # kombu's requeue would find no record to move. Put a copy back now, and drop the
            # record after it, on the same connection, as an acknowledgement.
            self.channel.requeue_copy(self.get(delivery_tag))
            self.ack(delivery_tag)
        else:
            super().reject(delivery_tag, requeue)

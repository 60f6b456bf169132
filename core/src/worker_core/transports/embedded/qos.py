"""Prefetch accounting for embedded channels: kombu's, with acks, rejects and restores written to
the file, where a delivered message stays (reserved) until it is acked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kombu.transport import virtual as _virtual

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["QoS"]

# kombu's virtual transport is not annotated: it is typed as Any here, once, not call by call.
virtual: Any = _virtual


class QoS(virtual.QoS):  # type: ignore[misc]
    """Prefetch accounting as kombu does it, with every ack and reject also written to the file."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        self.channel.store.ack(delivery_tag)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel.store.requeue([delivery_tag])
        else:
            self.channel.store.ack(delivery_tag)
        # Not super().reject(): kombu's requeue publishes a second copy; the row already went back.
        super().ack(delivery_tag)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Requeue, in one transaction, every message delivered on this channel and not acked."""
        self._flush()
        delivered = list(self._delivered.items())
        self._delivered.clear()
        try:
            self.channel.store.requeue(tag for tag, _ in delivered)
        except Exception as exc:
            # The rows are still in the file, reserved by this process: recovery hands them out
            # again once it is gone. kombu logs these and dumps them to a file as well.
            return [(exc, message) for _, message in delivered]
        return []

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """Requeue messages reserved by consumers that are gone (kombu's visibility-timeout hook)."""
        self.channel.maintain(force=True)

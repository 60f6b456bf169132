"""Prefetch accounting for the cluster's channels: kombu's window, with each delivered message the
fetch recorded held (and its lease renewed) in this process's :class:`~.location.Location` until
it is acknowledged, rejected or given back; acknowledgements are written in batches, a reject with
requeue at once."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual as _virtual

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["QoS"]

logger = logging.getLogger(__name__)

virtual: Any = _virtual


def _task_id(message: Any) -> str | None:
    headers = getattr(message, "headers", None)
    found = headers.get("id") if isinstance(headers, dict) else None
    return found if isinstance(found, str) else None


class QoS(virtual.QoS):  # type: ignore[misc]
    """kombu's prefetch window over the held messages (see the module docstring)."""

    channel: Channel
    #: set when the connection was lost: what this channel holds stays held (acknowledged or
    #: given back through the next connection), nothing is given back on close
    kept = False

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        physical = self.channel.recorded.get(delivery_tag)
        if physical is not None:
            self.channel.location.hold(delivery_tag, physical, self, _task_id(message))

    def ack(self, delivery_tag: str) -> None:
        location = self.channel.location
        if location.settle_lost(delivery_tag):
            # its lease was lost: the record, if any, is another delivery's (the worker knows)
            super().ack(delivery_tag)
            return
        if location.ack(delivery_tag):
            transport = self.channel.connection
            if transport is not None and not transport.consuming:
                # nothing loops to write it later (a client taking messages one at a time)
                transport.flush_acks()
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue:
            self.ack(delivery_tag)
            return
        location = self.channel.location
        held = location.held(delivery_tag)
        if held is not None and not location.settle_lost(delivery_tag):
            try:
                self.channel.requeue(held.queue, [delivery_tag])
            except Exception as exc:
                location.release([delivery_tag])
                logger.warning(
                    "Could not give message %s (task %s) back to queue %r now (%s: %s): it comes back once "
                    "its lease lapses (visibility_timeout=%gs)",
                    delivery_tag,
                    held.task,
                    held.queue,
                    type(exc).__name__,
                    exc,
                    location.visibility_timeout,
                )
        # Not super().reject(): kombu's requeue publishes a second copy; the record went back already.
        super().ack(delivery_tag)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give back, one script per queue, every message delivered on this channel and not
        settled; what cannot be given back now (the cluster is gone) comes back when its lease
        lapses."""
        self._flush()
        self._delivered.clear()
        location = self.channel.location
        held = location.held_by(self)
        if self.kept or not held:
            return []
        by_queue: dict[str, list[str]] = {}
        for tag, each in held:
            by_queue.setdefault(each.queue, []).append(tag)
        restored = 0
        for queue, tags in by_queue.items():
            try:
                restored += self.channel.requeue(queue, tags)
            except Exception as exc:
                location.release(tags)
                logger.warning(
                    "%d unacknowledged message(s) of queue %r could not be given back now (%s: %s): they "
                    "come back when their lease lapses (visibility_timeout=%gs)",
                    len(tags),
                    queue,
                    type(exc).__name__,
                    exc,
                    location.visibility_timeout,
                )
        if restored:
            logger.info("Restored %d unacknowledged message(s) to their queues", restored)
        return []

    def restore_unacked_once(self, stderr: Any = None) -> None:
        """kombu's, without its "Restoring N unacknowledged message(s)" line, written before it
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
        transport = self.channel.connection
        if transport is not None:
            transport.reclaim(force=True)

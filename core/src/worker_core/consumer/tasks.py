"""Consuming the task queues: the kombu consumer on the broker connection, the prefetch window
(QoS: concurrency times the multiplier, reduced after a lost connection while tasks run), and
the acknowledgements, rejections and copies of the messages it delivered."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import kombu
from kombu.common import QoS

from ..app.broker import task_queue
from .refusal import describe_message, refuse_undecodable

if TYPE_CHECKING:
    from kombu.message import Message
    from kombu.messaging import Consumer as KombuConsumer

    from .consumer import Consumer

__all__ = ["TaskConsumer"]

logger = logging.getLogger("worker.consumer")


class TaskConsumer:
    """The task queues' consumer and its prefetch window, across reconnects."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        options = consumer.options
        self.multiplier = options.prefetch_multiplier
        self.max_prefetch = (options.max_concurrency or 1) * self.multiplier
        self.kombu: KombuConsumer | None = None
        self.qos: QoS | None = None
        #: the window was reduced after a lost connection and grows back as tasks finish
        self.reduced = False
        self._initial_prefetch: int | None = None

    # -- consuming ---------------------------------------------------------------------------

    def start(self) -> None:
        consumer = self.consumer
        connection = consumer.broker.connection
        assert connection is not None
        worker = consumer.worker
        first, worker.before_consuming = worker.before_consuming, []
        for callback in first:
            callback()
        queues = [task_queue(name, consumer.app.settings) for name in worker.queues]
        self.kombu = kombu.Consumer(  # type: ignore[attr-defined,no-untyped-call]
            connection.default_channel, queues=queues, on_message=consumer.on_message, no_ack=False,
            # the transport or kombu could not build the message (a bad envelope or body
            # encoding, a 'compression' header kombu cannot undo): refuse it
            on_decode_error=lambda message, exc: refuse_undecodable(consumer, message, exc),
        )
        prefetch = self._initial_prefetch or self.max_prefetch
        self._initial_prefetch = None
        self.qos = QoS(self._set_prefetch, prefetch)
        self.qos.update()
        logger.debug("basic.qos: prefetch_count->%d", prefetch)
        self.kombu.consume()

    def stop(self) -> None:
        if self.kombu is not None and not self.consumer.broker.lost:
            try:
                self.kombu.cancel()
            except Exception as exc:
                logger.debug("error while cancelling the consumer: %r", exc)

    def forget(self) -> None:
        """The connection is gone: so are its consumer and window."""
        self.kombu = None
        self.qos = None

    def add_queue(self, queue: Any) -> None:
        """Start consuming ``queue`` (a kombu queue) too (remote ``add_consumer``)."""
        if self.kombu is not None and not self.consumer.broker.lost:
            self.kombu.add_queue(queue)
            self.kombu.consume()

    def cancel_queue(self, name: str) -> None:
        """Stop consuming the queue ``name`` (remote ``cancel_consumer``); the messages already
        received from it are still worked on."""
        if self.kombu is not None and not self.consumer.broker.lost:
            self.kombu.cancel_by_queue(name)

    # -- the prefetch window -------------------------------------------------------------------

    def _set_prefetch(self, prefetch_count: int) -> None:
        if self.kombu is not None:
            self.kombu.qos(prefetch_count=prefetch_count, apply_global=True)

    def update_qos(self) -> None:
        """Send a changed window to the broker (between loop turns: changes are batched)."""
        qos = self.qos
        if qos is not None and qos.prev != qos.value:
            qos.update()

    def prefetch_eventually(self, delta: int) -> None:
        """Widen (or narrow) the window by ``delta`` at the next update: a message held for its
        ETA does not block the others meanwhile."""
        qos = self.qos
        if qos is None:
            return
        if delta > 0:
            qos.increment_eventually(delta)
        elif delta < 0:
            qos.decrement_eventually(-delta)

    def change_max_prefetch(self, difference: int) -> None:
        """The pool's maximum moved by ``difference``: move the window by that many times the
        multiplier (the autoscaler's ``update``)."""
        delta = difference * self.multiplier
        self.max_prefetch = max(self.multiplier, self.max_prefetch + delta)
        self.prefetch_eventually(delta)

    def reduce_after_connection_loss(self, running: int) -> None:
        """Celery's prefetch reduction: do not over-fetch while ``running`` tasks still run; the
        window grows back as they finish."""
        reduced = max(self.multiplier, self.max_prefetch - running * self.multiplier)
        if reduced < self.max_prefetch:
            self.reduced = True
            self._initial_prefetch = reduced
            logger.info(
                "Temporarily reducing the prefetch count to %d to avoid over-fetching since %d tasks "
                "are currently being processed.\nThe prefetch count will be gradually restored to %d "
                "as the tasks complete processing.", reduced, running, self.max_prefetch,
            )

    def restore_prefetch_step(self) -> None:
        """A task ended: a reduced window grows back by one multiplier."""
        if not self.reduced or self.qos is None:
            return
        if self.qos.value < self.max_prefetch:
            self.qos.increment_eventually(min(self.multiplier, self.max_prefetch - self.qos.value))
        if self.qos.value >= self.max_prefetch:
            self.reduced = False
            logger.info(
                "Resuming normal operations following a restart.\nPrefetch count has been restored to "
                "the maximum of %d", self.max_prefetch,
            )

    # -- the messages it delivered (loop thread only) ------------------------------------------

    def ack(self, message: Message) -> None:
        try:
            message.ack()
        except Exception as exc:
            logger.error("Could not acknowledge %s: %r; the broker will deliver it again",
                         describe_message(message), exc)

    def reject(self, message: Message, *, requeue: bool) -> None:
        try:
            message.reject(requeue=requeue)
        except Exception as exc:
            logger.error("Could not reject %s: %r", describe_message(message), exc)

    def republish(self, message: Message, extra_headers: dict[str, Any]) -> bool:
        """Publish a copy of ``message`` (same body, properties and route) with more headers."""
        connection = self.consumer.broker.connection
        if connection is None:
            return False
        info = message.delivery_info or {}
        properties = message.properties or {}
        headers = dict(message.headers or {})
        headers.update(extra_headers)
        try:
            kombu.Producer(connection.default_channel).publish(  # type: ignore[attr-defined,no-untyped-call]
                message.body, exchange=info.get("exchange") or "", routing_key=info.get("routing_key") or "",
                headers=headers, content_type=message.content_type,
                content_encoding=message.content_encoding, delivery_mode=2,
                priority=properties.get("priority"), correlation_id=properties.get("correlation_id"),
                reply_to=properties.get("reply_to") or None, retry=True,
            )
        except Exception as exc:
            logger.error(
                "Could not send %s again: %r; it is requeued instead", describe_message(message), exc
            )
            return False
        return True

    def info(self) -> dict[str, Any]:
        return {"prefetch_count": self.qos.value if self.qos is not None else None}

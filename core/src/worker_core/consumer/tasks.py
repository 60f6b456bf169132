"""Consuming the task queues: the kombu consumer on the broker connection, the prefetch window
(QoS: concurrency times the multiplier, reduced after a lost connection while tasks run), and
the acknowledgements, rejections and copies of the messages it delivered."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import kombu
from kombu.common import QoS

from ..app import deadletters
from ..app.queues import is_quorum
from ..exceptions import TopologyError
from ..protocol.headers import DELIVERY_COUNT
from ..slots import AdoptsQueues, BuffersDeliveries, DelaysOnBroker
from .refusal import describe_message

if TYPE_CHECKING:
    from kombu.message import Message
    from kombu.messaging import Consumer as KombuConsumer

    from ..app.base import App
    from ..options import WorkerOptions
    from .connection import BrokerConnection
    from .poison import PoisonCap

__all__ = ["TaskConsumer"]

logger = logging.getLogger("worker.consumer")

#: most window changes sent in one turn of the loop (see ``TaskConsumer.update_qos``)
_QOS_ROUNDS = 8
#: most messages handled after each of those (the rest wait for the loop)
_ARRIVED_PER_ROUND = 256
#: seconds before the window is sent again when it still moved after those
_QOS_FOLLOW_UP = 0.001

#: a dead letter is sent from the loop's thread: a few quick tries, then the line that says so
_DEAD_LETTER_RETRY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


class TaskConsumer:
    """The task queues' consumer and its prefetch window, across reconnects."""

    def __init__(self, app: App, options: WorkerOptions, *, queues: list[str],
                 before_consuming: list[Callable[[], None]], timer: Any, hostname: str,
                 broker: BrokerConnection, poison: PoisonCap) -> None:
        """``queues`` are the worker's queues (changed in place by ``add_consumer`` and
        ``cancel_consumer``), ``before_consuming`` what runs once before consuming first starts
        (cleared then)."""
        self.app = app
        self.options = options
        self.queues = queues
        self.before_consuming = before_consuming
        self.timer = timer
        self.hostname = hostname
        self.broker = broker
        self.poison = poison
        self.multiplier = options.prefetch_multiplier
        self.max_prefetch = (options.max_concurrency or 1) * self.multiplier
        self.kombu: KombuConsumer | None = None
        self.qos: QoS | None = None
        #: the window was reduced after a lost connection and grows back as tasks finish
        self.reduced = False
        self._initial_prefetch: int | None = None
        #: the window is per consumer (quorum queues have no global one): the broker applies a
        #: change to consumers started after it only, so the window stays as it started
        self.per_consumer = False
        #: the dead-letter queue was declared on this connection
        self._dead_letters_declared = False
        #: ``worker_eta_task_limit``: the window sent to the broker never passes it
        self.eta_limit = app.settings.worker_eta_task_limit
        #: the window last sent to the broker on this connection (after the limit)
        self._sent_prefetch: int | None = None
        #: a timer will send the window again (it still moved after a turn's updates)
        self._qos_follow_up = False
        #: the connection's transport reads deliveries ahead of the loop (``BuffersDeliveries``)
        self._buffers = False
        #: ``--purge`` was done (once, on the first connection, as Celery does it at start)
        self._purged = False
        #: messages delivered to the worker, any outcome (the stall watchdog reads it)
        self.delivered = 0

    # -- consuming ---------------------------------------------------------------------------

    def start(self, on_message: Callable[[Message], None],
              on_decode_error: Callable[[Message, BaseException], None]) -> None:
        """Consume the worker's queues on the broker connection: each message delivered goes to
        ``on_message``, each the transport or kombu could not build to ``on_decode_error``."""
        connection = self.broker.connection
        assert connection is not None
        first = list(self.before_consuming)
        self.before_consuming.clear()
        for callback in first:
            callback()
        transport = self.broker.transport
        self._buffers = isinstance(transport, BuffersDeliveries) and transport.buffers_deliveries
        queues = self._declared(connection, self.app.topology.select(self.queues))
        settings = self.app.settings
        quorum = [queue for queue in queues if is_quorum(queue)]
        self.per_consumer = bool(quorum) and settings.worker_detect_quorum_queues
        if self.per_consumer:
            logger.info("Quorum queue%s %s: the prefetch window is per consumer and stays at %d",
                        "s" if len(quorum) > 1 else "", ", ".join(q.name for q in quorum), self.max_prefetch)
            self._initial_prefetch = None
            self.reduced = False
            self._wait_on_broker(connection, queues)
        if self.options.purge and not self._purged:
            self._purge(connection, queues)
        self.poison.warn_uncapped([queue.name for queue in queues if not is_quorum(queue)])
        self._dead_letters_declared = False
        self.kombu = kombu.Consumer(  # type: ignore[attr-defined,no-untyped-call]
            connection.default_channel, queues=queues, on_message=on_message, no_ack=False,
            # the transport or kombu could not build the message (a bad envelope or body
            # encoding, a 'compression' header kombu cannot undo): refuse it
            on_decode_error=on_decode_error,
        )
        prefetch = self._initial_prefetch or self.max_prefetch
        self._initial_prefetch = None
        if self.eta_limit is not None and self.eta_limit < prefetch:
            logger.info("worker_eta_task_limit=%d caps the prefetch window of %d at %d",
                        self.eta_limit, prefetch, self.eta_limit)
        self._sent_prefetch = None
        self.qos = QoS(self._set_prefetch, prefetch)
        self.qos.update()
        self.kombu.consume()

    def stop(self) -> None:
        if self.kombu is not None and not self.broker.lost:
            try:
                self.kombu.cancel()
            except Exception as exc:
                logger.debug("error while cancelling the consumer: %r", exc)

    def forget(self) -> None:
        """The connection is gone: so are its consumer and window."""
        self.kombu = None
        self.qos = None
        self._sent_prefetch = None

    def _wait_on_broker(self, connection: Any, queues: list[Any]) -> None:
        """Countdowns wait on the broker, in Celery's layout, not in this worker's memory, when
        the transport can hold them (``DelaysOnBroker``); a broker that refuses the layout leaves
        them to the worker, with a line that says why."""
        transport = self.broker.transport
        if not isinstance(transport, DelaysOnBroker):
            return
        try:
            transport.declare_delays(connection,
                                     self.app.settings.broker_native_delayed_delivery_queue_type)
            for queue in queues:
                transport.bind_to_delays(connection, queue)
        except Exception as exc:
            if self.broker.is_connection_error(exc):
                raise
            logger.warning("Countdowns on %s wait in the worker: the broker refused the delay queues "
                           "(broker_native_delayed_delivery_queue_type=%r): %s: %s",
                           ", ".join(q.name for q in queues),
                           self.app.settings.broker_native_delayed_delivery_queue_type,
                           type(exc).__name__, exc)

    def _purge(self, connection: Any, queues: list[Any]) -> None:
        """``--purge``: delete what waits in the consumed queues, before the first message is taken."""
        self._purged = True
        channel = connection.default_channel
        erased = sum(queue.bind(channel).purge() or 0 for queue in queues)
        logger.warning("purge: Erased %d message%s from the queue%s %s", erased, "" if erased == 1 else "s",
                       "" if len(queues) == 1 else "s", ", ".join(queue.name for queue in queues))

    def _declared(self, connection: Any, queues: list[Any]) -> list[Any]:
        """The queues as the broker has them, when its transport adopts queues that exist with
        other arguments (``AdoptsQueues``: each declared on a channel of its own, adopted or
        refused in one line without closing the channel that consumes); others as given."""
        transport = self.broker.transport
        if not isinstance(transport, AdoptsQueues):
            return queues
        return [transport.declare_queue(connection, queue) for queue in queues]

    def add_queue(self, queue: Any) -> None:
        """Start consuming ``queue`` (a kombu queue) too (remote ``add_consumer``).

        :raise TopologyError: the broker has the queue in a way this worker cannot consume, or it
            is a quorum queue and this channel's window is global; the other queues go on.
        """
        if self.kombu is None or self.broker.lost:
            return
        connection = self.broker.connection
        assert connection is not None
        (declared,) = self._declared(connection, [queue])
        detect = self.app.settings.worker_detect_quorum_queues
        if is_quorum(declared) and not self.per_consumer and detect:
            raise TopologyError(
                f"queue {queue.name!r} is a quorum queue, which RabbitMQ does not let a channel with a "
                f"global prefetch window consume (this worker's queues are classic): restart the worker "
                f"with it in -Q")
        transport = self.broker.transport
        if self.per_consumer and isinstance(transport, DelaysOnBroker):
            transport.bind_to_delays(connection, declared)
        self.kombu.add_queue(declared)
        self.kombu.consume()

    def cancel_queue(self, name: str) -> None:
        """Stop consuming the queue ``name`` (remote ``cancel_consumer``); the messages already
        received from it are still worked on."""
        if self.kombu is not None and not self.broker.lost:
            self.kombu.cancel_by_queue(name)

    # -- the prefetch window -------------------------------------------------------------------

    def _set_prefetch(self, prefetch_count: int) -> None:
        # The window counts the tasks held for their ETA (each widens it by one, so it does not
        # block the others), and worker_eta_task_limit caps it as Celery's does: once that many
        # messages are held, no more are fetched until one is done or comes due. (kombu's QoS
        # sends 0, no window at all, past AMQP's largest count.)
        prefetch_count = self._capped(prefetch_count)
        if self.kombu is not None and prefetch_count != self._sent_prefetch:
            self.kombu.qos(prefetch_count=prefetch_count, apply_global=not self.per_consumer)
            self._sent_prefetch = prefetch_count

    def _capped(self, prefetch_count: int) -> int:
        limit = self.eta_limit
        if limit is not None and (prefetch_count == 0 or prefetch_count > limit):
            return limit
        return prefetch_count

    def update_qos(self) -> None:
        """Send a changed window to the broker (between loop turns: changes are batched).

        RabbitMQ may deliver what a wider window lets through before its answer to the change,
        and what comes with the answer is read with it: those messages are not reported to the
        loop as readable, and when they are held for their ETA they widen the window again with
        nothing to wake the loop and send it. So what arrived is handled here, and the window sent
        again until it stays put: a few times in this turn, then from a timer a millisecond later
        (which also keeps the loop from sleeping until its next timer meanwhile).
        """
        qos = self.qos
        for _ in range(_QOS_ROUNDS):
            if qos is None or qos.prev == qos.value:
                return
            qos.update()
            self._handle_arrived()
            qos = self.qos  # (a lost connection forgets it)
        timer = self.timer
        if qos is not None and qos.prev != qos.value and timer is not None and not self._qos_follow_up:
            self._qos_follow_up = True
            timer.call_after(_QOS_FOLLOW_UP, self._follow_up_qos)

    def _follow_up_qos(self) -> None:
        self._qos_follow_up = False
        self.update_qos()

    def _handle_arrived(self) -> None:
        """Handle the messages the transport read ahead of the loop, without waiting
        (``BuffersDeliveries``; other transports: nothing to do)."""
        connection = self.broker.connection
        if connection is None or not self._buffers:
            return
        for _ in range(_ARRIVED_PER_ROUND):
            try:
                connection.drain_events(timeout=0)
            except TimeoutError:
                return
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    return
                raise

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
        if self.per_consumer:  # the window could not grow back: the broker keeps it as it starts
            return
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
        connection = self.broker.connection
        if connection is None:
            return False
        info = message.delivery_info or {}
        properties = message.properties or {}
        headers = dict(message.headers or {})
        headers.pop(DELIVERY_COUNT, None)  # the broker's count of the old message, not of the copy
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

    def dead_letter(self, message: Message, reason: str) -> None:
        """Send ``message`` to the dead-letter queue with ``reason`` in its headers, then take it
        off its queue; without a dead-letter queue (or when the copy cannot be sent) it is
        rejected, and the log line says so."""
        name = self.app.settings.worker_dead_letter_queue
        connection = self.broker.connection
        if name is None or connection is None:
            self.reject(message, requeue=False)
            return
        properties = message.properties or {}
        queue = deadletters.dead_letter_queue(name)
        try:
            kombu.Producer(connection.default_channel).publish(  # type: ignore[attr-defined,no-untyped-call]
                message.body, exchange=name, routing_key=name,
                headers=deadletters.dead_headers(message.headers, message.delivery_info, reason,
                                                 self.hostname),
                content_type=message.content_type, content_encoding=message.content_encoding, delivery_mode=2,
                priority=properties.get("priority"), correlation_id=properties.get("correlation_id"),
                reply_to=properties.get("reply_to") or None,
                declare=[] if self._dead_letters_declared else [queue], retry=True,
                retry_policy=_DEAD_LETTER_RETRY,
            )
        except Exception as exc:
            logger.error("Could not send %s to the dead-letter queue %r: %r; it is discarded",
                         describe_message(message), name, exc)
            self.reject(message, requeue=False)
            return
        self._dead_letters_declared = True
        logger.info("Sent %s to the dead-letter queue %r", describe_message(message), name)
        self.ack(message)

    def info(self) -> dict[str, Any]:
        return {"prefetch_count": self._capped(self.qos.value) if self.qos is not None else None}

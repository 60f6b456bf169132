"""kombu's virtual channel on a Redis Cluster: a publish is one script on the primary of the
queue's slot, a fetch takes many messages at once and records them in the same script, bindings
live in the cluster (so every process routes alike), fanout goes through (sharded) pub/sub.

One module because kombu's virtual channel is one class whose methods kombu calls by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.exceptions import ChannelError
from kombu.transport import virtual as _virtual

from worker_core.protocol.fastjson import dumps, loads
from worker_core.transports.message import Message, Unreadable, envelope_problem, fresh_tag, tag_problem

from .keys import QueueKeys, exchange_bindings, exchange_fanout, key_slot, shard_names, step_for
from .location import Location, named
from .qos import QoS as ClusterQoS
from .scripts import DELETE, FETCH, PUBLISH, PURGE, REQUEUE

if TYPE_CHECKING:
    from worker_core.slots import FencesLeases

    from .cluster import Router
    from .kombu_transport import Transport

__all__ = ["Channel", "Fetched"]

logger = logging.getLogger(__name__)

virtual: Any = _virtual

#: the routes already said to reach no queue (said once per exchange and key in a process)
_unrouted_warned: set[tuple[str, str]] = set()

#: kombu's separator in a binding's members (``routing_key``, ``pattern``, ``queue``)
SEP = "\x06\x16"

#: a message a fetch took: its envelope (or why it has none), its tag, and the physical queue
#: whose records hold it (None: nothing records it)
Fetched = tuple[Any, str, str | None]


def _task_id(payload: Any) -> str | None:
    headers = payload.get("headers") if isinstance(payload, dict) else None
    found = headers.get("id") if isinstance(headers, dict) else None
    return found if isinstance(found, str) else None


class Channel(virtual.Channel):  # type: ignore[misc]
    """A virtual channel whose queues, bindings and messages live in a Redis Cluster."""

    QoS = ClusterQoS
    Message = Message
    supports_fanout = True
    from_transport_options = ("body_encoding",)
    connection: Transport
    qos: ClusterQoS

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        config = connection.config
        self.config = config
        self.prefix = config.key_prefix
        self.steps = config.priority_steps
        self.location: Location = connection.location
        #: tag -> physical queue, for the message being delivered (read by the QoS)
        self.recorded: dict[str, str] = {}
        #: queues bound to a fanout exchange here -> the exchange
        self.fanout_queues: dict[str, str] = {}
        self.no_ack_queues: set[str] = set()
        self._next_shard: dict[str, int] = {}
        #: while a lease sends a message once: what would be pushed, ``(physical queue, step, item)``
        self.keeping: list[tuple[str, int, str]] | None = None

    @property
    def router(self) -> Router:
        return self.connection.router

    # -- where a queue lives --------------------------------------------------------------------

    def keys(self, physical: str) -> QueueKeys:
        return self.keys_for(physical, self.config)

    @staticmethod
    def keys_for(physical: str, config: Any) -> QueueKeys:
        """The keys of the physical queue ``physical`` under ``config``."""
        if not physical or physical.startswith("}"):
            raise ChannelError(
                f"queue name {physical!r} cannot be a Redis Cluster hash tag: it must be non-empty and not "
                f"start with '}}'"
            )
        return QueueKeys(physical, config.key_prefix, config.priority_steps)

    def physical(self, queue: str) -> list[str]:
        """The physical queues of ``queue``: itself, and its shards when it is sharded."""
        count = self.config.sharded_queues.get(queue)
        if not count or count < 2:
            return [queue]
        return [queue, *shard_names(queue, count)]

    def _publish_target(self, queue: str) -> str:
        count = self.config.sharded_queues.get(queue)
        if not count or count < 2:
            return queue
        shards = shard_names(queue, count)
        index = self._next_shard.get(queue, 0)
        self._next_shard[queue] = (index + 1) % len(shards)
        return shards[index]

    @property
    def wake_kind(self) -> str:
        return self.connection.wake_kind

    # -- publishing ------------------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        physical = self._publish_target(queue)
        keys = self.keys(physical)
        tag = message["properties"]["delivery_tag"]
        step = step_for(self._get_message_priority(message, reverse=False), self.steps)
        item = f"{tag} {dumps(message)}"
        if self.keeping is not None:  # a lease sends it once (see .election)
            self.keeping.append((physical, step, item))
            return
        router = self.router
        sent = router.run(
            keys.slot, [router.script(PUBLISH, [keys.list_for(step)], [item, keys.wake, self.wake_kind])]
        )
        if sent.replicas is not None and sent.replicas < self.config.wait_for_replicas:
            logger.debug(
                "the message published to queue %r (task %s) is on primary %s only for now",
                queue,
                _task_id(message),
                sent.node,
            )

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        if self.keeping is not None:
            raise ValueError(f"a message sent once goes to queues, not to the fanout exchange {exchange!r}")
        channel = exchange_fanout(self.prefix, exchange)
        command = "SPUBLISH" if self.wake_kind == "s" else "PUBLISH"
        self.router.run(key_slot(channel), [(command, channel, dumps(message))], write=False)

    # -- consuming ------------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self.no_ack_queues.add(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.connection.consuming_changed()
        return result

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue not in self._active_queues:
            self.no_ack_queues.discard(queue)
        if self.connection is not None:
            self.connection.consuming_changed()
        return result

    def fetch(self, queue: str, physical: str, want: int, acks: list[str]) -> list[Fetched]:
        """Take up to ``want`` messages of ``physical`` (a queue consumed as ``queue``) in
        priority order, recorded as delivered to this process (not for a queue consumed without
        acknowledgements), writing ``acks`` (of ``physical``) first, in one script."""
        keys = self.keys(physical)
        lease = -1 if queue in self.no_ack_queues else round(self.config.visibility_timeout * 1000)
        router = self.router
        command = router.script(
            FETCH,
            [*keys.records, *keys.lists],
            [self.location.owner, want, lease, len(acks), *acks, *self.steps],
        )
        try:
            sent = router.run(keys.slot, [command])
        except BaseException:
            if acks:
                self.location.put_back(physical, acks)
            raise
        reply = sent.replies[0]
        lost_count = int(reply[0])
        if acks:
            lost = [tag.decode() if isinstance(tag, bytes) else tag for tag in reply[1 : 1 + lost_count]]
            if lost:
                self.location.acknowledged_without_record(physical, lost)
            self.location.written(acks)
        fetched: list[Fetched] = []
        for position in range(1 + lost_count, len(reply), 2):
            flag, raw = int(reply[position]), reply[position + 1]
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            fetched.append(
                self._envelope(
                    text, queue, physical if flag >= 0 and lease >= 0 else None, flag == 1, recorded=flag >= 0
                )
            )
        if fetched and sent.replicas is not None and sent.replicas < self.config.wait_for_replicas:
            logger.warning(
                "A fetch of %d message(s) from queue %r was confirmed by %d of the %d replica(s) asked for "
                "within wait_timeout=%gs: if primary %s fails before they reach a replica, the cluster gives "
                "them out again and they may run twice. Tasks: %s",
                len(fetched),
                queue,
                sent.replicas,
                self.config.wait_for_replicas,
                self.config.wait_timeout,
                sent.node,
                named(_task_id(payload) for payload, _, _ in fetched),
            )
        return fetched

    def _envelope(
        self, text: str, queue: str, physical: str | None, redelivered: bool, *, recorded: bool
    ) -> Fetched:
        """The kombu envelope of a list item ``<tag> <JSON>``, or an :class:`Unreadable` saying why
        there is none (the consumer rejects it, which drops its record)."""
        tag, _, body = text.partition(" ")
        if not recorded:
            reason = f"its list item does not start with a delivery tag: {text[:120]!r}"
            return Unreadable(reason, fresh_tag(), queue), "", None
        try:
            payload = loads(body)
        except Exception as exc:
            return (
                Unreadable(
                    f"its envelope is not JSON ({type(exc).__name__}: {exc}): {body[:120]!r}", tag, queue
                ),
                tag,
                physical,
            )
        problem = envelope_problem(payload) or tag_problem(payload)
        if problem is not None:
            return Unreadable(problem, tag, queue), tag, physical
        properties = payload["properties"]
        properties["delivery_tag"] = tag
        info = properties.get("delivery_info")
        if not isinstance(info, dict):
            info = properties["delivery_info"] = {}
        info.setdefault("routing_key", queue)
        info.setdefault("exchange", "")
        info["redelivered"] = redelivered
        if redelivered and isinstance(payload.get("headers"), dict):
            payload["headers"]["redelivered"] = True  # where kombu's Redis transport puts it too
        return payload, tag, physical

    def deliver(self, queue: str, fetched: list[Fetched]) -> None:
        """Hand fetched messages to the consumer of ``queue``; a copy of one this process holds
        already (its lease lapsed, and it came back here) is dropped, as the original runs."""
        pending: Iterator[Fetched] = iter(fetched)
        try:
            for payload, tag, physical in pending:
                if physical is not None and self.location.held(tag) is not None:
                    self.location.regain(tag)  # the record is this process's again
                    logger.warning(
                        "Message %s (task %s) of queue %r was delivered again while this worker holds it "
                        "(its lease lapsed meanwhile): the copy is dropped, the task runs here once",
                        tag,
                        self.location.task_of(tag),
                        queue,
                    )
                    continue
                if physical is not None:
                    self.recorded[tag] = physical
                try:
                    self.connection._deliver(payload, queue)
                finally:
                    self.recorded.pop(tag, None)
        except BaseException:
            self._give_back(list(pending))
            raise

    def _give_back(self, fetched: list[Fetched]) -> None:
        """Put back, first in line, fetched messages a failing consumer callback never saw."""
        by_queue: dict[str, list[str]] = {}
        for _, tag, physical in fetched:
            if physical is not None:
                by_queue.setdefault(physical, []).append(tag)
        for physical, tags in by_queue.items():
            try:
                self.requeue(physical, tags)
            except Exception as exc:
                logger.error(
                    "Could not give back %d fetched message(s) of queue %r (%r): they come back after the "
                    "visibility timeout (%gs)",
                    len(tags),
                    physical,
                    exc,
                    self.config.visibility_timeout,
                )

    def lost_leases(self) -> frozenset[str] | None:
        """The held messages whose lease this process lost (:class:`~worker_core.slots.FencesLeases`):
        see :meth:`.location.Location.lost_leases`."""
        return self.location.lost_leases()

    def requeue(self, physical: str, tags: list[str]) -> int:
        """Give ``tags`` (held here, in delivery order) back to the head of ``physical``; how many
        went back."""
        keys = self.keys(physical)
        router = self.router
        command = router.script(
            REQUEUE,
            [*keys.records, *keys.lists],
            [self.location.owner, keys.wake, self.wake_kind, len(self.steps), *self.steps, *tags],
        )
        reply = router.run(keys.slot, [command]).replies[0]
        self.location.release(tags)
        return int(reply[0])

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        for physical in self.physical(queue):
            if no_ack:
                self.no_ack_queues.add(queue)
            try:
                fetched = self.fetch(queue, physical, 1, [])
            finally:
                if no_ack and queue not in self._active_queues:
                    self.no_ack_queues.discard(queue)
            if not fetched:
                continue
            payload, tag, recorded = fetched[0]
            message = self.Message(payload, channel=self)
            if not no_ack:
                if recorded is not None:
                    self.recorded[tag] = recorded
                try:
                    self.qos.append(message, message.delivery_tag)
                finally:
                    self.recorded.pop(tag, None)
            return message
        return None

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        raise Empty()  # the transport fetches for every channel (kombu_transport.Transport)

    # -- queues ---------------------------------------------------------------------------------

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.keys(queue)  # a name that cannot be a hash tag is refused when declared

    def _size(self, queue: str) -> int:
        total = 0
        router = self.router
        for physical in self.physical(queue):
            keys = self.keys(physical)
            total += sum(
                int(n)
                for n in router.run(
                    keys.slot, [("LLEN", name) for name in keys.lists], write=False, retry=True
                ).replies
            )
        return total

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        router = self.router
        for physical in self.physical(queue):
            keys = self.keys(physical)
            if any(
                router.run(
                    keys.slot, [("EXISTS", name) for name in keys.lists], write=False, retry=True
                ).replies
            ):
                return True
        return False

    def _purge(self, queue: str) -> int:
        total = 0
        router = self.router
        for physical in self.physical(queue):
            keys = self.keys(physical)
            total += int(router.run(keys.slot, [router.script(PURGE, keys.lists, [])]).replies[0])
        return total

    def _delete(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str | None = None,
        pattern: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        router = self.router
        if exchange:
            key = exchange_bindings(self.prefix, exchange)
            router.run(key_slot(key), [("SREM", key, SEP.join([routing_key or "", pattern or "", queue]))])
        for physical in self.physical(queue):
            keys = self.keys(physical)
            router.run(keys.slot, [router.script(DELETE, [*keys.records, *keys.lists], [])])
        self.fanout_queues.pop(queue, None)

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        if if_empty and self._size(queue):
            return
        bindings = list(self.state.queue_bindings(queue))
        for exchange, routing_key, args in bindings:
            meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, args)
            self._delete(queue, exchange, *meta)
        if not bindings:
            self._delete(queue)
        self.state.queue_bindings_delete(queue)

    # -- exchanges and bindings -------------------------------------------------------------------

    def exchange_declare(
        self, exchange: str | None = None, type: str = "direct", *args: Any, **kwargs: Any
    ) -> None:
        type = type or "direct"
        if type not in self.exchange_types:
            raise ChannelError(
                f"exchange {exchange!r} has type {type!r}, which the Redis Cluster transport does not "
                f"support; use one of {', '.join(sorted(self.exchange_types))}"
            )
        super().exchange_declare(exchange, type, *args, **kwargs)

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        key = exchange_bindings(self.prefix, exchange)
        self.router.run(key_slot(key), [("DEL", key)])
        self.state.exchanges.pop(exchange, None)

    def queue_bind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        # kombu's own needs the exchange declared in this process; here it may not be.
        exchange = exchange or "amq.direct"
        self.state.binding_declare(queue, exchange, routing_key, arguments)
        self._queue_bind(
            exchange, *self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        )

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        if self.typeof(exchange).type == "fanout":
            self.fanout_queues[queue] = exchange
        key = exchange_bindings(self.prefix, exchange)
        self.router.run(key_slot(key), [("SADD", key, SEP.join([routing_key or "", pattern or "", queue]))])

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        exchange = exchange or "amq.direct"
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        _, pattern, _ = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        key = exchange_bindings(self.prefix, exchange)
        self.router.run(key_slot(key), [("SREM", key, SEP.join([routing_key or "", pattern or "", queue]))])
        if self.fanout_queues.get(queue) == exchange:
            del self.fanout_queues[queue]

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        key = exchange_bindings(self.prefix, exchange)
        members = self.router.run(key_slot(key), [("SMEMBERS", key)], write=False, retry=True).replies[0]
        table = []
        for member in members or ():
            text = member.decode() if isinstance(member, bytes) else str(member)
            parts = text.split(SEP)
            if len(parts) == 3:
                table.append((parts[0], parts[1], parts[2]))
        return table

    def _lookup(self, exchange: str, routing_key: str, default: str | None = None) -> list[str]:
        if not exchange:
            return [routing_key]
        queues: list[str] = self.typeof(exchange).lookup(
            self.get_table(exchange), exchange, routing_key, default
        )
        if not queues:
            self._unrouted(exchange, routing_key)
        return queues

    def _unrouted(self, exchange: str, routing_key: str) -> None:
        key = (exchange, routing_key)
        if key not in _unrouted_warned:
            _unrouted_warned.add(key)
            logger.warning(
                "A message published to exchange %r with routing key %r reached no queue: nothing is bound "
                "there (said once per exchange and key)",
                exchange,
                routing_key,
            )

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        if not self.closed and self.connection is not None and not self.connection.lost:
            try:
                self.connection.flush_acks()
            except Exception as exc:
                logger.debug("could not write the acknowledgements before closing: %r", exc)
        super().close()


if TYPE_CHECKING:
    _FENCES: type[FencesLeases] = Channel

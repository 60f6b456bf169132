"""kombu's virtual transport on the embedded store: each channel has its own SQLite connection,
and deliveries, acks, rejects and restores are written to the file, so no message is lost.

One module because kombu's virtual channel is one class whose methods kombu calls by name.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

from amqp.protocol import queue_declare_ok_t
from kombu.exceptions import ChannelError
from kombu.transport import virtual as _virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.utils import json as _json
from kombu.utils.uuid import uuid

from ...exceptions import BrokerStorageError
from ..message import Message, Unreadable, envelope_problem
from .database import SCHEME, resolve_path
from .qos import QoS
from .store import Binding, QueueStore

__all__ = ["DEFAULT_POLLING_INTERVAL", "DEFAULT_VISIBILITY_TIMEOUT", "Channel", "Transport", "expires_at"]

logger = logging.getLogger(__name__)

DEFAULT_POLLING_INTERVAL = 0.05
DEFAULT_VISIBILITY_TIMEOUT = 3600.0
#: Seconds between looks for messages reserved by consumers that are gone, and for expired ones.
MAINTENANCE_INTERVAL = 1.0

# kombu's virtual transport is not annotated: it is typed as Any here, once, not call by call.
virtual: Any = _virtual
dumps: Callable[[Any], str] = _json.dumps
loads: Callable[[str], Any] = _json.loads


class Channel(virtual.Channel):  # type: ignore[misc]
    """A virtual channel whose queues, exchanges and bindings live in the SQLite file."""

    QoS = QoS
    Message = Message
    supports_fanout = True
    from_transport_options = (*virtual.Channel.from_transport_options, "path", "visibility_timeout")
    path: str = ""
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.store = QueueStore(self.path or resolve_path(f"{SCHEME}://"))
        self._no_ack_queues: set[str] = set()
        self._auto_delete_queues: set[str] = set()
        self._fanout_queues: set[str] = set()
        self._next_maintenance = 0.0
        self._next_renewal = time.monotonic() + self.visibility_timeout / 4
        try:
            # A file that cannot be written refuses the connection: the worker backs off.
            self.store.check_writable()
            # A consumer opening the file takes back what consumers killed earlier left reserved.
            self.maintain(force=True)
        except BaseException:
            connection.close_channel(self)
            raise

    # -- consuming -------------------------------------------------------------------------------

    def drain_events(self, timeout: float | None = None, callback: Callable[..., Any] | None = None) -> Any:
        self.maintain()
        return super().drain_events(timeout=timeout, callback=callback)

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        # No-ack consumers (kombu's pidbox and reply queues) take messages out of the file at once.
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
        return result

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        try:
            message = self.Message(self._claim(queue, remove=no_ack), channel=self)
        except Empty:
            return None
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        return self._claim(queue, remove=queue in self._no_ack_queues)

    def _claim(self, queue: str, *, remove: bool) -> Any:
        """The next message of ``queue``, reserved under a fresh tag: its envelope, or an
        :class:`Unreadable` saying why it has none (the consumer rejects it, which removes it)."""
        # A fresh tag per delivery: copies of one fanout message share the tag given at publish.
        tag = uuid()
        found = self.store.claim(queue, tag, remove=remove)
        if found is None:
            raise Empty()
        text, redelivered = found
        try:
            payload = loads(text)
        except Exception as exc:  # not JSON, nested too deeply, a kombu type tag it cannot read
            return Unreadable(f"its envelope is not JSON ({type(exc).__name__}: {exc}): {text[:120]!r}",
                              tag, queue)
        problem = envelope_problem(payload)
        if problem is not None:
            return Unreadable(problem, tag, queue)
        properties = payload["properties"] = dict(payload["properties"])
        properties["delivery_tag"] = tag
        info = properties.setdefault("delivery_info", {})
        if isinstance(info, dict):
            info["redelivered"] = redelivered
        if redelivered and isinstance(payload.get("headers"), dict):
            payload["headers"]["redelivered"] = True  # where kombu's Redis transport puts it too
        return payload

    def _restore(self, message: Any) -> None:
        self.store.requeue([message.delivery_tag])

    def _restore_at_beginning(self, message: Any) -> None:
        self.store.requeue([message.delivery_tag])

    def maintain(self, force: bool = False) -> None:
        """At most every second: write what this process could not write before, renew this
        channel's reservations, requeue those of consumers that are gone and drop expired
        messages."""
        now = time.monotonic()
        if not force and now < self._next_maintenance:
            return
        self._next_maintenance = now + MAINTENANCE_INTERVAL
        acks, requeues = self.store.write_later()
        if acks or requeues:
            logger.info(
                "%s can be written again: wrote the %d acknowledgement(s) and put back in their "
                "queues the %d message(s) that waited for it", self.store.db.path, acks, requeues,
            )
        if self._qos is not None and now >= self._next_renewal:
            self._next_renewal = now + self.visibility_timeout / 4
            self.store.renew(list(self._qos._delivered))
        restored = self.store.recover(self.visibility_timeout)
        if restored:
            logger.warning(
                "Restored %d message(s) reserved by consumers that are gone (their process "
                "ended, or they were silent for %gs) in %s",
                restored,
                self.visibility_timeout,
                self.store.db.path,
            )
        self.store.expire()

    # -- publishing ------------------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.store.put(queue, dumps(message), self._get_message_priority(message), expires_at(message))

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        self.store.put_fanout(
            exchange, dumps(message), self._get_message_priority(message), expires_at(message)
        )

    # -- exchanges -------------------------------------------------------------------------------

    def exchange_declare(
        self,
        exchange: str | None = None,
        type: str = "direct",
        durable: bool = False,
        auto_delete: bool = False,
        arguments: Any = None,
        nowait: bool = False,
        passive: bool = False,
    ) -> None:
        type = type or "direct"
        exchange = exchange or f"amq.{type}"
        if passive:
            if exchange not in self.state.exchanges and self.store.exchange_type(exchange) is None:
                raise ChannelError(
                    f"NOT_FOUND - no exchange {exchange!r} in {self.store.db.path}",
                    (50, 10),
                    "Channel.exchange_declare",
                    "404",
                )
            return
        if type not in self.exchange_types:
            raise ChannelError(
                f"exchange {exchange!r} has type {type!r}, which the embedded transport does "
                f"not support; use one of {', '.join(sorted(self.exchange_types))}"
            )
        super().exchange_declare(exchange, type, durable, auto_delete, arguments, nowait, passive)
        self.store.declare_exchange(exchange, type)

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        super().exchange_delete(exchange, if_unused, nowait)
        self.store.delete_exchange(exchange)

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        # Another process may have declared the exchange: the file knows its type.
        declared = self.state.exchanges.get(exchange)
        kind = declared["type"] if declared else self.store.exchange_type(exchange) or default
        return self.exchange_types.get(kind) or self.exchange_types[default]

    def get_table(self, exchange: str) -> list[Binding]:
        return self.store.table(exchange)

    # -- queues and bindings ---------------------------------------------------------------------

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        queue = queue or f"amq.gen-{uuid()}"
        if passive:
            if not self._has_queue(queue):
                raise ChannelError(
                    f"NOT_FOUND - no queue {queue!r} in {self.store.db.path}",
                    (50, 10),
                    "Channel.queue_declare",
                    "404",
                )
        else:
            self._new_queue(queue, **kwargs)
        return queue_declare_ok_t(queue, self._size(queue), 0)

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        # kombu's default drops Queue(message_ttl=...); read it as RabbitMQ's x-message-ttl.
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _new_queue(self, queue: str, auto_delete: bool = False, arguments: Any = None, **kwargs: Any) -> None:
        ttl = (arguments or {}).get("x-message-ttl")
        self.store.declare_queue(queue, None if ttl is None else float(ttl) / 1000)
        if auto_delete:
            self._auto_delete_queues.add(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self.store.has_queue(queue)

    def queue_bind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        # kombu's own queue_bind needs the exchange declared in this process; here it may not be.
        exchange = exchange or "amq.direct"
        self.state.binding_declare(queue, exchange, routing_key, arguments)
        self._queue_bind(
            exchange, *self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        )

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        self.store.bind(exchange, routing_key or "", pattern or "", queue)
        if self.typeof(exchange).type == "fanout":
            self._fanout_queues.add(queue)

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        exchange = exchange or "amq.direct"
        self.state.binding_delete(queue, exchange, routing_key)
        key, pattern, _ = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        self.store.unbind(exchange, key or "", pattern or "", queue)

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any) -> Any:
        """Delete the queue, its messages (reserved ones too) and its bindings. ``if_unused`` is
        not checked: consumers in other processes cannot be seen."""
        if if_empty and self._size(queue):
            return None
        self.state.queue_bindings_delete(queue)
        self._auto_delete_queues.discard(queue)
        self._fanout_queues.discard(queue)
        return self.store.delete_queue(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.store.delete_queue(queue)

    def _purge(self, queue: str) -> int:
        return self.store.purge(queue)

    def _size(self, queue: str) -> int:
        return self.store.size(queue)

    def close(self) -> None:
        if not self.closed and self.connection is not None:
            # Broadcast queues that die with their consumer (kombu's pidbox): otherwise every
            # later broadcast would pile up in a queue nobody reads.
            for queue in self._auto_delete_queues & self._fanout_queues:
                try:
                    self.queue_delete(queue)
                except (sqlite3.Error, BrokerStorageError) as exc:
                    logger.warning("could not delete auto-delete queue %r on close: %s", queue, exc)
        super().close()
        self.store.close()


class Transport(virtual.Transport):  # type: ignore[misc]
    """The kombu transport class: ``kombu.Connection(url, transport=Transport, transport_options=
    {"path": ..., "polling_interval": ..., "visibility_timeout": ...})``."""

    Channel = Channel
    polling_interval = DEFAULT_POLLING_INTERVAL
    default_port = 0
    driver_type = SCHEME
    driver_name = "sqlite3"
    # A file locked past the busy timeout, a full or failing disk: reconnect and retry, backing off.
    connection_errors = (*virtual.Transport.connection_errors, sqlite3.OperationalError, BrokerStorageError)
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset({"direct", "topic", "fanout"}), heartbeats=False
    )

    def driver_version(self) -> str:
        return sqlite3.sqlite_version


def expires_at(message: dict[str, Any]) -> float | None:
    """The absolute expiry time of a message from its AMQP ``expiration`` (milliseconds)."""
    expiration = message.get("properties", {}).get("expiration")
    if expiration is None:
        return None
    try:
        return time.time() + float(expiration) / 1000
    except (TypeError, ValueError):
        raise ChannelError(
            f"message property 'expiration' must be milliseconds as a number or numeric string "
            f"(got {expiration!r} that is a {type(expiration).__name__}); kombu sets it from "
            f"Producer.publish(expiration=seconds)"
        ) from None

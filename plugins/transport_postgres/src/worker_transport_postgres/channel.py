"""kombu's virtual channel on the queue tables: declarations, bindings and routing in SQL (so
every process sees them), a publish as one ``INSERT ... SELECT`` routed by the bindings, fetches
of many messages at once with ``FOR UPDATE SKIP LOCKED``, and acknowledgements by row.

One module because kombu's virtual channel is one class whose methods kombu calls by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from queue import Empty
from typing import TYPE_CHECKING, Any

from amqp.protocol import queue_declare_ok_t
from kombu.exceptions import ChannelError
from kombu.transport import virtual as _virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.utils.uuid import uuid

from worker_core.protocol import parse_iso
from worker_core.protocol.fastjson import dumps, loads
from worker_core.transports.message import Message, Unreadable, envelope_problem

from .qos import QoS
from .transaction import enlisted

if TYPE_CHECKING:
    from .kombu_transport import Transport

__all__ = ["Channel"]

logger = logging.getLogger(__name__)

# kombu's virtual transport is not annotated: it is typed as Any here, once.
virtual: Any = _virtual

#: a row as a fetch returns it
Row = tuple[int, int, str, int]


def _moment(text: Any) -> datetime | None:
    """The ETA header as a time, or None (none, or one the worker will refuse with its reason)."""
    if not isinstance(text, str):
        return None
    try:
        return parse_iso(text)
    except ValueError:
        return None


class Channel(virtual.Channel):  # type: ignore[misc]
    """A virtual channel whose queues, exchanges, bindings and messages live in PostgreSQL."""

    QoS = QoS
    Message = Message
    supports_fanout = True
    connection: Transport

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.names = connection.names
        self.sql = connection.sql
        #: what this process holds from these tables (outlives the connection: see .location)
        self.location = connection.location
        #: queue name -> its row id, for the queues this channel consumes or declared
        self.queue_ids: dict[str, int] = {}
        self._no_ack_queues: set[str] = set()
        self._auto_delete_queues: set[str] = set()
        self._fanout_queues: set[str] = set()
        self._unrouted_warned: set[tuple[str, str]] = set()
        try:
            connection.ensure_tables()
        except BaseException:
            connection.close_channel(self)
            raise

    def _db(self) -> Any:
        return self.connection.db()

    # -- consuming -------------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        self.queue_id(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.connection.consuming_changed()
        return result

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
        if self.connection is not None:
            self.connection.consuming_changed()
        return result

    def queue_id(self, queue: str) -> int:
        """The row id of ``queue``, created when it does not exist yet."""
        found = self.queue_ids.get(queue)
        if found is None:
            row = self._db().execute(self.sql.ensure_queue, {"name": queue}).fetchone()
            found = self.queue_ids[queue] = int(row[0])
        return found

    def fetch(self, queue: str, limit: int) -> list[Row]:
        """Take up to ``limit`` ready messages of ``queue``, in priority then publication order:
        leased to this process (or deleted, for a no-ack consumer)."""
        queue_id = self.queue_ids.get(queue)
        if queue_id is None:
            queue_id = self.queue_id(queue)
        rows: list[Row]
        if queue in self._no_ack_queues:
            rows = self._db().execute(self.sql.take_no_ack, (queue_id, limit)).fetchall()
        else:
            lease = self.connection.config.visibility_timeout
            rows = self._db().execute(self.sql.take, (self.location.owner, lease, queue_id, limit)).fetchall()
        if len(rows) > 1:
            rows.sort(key=lambda row: (-row[3], row[0]))
        return rows

    def taken_again(self, row: Row, envelope: Any, queue: str) -> bool:
        """Whether ``row`` is a message this process holds already (or acknowledged, not written
        yet) under the same delivery tag: the database lost the take that leased it here (a
        server crash before that commit was flushed, with ``consumer_synchronous_commit`` off)
        and this take wrote it again. The copy is not delivered: the message held here runs once
        and its acknowledgement settles the row. One line says so."""
        row_id, delivered = row[0], row[1]
        tag = f"{row_id}.{delivered}"
        if not self.location.already_here(tag):
            return False
        headers = envelope.get("headers") if isinstance(envelope, dict) else None
        task = headers.get("id") if isinstance(headers, dict) else None
        logger.warning(
            "Took message %s of queue %r (task %s, delivery %d) again while this worker holds it: the "
            "database lost the earlier take (a crash before its commit was flushed); the copy is "
            "dropped and the held message runs once",
            row_id, queue, task or "?", delivered,
        )
        return True

    def envelope(self, row: Row, queue: str) -> Any:
        """The kombu envelope of a fetched row, or an :class:`Unreadable` saying why there is none
        (the consumer rejects it, which deletes it)."""
        row_id, delivered, text, _ = row
        tag = f"{row_id}.{delivered}"
        try:
            payload = loads(text)
        except Exception as exc:
            return Unreadable(
                f"its envelope is not JSON ({type(exc).__name__}: {exc}): {text[:120]!r}", tag, queue
            )
        problem = envelope_problem(payload)
        if problem is not None:
            return Unreadable(problem, tag, queue)
        properties = payload["properties"] = dict(payload["properties"])
        properties["delivery_tag"] = tag
        info = properties.get("delivery_info")
        if not isinstance(info, dict):
            info = properties["delivery_info"] = {}
        info.setdefault("routing_key", queue)
        info.setdefault("exchange", "")
        redelivered = delivered > 1
        info["redelivered"] = redelivered
        if redelivered and isinstance(payload.get("headers"), dict):
            payload["headers"]["redelivered"] = True  # where kombu's Redis transport puts it too
        return payload

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        try:
            raw = self._get(queue)
        except Empty:
            return None
        message = self.Message(raw, channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        rows = self.fetch(queue, 1)
        if not rows:
            raise Empty()
        return self.envelope(rows[0], queue)

    def _restore(self, message: Any) -> None:
        self.location.requeue(self._db(), [message.delivery_tag])

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

    # -- publishing ------------------------------------------------------------------------------

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> None:
        self._inplace_augment_message(message, exchange, routing_key)
        properties = message.get("properties") or {}
        headers = message.get("headers") or {}
        eta = _moment(headers.get("eta") if isinstance(headers, dict) else None)
        expiration = properties.get("expiration")
        try:
            ttl = None if expiration is None else float(expiration) / 1000
        except (TypeError, ValueError):
            raise ChannelError(
                f"message property 'expiration' must be milliseconds as a number or numeric string (got "
                f"{expiration!r}); kombu sets it from Producer.publish(expiration=seconds)"
            ) from None
        params = {
            "payload": dumps(message),
            "priority": self._get_message_priority(message),
            "eta": eta,
            "ttl": ttl,
            "exchange": exchange or "",
            "key": routing_key or "",
        }
        external = enlisted()
        connection = external if external is not None else self._db()
        statement = self.sql.put_routed if exchange else self.sql.put_direct
        if not exchange and external is None:
            self.queue_id(routing_key)
        try:
            cursor = connection.execute(statement, params)
        except Exception as exc:
            if external is not None:
                raise self.connection.enlisted_error(exc) from exc
            raise
        if cursor.rowcount == 0:
            self._unrouted(exchange, routing_key)

    def _unrouted(self, exchange: str, routing_key: str) -> None:
        key = (exchange, routing_key)
        if key not in self._unrouted_warned:
            self._unrouted_warned.add(key)
            # (as on RabbitMQ: events nobody monitors go nowhere, and that is no news)
            logger.debug(
                "A message published to exchange %r with routing key %r reached no queue: nothing is "
                "bound there (said once per exchange and key)",
                exchange,
                routing_key,
            )

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.queue_id(queue)
        self._db().execute(
            self.sql.put_direct,
            {
                "payload": dumps(message),
                "priority": self._get_message_priority(message),
                "eta": None,
                "ttl": None,
                "exchange": "",
                "key": queue,
            },
        )

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        self.basic_publish(message, exchange, routing_key)

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
            if exchange not in self.state.exchanges and self.exchange_type(exchange) is None:
                raise ChannelError(
                    f"NOT_FOUND - no exchange {exchange!r} in {self.names.schema_name}",
                    (50, 10),
                    "Channel.exchange_declare",
                    "404",
                )
            return
        if type not in self.exchange_types:
            raise ChannelError(
                f"exchange {exchange!r} has type {type!r}, which the PostgreSQL transport does not support; "
                f"use one of {', '.join(sorted(self.exchange_types))}"
            )
        super().exchange_declare(exchange, type, durable, auto_delete, arguments, nowait, passive)
        self._db().execute(self.sql.declare_exchange, (exchange, type))

    def exchange_type(self, exchange: str) -> str | None:
        row = (
            self._db()
            .execute(f"SELECT type FROM {self.names.exchanges} WHERE name = %s", (exchange,))
            .fetchone()
        )
        return None if row is None else str(row[0])

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        super().exchange_delete(exchange, if_unused, nowait)
        db = self._db()
        with db.transaction():
            db.execute(f"DELETE FROM {self.names.bindings} WHERE exchange = %s", (exchange,))
            db.execute(f"DELETE FROM {self.names.exchanges} WHERE name = %s", (exchange,))

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        declared = self.state.exchanges.get(exchange)
        kind = declared["type"] if declared else self.exchange_type(exchange) or default
        return self.exchange_types.get(kind) or self.exchange_types[default]

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        rows = (
            self._db()
            .execute(
                f"SELECT routing_key, pattern, queue FROM {self.names.bindings} WHERE exchange = %s",
                (exchange,),
            )
            .fetchall()
        )
        return [(str(key), str(pattern), str(queue)) for key, pattern, queue in rows]

    # -- queues and bindings ---------------------------------------------------------------------

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        queue = queue or f"amq.gen-{uuid()}"
        if passive:
            if not self._has_queue(queue):
                raise ChannelError(
                    f"NOT_FOUND - no queue {queue!r} in {self.names.schema_name}",
                    (50, 10),
                    "Channel.queue_declare",
                    "404",
                )
        else:
            self._new_queue(queue, **kwargs)
        return queue_declare_ok_t(queue, self._size(queue), 0)

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        # kombu's default drops Queue(message_ttl=..., expires=...): read them as RabbitMQ's arguments.
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _new_queue(self, queue: str, auto_delete: bool = False, arguments: Any = None, **kwargs: Any) -> None:
        arguments = arguments or {}
        ttl, expires = arguments.get("x-message-ttl"), arguments.get("x-expires")
        self.queue_ids[queue] = self._declare_queue(
            queue,
            None if ttl is None else float(ttl) / 1000,
            None if expires is None else float(expires) / 1000,
        )
        if auto_delete:
            self._auto_delete_queues.add(queue)

    def _declare_queue(self, queue: str, ttl: float | None, expires: float | None) -> int:
        row = self._db().execute(self.sql.declare_queue, (queue, ttl, expires)).fetchone()
        return int(row[0])

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        row = self._db().execute(f"SELECT 1 FROM {self.names.queues} WHERE name = %s", (queue,)).fetchone()
        return row is not None

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
        key, pattern, _ = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        self._db().execute(self.sql.bind, (exchange, key or "", pattern or "", queue))
        if self.typeof(exchange).type == "fanout":
            self._fanout_queues.add(queue)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        self._db().execute(self.sql.bind, (exchange, routing_key or "", pattern or "", queue))

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
        self._db().execute(
            f"DELETE FROM {self.names.bindings} WHERE exchange = %s AND routing_key = %s "
            f"AND pattern = %s AND queue = %s",
            (exchange, key or "", pattern or "", queue),
        )

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any) -> Any:
        """Delete the queue, its messages (delivered ones too) and its bindings. ``if_unused`` is
        not checked: consumers in other processes cannot be seen."""
        if if_empty and self._size(queue):
            return None
        self.state.queue_bindings_delete(queue)
        self._auto_delete_queues.discard(queue)
        self._fanout_queues.discard(queue)
        self.queue_ids.pop(queue, None)
        return self._delete(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> int:
        db = self._db()
        with db.transaction():
            cursor = db.execute(
                f"DELETE FROM {self.names.messages} WHERE queue_id = "
                f"(SELECT id FROM {self.names.queues} WHERE name = %s)",
                (queue,),
            )
            db.execute(f"DELETE FROM {self.names.bindings} WHERE queue = %s", (queue,))
            db.execute(f"DELETE FROM {self.names.queues} WHERE name = %s", (queue,))
        return int(cursor.rowcount)

    def _purge(self, queue: str) -> int:
        """Delete the ready messages of ``queue`` (held ones stay with their consumers)."""
        cursor = self._db().execute(
            f"DELETE FROM {self.names.messages} WHERE visible AND queue_id = "
            f"(SELECT id FROM {self.names.queues} WHERE name = %s)",
            (queue,),
        )
        return int(cursor.rowcount)

    def _size(self, queue: str) -> int:
        row = self._db().execute(self.sql.size, (queue,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        if not self.closed and self.connection is not None and not self.connection.lost:
            # Broadcast queues that die with their consumer (kombu's pidbox): otherwise every later
            # broadcast would pile up in a queue nobody reads (x-expires removes those of the dead).
            for queue in self._auto_delete_queues & self._fanout_queues:
                try:
                    self.queue_delete(queue)
                except Exception as exc:
                    logger.debug("could not delete auto-delete queue %r on close: %s", queue, exc)
        connection = self.connection
        super().close()
        if connection is not None:
            connection.consuming_changed()

    def drain_events(self, timeout: float | None = None, callback: Callable[..., Any] | None = None) -> Any:
        raise Empty()  # the transport fetches for every channel at once (kombu_transport.Transport)

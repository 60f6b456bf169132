"""Dead letters: what a message the worker would discard becomes. A copy goes, through an exchange
of the dead-letter queue's name, to that queue (``worker_dead_letter_queue``; on Redis and the
embedded transport a list of that name), with the reason, the worker, the time and its route in
headers; ``workerctl dead-letters`` lists, shows, requeues and purges them."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import attrs
import kombu

from ..protocol.delays import strip_delay

if TYPE_CHECKING:
    from kombu.connection import Connection

    from .queues import Queue

_kombu: Any = kombu

__all__ = [
    "DEAD_HEADERS",
    "REASON",
    "TIME",
    "WORKER",
    "DeadLetter",
    "browse",
    "dead_headers",
    "dead_letter_queue",
    "origin_of",
    "purge",
    "requeue",
    "revived_headers",
]

#: a dead letter is shown whatever its content type: it is read, never run
#: (never pickle: reading it would run the code it holds; such a body is shown as bytes)
_ACCEPT_ALL = [
    "application/json",
    "application/x-yaml",
    "application/x-msgpack",
    "application/data",
    "application/text",
    "text/plain",
]

#: why the worker would have discarded it (one line)
REASON = "x-dead-reason"
#: the worker that did (its node name)
WORKER = "x-dead-worker"
#: when (ISO 8601, UTC)
TIME = "x-dead-time"
#: the exchange and routing key it came by, where a requeue sends it back
EXCHANGE = "x-dead-exchange"
ROUTING_KEY = "x-dead-routing-key"
DEAD_HEADERS = frozenset({REASON, WORKER, TIME, EXCHANGE, ROUTING_KEY})


def dead_letter_queue(name: str) -> Queue:
    """The dead-letter queue ``name``: durable, on a direct exchange of its name (RabbitMQ's
    dead-letter exchange; a list of that name on Redis and the embedded transport)."""
    return _kombu.Queue(name, _kombu.Exchange(name, type="direct"), routing_key=name)


def dead_headers(
    headers: Mapping[str, Any] | None, delivery_info: Mapping[str, Any] | None, reason: str, worker: str
) -> dict[str, Any]:
    """The headers of a dead letter: the message's own plus where, why, who and when."""
    info = delivery_info or {}
    found = dict(headers or {})
    found.update(
        {
            REASON: reason,
            WORKER: worker,
            TIME: datetime.now(timezone.utc).isoformat(),
            EXCHANGE: str(info.get("exchange") or ""),
            ROUTING_KEY: strip_delay(str(info.get("routing_key") or "")),
        }
    )
    return found


def origin_of(headers: Mapping[str, Any]) -> tuple[str, str]:
    """The exchange and routing key a dead letter came by (a requeue sends it there)."""
    return str(headers.get(EXCHANGE) or ""), str(headers.get(ROUTING_KEY) or "")


def revived_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A requeued dead letter's headers: its own, without the dead letter's."""
    return {key: value for key, value in headers.items() if key not in DEAD_HEADERS}


@attrs.frozen
class DeadLetter:
    """One message of the dead-letter queue, as read."""

    task_id: str | None
    task: str | None
    reason: str
    worker: str
    time: str
    exchange: str
    routing_key: str
    headers: Mapping[str, Any]
    body: Any
    content_type: str | None


def _letter(message: Any) -> DeadLetter:
    headers = dict(message.headers or {})
    properties = message.properties or {}
    exchange, routing_key = origin_of(headers)
    try:
        body = message.decode()
    except Exception:  # kept as the broker holds it: the reason it is here may be that
        body = message.body
    return DeadLetter(
        task_id=headers.get("id") or properties.get("correlation_id"),
        task=headers.get("task"),
        reason=str(headers.get(REASON, "")),
        worker=str(headers.get(WORKER, "")),
        time=str(headers.get(TIME, "")),
        exchange=exchange,
        routing_key=routing_key,
        headers=headers,
        body=body,
        content_type=message.content_type,
    )


def _matches(letter: DeadLetter, ids: Collection[str]) -> bool:
    return not ids or letter.task_id in ids


def browse(connection: Connection, name: str, limit: int | None = None) -> list[DeadLetter]:
    """The dead letters of the queue ``name``, oldest first, left where they are: each is read
    unacknowledged, and all go back when the reading channel closes."""
    letters: list[DeadLetter] = []
    channel = connection.channel()
    try:
        queue = dead_letter_queue(name)(channel)
        queue.declare()
        while limit is None or len(letters) < limit:
            message = queue.get(no_ack=False, accept=_ACCEPT_ALL)
            if message is None:
                break
            letters.append(_letter(message))
    finally:
        channel.close()
    return letters


def requeue(connection: Connection, name: str, ids: Collection[str] = ()) -> list[DeadLetter]:
    """Send the dead letters (those with these task ids; all without) back the way they came,
    without the dead letter's headers; return those sent."""
    sent: list[DeadLetter] = []
    channel = connection.channel()
    try:
        queue = dead_letter_queue(name)(channel)
        queue.declare()
        producer = _kombu.Producer(channel)
        while True:
            message = queue.get(no_ack=False, accept=_ACCEPT_ALL)
            if message is None:
                break
            letter = _letter(message)
            if not _matches(letter, ids):
                continue  # unacknowledged: back in the queue when the channel closes
            properties = message.properties or {}
            producer.publish(
                message.body,
                exchange=letter.exchange,
                routing_key=letter.routing_key,
                headers=revived_headers(letter.headers),
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                delivery_mode=2,
                priority=properties.get("priority"),
                correlation_id=properties.get("correlation_id"),
                reply_to=properties.get("reply_to") or None,
                retry=True,
            )
            message.ack()
            sent.append(letter)
    finally:
        channel.close()
    return sent


def purge(connection: Connection, name: str, ids: Collection[str] = ()) -> int:
    """Delete the dead letters (those with these task ids; all without); return how many."""
    channel = connection.channel()
    try:
        queue = dead_letter_queue(name)(channel)
        queue.declare()
        if not ids:
            return int(queue.purge() or 0)
        deleted = 0
        while True:
            message = queue.get(no_ack=False, accept=_ACCEPT_ALL)
            if message is None:
                break
            if _matches(_letter(message), ids):
                message.ack()
                deleted += 1
        return deleted
    finally:
        channel.close()

"""Countdowns held by RabbitMQ, in the layout of Celery's native delayed delivery, so Celery's
clients and workers and this worker's share them (the transport's ``DelaysOnBroker``).

A delayed message is published to the topic exchange ``celery_delayed_27`` with its delay in
seconds written as 28 bits before its routing key (``1.0.0. ... .1.feed.new``). Level ``L`` has an
exchange and a queue of the name ``celery_delayed_L``: the queue holds the messages whose bit
``L`` is 1 for ``2**L`` seconds (its message TTL), then dead-letters them to level ``L-1``; a
message whose bit is 0 passes on to level ``L-1`` at once (an exchange-to-exchange binding).
Level 0 hands everything to ``celery_delayed_delivery``, which each task queue's exchange is
bound to with ``#.<its routing key>``. Direct exchanges cannot take part (the prefixed routing key
matches no direct binding): their countdowns wait in the worker, as with Celery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import kombu

from worker_core.protocol import DELAY_LEVELS as LEVELS
from worker_core.protocol import DELIVERY_EXCHANGE, strip_delay

if TYPE_CHECKING:
    from kombu.connection import Connection

#: kombu's queue, untyped there
Queue = Any

_kombu: Any = kombu

__all__ = ["ENTRY_EXCHANGE", "MAX_DELAY", "bind_to_delays", "declare_delays", "delayed_routing_key",
           "level_name"]

logger = logging.getLogger("worker.consumer")

#: where delayed messages go in (they come out of ``DELIVERY_EXCHANGE``)
ENTRY_EXCHANGE = f"celery_delayed_{LEVELS - 1}"
#: the longest delay the levels hold; a longer one waits the rest in the worker (its ETA)
MAX_DELAY = 2**LEVELS - 1


def level_name(level: int) -> str:
    return f"celery_delayed_{level}"


def delayed_routing_key(seconds: float, routing_key: str) -> str:
    """The routing key that holds a message ``seconds`` (whole, at least 1) on its way to
    ``routing_key`` (a delay prefix it already carries, from an earlier delay, is replaced)."""
    whole = min(int(seconds), MAX_DELAY)
    if whole < 1:
        raise ValueError(f"a broker-side delay is at least 1 second (got {seconds!r})")
    if not routing_key:
        raise ValueError("a broker-side delay needs a routing key to deliver the message by")
    bits = format(whole, f"0{LEVELS}b")
    return ".".join(bits) + "." + strip_delay(routing_key)


def _pattern(level: int, bit: str) -> str:
    """Matches the routing keys whose bit ``level`` is ``bit`` (the higher bits come first)."""
    return "*." * (LEVELS - 1 - level) + f"{bit}.#"


def declare_delays(connection: Connection, queue_type: str) -> None:
    """Declare the levels' exchanges, queues and bindings (as Celery's workers declare them)."""
    channel = connection.channel()
    try:
        delivery = _kombu.Exchange(DELIVERY_EXCHANGE, type="topic", channel=channel)
        delivery.declare()
        for level in range(LEVELS):
            name = level_name(level)
            _kombu.Exchange(name, type="topic", channel=channel).declare()
            arguments: dict[str, Any] = {
                "x-queue-type": queue_type,
                # a full queue refuses the publish (the client sees it) rather than drop the oldest
                "x-overflow": "reject-publish",
                "x-message-ttl": 2**level * 1000,
                "x-dead-letter-exchange": level_name(level - 1) if level else DELIVERY_EXCHANGE,
            }
            if queue_type == "quorum":
                # held messages move to the next level only once it has them
                arguments["x-dead-letter-strategy"] = "at-least-once"
            queue = _kombu.Queue(name, queue_arguments=arguments, channel=channel)
            queue.declare()
            queue.bind_to(name, _pattern(level, "1"))
        for level in range(1, LEVELS):
            channel.exchange_bind(
                destination=level_name(level - 1), source=level_name(level), routing_key=_pattern(level, "0")
            )
        channel.exchange_bind(
            destination=DELIVERY_EXCHANGE, source=level_name(0), routing_key=_pattern(0, "0")
        )
    finally:
        try:
            channel.close()
        except Exception as exc:
            logger.debug("closing the delays' channel: %r", exc)


def bind_to_delays(connection: Connection, queue: Queue) -> None:
    """Let delayed messages for ``queue`` reach it: bind each of its exchanges that is not direct
    to the delivery exchange, and the queue to that exchange, with ``#.<routing key>``."""
    bindings = [(queue.exchange, queue.routing_key, queue.binding_arguments)] if queue.exchange else []
    bindings += [(b.exchange, b.routing_key, b.arguments) for b in queue.bindings or ()]
    channel = connection.channel()
    try:
        for exchange, routing_key, arguments in bindings:
            if exchange is None or not exchange.name:
                continue
            if exchange.type == "direct":
                logger.info(
                    "Queue %r: its exchange %r is direct, so its countdowns wait in the worker, not on "
                    "the broker (bind it through a topic exchange to have them wait on the broker)",
                    queue.name,
                    exchange.name,
                )
                continue
            key = routing_key or ""
            key = key if key.startswith("#") else f"#.{key}"
            channel.exchange_bind(destination=exchange.name, source=DELIVERY_EXCHANGE, routing_key=key)
            channel.queue_bind(queue=queue.name, exchange=exchange.name, routing_key=key, arguments=arguments)
    finally:
        try:
            channel.close()
        except Exception as exc:
            logger.debug("closing the delays' channel: %r", exc)

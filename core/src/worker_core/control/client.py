"""Sending a command to workers and collecting their replies (``workerctl inspect/control``).

The request is kombu's pidbox message, as Celery's clients send it, plus a header naming the
sender, so workers can log who changed them; it is published with kombu's public API because the
pidbox's own sending takes no extra header.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..app.broker import connection_for
from ..protocol import origin_name
from .mailbox import SENDER_HEADER, mailbox

if TYPE_CHECKING:
    from ..app.base import App

__all__ = ["broadcast"]


def broadcast(app: App, command: str, arguments: dict[str, Any] | None = None,
              destination: Sequence[str] | None = None, timeout: float = 1.0,
              reply: bool = True, limit: int | None = None,
              sender: str | None = None) -> list[dict[str, Any]]:
    """Send ``command`` to every worker (or only ``destination``) and return the replies,
    each ``{hostname: reply}``, received within ``timeout`` seconds of each other or until
    ``limit`` came (none without ``reply``). Workers log ``sender`` (by default this process's
    ``gen<pid>@<host>``) as who asked."""
    import kombu
    from kombu.common import maybe_declare

    nodes = list(destination) if destination else None
    with connection_for(app.plugins, app.broker_urls[0], app.settings) as connection:
        bound = mailbox()(connection)
        channel = connection.default_channel
        body: dict[str, Any] = {"method": command, "arguments": arguments or {}, "destination": nodes,
                                "pattern": None, "matcher": None}
        ticket = str(uuid.uuid4()) if reply else None
        queue = bound.reply_queue(channel)
        if ticket:
            maybe_declare(queue)  # before publishing, so no reply is lost
            body.update(ticket=ticket,
                        reply_to={"exchange": bound.reply_exchange.name, "routing_key": bound.oid})
        kombu.Producer(channel).publish(  # type: ignore[attr-defined,no-untyped-call]
            body, exchange=bound.exchange, declare=[bound.exchange], serializer="json", retry=True,
            headers={"clock": bound.clock.forward(), "expires": time.time() + timeout if timeout else 0,
                     SENDER_HEADER: sender or origin_name()},
        )
        if not ticket:
            return []
        return _collect(connection, channel, queue, bound, ticket, timeout,
                        limit if limit is not None else (len(nodes) if nodes else None))


def _collect(connection: Any, channel: Any, queue: Any, bound: Any, ticket: str, timeout: float,
             limit: int | None) -> list[dict[str, Any]]:
    import kombu

    replies: list[dict[str, Any]] = []

    def on_reply(body: Any, message: Any) -> None:
        headers = message.headers or {}
        bound.clock.adjust(headers.get("clock") or 0)
        expires = headers.get("expires")
        if expires and time.time() > expires:
            return
        if headers.get("ticket", ticket) == ticket and isinstance(body, dict):
            replies.append(body)

    consumer = kombu.Consumer(  # type: ignore[attr-defined,no-untyped-call]
        channel, [queue], callbacks=[on_reply], accept=["json"], no_ack=True)
    try:
        with consumer:
            while limit is None or len(replies) < limit:
                try:
                    connection.drain_events(timeout=timeout)
                except TimeoutError:
                    break
    finally:
        channel.after_reply_message_received(queue.name)
    return replies

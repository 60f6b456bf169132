"""Listening to Celery's monitoring events as a monitor does, from tests."""

from __future__ import annotations

import kombu
from workers import drain


class Listener:
    """An exclusive queue bound to the ``celeryev`` exchange (topic; fanout on Redis, as Celery
    has it)."""

    def __init__(self, url: str) -> None:
        self.connection = kombu.Connection(url)
        kind = "fanout" if self.connection.transport.driver_type == "redis" else "topic"
        exchange = kombu.Exchange("celeryev", type=kind)
        queue = kombu.Queue("", exchange, routing_key="#", exclusive=True, auto_delete=True)
        self.messages: list[kombu.Message] = []
        self.consumer = kombu.Consumer(self.connection, [queue], callbacks=[self._on_message],
                                       accept=["json"])
        self.consumer.consume()
        try:  # Redis subscribes to the fanout channel on the first drain
            self.connection.drain_events(timeout=0.2)
        except TimeoutError:
            pass

    def _on_message(self, body, message) -> None:
        self.messages.append(message)

    def events(self, kind: str | None = None) -> list[dict]:
        return [m.payload for m in self.messages if kind is None or m.payload["type"] == kind]

    def until(self, condition, timeout: float = 10.0) -> None:
        drain(self.connection, condition, timeout,
              message=lambda: f"events (so far: {[e['type'] for e in self.events()]})")

    def close(self) -> None:
        self.connection.close()

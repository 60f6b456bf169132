"""Publishing events as Celery does: a JSON object per event on the ``celeryev`` exchange
(topic; fanout where the transport says so, as on Redis: see ``slots.FansOutEvents``), routing
key the type with ``-`` turned into ``.``, not persistent, with the sender's hostname in the
headers and in the body next to its pid, a logical clock, the time and the UTC offset."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import kombu

from ..clock import LogicalClock

__all__ = ["EXCHANGE", "EventDispatcher", "utcoffset"]

logger = logging.getLogger("worker.events")

EXCHANGE = "celeryev"


def utcoffset() -> float:
    """Hours west of UTC, as Celery sends it."""
    return (time.altzone if time.localtime().tm_isdst else time.timezone) / 3600


class EventDispatcher:
    """Sends events on a channel of its own on the consumer's connection (loop thread only)."""

    def __init__(self, connection: Any, hostname: str, *, task_events: bool,
                 clock: LogicalClock | None = None, fanout: bool = False) -> None:
        self.hostname = hostname
        self.pid = os.getpid()
        #: whether task events are sent (``-E``; ``enable_events``/``disable_events``)
        self.task_events = task_events
        #: the worker's logical clock, forwarded by each event (a clock of its own without one)
        self.clock = clock if clock is not None else LogicalClock()
        self.sent = 0
        self._headers = {"hostname": hostname}
        kind = "fanout" if fanout else "topic"
        self.exchange = kombu.Exchange(EXCHANGE, type=kind)  # type: ignore[attr-defined,no-untyped-call]
        self.channel = connection.channel()
        self.producer = kombu.Producer(  # type: ignore[attr-defined,no-untyped-call]
            self.channel, exchange=self.exchange, serializer="json")
        self._failing = False

    def send(self, type: str, **fields: Any) -> None:
        """Publish one event; a failure is logged (once until a send works again), never raised:
        a lost connection is the consumer's to notice."""
        event = {"hostname": self.hostname, "utcoffset": utcoffset(), "pid": self.pid,
                 "clock": self.clock.forward(),
                 "timestamp": time.time(), "type": type, **fields}
        try:
            self.producer.publish(event, routing_key=type.replace("-", "."), headers=self._headers,
                                  delivery_mode=1)
        except Exception as exc:
            if not self._failing:
                logger.warning("Could not send the %s event: %r; events are dropped until sending works "
                               "again", type, exc)
            self._failing = True
            return
        self.sent += 1
        self._failing = False

    def close(self) -> None:
        try:
            self.channel.close()
        except Exception:
            pass  # the connection is gone with it

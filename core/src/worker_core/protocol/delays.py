"""What Celery's native delayed delivery leaves on a message: the bits of its delay before its
routing key (``1.0.0. ... .1.feed.new``), and the exchange it comes out of. A broker that holds
countdowns (:class:`~worker_core.slots.DelaysOnBroker`) lays the delays out so; a retry and a
dead letter go back by the routing key without them."""

from __future__ import annotations

import re

__all__ = ["DELAY_LEVELS", "DELIVERY_EXCHANGE", "strip_delay"]

#: the bits of a delay (seconds, up to ``2**28 - 1``) written before a routing key
DELAY_LEVELS = 28
#: the exchange delayed messages come out of, towards the queues bound to it
DELIVERY_EXCHANGE = "celery_delayed_delivery"

_DELAY_PREFIX = re.compile(rf"^(?:[01]\.){{{DELAY_LEVELS}}}")


def strip_delay(routing_key: str) -> str:
    """A routing key without the delay bits a broker-side delay put before it."""
    return _DELAY_PREFIX.sub("", routing_key, count=1)

"""Which headers of a task message are the protocol's and which are the sender's own
(``apply_async(headers={...})``), as Celery tells them apart for ``task.request.headers``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEAD_LETTER_HEADERS",
    "DELIVERY_COUNT",
    "LOST_HEADER",
    "PROTOCOL_HEADERS",
    "carried_count",
    "custom_headers",
]

#: Header counting the processes a task has killed, so a poison message stops coming back
#: (the worker's own, never one of the sender's).
LOST_HEADER = "x-worker-lost"

#: The header in which a RabbitMQ quorum queue counts a message's earlier deliveries that ended
#: without an acknowledgement (the broker's own count: it survives the worker).
DELIVERY_COUNT = "x-delivery-count"

#: Celery's protocol headers and the names of its request's attributes (which a header may not
#: take): every other header of a message is the sender's own.
PROTOCOL_HEADERS = frozenset({
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries", "timelimit",
    "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin", "ignore_result", "replaced_task_nesting",
    "stamped_headers", "stamps", "compression",
    "args", "kwargs", "callbacks", "errbacks", "chain", "chord", "called_directly", "correlation_id",
    "delivery_info", "headers", "hostname", "is_eager", "logfile", "loglevel", "properties", "reply_to",
    "taskset", "time_limit", "soft_time_limit", "utc", "children",
    LOST_HEADER, DELIVERY_COUNT,
})


#: RabbitMQ's dead-lettering headers: a retry leaves them out of its message, as Celery's does,
#: or RabbitMQ would take the new message for a dead-letter cycle.
DEAD_LETTER_HEADERS = frozenset({
    "x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
    "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason",
})


def custom_headers(headers: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sender's own headers of a message, or None when it has none (Celery's
    ``request.headers``)."""
    if PROTOCOL_HEADERS.issuperset(headers):  # a message from Celery's or this client: no copying
        return None
    return {key: value for key, value in headers.items() if key not in PROTOCOL_HEADERS}


def carried_count(headers: Mapping[str, Any]) -> int:
    """How many earlier deliveries of a task ended without an outcome, as its message carries it:
    the prefork pool's count of lost children (:data:`LOST_HEADER`) plus the broker's count of
    this message's returns (:data:`DELIVERY_COUNT`)."""
    lost, returned = headers.get(LOST_HEADER), headers.get(DELIVERY_COUNT)
    return ((lost if type(lost) is int and lost > 0 else 0)
            + (returned if type(returned) is int and returned > 0 else 0))

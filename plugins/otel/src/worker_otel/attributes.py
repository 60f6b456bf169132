"""The span names, kinds and attributes of OpenTelemetry's Celery instrumentation
(``opentelemetry-instrumentation-celery``), so a trace reads the same whichever worker ran the task
and whichever client sent it.

- publishing: ``apply_async/<task name>``, kind PRODUCER, with ``celery.action=apply_async``,
  ``messaging.message.id``, ``celery.task_name`` and what the publish names (exchange, routing
  key, what it declares);
- running: ``run/<task name>``, kind CONSUMER, with ``celery.action=run``, ``celery.state``,
  ``celery.task_name`` and what the task's request holds (its id, delivery info and routing key,
  hostname, retries, time limits, ...); a failure is the span's ERROR status and its exception,
  a retry ``celery.retry.reason``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["ACTION", "PUBLISH", "RUN", "TASK_NAME", "request_attributes"]

ACTION = "celery.action"
TASK_NAME = "celery.task_name"
RETRY_REASON = "celery.retry.reason"
PUBLISH = "apply_async"
RUN = "run"
MESSAGE_ID = "messaging.message.id"
DESTINATION = "messaging.destination"
CONVERSATION_ID = "messaging.conversation_id"
DESTINATION_KIND = "messaging.destination_kind"

#: what the instrumentation reads of a request (or of a publish), in its order: a later key
#: writes over an earlier one of the same attribute (``origin`` over ``hostname``)
READ = ("compression", "correlation_id", "countdown", "delivery_info", "declare", "eta", "exchange",
        "expires", "hostname", "id", "priority", "queue", "reply_to", "retries", "routing_key", "serializer",
        "timelimit", "origin", "state")
#: keys whose attribute is not ``celery.<key>``
RENAMED = {"id": MESSAGE_ID, "correlation_id": CONVERSATION_ID, "routing_key": DESTINATION,
           "declare": DESTINATION_KIND, "origin": "celery.hostname"}


def request_attributes(get: Callable[[str], Any]) -> dict[str, Any]:
    """The attributes of what ``get(key)`` reads (a task's request, or a publish's arguments)."""
    found: dict[str, Any] = {}
    for key in READ:
        value = get(key)
        if value is None or value == "":
            continue
        if key == "timelimit":
            if list(value) == [None, None]:
                continue
            if None in value:
                value = ["" if limit is None else str(limit) for limit in value]
        elif key == "retries" and value == 0:
            continue
        elif key == "delivery_info":
            routing_key = value.get("routing_key")
            if routing_key is not None:
                found[DESTINATION] = routing_key
            value = str(value)
        elif key == "declare":
            value = _destination_kind(value)
        found[RENAMED.get(key, f"celery.{key}")] = _attribute_value(value)
    return found


def _destination_kind(declared: Iterable[Any]) -> Any:
    """``queue`` for a direct exchange, ``topic`` for a topic one (the first declared that is
    either), else the declared entities as they are."""
    entities = list(declared)
    for entity in entities:
        kind = getattr(getattr(entity, "exchange", None), "type", None)
        if kind == "direct":
            return "queue"
        if kind == "topic":
            return "topic"
    return str(entities)


def _attribute_value(value: Any) -> Any:
    """What OpenTelemetry takes as an attribute: a str, bool, int or float, or a sequence of one
    of them."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(item, (str, bool, int, float)) for item in value):
        return list(value)
    return str(value)

"""The plain-data form of ``task_queues`` (also JSON in ``WORKER_TASK_QUEUES``), Celery's
``{name: options}`` form and kombu ``Queue`` objects, read into kombu queues and checked, each
mistake in one line naming the queue and the key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import kombu

from ..exceptions import ConfigurationError
from ..options import did_you_mean

#: kombu's entities, untyped there: the names say which is meant
Queue = Any
Exchange = Any
_kombu: Any = kombu

__all__ = ["BINDING_KEYS", "EXCHANGE_TYPES", "QUEUE_KEYS", "QUEUE_TYPES", "as_queue", "check_queues",
           "queue_from_data"]

QUEUE_TYPES = ("classic", "quorum")
EXCHANGE_TYPES = ("direct", "topic", "fanout", "headers")

#: the keys of a queue given as plain data (``task_queues=[{"name": ..., ...}]``, or as JSON in
#: ``WORKER_TASK_QUEUES``)
QUEUE_KEYS = frozenset(
    {
        "name",
        "exchange",
        "exchange_type",
        "routing_key",
        "bindings",
        "queue_arguments",
        "binding_arguments",
        "consumer_arguments",
        "durable",
        "auto_delete",
        "exclusive",
        "max_priority",
        "queue_type",
        "message_ttl",
        "expires",
        "max_length",
    }
)
BINDING_KEYS = frozenset({"exchange", "exchange_type", "routing_key", "arguments"})

_EXAMPLE = (
    "for example {'name': 'feed', 'exchange': 'feed', 'exchange_type': 'topic', 'routing_key': 'feed.#'}"
)


def _fail(where: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: {problem}")


def _exchange(value: Any, kind: Any, where: str) -> Exchange:
    """An exchange from a name (and a type) or from a kombu ``Exchange``."""
    if isinstance(value, _kombu.Exchange):
        return value
    if isinstance(value, Mapping):
        kind = value.get("type", kind)
        value = value.get("name")
    if not isinstance(value, str):
        raise _fail(where, f"'exchange' must be an exchange name or a kombu Exchange (got {value!r})")
    kind = kind or "direct"
    if kind not in EXCHANGE_TYPES:
        raise _fail(
            where,
            f"exchange type must be one of {', '.join(EXCHANGE_TYPES)} (got {kind!r})."
            f"{did_you_mean(str(kind), EXCHANGE_TYPES)}",
        )
    return _kombu.Exchange(value, type=kind)


def _text(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise _fail(where, f"{key!r} must be a string (got {value!r})")
    return value


def _mapping(data: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise _fail(where, f"{key!r} must be an object of arguments (got {value!r})")
    return dict(value) if value is not None else None


def queue_from_data(data: Mapping[str, Any], where: str) -> Queue:
    """A kombu queue from its plain-data form (the keys of :data:`QUEUE_KEYS`)."""
    unknown = sorted(set(data) - QUEUE_KEYS)
    if unknown:
        raise _fail(
            where,
            f"unknown key {unknown[0]!r}.{did_you_mean(unknown[0], QUEUE_KEYS)} A queue's keys "
            f"are {', '.join(sorted(QUEUE_KEYS))}",
        )
    name = data.get("name")
    if not isinstance(name, str) or not name or name != name.strip():
        raise _fail(where, f"a queue needs a 'name' without surrounding spaces (got {name!r}); {_EXAMPLE}")
    arguments = _mapping(data, "queue_arguments", where) or {}
    queue_type = data.get("queue_type")
    if queue_type is not None:
        if queue_type not in QUEUE_TYPES:
            raise _fail(where, f"'queue_type' must be one of {', '.join(QUEUE_TYPES)} (got {queue_type!r})")
        arguments.setdefault("x-queue-type", queue_type)
    for key, argument in (
        ("max_priority", "x-max-priority"),
        ("message_ttl", "x-message-ttl"),
        ("expires", "x-expires"),
        ("max_length", "x-max-length"),
    ):
        value = data.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise _fail(where, f"{key!r} must be a number of at least 0 (got {value!r})")
            # RabbitMQ takes milliseconds for times; the plain data gives seconds, as kombu's Queue
            arguments[argument] = int(value * 1000) if key in ("message_ttl", "expires") else int(value)
    exchange_name = data.get("exchange")
    exchange_type = _text(data, "exchange_type", where)
    routing_key = _text(data, "routing_key", where)
    bindings = data.get("bindings")
    options: dict[str, Any] = {}
    for flag in ("durable", "auto_delete", "exclusive"):
        if flag in data:
            if not isinstance(data[flag], bool):
                raise _fail(where, f"{flag!r} must be true or false (got {data[flag]!r})")
            options[flag] = data[flag]
    consumer_arguments = _mapping(data, "consumer_arguments", where)
    if bindings is not None:
        if not isinstance(bindings, Sequence) or isinstance(bindings, str) or not bindings:
            raise _fail(
                where,
                f"'bindings' must be a non-empty list of {{'exchange': ..., 'routing_key': ...}} "
                f"(got {bindings!r})",
            )
        made = []
        for index, item in enumerate(bindings):
            if isinstance(item, _kombu.binding):
                made.append(item)
                continue
            at = f"{where}, binding {index}"
            if not isinstance(item, Mapping):
                raise _fail(
                    at,
                    f"a binding must be an object such as {{'exchange': 'feed', 'routing_key': "
                    f"'feed.#'}} (got {item!r})",
                )
            extra = sorted(set(item) - BINDING_KEYS)
            if extra:
                raise _fail(
                    at, f"unknown key {extra[0]!r}; a binding's keys are {', '.join(sorted(BINDING_KEYS))}"
                )
            made.append(
                _kombu.binding(
                    _exchange(item.get("exchange"), item.get("exchange_type"), at),
                    routing_key=_text(item, "routing_key", at) or "",
                    arguments=_mapping(item, "arguments", at),
                )
            )
        return _kombu.Queue(
            name,
            bindings=made,
            queue_arguments=arguments or None,
            consumer_arguments=consumer_arguments,
            **options,
        )
    # without an exchange, the topology gives it the default exchange, as Celery does
    if exchange_name is None and exchange_type is not None:  # a type alone: an exchange of its name
        exchange_name = name
    exchange = None if exchange_name is None else _exchange(exchange_name, exchange_type, where)
    return _kombu.Queue(
        name,
        exchange,
        routing_key=name if routing_key is None else routing_key,
        queue_arguments=arguments or None,
        binding_arguments=_mapping(data, "binding_arguments", where),
        consumer_arguments=consumer_arguments,
        **options,
    )


def as_queue(item: Any, where: str, name: str | None = None) -> Queue:
    """A kombu queue from a kombu ``Queue`` (as it is) or its plain data (``name`` given by the
    key of Celery's ``{name: options}`` form)."""
    if isinstance(item, _kombu.Queue):
        if not item.name:
            raise _fail(where, "a kombu Queue in task_queues needs a name")
        return item
    if isinstance(item, Mapping):
        return queue_from_data({"name": name, **item} if name is not None else item, where)
    raise _fail(
        where,
        f"each queue must be a kombu Queue or an object such as "
        f"{{'name': 'feed', 'exchange_type': 'topic', 'routing_key': 'feed.#'}} (got {item!r} "
        f"that is a {type(item).__name__})",
    )


def _items(value: Any) -> Iterable[tuple[str, Any, str | None]]:
    if isinstance(value, Mapping):  # Celery's {name: {exchange: ..., routing_key: ...}}
        for name, options in value.items():
            yield f"task_queues[{name!r}]", options if options is not None else {}, name
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield f"task_queues[{index}]", item, None
    else:
        raise ConfigurationError(
            f"setting 'task_queues' must be a list of queues (kombu Queue objects or objects such as "
            f"{{'name': 'feed', 'exchange_type': 'topic', 'routing_key': 'feed.#'}}) or None (got "
            f"{value!r} that is a {type(value).__name__})"
        )


def check_queues(value: Any) -> tuple[Queue, ...] | None:
    """The queues of a ``task_queues`` value, checked; None when it is None."""
    if value is None:
        return None
    queues: list[Queue] = []
    seen: set[str] = set()
    for where, item, name in _items(value):
        queue = as_queue(item, where, name)
        if queue.name in seen:
            raise ConfigurationError(f"setting 'task_queues' names the queue {queue.name!r} twice")
        seen.add(queue.name)
        queues.append(queue)
    return tuple(queues)

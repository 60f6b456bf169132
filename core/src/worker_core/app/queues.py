"""Celery's routing model, the queues' side: ``task_queues`` (kombu ``Queue`` objects or plain
data), the default queue, queues made on demand (``task_create_missing_queues``) and ``-Q``'s
choice among them, each queue with its exchange, bindings and arguments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import kombu

from ..exceptions import ConfigurationError
from ..options import did_you_mean
from .queue_data import EXCHANGE_TYPES, QUEUE_TYPES, as_queue, check_queues, queue_from_data

if TYPE_CHECKING:
    from .settings import Settings

#: kombu's entities, untyped there: the names say which is meant
Queue = Any
Exchange = Any
_kombu: Any = kombu

__all__ = ["EXCHANGE_TYPES", "QUEUE_TYPES", "Topology", "as_queue", "check_queues", "is_quorum",
           "queue_from_data", "queue_type_of"]


def queue_type_of(queue: Queue) -> str:
    return str((queue.queue_arguments or {}).get("x-queue-type") or "classic")


def is_quorum(queue: Queue) -> bool:
    return queue_type_of(queue) == "quorum"


@attrs.frozen
class Topology:
    """The queues an app knows (``task_queues``, else the default queue), by name, and how it
    makes the others."""

    queues: Mapping[str, Queue]
    default_queue: str
    default_exchange: Exchange
    default_routing_key: str
    create_missing: bool
    missing_queue_type: str
    missing_exchange_type: str | None
    max_priority: int | None
    #: queues made on demand, by name (made once)
    _made: dict[str, Queue] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        configured = check_queues(settings.task_queues)
        name = settings.task_default_queue
        exchange = _kombu.Exchange(
            settings.task_default_exchange or name, type=settings.task_default_exchange_type
        )
        routing_key = settings.task_default_routing_key or name
        if not configured:
            arguments = {"x-queue-type": "quorum"} if settings.task_default_queue_type == "quorum" else None
            configured = (_kombu.Queue(name, exchange, routing_key=routing_key, queue_arguments=arguments),)
        made = cls(
            queues={},
            default_queue=name,
            default_exchange=exchange,
            default_routing_key=routing_key,
            create_missing=settings.task_create_missing_queues,
            missing_queue_type=settings.task_create_missing_queue_type,
            missing_exchange_type=settings.task_create_missing_queue_exchange_type,
            max_priority=settings.task_queue_max_priority,
        )
        return attrs.evolve(made, queues={queue.name: made._prepared(queue) for queue in configured})

    def _prepared(self, queue: Queue) -> Queue:
        """``task_queue_max_priority`` on a queue that sets none, as Celery adds it; a quorum
        queue takes no ``x-max-priority`` (RabbitMQ refuses it; 4.0 and later prioritise
        quorum queues' messages without it)."""
        copy: Queue = queue.__copy__()
        if copy.exchange is None or not copy.exchange.name:  # as Celery gives them the default one
            copy.exchange = self.default_exchange
        if not copy.routing_key:
            copy.routing_key = self.default_routing_key
        arguments = dict(copy.queue_arguments or {})
        if self.max_priority is not None and "x-max-priority" not in arguments and not is_quorum(copy):
            arguments["x-max-priority"] = self.max_priority
            copy.queue_arguments = arguments
        return copy

    def queue(self, name: str) -> Queue:
        """The queue ``name``: as configured, else made as Celery makes a missing queue (bound to
        a direct exchange of its name, or of ``task_create_missing_queue_exchange_type``).

        :raise ConfigurationError: it is not configured and ``task_create_missing_queues`` is off.
        """
        found = self.queues.get(name) or self._made.get(name)
        if found is not None:
            return found
        if not self.create_missing:
            known = list(self.queues)
            raise ConfigurationError(
                f"queue {name!r} is not in task_queues and task_create_missing_queues is off."
                f"{did_you_mean(name, known)} The queues are {', '.join(known)}; add it to task_queues or "
                f"turn task_create_missing_queues on"
            )
        arguments = {"x-queue-type": "quorum"} if self.missing_queue_type == "quorum" else None
        exchange = _kombu.Exchange(name, type=self.missing_exchange_type or "direct")
        made = self._made[name] = self._prepared(
            _kombu.Queue(name, exchange, routing_key=name, queue_arguments=arguments)
        )
        return made

    def select(self, names: Iterable[str]) -> list[Queue]:
        """The queues ``-Q`` names, in its order."""
        return [self.queue(name) for name in names]

    def uses_quorum(self) -> bool:
        """Whether a configured queue is a quorum queue (Celery's test for native delayed
        delivery and per-consumer prefetch)."""
        return any(is_quorum(queue) for queue in self.queues.values())

    def exchange(self, name: str) -> Exchange | None:
        """The exchange ``name`` as the configured queues declare it (None: unknown)."""
        for queue in self.queues.values():
            for exchange in _exchanges_of(queue):
                if exchange.name == name:
                    return exchange
        return None

    def exchange_type(self, name: str) -> str | None:
        """The type of the exchange ``name`` as the configured queues declare it (None: unknown)."""
        exchange = self.exchange(name)
        return None if exchange is None else str(exchange.type)


def _exchanges_of(queue: Queue) -> list[Exchange]:
    if queue.bindings:
        return [binding.exchange for binding in queue.bindings if binding.exchange is not None]
    return [queue.exchange] if queue.exchange is not None else []

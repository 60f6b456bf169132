"""Celery's routing model, the client's side: ``task_routes`` (a dict of names, glob and regex
patterns; router functions; a list of them, first answer wins) turned into where a task's message
goes: an exchange, a routing key and the queue declared on the way."""

from __future__ import annotations

import fnmatch
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import kombu

from ..exceptions import ConfigurationError
from ..protocol.delays import DELIVERY_EXCHANGE

if TYPE_CHECKING:
    from .queues import Queue, Topology

_kombu: Any = kombu

__all__ = ["ROUTE_KEYS", "Destination", "Router", "check_routes"]

#: what a route may say (Celery's route dicts): the rest of a publish is the caller's
ROUTE_KEYS = frozenset({"queue", "exchange", "exchange_type", "routing_key", "priority"})

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*$")


@attrs.frozen
class Destination:
    """Where one message goes: ``queue`` is declared first (None: the exchange routes it)."""

    exchange: str
    routing_key: str
    exchange_type: str
    queue: Queue | None
    priority: int | None = None
    #: what is declared before the first publish: the queue, else the exchange when it is known
    #: (a virtual transport routes only through an exchange it knows the type of)
    declare: tuple[Any, ...] = ()


class _MapRoute:
    """A dict router: exact names first, then patterns (``*`` globs and compiled regexes) in order."""

    def __init__(self, table: Mapping[Any, Any] | Sequence[tuple[Any, Any]]) -> None:
        pairs = table.items() if isinstance(table, Mapping) else table
        self.exact: dict[str, Any] = {}
        self.patterns: list[tuple[re.Pattern[str], Any]] = []
        for key, route in pairs:
            if isinstance(key, re.Pattern):
                self.patterns.append((key, route))
            elif isinstance(key, str) and "*" in key:
                self.patterns.append((re.compile(fnmatch.translate(key)), route))
            elif isinstance(key, str):
                self.exact[key] = route
            else:
                raise ConfigurationError(
                    f"setting 'task_routes': a key must be a task name, a glob pattern or a "
                    f"compiled regex (got {key!r})"
                )

    def __call__(self, name: str, *_args: Any, **_kwargs: Any) -> Any:
        if name in self.exact:
            return self.exact[name]
        for pattern, route in self.patterns:
            if pattern.match(name):
                return route
        return None


def _import(path: str) -> Any:
    module, _, attribute = path.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"setting 'task_routes': cannot import the router {path!r}: {exc}") from None


def check_routes(value: Any, *, resolve: bool = True) -> tuple[Callable[..., Any], ...]:
    """The routers of a ``task_routes`` value, in order; a dotted path is imported only when
    ``resolve`` (the settings check its shape without importing the router's module)."""
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else (value,)
    routers: list[Callable[..., Any]] = []
    for item in items:
        if isinstance(item, (Mapping, list, tuple)):
            routers.append(_MapRoute(item))
        elif isinstance(item, str):
            if not _DOTTED.match(item):
                raise ConfigurationError(
                    f"setting 'task_routes': {item!r} is not a dotted path to a router function, such as "
                    f"'proj.routers.route_task' (a dict of routes is written as JSON in WORKER_TASK_ROUTES)"
                )
            if not resolve:
                continue
            found = _import(item)
            routers.append(found() if isinstance(found, type) else found)
        elif callable(item):
            routers.append(item)
        else:
            raise ConfigurationError(
                f"setting 'task_routes' must be a dict, a router function, a dotted path to one, or a list "
                f"of "
                f"them (got {item!r} that is a {type(item).__name__})"
            )
    return tuple(routers)


class Router:
    """Celery's ``Router``: the caller's queue, exchange and routing key win over the route's,
    the route's over the default queue's."""

    def __init__(self, routes: Any, topology: Topology) -> None:
        self.routers = check_routes(routes)
        self.topology = topology
        self._known: dict[tuple[str, str | None, str | None, str | None], Destination] = {}

    def _ask(
        self, router: Callable[..., Any], name: str, args: Any, kwargs: Any, options: Mapping[str, Any]
    ) -> Any:
        legacy = getattr(router, "route_for_task", None)
        if legacy is not None:
            return legacy(name, args, kwargs)
        return router(name, args, kwargs, options, task=None)

    def _lookup(self, name: str, args: Any, kwargs: Any, options: Mapping[str, Any]) -> dict[str, Any] | None:
        for router in self.routers:
            route = self._ask(router, name, args, kwargs, options)
            if route is None:
                continue
            if isinstance(route, str):
                return {"queue": route}
            if not isinstance(route, Mapping):
                raise ConfigurationError(
                    f"task_routes: the route of {name!r} must be a queue name or a dict (got {route!r})"
                )
            unknown = sorted(set(route) - ROUTE_KEYS)
            if unknown:
                raise ConfigurationError(
                    f"task_routes: the route of {name!r} has the key {unknown[0]!r}; a route "
                    f"says {', '.join(sorted(ROUTE_KEYS))}"
                )
            return dict(route)
        return None

    def route(
        self,
        name: str,
        queue: str | None = None,
        exchange: str | None = None,
        routing_key: str | None = None,
        args: Any = None,
        kwargs: Any = None,
        options: Mapping[str, Any] | None = None,
    ) -> Destination:
        """Where the task ``name`` goes, given the caller's ``queue``/``exchange``/``routing_key``."""
        if (
            not self.routers
            and isinstance(queue, (str, type(None)))
            and isinstance(exchange, (str, type(None)))
        ):
            # no router looks at the call: the same arguments go the same way (the hot path)
            key = (name, queue, exchange, routing_key)
            found = self._known.get(key)
            if found is None:
                found = self._known[key] = self._route(
                    name, queue, exchange, routing_key, args, kwargs, options
                )
            return found
        return self._route(name, queue, exchange, routing_key, args, kwargs, options)

    def _route(
        self,
        name: str,
        queue: Any,
        exchange: Any,
        routing_key: str | None,
        args: Any,
        kwargs: Any,
        options: Mapping[str, Any] | None,
    ) -> Destination:
        chosen: dict[str, Any] = {"queue": queue, "exchange": exchange, "routing_key": routing_key}
        route = self._lookup(name, args or (), kwargs or {}, options or {}) if self.routers else None
        for key, value in (route or {}).items():
            if chosen.get(key) is None:
                chosen[key] = value
        queue_name = chosen.pop("queue", None)
        if queue_name is None and chosen.get("exchange") is None:
            queue_name = self.topology.default_queue
        return self._destination(chosen, queue_name)

    def _destination(self, chosen: Mapping[str, Any], queue_name: Any) -> Destination:
        """Celery's choice: on a direct exchange without both an exchange and a routing key, the
        default exchange with the queue's name; otherwise the queue's exchange and routing key."""
        queue: Queue | None = None
        if queue_name is not None:
            queue = queue_name if not isinstance(queue_name, str) else self.topology.queue(queue_name)
        exchange = chosen.get("exchange")
        if exchange is not None and not isinstance(exchange, str):  # a kombu Exchange
            exchange_type = chosen.get("exchange_type") or getattr(exchange, "type", None)
            exchange = getattr(exchange, "name", "")
        else:
            exchange_type = chosen.get("exchange_type")
        if exchange_type is None and exchange == DELIVERY_EXCHANGE:
            exchange_type = "topic"  # a retry of a message that came out of a broker-side delay
        if exchange_type is None:
            if queue is not None and queue.exchange is not None:
                exchange_type = queue.exchange.type
            elif exchange:
                exchange_type = self.topology.exchange_type(exchange) or "direct"
            else:
                exchange_type = "direct"
        routing_key = chosen.get("routing_key")
        if (not exchange or not routing_key) and exchange_type == "direct":
            exchange, routing_key = "", queue.name if queue is not None else routing_key or ""
        elif exchange is None:
            exchange = (
                queue.exchange.name if queue is not None and queue.exchange is not None else ""
            ) or self.topology.default_exchange.name
            routing_key = (
                routing_key
                or (queue.routing_key if queue is not None else "")
                or self.topology.default_routing_key
            )
        declare: tuple[Any, ...] = ()
        if queue is not None:
            declare = (queue,)
        elif exchange:
            known = self.topology.exchange(exchange)
            if known is None and chosen.get("exchange_type"):
                known = _kombu.Exchange(exchange, type=chosen["exchange_type"])
            declare = () if known is None else (known,)
        return Destination(
            exchange=exchange,
            routing_key=routing_key or "",
            exchange_type=str(exchange_type),
            queue=queue,
            priority=chosen.get("priority"),
            declare=declare,
        )

"""``broker_transport_options`` (and ``result_backend_transport_options``) of the Redis Cluster
transport, checked once into one configuration object; an unknown name is refused with a
suggestion, a bad value names the option, what it must be and an example."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_value

from .tls import resolve_tls
from .urls import ClusterUrl, parse_url

__all__ = [
    "BACKEND_OPTIONS",
    "BROKER_OPTIONS",
    "BackendConfig",
    "BrokerConfig",
    "check_backend",
    "check_broker",
]

#: Options with a value of their own: name -> (default, description). The documentation's table is
#: this mapping.
BROKER_OPTIONS: Mapping[str, tuple[Any, str]] = {
    "visibility_timeout": (
        60.0,
        "seconds a delivered message stays leased without a renewal (renewed every quarter of it while the "
        "worker holds it)",
    ),
    "fetch_limit": (100, "the most messages one fetch script takes from a queue"),
    "polling_interval": (
        1.0,
        "seconds between the fallback looks at every queue and the rounds that give back messages whose "
        "lease lapsed",
    ),
    "priority_steps": (
        [0, 3, 6, 9],
        "the priority lists of each queue (a message goes to the step at or below its priority; the lower "
        "number is served first)",
    ),
    "global_keyprefix": ("", "a prefix for every key and channel (no '{' or '}' in it)"),
    "wait_for_replicas": (
        0,
        "after each write (publish, fetch, acknowledgement), WAIT until this many replicas have it; a write "
        "they do not confirm in time is logged with the messages it concerns",
    ),
    "wait_timeout": (1.0, "seconds WAIT waits for the replicas"),
    "sharded_pubsub": (
        None,
        "wake consumers and fan out through sharded pub/sub (SPUBLISH, Redis 7); None asks the server, False "
        "uses PUBLISH",
    ),
    "sharded_queues": (
        {},
        "queues spread over several slots: {'name': number of shards}; producers and consumers must agree",
    ),
    "socket_timeout": (10.0, "seconds a node may take to answer a command"),
    "socket_connect_timeout": (3.0, "seconds a connection to a node may take"),
    "max_connections": (None, "the most connections to one node (redis-py's pool)"),
    "health_check_interval": (0, "seconds after which an idle connection is checked with PING before use"),
    "socket_keepalive": (None, "TCP keepalive on the nodes' connections"),
    "client_name": (None, "the connections' CLIENT SETNAME"),
    "username": (None, "the ACL user (also the URL's user)"),
    "password": (None, "the password (also the URL's password)"),
    "ssl": (None, "redis-py SSL arguments, as broker_use_ssl"),
}
#: kombu's reconnection options (read by kombu.Connection and the worker's connector) and kombu's
#: virtual channel options, passed through as they are.
PASSED = frozenset(
    {
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "connect_retries_timeout",
        "errback",
        "body_encoding",
    }
)

BACKEND_OPTIONS: Mapping[str, tuple[Any, str]] = {
    "global_keyprefix": ("", "a prefix for every result key (Celery's spelling)"),
    "result_chord_ordered": (True, "keep a chord's results in header order (a sorted set), as Celery"),
    "retry_policy": (
        None,
        "Celery's retry policy for result writes: max_retries, interval_start, interval_step, interval_max",
    ),
    "sharded_pubsub": (None, "wait for results on sharded pub/sub (None asks the server)"),
    "socket_timeout": (10.0, "seconds a node may take to answer a command"),
    "socket_connect_timeout": (3.0, "seconds a connection to a node may take"),
    "max_connections": (None, "the most connections to one node"),
    "health_check_interval": (0, "seconds after which an idle connection is checked before use"),
    "client_name": (None, "the connections' CLIENT SETNAME"),
    "username": (None, "the ACL user (also the URL's user)"),
    "password": (None, "the password (also the URL's password)"),
}
_BACKEND_IGNORED = frozenset({"visibility_timeout"})
DEFAULT_RETRY_POLICY: Mapping[str, float] = {
    "max_retries": 20,
    "interval_start": 0,
    "interval_step": 1,
    "interval_max": 1,
}
#: options that are redis-py connection arguments
_CONNECTION = (
    "socket_timeout",
    "socket_connect_timeout",
    "max_connections",
    "health_check_interval",
    "socket_keepalive",
    "client_name",
    "username",
    "password",
)


def _bad(where: str, name: str, value: Any, expected: str, example: Any) -> ConfigurationError:
    return ConfigurationError(
        f"{where} {name!r} must be {expected} (got {redact_value(name, value)!r} that is a "
        f"{type(value).__name__}); for example {{{name!r}: {example!r}}}"
    )


def _number(
    *, above: float | None = None, minimum: float | None = None, optional: bool = False
) -> Callable[[str, str, Any], Any]:
    def check(where: str, name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and above is not None and value <= above:
            ok = False
        if ok and minimum is not None and value < minimum:
            ok = False
        if not ok:
            bound = f"greater than {above:g}" if above is not None else f"at least {minimum:g}"
            raise _bad(where, name, value, f"a number {bound}" + (" or None" if optional else ""), 60)
        return float(value)

    return check


def _integer(minimum: int, optional: bool = False) -> Callable[[str, str, Any], Any]:
    def check(where: str, name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _bad(where, name, value, f"a whole number, at least {minimum}", max(minimum, 10))
        return value

    return check


def _prefix(where: str, name: str, value: Any) -> Any:
    if not isinstance(value, str) or "{" in value or "}" in value:
        raise _bad(
            where, name, value, "a string without '{' or '}' (the braces are the keys' hash tags)", "myapp:"
        )
    return value


def _steps(where: str, name: str, value: Any) -> Any:
    ok = (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(step, int) and not isinstance(step, bool) for step in value)
        and value[0] == 0
        and all(a < b for a, b in itertools.pairwise(value))
        and value[-1] <= 255
    )
    if not ok:
        raise _bad(where, name, value, "an increasing list of whole numbers starting at 0", [0, 3, 6, 9])
    return tuple(value)


def _tristate(where: str, name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, bool):
        raise _bad(where, name, value, "True, False or None", None)
    return value


def _shards(where: str, name: str, value: Any) -> Any:
    ok = isinstance(value, Mapping) and all(
        isinstance(queue, str)
        and queue
        and isinstance(count, int)
        and not isinstance(count, bool)
        and 1 <= count <= 1024
        for queue, count in value.items()
    )
    if not ok:
        raise _bad(
            where, name, value, "a mapping of queue names to a number of shards from 1 to 1024", {"busy": 6}
        )
    return dict(value)


def _anything(where: str, name: str, value: Any) -> Any:
    return value


def _text(where: str, name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise _bad(where, name, value, "a string", "worker")
    return value


def _retry_policy(where: str, name: str, value: Any) -> Any:
    if value is not None and (not isinstance(value, Mapping) or not set(value) <= set(DEFAULT_RETRY_POLICY)):
        raise _bad(
            where,
            name,
            value,
            f"a mapping with keys among {', '.join(DEFAULT_RETRY_POLICY)}",
            dict(DEFAULT_RETRY_POLICY),
        )
    return value


_CHECKS: Mapping[str, Callable[[str, str, Any], Any]] = {
    "visibility_timeout": _number(above=0),
    "fetch_limit": _integer(1),
    "polling_interval": _number(above=0),
    "priority_steps": _steps,
    "global_keyprefix": _prefix,
    "wait_for_replicas": _integer(0),
    "wait_timeout": _number(above=0),
    "sharded_pubsub": _tristate,
    "sharded_queues": _shards,
    "socket_timeout": _number(above=0, optional=True),
    "socket_connect_timeout": _number(above=0, optional=True),
    "max_connections": _integer(1, optional=True),
    "health_check_interval": _number(minimum=0),
    "socket_keepalive": _tristate,
    "client_name": _text,
    "username": _text,
    "password": _text,
    "ssl": _anything,
    "result_chord_ordered": _tristate,
    "retry_policy": _retry_policy,
}


def _read(
    where: str,
    given: Mapping[str, Any],
    known: Mapping[str, tuple[Any, str]],
    passed: frozenset[str],
    what: str,
) -> dict[str, Any]:
    values = {name: default for name, (default, _) in known.items()}
    for name, value in given.items():
        if name not in known:
            if name in passed:
                continue
            names = sorted({*known, *passed})
            raise ConfigurationError(
                f"unknown {where} {name!r} for {what}.{did_you_mean(name, names)} It reads {', '.join(names)}"
            )
        values[name] = _CHECKS[name](where, name, value)
    return values


def _connection_arguments(
    parsed: ClusterUrl, values: Mapping[str, Any], tls: Mapping[str, Any] | None
) -> dict[str, Any]:
    arguments = {name: values[name] for name in _CONNECTION if values.get(name) is not None}
    if parsed.username and "username" not in arguments:
        arguments["username"] = parsed.username
    if parsed.password and "password" not in arguments:
        arguments["password"] = parsed.password
    if tls is not None:
        arguments.update(tls, ssl=True)
    return arguments


@attrs.frozen
class BrokerConfig:
    """Everything the broker side needs, checked."""

    url: str
    seeds: tuple[tuple[str, int], ...]
    #: redis-py's arguments for every node's connections (credentials, timeouts, TLS)
    connection: Mapping[str, Any]
    tls: Mapping[str, Any] | None
    visibility_timeout: float
    fetch_limit: int
    polling_interval: float
    priority_steps: tuple[int, ...]
    key_prefix: str
    wait_for_replicas: int
    wait_timeout: float
    sharded_pubsub: bool | None
    sharded_queues: Mapping[str, int]
    #: the options kombu reads itself, passed on
    passed: Mapping[str, Any]

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows (no secrets)."""
        return {
            "transport": "redis-cluster",
            "seeds": [f"{host}:{port}" for host, port in self.seeds],
            "tls": self.tls is not None,
            "visibility_timeout": self.visibility_timeout,
            "fetch_limit": self.fetch_limit,
            "polling_interval": self.polling_interval,
            "priority_steps": list(self.priority_steps),
            "global_keyprefix": self.key_prefix,
            "wait_for_replicas": self.wait_for_replicas,
            "sharded_queues": dict(self.sharded_queues),
        }


def check_broker(url: str, options: Mapping[str, Any], use_ssl: Any = None) -> BrokerConfig:
    """The broker's configuration from its URL, ``broker_transport_options`` and ``broker_use_ssl``."""
    parsed = parse_url(url)
    values = _read("broker transport option", options, BROKER_OPTIONS, PASSED, "the Redis Cluster transport")
    tls = resolve_tls(
        url,
        parsed,
        (("broker_use_ssl", use_ssl), ("broker_transport_options['ssl']", values["ssl"])),
        "Redis Cluster broker",
    )
    if (
        values["wait_for_replicas"]
        and values["socket_timeout"] is not None
        and values["socket_timeout"] <= values["wait_timeout"]
    ):
        raise ConfigurationError(
            f"broker transport option 'socket_timeout' ({values['socket_timeout']:g}s) must be longer than "
            f"'wait_timeout' ({values['wait_timeout']:g}s): a WAIT for the replicas would time the "
            f"connection out"
        )
    return BrokerConfig(
        url=url,
        seeds=parsed.seeds,
        connection=_connection_arguments(parsed, values, tls),
        tls=tls,
        visibility_timeout=values["visibility_timeout"],
        fetch_limit=values["fetch_limit"],
        polling_interval=values["polling_interval"],
        priority_steps=values["priority_steps"],
        key_prefix=values["global_keyprefix"],
        wait_for_replicas=values["wait_for_replicas"],
        wait_timeout=values["wait_timeout"],
        sharded_pubsub=values["sharded_pubsub"],
        sharded_queues=values["sharded_queues"],
        passed={name: value for name, value in options.items() if name in PASSED},
    )


@attrs.frozen
class BackendConfig:
    """Everything the result backend needs, checked."""

    url: str
    seeds: tuple[tuple[str, int], ...]
    connection: Mapping[str, Any]
    tls: Mapping[str, Any] | None
    #: Celery's prefix joining: ``<prefix>_celery-task-meta-<id>`` unless the prefix ends in a separator
    key_prefix: str
    chord_ordered: bool
    retry_policy: Mapping[str, float]
    sharded_pubsub: bool | None


def check_backend(url: str, options: Mapping[str, Any], use_ssl: Any = None) -> BackendConfig:
    """The result backend's configuration from its URL, ``result_backend_transport_options`` and
    ``redis_backend_use_ssl``."""
    parsed = parse_url(url)
    values = _read(
        "result backend transport option",
        options,
        BACKEND_OPTIONS,
        _BACKEND_IGNORED,
        "the Redis Cluster result backend",
    )
    tls = resolve_tls(url, parsed, (("redis_backend_use_ssl", use_ssl),), "Redis Cluster result backend")
    prefix = values["global_keyprefix"]
    if prefix and prefix[-1] not in ":_-.":
        prefix += "_"
    policy = dict(DEFAULT_RETRY_POLICY)
    policy.update(values["retry_policy"] or {})
    return BackendConfig(
        url=url,
        seeds=parsed.seeds,
        connection=_connection_arguments(parsed, values, tls),
        tls=tls,
        key_prefix=prefix,
        chord_ordered=values["result_chord_ordered"] is not False,
        retry_policy=policy,
        sharded_pubsub=values["sharded_pubsub"],
    )

"""Broker URLs and ``broker_transport_options`` for the Redis transport, checked once, with errors
that name the option, what was given and a correct example.

Every option kombu's Redis transport reads is accepted (so a Celery configuration moves over as
it is); the ones whose type matters are checked, and names nobody reads are refused, so a typo
such as ``visiblity_timeout`` fails at start-up instead of silently keeping the one-hour default.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url, redact_value

__all__ = ["DEFAULT_FETCH_LIMIT", "DEFAULT_VISIBILITY_TIMEOUT", "SCHEMES", "check_options", "check_urls"]

SCHEMES = ("redis", "rediss", "sentinel")
#: The most messages one round trip takes from Redis (the prefetch window limits it further).
DEFAULT_FETCH_LIMIT = 100
#: kombu's ``visibility_timeout`` when none is set (seconds)
DEFAULT_VISIBILITY_TIMEOUT = 3600.0
#: kombu's queue order strategies (``kombu.utils.scheduling.CYCLE_ALIASES``).
QUEUE_ORDER_STRATEGIES = ("round_robin", "priority", "sorted")

_EXAMPLE_URL = "redis://:password@127.0.0.1:6379/0"
_EXAMPLES: Mapping[str, str] = {
    "redis": _EXAMPLE_URL,
    "rediss": "rediss://:password@redis.example.com:6380/0?ssl_cert_reqs=required",
    "sentinel": "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379 with "
    "broker_transport_options={'master_name': 'mymaster'}",
}

#: Options kombu's Redis channel and transport read that are passed through unchecked.
_PASSED = frozenset({
    "body_encoding", "deadletter_queue", "ack_emulation", "unacked_key", "unacked_index_key",
    "unacked_mutex_key", "unacked_restore_limit", "fanout_prefix", "fanout_patterns",
    "socket_keepalive", "socket_keepalive_options", "retry_on_timeout", "client_name",
    "min_other_sentinels", "sentinel_kwargs", "sentinel_fanout_compat", "reauth_check_interval",
    # read by kombu.Connection (and the worker's connector) for the reconnect schedule
    "max_retries", "interval_start", "interval_step", "interval_max", "connect_retries_timeout",
    "errback",
})


def _number(*, minimum: float = 0, above: bool = False, optional: bool = False) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        ok = not isinstance(value, bool) and isinstance(value, (int, float))
        if not ok or value < minimum or (above and value == minimum):
            bound = f"greater than {minimum:g}" if above else f"at least {minimum:g}"
            raise _bad(name, value, f"a number of seconds {bound}" + (" or None" if optional else ""), 3600)
        return value

    return check


def _integer(*, minimum: int) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _bad(name, value, f"a whole number, at least {minimum}", max(minimum, 10))
        return value

    return check


def _text(*, empty: bool) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str) or (not empty and not value):
            raise _bad(name, value, "a string" if empty else "a non-empty string", "myapp:")
        return value

    return check


def _priority_steps(name: str, value: Any) -> Any:
    ok = (
        isinstance(value, (list, tuple)) and len(value) > 0
        and all(isinstance(step, int) and not isinstance(step, bool) for step in value)
        and value[0] == 0 and all(a < b for a, b in itertools.pairwise(value))
        and value[-1] <= 255
    )
    if not ok:
        raise _bad(name, value, "an increasing list of whole numbers starting at 0 (each step is a "
                   "Redis list per queue; the lower number is served first)", [0, 3, 6, 9])
    return list(value)


def _queue_order(name: str, value: Any) -> Any:
    if not isinstance(value, str) or (value not in QUEUE_ORDER_STRATEGIES and ":" not in value):
        raise _bad(name, value, f"one of {', '.join(map(repr, QUEUE_ORDER_STRATEGIES))} or "
                   f"'module:CycleClass'{did_you_mean(str(value), QUEUE_ORDER_STRATEGIES)}", "round_robin")
    return value


def _ssl(name: str, value: Any) -> Any:
    # the arguments themselves are checked with the URL's and broker_use_ssl (see .tls)
    if isinstance(value, bool):
        return value
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise _bad(name, value, "True, False or a mapping of redis-py SSL arguments",
                   {"ssl_cert_reqs": "required", "ssl_ca_certs": "/etc/ssl/certs/ca.pem"})
    return dict(value)


def _bad(name: str, value: Any, expected: str, example: Any) -> ConfigurationError:
    return ConfigurationError(
        f"broker transport option {name!r} must be {expected} (got {redact_value(name, value)!r} that is a "
        f"{type(value).__name__}); for example broker_transport_options={{{name!r}: {example!r}}}"
    )


#: Options whose values are checked; the value each check returns is what kombu gets.
_CHECKED: Mapping[str, Callable[[str, Any], Any]] = {
    "visibility_timeout": _number(above=True),
    "priority_steps": _priority_steps,
    "sep": _text(empty=False),
    "queue_order_strategy": _queue_order,
    "global_keyprefix": _text(empty=True),
    "max_connections": _integer(minimum=1),
    "socket_timeout": _number(above=True, optional=True),
    "socket_connect_timeout": _number(above=True, optional=True),
    "health_check_interval": _number(),
    "polling_interval": _number(optional=True),
    "unacked_mutex_expire": _integer(minimum=1),
    "unacked_restore_interval": _number(above=True),
    "unacked_restore_throttle": _integer(minimum=1),
    "master_name": _text(empty=False),
    "fetch_limit": _integer(minimum=1),
    "ssl": _ssl,
}
KNOWN = frozenset({*_PASSED, *_CHECKED})


def check_urls(url: str) -> tuple[str, list[str]]:
    """The scheme and the ``;``-separated URLs of ``url``, each checked (host, port, database)."""
    parts = [part.strip() for part in url.split(";") if part.strip()]
    if not parts:
        raise ConfigurationError(f"empty Redis broker URL; write it as {_EXAMPLE_URL}")
    scheme = parts[0].partition("://")[0].lower()
    for part in parts:
        _check_url(part, scheme)
    return scheme, parts


def _check_url(url: str, scheme: str) -> None:
    example = _EXAMPLES.get(scheme, _EXAMPLE_URL)
    given, sep, _ = url.partition("://")
    if not sep or given.lower() not in SCHEMES:
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r} is not a Redis URL: the scheme must be one of "
            f"{', '.join(SCHEMES)}; for example {example}"
        )
    if given.lower() != scheme:
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r} mixes schemes ({scheme!r} and {given.lower()!r}) in one "
            f"';'-separated list; for example {example}"
        )
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r} is malformed ({exc}); for example {example}") from None
    if port is not None and not 0 < port < 65536:
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r} has port {port}, outside 1-65535; for example {example}"
        )
    path = parsed.path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r} names database {path!r}: the path must be the database number "
            f"(0-15 on a default server); for example {example}"
        )


def check_options(scheme: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with checked values; unknown names and bad values raise ConfigurationError."""
    options: dict[str, Any] = {}
    for name, value in given.items():
        check = _CHECKED.get(name)
        if check is None and name not in _PASSED:
            raise ConfigurationError(
                f"unknown broker transport option {name!r} for the Redis transport."
                f"{did_you_mean(name, KNOWN)} It reads kombu's Redis options: "
                f"{', '.join(sorted(KNOWN))}"
            )
        options[name] = check(name, value) if check is not None else value
    if scheme == "sentinel" and "master_name" not in options:
        raise ConfigurationError(
            "a sentinel:// broker URL needs the master's name: set broker_transport_options="
            "{'master_name': 'mymaster'} (the name in the sentinels' 'sentinel monitor' line)"
        )
    return options

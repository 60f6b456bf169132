"""Broker and result-backend URLs and options for PostgreSQL, checked once, with errors that name the
option, what was given and a correct example.

A URL is libpq's (``postgresql://user:password@host:5432/dbname?sslmode=require``, several hosts
with ``target_session_attrs=read-write``); the schemes Celery's clients use for the same database
(``sqla+postgresql://``, ``sqla+postgresql+psycopg://``, ``db+postgresql://``, ...) are read as
the same URL, so one configuration serves both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.redaction import redact_url

__all__ = [
    "BACKEND_OPTIONS",
    "BROKER_OPTIONS",
    "DEFAULT_FETCH_LIMIT",
    "DEFAULT_POLLING_INTERVAL",
    "DEFAULT_SCHEMA",
    "DEFAULT_VISIBILITY_TIMEOUT",
    "BrokerConfig",
    "check_broker",
    "check_schema",
    "conninfo_of",
]

#: Seconds a delivered message stays leased to its worker without a renewal; the worker renews
#: the leases of what it holds every quarter of it, so only a dead (or cut off) worker's lapse.
DEFAULT_VISIBILITY_TIMEOUT = 60.0
#: Seconds between looks at the queues when no notification came (LISTEN/NOTIFY wakes a worker
#: at once; this poll only covers a notification lost with a connection).
DEFAULT_POLLING_INTERVAL = 1.0
#: The most messages one fetch takes (the prefetch window limits it further).
DEFAULT_FETCH_LIMIT = 100
DEFAULT_SCHEMA = "public"

_EXAMPLE_URL = "postgresql://worker:secret@127.0.0.1:5432/app"
_SCHEMES = re.compile(r"^(?:sqla\+|sqlalchemy\+|db\+)?(?:postgresql|postgres)(?:\+[a-z0-9_]+)?://", re.I)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def conninfo_of(url: str) -> str:
    """The libpq URL psycopg connects with: ``url`` with Celery's scheme prefixes and SQLAlchemy's
    driver name taken off (``sqla+postgresql+psycopg://h/db`` -> ``postgresql://h/db``)."""
    match = _SCHEMES.match(url)
    if match is None:
        raise ConfigurationError(
            f"{redact_url(url)!r} is not a PostgreSQL URL: use postgresql://, postgres:// (or Celery's "
            f"sqla+postgresql:// and db+postgresql://), as in {_EXAMPLE_URL}"
        )
    return "postgresql://" + url[match.end() :]


def check_schema(name: Any, what: str = "schema") -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(
            f"{what} must be a plain PostgreSQL identifier (letters, digits, _ and $, at most 63, not "
            f"starting with a digit) (got {name!r}); for example 'worker'"
        )
    return name


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(
            f"broker transport option {name!r} must be a number of seconds greater than 0 (got {value!r}"
            f" that is a {type(value).__name__}); for example {{{name!r}: 30}}"
        )
    return float(value)


def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"broker transport option {name!r} must be a whole number, at least 1 (got {value!r}); "
            f"for example {{{name!r}: 100}}"
        )
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"transport option {name!r} must be True or False (got {value!r})")
    return value


def _optional_url(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigurationError(f"transport option {name!r} must be a PostgreSQL URL (got {value!r})")
    conninfo_of(value)
    return value


def _table(name: str, value: Any) -> str:
    return check_schema(value, f"transport option {name!r}")


def _commit(name: str, value: Any) -> str:
    choices = ("on", "off", "local", "remote_write", "remote_apply")
    if value not in choices:
        raise ConfigurationError(f"transport option {name!r} must be one of {', '.join(choices)} "
                                 f"(PostgreSQL's synchronous_commit) (got {value!r})")
    return str(value)


def _threshold(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"transport option {name!r} must be a whole number or None (got {value!r})")
    return value


#: The ``broker_transport_options`` this transport reads: name -> (default, check).
BROKER_OPTIONS: Mapping[str, tuple[Any, Callable[[str, Any], Any]]] = {
    "schema": (DEFAULT_SCHEMA, lambda name, value: check_schema(value, "transport option 'schema'")),
    "visibility_timeout": (DEFAULT_VISIBILITY_TIMEOUT, _seconds),
    "polling_interval": (DEFAULT_POLLING_INTERVAL, _seconds),
    "fetch_limit": (DEFAULT_FETCH_LIMIT, _whole),
    "queue_tablename": ("kombu_queue", _table),
    "message_tablename": ("kombu_message", _table),
    "listen": (True, _flag),
    "listen_url": (None, _optional_url),
    "prepare_threshold": (5, _threshold),
    "migrate": (True, _flag),
    "consumer_synchronous_commit": ("off", _commit),
}
#: The ``result_backend_transport_options`` the result backend reads.
BACKEND_OPTIONS: Mapping[str, tuple[Any, Callable[[str, Any], Any]]] = {
    "schema": BROKER_OPTIONS["schema"],
    "listen_url": BROKER_OPTIONS["listen_url"],
    "prepare_threshold": BROKER_OPTIONS["prepare_threshold"],
    "migrate": BROKER_OPTIONS["migrate"],
}
#: Options kombu.Connection reads (the reconnect schedule), or kombu's virtual channel: passed
#: through untouched.
_PASSED = frozenset(
    {
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "connect_retries_timeout",
        "errback",
        "body_encoding",
        "callback",
        "retry_errors",
    }
)


def read_options(
    given: Mapping[str, Any], known: Mapping[str, tuple[Any, Callable[[str, Any], Any]]], setting: str
) -> dict[str, Any]:
    """The options with defaults filled in; unknown names and bad values are refused."""
    for name in given:
        if name not in known and name not in _PASSED:
            raise ConfigurationError(
                f"unknown {setting} option {name!r} for PostgreSQL.{did_you_mean(name, [*known])} It reads "
                f"{', '.join(sorted(known))}"
            )
    options = {name: given[name] for name in given if name in _PASSED}
    for name, (default, check) in known.items():
        options[name] = check(name, given[name]) if name in given else default
    return options


@attrs.frozen
class BrokerConfig:
    """What the transport connects with, checked."""

    url: str
    conninfo: str
    schema: str
    visibility_timeout: float
    polling_interval: float
    fetch_limit: int
    queue_table: str
    message_table: str
    listen: bool
    listen_conninfo: str
    #: whether ``listen_url`` was given (past a pooler, LISTEN goes only where it says)
    listen_given: bool
    prepare_threshold: int | None
    migrate: bool
    consumer_synchronous_commit: str
    passed: Mapping[str, Any]

    def location(self) -> tuple[str, str, str, str]:
        """What identifies these queues for this process's leases and acknowledgements."""
        return (self.conninfo, self.schema, self.queue_table, self.message_table)


def check_broker(url: str, given: Mapping[str, Any]) -> BrokerConfig:
    conninfo = conninfo_of(url)
    options = read_options(given, BROKER_OPTIONS, "broker_transport_options")
    listen_url = options.pop("listen_url")
    known = {name: options.pop(name) for name in list(options) if name in BROKER_OPTIONS}
    return BrokerConfig(
        url=url,
        conninfo=conninfo,
        schema=known["schema"],
        visibility_timeout=known["visibility_timeout"],
        polling_interval=known["polling_interval"],
        fetch_limit=known["fetch_limit"],
        queue_table=known["queue_tablename"],
        message_table=known["message_tablename"],
        listen=known["listen"],
        listen_conninfo=conninfo if listen_url is None else conninfo_of(listen_url),
        listen_given=listen_url is not None,
        prepare_threshold=known["prepare_threshold"],
        migrate=known["migrate"],
        consumer_synchronous_commit=known["consumer_synchronous_commit"],
        passed=options,
    )

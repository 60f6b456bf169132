"""The embedded transport slot: brokers messages through a local SQLite file, no server needed."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...exceptions import ConfigurationError, TransportError
from ...options import did_you_mean
from .database import resolve_path

if TYPE_CHECKING:
    from kombu.connection import Connection

    from ... import Settings
    from ...slots import (
        CountsDeliveries,
        ElectsLeaders,
        KeepsRecords,
        OffersResultBackend,
        OrdersByPriority,
        Transport,
    )
    from .leases import EmbeddedLease, EmbeddedRecords

__all__ = ["OPTIONS", "EmbeddedTransport"]

#: The ``broker_transport_options`` this transport reads, with their defaults.
OPTIONS: Mapping[str, float] = {"visibility_timeout": 3600.0, "polling_interval": 0.05}
#: Options every kombu connection reads (reconnect schedule): passed through untouched.
CONNECTION_OPTIONS = frozenset(
    {"max_retries", "interval_start", "interval_step", "interval_max", "connect_retries_timeout", "errback"}
)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(
            f"broker transport option {name!r} must be a number "
            f"(got {value!r} that is a {type(value).__name__})"
        )
    if value <= 0:
        raise ConfigurationError(f"broker transport option {name!r} must be greater than 0 (got {value!r})")
    return float(value)


def check_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """The transport options with defaults filled in; unknown names and bad values are refused."""
    for name in given:
        if name not in OPTIONS and name not in CONNECTION_OPTIONS:
            known = ", ".join(sorted({*OPTIONS, *CONNECTION_OPTIONS}))
            raise ConfigurationError(
                f"unknown broker transport option {name!r} for the embedded transport."
                f"{did_you_mean(name, [*OPTIONS, *CONNECTION_OPTIONS])} It reads {known}; the file "
                f"itself is named by the URL (embedded:///var/lib/app/queue.db)"
            )
    passed = {name: value for name, value in given.items() if name in CONNECTION_OPTIONS}
    return {**passed, **{name: _number(name, given.get(name, default)) for name, default in OPTIONS.items()}}


class EmbeddedTransport:
    """Messages in a SQLite file that any process on this machine can open: producers and workers
    in separate shells share it, and queued or unacked messages survive restarts and crashes.

    ``embedded://`` is ``./.worker/embedded.db``; ``embedded:///abs/x.db`` is absolute;
    ``embedded://rel/x.db`` is relative to the current directory. Results go in the same file.
    """

    supports_async: ClassVar[bool] = False
    #: The channel renews the reservations of the messages it holds (every quarter of
    #: ``visibility_timeout``): a countdown longer than the timeout is not delivered twice.
    renews_leases: ClassVar[bool] = True

    @classmethod
    def lease_timeout(cls, settings: Settings) -> float:
        given = settings.broker_transport_options.get("visibility_timeout", OPTIONS["visibility_timeout"])
        return float(given)

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        return broker_url

    @classmethod
    def priority_order(cls, settings: Settings) -> tuple[int, int] | None:
        # rows are served by priority, the higher first, clamped to kombu's 0 to 9
        return (9, 0)

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        #: The database file, absolute (shown in the worker's banner).
        self.path = resolve_path(url)
        self.options = check_options(settings.broker_transport_options)

    def __repr__(self) -> str:
        return f"<EmbeddedTransport {self.path}>"

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows about the broker."""
        return {"transport": "embedded", "path": self.path, "sqlite": sqlite3.sqlite_version, **self.options}

    def kombu_transport(self) -> type:
        from .channel import Transport  # kombu's virtual transport: imported only when connecting

        return Transport

    def connection_options(self) -> dict[str, Any]:
        return {"transport_options": {"path": self.path, **self.options}}

    def queue_depth(self, connection: Connection, queue: str) -> int:
        from .channel import Channel

        channel = connection.default_channel
        if not isinstance(channel, Channel):
            raise TransportError(
                f"queue_depth() needs a connection made with this transport's kombu_transport() "
                f"(got a channel of {type(channel).__module__}.{type(channel).__qualname__})"
            )
        return channel.store.size(queue)

    def count_delivery(self, connection: Connection, key: str, expires: float) -> int:
        """The poison cap's counter, in the queue file itself."""
        from .channel import Channel

        channel = connection.default_channel
        if not isinstance(channel, Channel):
            raise TransportError(
                f"count_delivery() needs a connection made with this transport's kombu_transport() "
                f"(got a channel of {type(channel).__module__}.{type(channel).__qualname__})"
            )
        return channel.store.count(key, expires)

    def lease(self, name: str, holder: str, *, ttl: float) -> EmbeddedLease:
        """A row of the file: holder, fencing token and deadline (the machine's clock); a message
        sent under it is written in the transaction that checks it (see :mod:`.leases`)."""
        from .leases import EmbeddedLease

        return EmbeddedLease(self.url, self.connection_options()["transport_options"], name, holder, ttl)

    def record_table(self, name: str) -> EmbeddedRecords:
        """A table of records in the file."""
        from .leases import EmbeddedRecords

        return EmbeddedRecords(self.url, self.connection_options()["transport_options"], name)


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _TRANSPORT: type[Transport] = EmbeddedTransport
    _DEFAULT_BACKEND: type[OffersResultBackend] = EmbeddedTransport
    _COUNTS: type[CountsDeliveries] = EmbeddedTransport
    _ELECTS: type[ElectsLeaders] = EmbeddedTransport
    _RECORDS: type[KeepsRecords] = EmbeddedTransport
    _PRIORITIES: type[OrdersByPriority] = EmbeddedTransport

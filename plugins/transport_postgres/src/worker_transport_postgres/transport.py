"""The PostgreSQL transport slot: queues in tables of the application's own database, taken with
``FOR UPDATE SKIP LOCKED``, consumers woken by ``LISTEN/NOTIFY``, in the layout of kombu's
SQLAlchemy transport so Celery clients on ``sqla+postgresql://`` reach the same queues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import TransportError
from worker_core.redaction import redact_url

from .options import DEFAULT_VISIBILITY_TIMEOUT, check_broker

if TYPE_CHECKING:
    from kombu.connection import Connection

    from worker_core import Settings
    from worker_core.slots import (
        AcksSurviveReconnect,
        CountsDeliveries,
        ElectsLeaders,
        KeepsRecords,
        LeasesMessages,
        OrdersByPriority,
        RewritesUrls,
        TellsTime,
        Transport,
    )

    from .election import PostgresLease, PostgresRecords

__all__ = ["PostgresTransport"]


class PostgresTransport:
    """``postgresql://user:password@host:5432/dbname`` (also ``postgres://`` and Celery's
    ``sqla+postgresql://``). ``broker_transport_options``: ``schema`` (``public``),
    ``visibility_timeout`` (60 s: a delivered message's lease, renewed while held),
    ``polling_interval`` (1 s: the fallback poll), ``fetch_limit`` (100), ``queue_tablename`` and
    ``message_tablename`` (kombu's), ``listen`` (True; False polls only), ``listen_url`` (a URL
    for the LISTEN connection, past a pooler in transaction mode), ``prepare_threshold``
    (psycopg's; None behind PgBouncer in transaction mode) and ``migrate`` (True: create and
    migrate the tables on the first connection).
    """

    supports_async: ClassVar[bool] = True
    #: Acknowledgements name the row (and its delivery count), not the connection.
    acks_survive_reconnect: ClassVar[bool] = True
    #: The leases of held messages are renewed every quarter of ``visibility_timeout``.
    renews_leases: ClassVar[bool] = True

    @classmethod
    def lease_timeout(cls, settings: Settings) -> float:
        return float(settings.broker_transport_options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        # As in Celery: results are off unless result_backend is set.
        return None

    @classmethod
    def priority_order(cls, settings: Settings) -> tuple[int, int] | None:
        # rows are served by priority, the higher first, clamped to 0 to 9 (see .schema)
        return (9, 0)

    @classmethod
    def broker_time(cls, connection: Connection) -> float:
        """PostgreSQL's clock (``clock_timestamp()``), seconds since the epoch: the clock the
        countdowns held in the table and the leases are judged by."""
        channel = cls._channel(connection)
        row = channel._db().execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        return float(row[0])

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.config = check_broker(url, settings.broker_transport_options)

    def __repr__(self) -> str:
        return f"<PostgresTransport {redact_url(self.config.conninfo)} schema={self.config.schema}>"

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows about the broker."""
        config = self.config
        return {
            "transport": "postgresql",
            "url": redact_url(config.conninfo),
            "schema": config.schema,
            "visibility_timeout": config.visibility_timeout,
            "polling_interval": config.polling_interval,
            "fetch_limit": config.fetch_limit,
            "listen": config.listen,
        }

    def kombu_url(self, url: str) -> str:
        """``postgresql://...`` for Celery's ``sqla+postgresql+psycopg://...``: kombu reads the part
        before ``+`` as its own SQLAlchemy transport's name."""
        from .options import conninfo_of

        return conninfo_of(url)

    def kombu_transport(self) -> type:
        from .kombu_transport import Transport  # imports psycopg: only when connecting

        return Transport

    def connection_options(self) -> dict[str, Any]:
        return {"transport_options": {"postgres": self.config, **self.config.passed}}

    @staticmethod
    def _channel(connection: Connection) -> Any:
        from .channel import Channel

        channel = connection.default_channel
        if not isinstance(channel, Channel):
            raise TransportError(
                f"needs a connection made with this transport's kombu_transport() (got a channel of "
                f"{type(channel).__module__}.{type(channel).__qualname__})"
            )
        return channel

    def lease(self, name: str, holder: str, *, ttl: float) -> PostgresLease:
        """A row of ``worker_leases`` with its holder, fencing token and deadline (the server's
        clock); a message sent under it is written in the transaction that checks it (see
        :mod:`.election`)."""
        from .election import PostgresLease

        url = self.kombu_url(self.url)
        return PostgresLease(url, self.config, self.connection_options(), name, holder, ttl)

    def record_table(self, name: str) -> PostgresRecords:
        """A table of records in ``worker_records``."""
        from .election import PostgresRecords

        return PostgresRecords(self.config, name)

    def queue_depth(self, connection: Connection, queue: str) -> int:
        """The ready messages of ``queue`` (held and delayed ones not counted), from SQL."""
        return int(self._channel(connection)._size(queue))

    def queue_depths(self, connection: Connection, queues: list[str]) -> dict[str, dict[str, int]]:
        """``{queue: {"ready", "delayed", "taken"}}`` for ``workerctl inspect`` and metrics."""
        channel = self._channel(connection)
        rows = channel._db().execute(channel.sql.depths, (queues,)).fetchall()
        return {
            name: {"ready": int(ready), "delayed": int(delayed), "taken": int(taken)}
            for name, ready, delayed, taken in rows
        }

    def count_delivery(self, connection: Connection, key: str, expires: float) -> int:
        """The poison cap's counter, in ``worker_counters``: one upsert. The acknowledgements
        kept so far are written first, so a task that takes the worker down cannot take along
        those of the tasks that finished before it."""
        channel = self._channel(connection)
        db = channel._db()
        if channel.location.unwritten:
            channel.location.write(db)
        row = db.execute(channel.sql.count, (key, expires)).fetchone()
        return int(row[0])


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _TRANSPORT: type[Transport] = PostgresTransport
    _ACKS: type[AcksSurviveReconnect] = PostgresTransport
    _COUNTS: type[CountsDeliveries] = PostgresTransport
    _LEASES: type[LeasesMessages] = PostgresTransport
    _URLS: type[RewritesUrls] = PostgresTransport
    _TIME: type[TellsTime] = PostgresTransport
    _PRIORITIES: type[OrdersByPriority] = PostgresTransport
    _ELECTS: type[ElectsLeaders] = PostgresTransport
    _RECORDS: type[KeepsRecords] = PostgresTransport

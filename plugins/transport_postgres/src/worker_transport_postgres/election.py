"""Leases and record tables in the broker's database: a lease is a row with its holder, its fencing
token and its deadline (the server's clock, ``now()``, so no client clock matters), and a message
sent under a lease is written in the transaction that locks and checks that row and records the
message's key, on the lease's own connection (enlisted as :func:`.transaction.enqueue_in` does),
so it is sent once or not at all.

Tables, in the broker's schema: ``worker_leases``, ``worker_lease_keys``, ``worker_records`` and
``worker_record_versions`` (created when first used).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kombu.connection import Connection
from kombu.messaging import Producer

from worker_core.election import check_lease
from worker_core.exceptions import LeaseLost
from worker_core.slots import LeaseState

from .channel import Channel
from .database import connect
from .kombu_transport import Transport
from .schema import quote
from .transaction import enqueue_in

if TYPE_CHECKING:
    from worker_core.slots import Lease, RecordTable, SendsOnce

__all__ = ["PostgresLease", "PostgresRecords"]


def _tables(schema: str) -> dict[str, str]:
    s = quote(schema)
    return {"leases": f"{s}.worker_leases", "keys": f"{s}.worker_lease_keys",
            "records": f"{s}.worker_records", "versions": f"{s}.worker_record_versions", "schema": s}


def _create(connection: Any, t: Mapping[str, str]) -> None:
    with connection.transaction():
        connection.execute(f"CREATE SCHEMA IF NOT EXISTS {t['schema']}")
        connection.execute(f"""CREATE TABLE IF NOT EXISTS {t['leases']} (name text PRIMARY KEY, holder text,
            token bigint NOT NULL, expires_at timestamptz)""")
        connection.execute(f"""CREATE TABLE IF NOT EXISTS {t['keys']} (lease text NOT NULL, key text NOT NULL,
            expires_at timestamptz NOT NULL, PRIMARY KEY (lease, key))""")
        connection.execute(f"""CREATE TABLE IF NOT EXISTS {t['records']} (tbl text NOT NULL,
            key text NOT NULL, value text NOT NULL, PRIMARY KEY (tbl, key))""")
        connection.execute(f"""CREATE TABLE IF NOT EXISTS {t['versions']} (tbl text PRIMARY KEY,
            version bigint NOT NULL)""")


def _write(connection: Any, t: Mapping[str, str], table: str, changes: Mapping[str, str | None]) -> None:
    for key, value in changes.items():
        if value is None:
            connection.execute(f"DELETE FROM {t['records']} WHERE tbl = %s AND key = %s", (table, key))
        else:
            connection.execute(f"""INSERT INTO {t['records']} (tbl, key, value) VALUES (%s, %s, %s)
                ON CONFLICT (tbl, key) DO UPDATE SET value = excluded.value""", (table, key, value))
    if changes:
        _bump(connection, t, table)


def _bump(connection: Any, t: Mapping[str, str], table: str) -> None:
    connection.execute(f"""INSERT INTO {t['versions']} (tbl, version) VALUES (%s, 1)
        ON CONFLICT (tbl) DO UPDATE SET version = {t['versions']}.version + 1""", (table,))


class LeaseChannel(Channel):
    """The broker's channel, counting what is published while a message is sent once."""

    publishes: int | None = None

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> None:
        if self.publishes is not None:
            self.publishes += 1
        super().basic_publish(message, exchange, routing_key, **kwargs)


class LeaseTransport(Transport):
    Channel = LeaseChannel


class _Database:
    """The lease's (or table's) own connection, opened when first used, with its tables."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.tables = _tables(config.schema)
        self._connection: Any = None

    @property
    def connection(self) -> Any:
        if self._connection is None or self._connection.closed:
            self._connection = connect(self.config.conninfo, role="lease")
            _create(self._connection, self.tables)
        return self._connection

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class PostgresLease:
    """A :class:`~worker_core.slots.Lease` (and :class:`~worker_core.slots.SendsOnce`) in the
    broker's database."""

    def __init__(self, url: str, config: Any, options: Mapping[str, Any], name: str, holder: str,
                 ttl: float) -> None:
        check_lease(name, ttl)
        self.name = name
        self.holder = f"{holder}#{secrets.token_hex(3)}"
        self.ttl = float(ttl)
        self._url = url
        self._options = dict(options)
        self._db = _Database(config)
        self._token: int | None = None
        self._kombu: Any = None
        self._records_table = f"lease:{name}"
        self._next_sweep = 0.0

    def __repr__(self) -> str:
        return f"<PostgresLease {self.name!r} {self.holder}>"

    @property
    def bound(self) -> float:
        return self.ttl

    @property
    def token(self) -> int | None:
        return self._token

    def acquire(self, wait: float = 0.0) -> int | None:
        deadline = time.monotonic() + wait
        while True:
            token = self._try_acquire()
            if token is not None or time.monotonic() >= deadline:
                return token
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _try_acquire(self) -> int | None:
        connection, t = self._db.connection, self._db.tables
        with connection.transaction():
            connection.execute(f"INSERT INTO {t['leases']} (name, token) VALUES (%s, 0) "
                               f"ON CONFLICT DO NOTHING", (self.name,))
            holder, token, live = connection.execute(
                f"SELECT holder, token, coalesce(expires_at > now(), false) FROM {t['leases']} "
                f"WHERE name = %s FOR UPDATE", (self.name,)).fetchone()
            if live and holder is not None:
                if holder == self.holder and token == self._token:
                    connection.execute(f"UPDATE {t['leases']} SET expires_at = now() + %s * interval "
                                       f"'1 second' WHERE name = %s", (self.ttl, self.name))
                    return self._token
                self._token = None
                return None
            connection.execute(f"""UPDATE {t['leases']} SET holder = %s, token = token + 1,
                expires_at = now() + %s * interval '1 second' WHERE name = %s""",
                               (self.holder, self.ttl, self.name))
            self._token = int(token) + 1
        return self._token

    def renew(self) -> bool:
        if self._token is None:
            return False
        t = self._db.tables
        renewed = self._db.connection.execute(
            f"""UPDATE {t['leases']} SET expires_at = now() + %s * interval '1 second'
                WHERE name = %s AND holder = %s AND token = %s AND expires_at > now()""",
            (self.ttl, self.name, self.holder, self._token)).rowcount
        if not renewed:
            self._token = None
        return bool(renewed)

    def release(self) -> None:
        if self._token is None:
            return
        token, self._token = self._token, None
        t = self._db.tables
        self._db.connection.execute(f"UPDATE {t['leases']} SET holder = NULL, expires_at = NULL "
                                    f"WHERE name = %s AND holder = %s AND token = %s",
                                    (self.name, self.holder, token))

    def current(self) -> LeaseState | None:
        t = self._db.tables
        row = self._db.connection.execute(
            f"SELECT holder, token, extract(epoch FROM expires_at - now())::float8 FROM {t['leases']} "
            f"WHERE name = %s AND holder IS NOT NULL AND expires_at > now()", (self.name,)).fetchone()
        return None if row is None else LeaseState(str(row[0]), int(row[1]), float(row[2]))

    def close(self) -> None:
        try:
            if self._token is not None:
                self.release()
        finally:
            self._db.close()
            kombu, self._kombu = self._kombu, None
            if kombu is not None:
                kombu.release()

    # -- sending once ----------------------------------------------------------------------------

    def _held(self, connection: Any, key: str) -> None:
        t = self._db.tables
        held = connection.execute(
            f"SELECT 1 FROM {t['leases']} WHERE name = %s AND holder = %s AND token = %s "
            f"AND expires_at > now() FOR UPDATE", (self.name, self.holder, self._token)).fetchone()
        if held is None:
            self._token = None
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; {key!r} was not done")

    def send_once(self, key: str, publish: Callable[[Any], None], *, record: tuple[str, str] | None = None,
                  keep: float) -> bool:
        if self._token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was sent")
        if self._kombu is None:
            self._kombu = Connection(self._url, transport=LeaseTransport, **self._options)
        channel = self._kombu.default_channel
        connection, t = self._db.connection, self._db.tables
        with connection.transaction():
            self._held(connection, key)
            if time.monotonic() >= self._next_sweep:
                connection.execute(f"DELETE FROM {t['keys']} WHERE expires_at <= now()")
                self._next_sweep = time.monotonic() + 10
            fresh = connection.execute(
                f"""INSERT INTO {t['keys']} (lease, key, expires_at)
                    VALUES (%s, %s, now() + %s * interval '1 second') ON CONFLICT DO NOTHING""",
                (self.name, key, keep)).rowcount
            if not fresh:
                return False
            channel.publishes = 0
            try:
                with enqueue_in(connection):
                    publish(Producer(channel))
                count = channel.publishes
            finally:
                channel.publishes = None
            if count != 1:
                raise ValueError(f"send_once({key!r}) sends one message; the publish sent {count}")
            if record is not None:
                _write(connection, t, self._records_table, {record[0]: record[1]})
        return True

    def records(self) -> dict[str, str] | None:
        t = self._db.tables
        rows = self._db.connection.execute(f"SELECT key, value FROM {t['records']} WHERE tbl = %s",
                                           (self._records_table,)).fetchall()
        return {str(key): str(value) for key, value in rows}

    def write_records(self, changes: Mapping[str, str | None]) -> None:
        if self._token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was written")
        connection = self._db.connection
        with connection.transaction():
            self._held(connection, "the records")
            _write(connection, self._db.tables, self._records_table, changes)


class PostgresRecords:
    """A :class:`~worker_core.slots.RecordTable` in the broker's database."""

    def __init__(self, config: Any, name: str) -> None:
        check_lease(name)
        self.name = name
        self._table = f"table:{name}"
        self._db = _Database(config)

    def read(self) -> dict[str, str]:
        t = self._db.tables
        rows = self._db.connection.execute(f"SELECT key, value FROM {t['records']} WHERE tbl = %s",
                                           (self._table,)).fetchall()
        return {str(key): str(value) for key, value in rows}

    def version(self) -> int:
        t = self._db.tables
        row = self._db.connection.execute(f"SELECT version FROM {t['versions']} WHERE tbl = %s",
                                          (self._table,)).fetchone()
        return 0 if row is None else int(row[0])

    def put(self, key: str, value: str) -> None:
        connection = self._db.connection
        with connection.transaction():
            _write(connection, self._db.tables, self._table, {key: value})

    def delete(self, key: str) -> bool:
        connection, t = self._db.connection, self._db.tables
        with connection.transaction():
            deleted = connection.execute(f"DELETE FROM {t['records']} WHERE tbl = %s AND key = %s",
                                         (self._table, key)).rowcount
            if deleted:
                _bump(connection, t, self._table)
        return bool(deleted)

    def close(self) -> None:
        self._db.close()


if TYPE_CHECKING:
    _LEASE: type[Lease] = PostgresLease
    _ONCE: type[SendsOnce] = PostgresLease
    _TABLE: type[RecordTable] = PostgresRecords

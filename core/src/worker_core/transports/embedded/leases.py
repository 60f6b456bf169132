"""Leases and record tables in the embedded file (one machine): a lease is a row with its holder,
its fencing token and its deadline (wall-clock time, which every process of the machine shares),
and a message sent under a lease is written in the same transaction that checks the lease and
records its key, so it is sent once or not at all."""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kombu.connection import Connection
from kombu.messaging import Producer

from ...election import check_lease
from ...exceptions import LeaseLost
from ...slots import LeaseState
from .channel import Channel, Transport
from .store import EXPIRES_SQL

if TYPE_CHECKING:
    from ...slots import Lease, RecordTable, SendsOnce

__all__ = ["EmbeddedLease", "EmbeddedRecords", "LeaseChannel"]

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT, token INTEGER NOT NULL,
                                   expires_at REAL);
CREATE TABLE IF NOT EXISTS sent_keys (lease TEXT NOT NULL, key TEXT NOT NULL, expires_at REAL NOT NULL,
                                      PRIMARY KEY (lease, key));
CREATE INDEX IF NOT EXISTS sent_keys_expiring ON sent_keys (expires_at);
CREATE TABLE IF NOT EXISTS records (tbl TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                                    PRIMARY KEY (tbl, key));
CREATE TABLE IF NOT EXISTS record_versions (tbl TEXT PRIMARY KEY, version INTEGER NOT NULL);
COMMIT;
"""
_HELD = "SELECT 1 FROM leases WHERE name = ? AND holder = ? AND token = ? AND expires_at > ?"
#: seconds between deletions of the keys past their keeping time
_SWEEP_EVERY = 10.0


def _create_tables(connection: sqlite3.Connection) -> None:
    connection.executescript(_SCHEMA)


def _bump(conn: sqlite3.Connection, table: str) -> None:
    conn.execute("""INSERT INTO record_versions (tbl, version) VALUES (?, 1)
                    ON CONFLICT (tbl) DO UPDATE SET version = version + 1""", (table,))


def _write(conn: sqlite3.Connection, table: str, changes: Mapping[str, str | None]) -> None:
    for key, value in changes.items():
        if value is None:
            conn.execute("DELETE FROM records WHERE tbl = ? AND key = ?", (table, key))
        else:
            conn.execute("""INSERT INTO records (tbl, key, value) VALUES (?, ?, ?)
                            ON CONFLICT (tbl, key) DO UPDATE SET value = excluded.value""",
                         (table, key, value))
    if changes:
        _bump(conn, table)


class LeaseChannel(Channel):
    """The embedded channel of a lease's connection: the one message published inside
    :meth:`EmbeddedLease.send_once` is kept back and written in the lease's transaction."""

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        #: ``(queue, payload, priority, expires)`` of the messages kept back, while collecting
        self.kept: list[tuple[str, str, int, float | None]] | None = None
        with self.store.db.locked() as conn:
            _create_tables(conn)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        if self.kept is None:
            super()._put(queue, message, **kwargs)
            return
        from .channel import dumps, expires_at

        self.kept.append((queue, dumps(message), self._get_message_priority(message), expires_at(message)))

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        if self.kept is not None:
            raise ValueError(f"a message sent once goes to queues, not to the fanout exchange {exchange!r}")
        super()._put_fanout(exchange, message, routing_key, **kwargs)


class LeaseTransport(Transport):
    """The kombu transport of a lease's connection."""

    Channel = LeaseChannel


class EmbeddedLease:
    """A :class:`~worker_core.slots.Lease` (and :class:`~worker_core.slots.SendsOnce`) in the
    embedded file."""

    def __init__(self, url: str, options: Mapping[str, Any], name: str, holder: str, ttl: float) -> None:
        check_lease(name, ttl)
        self.name = name
        self.holder = f"{holder}#{secrets.token_hex(3)}"
        self.ttl = float(ttl)
        self._url = url
        self._options = dict(options)
        self._token: int | None = None
        self._connection: Any = None
        self._next_sweep = 0.0
        self._records_table = f"lease:{name}"

    def __repr__(self) -> str:
        return f"<EmbeddedLease {self.name!r} {self.holder}>"

    @property
    def bound(self) -> float:
        return self.ttl

    @property
    def token(self) -> int | None:
        return self._token

    @property
    def _channel(self) -> LeaseChannel:
        if self._connection is None:
            self._connection = Connection(self._url, transport=LeaseTransport,
                                                transport_options=dict(self._options))
        channel: LeaseChannel = self._connection.default_channel
        return channel

    def _transaction(self) -> Any:
        return self._channel.store.db.transaction()

    # -- the lease -------------------------------------------------------------------------------

    def acquire(self, wait: float = 0.0) -> int | None:
        deadline = time.monotonic() + wait
        while True:
            token = self._try_acquire()
            if token is not None or time.monotonic() >= deadline:
                return token
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _try_acquire(self) -> int | None:
        now = time.time()
        with self._transaction() as conn:
            row = conn.execute("SELECT holder, token, expires_at FROM leases WHERE name = ?",
                               (self.name,)).fetchone()
            if row is not None and row[0] is not None and row[2] > now:
                if row[0] == self.holder and row[1] == self._token:
                    conn.execute("UPDATE leases SET expires_at = ? WHERE name = ?",
                                 (now + self.ttl, self.name))
                    return self._token
                self._token = None
                return None
            token = (row[1] if row is not None else 0) + 1
            conn.execute("""INSERT INTO leases (name, holder, token, expires_at) VALUES (?, ?, ?, ?)
                            ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token,
                            expires_at = excluded.expires_at""",
                         (self.name, self.holder, token, now + self.ttl))
        self._token = token
        return token

    def renew(self) -> bool:
        if self._token is None:
            return False
        now = time.time()
        with self._transaction() as conn:
            renewed = conn.execute(
                "UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND token = ? "
                "AND expires_at > ?",
                (now + self.ttl, self.name, self.holder, self._token, now)).rowcount
        if not renewed:
            self._token = None
        return bool(renewed)

    def release(self) -> None:
        if self._token is None:
            return
        token, self._token = self._token, None
        with self._transaction() as conn:
            conn.execute("UPDATE leases SET holder = NULL, expires_at = NULL WHERE name = ? AND holder = ? "
                         "AND token = ?", (self.name, self.holder, token))

    def current(self) -> LeaseState | None:
        now = time.time()
        with self._channel.store.db.locked() as conn:
            row = conn.execute("SELECT holder, token, expires_at FROM leases WHERE name = ? "
                               "AND holder IS NOT NULL AND expires_at > ?", (self.name, now)).fetchone()
        return None if row is None else LeaseState(str(row[0]), int(row[1]), float(row[2]) - now)

    def close(self) -> None:
        try:
            if self._token is not None:
                self.release()
        finally:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.release()

    # -- sending once ----------------------------------------------------------------------------

    def send_once(self, key: str, publish: Callable[[Any], None], *, record: tuple[str, str] | None = None,
                  keep: float) -> bool:
        token = self._token
        if token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was sent")
        channel = self._channel
        kept: list[tuple[str, str, int, float | None]] = []
        channel.kept = kept
        try:
            publish(Producer(channel))
        finally:
            channel.kept = None
        if len(kept) != 1:
            raise ValueError(f"send_once({key!r}) sends one message; the publish sent {len(kept)}")
        now = time.time()
        with self._transaction() as conn:
            if conn.execute(_HELD, (self.name, self.holder, token, now)).fetchone() is None:
                self._token = None
                raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; {key!r} was not sent")
            if now >= self._next_sweep:
                conn.execute("DELETE FROM sent_keys WHERE expires_at <= ?", (now,))
                self._next_sweep = now + _SWEEP_EVERY
            if not conn.execute("INSERT OR IGNORE INTO sent_keys (lease, key, expires_at) VALUES (?, ?, ?)",
                                (self.name, key, now + keep)).rowcount:
                return False
            for queue, payload, priority, expires in kept:
                conn.execute(
                    f"""INSERT INTO messages (queue, priority, payload, expires_at)
                        SELECT :queue, :priority, :payload, {EXPIRES_SQL}
                        FROM (SELECT :queue AS name) AS n LEFT JOIN queues AS q ON q.name = n.name""",
                    {"queue": queue, "priority": priority, "payload": payload, "expires": expires,
                     "now": now})
            if record is not None:
                _write(conn, self._records_table, {record[0]: record[1]})
        return True

    def records(self) -> dict[str, str] | None:
        with self._channel.store.db.locked() as conn:
            rows = conn.execute("SELECT key, value FROM records WHERE tbl = ?",
                                (self._records_table,)).fetchall()
        return {str(key): str(value) for key, value in rows}

    def write_records(self, changes: Mapping[str, str | None]) -> None:
        token = self._token
        if token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was written")
        with self._transaction() as conn:
            if conn.execute(_HELD, (self.name, self.holder, token, time.time())).fetchone() is None:
                self._token = None
                raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; nothing was written")
            _write(conn, self._records_table, changes)


class EmbeddedRecords:
    """A :class:`~worker_core.slots.RecordTable` in the embedded file."""

    def __init__(self, url: str, options: Mapping[str, Any], name: str) -> None:
        check_lease(name)
        self.name = name
        self._table = f"table:{name}"
        self._url = url
        self._options = dict(options)
        self._connection: Any = None

    @property
    def _db(self) -> Any:
        if self._connection is None:
            self._connection = Connection(self._url, transport=LeaseTransport,
                                                transport_options=dict(self._options))
        return self._connection.default_channel.store.db

    def read(self) -> dict[str, str]:
        with self._db.locked() as conn:
            rows = conn.execute("SELECT key, value FROM records WHERE tbl = ?", (self._table,)).fetchall()
        return {str(key): str(value) for key, value in rows}

    def version(self) -> int:
        with self._db.locked() as conn:
            row = conn.execute("SELECT version FROM record_versions WHERE tbl = ?", (self._table,)).fetchone()
        return 0 if row is None else int(row[0])

    def put(self, key: str, value: str) -> None:
        with self._db.transaction() as conn:
            _write(conn, self._table, {key: value})

    def delete(self, key: str) -> bool:
        with self._db.transaction() as conn:
            deleted = conn.execute("DELETE FROM records WHERE tbl = ? AND key = ?",
                                   (self._table, key)).rowcount
            if deleted:
                _bump(conn, self._table)
        return bool(deleted)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.release()


if TYPE_CHECKING:
    _LEASE: type[Lease] = EmbeddedLease
    _ONCE: type[SendsOnce] = EmbeddedLease
    _TABLE: type[RecordTable] = EmbeddedRecords

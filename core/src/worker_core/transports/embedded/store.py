"""The embedded broker's tables: messages (ready or reserved by a consumer), queues, exchanges and
bindings, and the SQL that moves a message between those states atomically across processes."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence

from ...exceptions import BrokerStorageError, TransportError
from .database import Database
from .disk import FULL_DISKS

__all__ = ["EXPIRES_SQL", "Binding", "QueueStore", "pid_alive"]

#: ``(routing_key, pattern, queue)``, the row layout kombu's exchange types look up.
Binding = tuple[str, str, str]

# A message row is ready while ``tag`` is NULL and reserved (delivered, not yet acked) while it
# holds the delivery tag. Rows are served by priority, then by id: a requeued message keeps its
# id, so it goes back before everything published after it, as RabbitMQ requeues.
_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL,
    expires_at REAL,
    redelivered INTEGER NOT NULL DEFAULT 0,
    tag TEXT,
    owner_host TEXT,
    owner_pid INTEGER,
    reserved_at REAL
);
CREATE INDEX IF NOT EXISTS messages_ready ON messages (queue, priority DESC, id) WHERE tag IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS messages_reserved ON messages (tag) WHERE tag IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_expiring ON messages (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, message_ttl REAL);
CREATE TABLE IF NOT EXISTS exchanges (name TEXT PRIMARY KEY, type TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS bindings (
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    pattern TEXT NOT NULL,
    queue TEXT NOT NULL,
    PRIMARY KEY (exchange, routing_key, pattern, queue)
);
CREATE INDEX IF NOT EXISTS bindings_queue ON bindings (queue);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS write_check (id INTEGER PRIMARY KEY CHECK (id = 1), checked_at REAL NOT NULL);
COMMIT;
"""

_LIVE = "(expires_at IS NULL OR expires_at > :now)"
_HEAD = f"""SELECT id FROM messages WHERE queue = :queue AND tag IS NULL AND {_LIVE}
            ORDER BY priority DESC, id LIMIT 1"""
#: The expiry time of a message put in a queue, in SQL: the earlier of the message's own expiry
#: and the queue's x-message-ttl, either may be NULL.
EXPIRES_SQL = """CASE WHEN :expires IS NULL THEN :now + q.message_ttl
                   WHEN q.message_ttl IS NULL THEN :expires
                   ELSE MIN(:expires, :now + q.message_ttl) END"""
_RELEASE = "tag = NULL, owner_host = NULL, owner_pid = NULL, reserved_at = NULL, redelivered = 1"


def _create_tables(connection: sqlite3.Connection) -> None:
    connection.executescript(_SCHEMA)


class _Unwritten:
    """Acknowledgements and requeues this process could not write to one file (a full disk):
    kept here and written at the next chance, so a message is neither run twice nor left
    reserved by a process that no longer holds it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acks: set[str] = set()
        self.requeues: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.acks or self.requeues)


#: by database path, for this process only (a forked child starts with none)
_UNWRITTEN: dict[str, _Unwritten] = {}
os.register_at_fork(after_in_child=_UNWRITTEN.clear)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (one we may not signal still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class QueueStore:
    """Messages, queues, exchanges and bindings in one SQLite file shared by every process."""

    def __init__(self, path: str) -> None:
        self.db = Database(path, _create_tables, error=TransportError, unavailable=BrokerStorageError)
        #: ``UPDATE ... RETURNING`` claims a message in one statement (SQLite 3.35+); older
        #: libraries claim it in a ``BEGIN IMMEDIATE`` transaction instead.
        self.use_returning = sqlite3.sqlite_version_info >= (3, 35, 0)
        self.host = socket.gethostname()

    def close(self) -> None:
        self.db.close()

    # -- messages --------------------------------------------------------------------------------

    def put(self, queue: str, payload: str, priority: int, expires: float | None) -> None:
        """Append a message to ``queue``; ``expires`` is an absolute time or None."""
        with self.db.locked() as conn:
            conn.execute(
                f"""INSERT INTO messages (queue, priority, payload, expires_at)
                    SELECT :queue, :priority, :payload, {EXPIRES_SQL}
                    FROM (SELECT :queue AS name) AS n LEFT JOIN queues AS q ON q.name = n.name""",
                {
                    "queue": queue,
                    "priority": priority,
                    "payload": payload,
                    "expires": expires,
                    "now": time.time(),
                },
            )

    def put_fanout(self, exchange: str, payload: str, priority: int, expires: float | None) -> int:
        """Copy a message into every queue bound to ``exchange``, all or none; return how many."""
        with self.db.locked() as conn:
            cursor = conn.execute(
                f"""INSERT INTO messages (queue, priority, payload, expires_at)
                    SELECT b.queue, :priority, :payload, {EXPIRES_SQL}
                    FROM (SELECT DISTINCT queue FROM bindings WHERE exchange = :exchange) AS b
                    LEFT JOIN queues AS q ON q.name = b.queue""",
                {
                    "exchange": exchange,
                    "priority": priority,
                    "payload": payload,
                    "expires": expires,
                    "now": time.time(),
                },
            )
            return cursor.rowcount

    def claim(self, queue: str, tag: str, *, remove: bool = False) -> tuple[str, bool] | None:
        """Take the next ready message of ``queue``: reserve it under ``tag`` for this process,
        or delete it when ``remove`` (no-ack consumers). Return ``(payload, redelivered)``."""
        now = time.time()
        params = {"queue": queue, "now": now, "tag": tag, "host": self.host, "pid": os.getpid()}
        take = (
            f"DELETE FROM messages WHERE id = ({_HEAD})"
            if remove
            else f"""UPDATE messages SET tag = :tag, owner_host = :host, owner_pid = :pid, reserved_at = :now
                    WHERE id = ({_HEAD})"""
        )
        with self.db.locked() as conn:
            # A read never waits for writers: an empty queue costs no write lock.
            if conn.execute(f"SELECT EXISTS ({_HEAD})", params).fetchone() == (0,):
                return None
            if self.use_returning:
                # fetchall: the statement must run to completion to release the write lock.
                rows = conn.execute(f"{take} RETURNING payload, redelivered", params).fetchall()
                return (rows[0][0], bool(rows[0][1])) if rows else None
        with self.db.transaction() as conn:
            row = conn.execute(
                f"SELECT id, payload, redelivered FROM messages WHERE id = ({_HEAD})", params
            ).fetchone()
            if row is None:
                return None
            conn.execute(take, params)
            return row[1], bool(row[2])

    def ack(self, tag: str) -> None:
        """Delete a delivered message for good."""
        with self.db.locked() as conn:
            conn.execute("DELETE FROM messages WHERE tag = ?", (tag,))

    def requeue(self, tags: Iterable[str]) -> int:
        """Make delivered messages ready again, flagged as redelivered; return how many."""
        tags = list(tags)
        with self.db.transaction() as conn:
            return sum(
                conn.execute(f"UPDATE messages SET {_RELEASE} WHERE tag = ?", (tag,)).rowcount for tag in tags
            )

    # -- writes kept for later -------------------------------------------------------------------

    @property
    def _unwritten(self) -> _Unwritten:
        return _UNWRITTEN.setdefault(self.db.path, _Unwritten())

    def ack_later(self, tags: Iterable[str]) -> None:
        """Remember acknowledgements that could not be written; :meth:`write_later` writes them."""
        unwritten = self._unwritten
        with unwritten.lock:
            tags = set(tags)
            unwritten.acks |= tags
            unwritten.requeues -= tags

    def requeue_later(self, tags: Iterable[str]) -> None:
        """Remember requeues that could not be written; :meth:`write_later` writes them."""
        unwritten = self._unwritten
        with unwritten.lock:
            unwritten.requeues |= set(tags) - unwritten.acks

    @property
    def unwritten(self) -> tuple[int, int]:
        """``(acknowledgements, requeues)`` this process still has to write to the file."""
        unwritten = _UNWRITTEN.get(self.db.path)
        return (0, 0) if unwritten is None else (len(unwritten.acks), len(unwritten.requeues))

    def write_later(self) -> tuple[int, int]:
        """Write the remembered acknowledgements and requeues in one transaction; return how many
        of each were written. They stay remembered if that fails (:class:`BrokerStorageError`)."""
        unwritten = _UNWRITTEN.get(self.db.path)
        if not unwritten:
            return (0, 0)
        with unwritten.lock:
            acks, requeues = sorted(unwritten.acks), sorted(unwritten.requeues)
            with self.db.transaction() as conn:
                conn.executemany("DELETE FROM messages WHERE tag = ?", [(tag,) for tag in acks])
                conn.executemany(
                    f"UPDATE messages SET {_RELEASE} WHERE tag = ?", [(tag,) for tag in requeues]
                )
            unwritten.acks.clear()
            unwritten.requeues.clear()
        return len(acks), len(requeues)

    def check_writable(self) -> None:
        """Write one small row, so a file that cannot be written (a full disk) is found when a
        connection opens rather than at its first delivery: the worker retries a connection that
        fails to open with its back-off, and one that fails later at once. After a full disk,
        it waits for room (:class:`~.disk.FullDisks`)."""
        lacking = FULL_DISKS.lacking_room(self.db.path)
        if lacking is not None:
            raise BrokerStorageError(lacking)
        with self.db.transaction() as conn:
            conn.execute(
                """INSERT INTO write_check (id, checked_at) VALUES (1, ?)
                   ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at""",
                (time.time(),),
            )
        FULL_DISKS.room_again(self.db.path)

    def renew(self, tags: Sequence[str]) -> None:
        """Refresh this consumer's reservations so the visibility timeout does not reclaim them."""
        if tags:
            with self.db.transaction() as conn:
                conn.executemany(
                    "UPDATE messages SET reserved_at = ? WHERE tag = ?", [(time.time(), tag) for tag in tags]
                )

    def recover(self, visibility_timeout: float) -> int:
        """Make ready again the reservations whose consumer is gone: its process no longer runs on
        this host, or it has not renewed them for ``visibility_timeout`` seconds."""
        now = time.time()
        with self.db.locked() as conn:
            reserved = conn.execute(
                "SELECT tag, owner_host, owner_pid, reserved_at FROM messages WHERE tag IS NOT NULL"
            ).fetchall()
        orphans = [
            (tag, reserved_at)
            for tag, host, pid, reserved_at in reserved
            if reserved_at < now - visibility_timeout
            or (host == self.host and pid != os.getpid() and not pid_alive(pid))
        ]
        if not orphans:
            return 0
        with self.db.transaction() as conn:
            # Only if unchanged since read: an owner that renewed meanwhile keeps its message.
            return sum(
                conn.execute(
                    f"UPDATE messages SET {_RELEASE} WHERE tag = ? AND reserved_at = ?", orphan
                ).rowcount
                for orphan in orphans
            )

    def expire(self) -> int:
        """Delete ready messages past their expiry time; return how many."""
        params = {"now": time.time()}
        with self.db.locked() as conn:
            if conn.execute(
                "SELECT EXISTS (SELECT 1 FROM messages WHERE expires_at <= :now AND tag IS NULL)", params
            ).fetchone() == (0,):
                return 0
            return conn.execute(
                "DELETE FROM messages WHERE expires_at <= :now AND tag IS NULL", params
            ).rowcount

    def size(self, queue: str) -> int:
        """Ready (not reserved, not expired) messages in ``queue``."""
        with self.db.locked() as conn:
            row = conn.execute(
                f"SELECT COUNT(*) FROM messages WHERE queue = :queue AND tag IS NULL AND {_LIVE}",
                {"queue": queue, "now": time.time()},
            ).fetchone()
        return int(row[0])

    def purge(self, queue: str) -> int:
        """Delete the ready messages of ``queue``; reserved ones stay with their consumers."""
        with self.db.locked() as conn:
            return conn.execute("DELETE FROM messages WHERE queue = ? AND tag IS NULL", (queue,)).rowcount

    # -- counters (the poison cap's) ------------------------------------------------------------

    def count(self, name: str, expires: float) -> int:
        """Add one to the counter ``name`` (0 when missing or expired), keep it ``expires`` more
        seconds, and return its value; expired counters are dropped on the way."""
        now = time.time()
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM counters WHERE expires_at <= ?", (now,))
            conn.execute(
                """INSERT INTO counters (name, value, expires_at) VALUES (?, 1, ?)
                   ON CONFLICT (name) DO UPDATE SET value = value + 1, expires_at = excluded.expires_at""",
                (name, now + expires),
            )
            row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0])

    # -- queues, exchanges, bindings -------------------------------------------------------------

    def declare_queue(self, queue: str, message_ttl: float | None) -> None:
        with self.db.locked() as conn:
            conn.execute(
                """INSERT INTO queues (name, message_ttl) VALUES (?, ?)
                            ON CONFLICT (name) DO UPDATE SET message_ttl = excluded.message_ttl""",
                (queue, message_ttl),
            )

    def has_queue(self, queue: str) -> bool:
        with self.db.locked() as conn:
            row = conn.execute(
                """SELECT EXISTS (SELECT 1 FROM queues WHERE name = :queue)
                                  OR EXISTS (SELECT 1 FROM messages WHERE queue = :queue)""",
                {"queue": queue},
            ).fetchone()
        return bool(row[0])

    def delete_queue(self, queue: str) -> int:
        """Delete a queue with all its messages and bindings; return how many messages went."""
        with self.db.transaction() as conn:
            count = conn.execute("DELETE FROM messages WHERE queue = ?", (queue,)).rowcount
            conn.execute("DELETE FROM bindings WHERE queue = ?", (queue,))
            conn.execute("DELETE FROM queues WHERE name = ?", (queue,))
        return count

    def declare_exchange(self, exchange: str, type: str) -> None:
        with self.db.locked() as conn:
            conn.execute(
                """INSERT INTO exchanges (name, type) VALUES (?, ?)
                            ON CONFLICT (name) DO UPDATE SET type = excluded.type""",
                (exchange, type),
            )

    def exchange_type(self, exchange: str) -> str | None:
        with self.db.locked() as conn:
            row = conn.execute("SELECT type FROM exchanges WHERE name = ?", (exchange,)).fetchone()
        return None if row is None else str(row[0])

    def delete_exchange(self, exchange: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM bindings WHERE exchange = ?", (exchange,))
            conn.execute("DELETE FROM exchanges WHERE name = ?", (exchange,))

    def bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        with self.db.locked() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?)", (exchange, routing_key, pattern, queue)
            )

    def unbind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        with self.db.locked() as conn:
            conn.execute(
                "DELETE FROM bindings WHERE exchange = ? AND routing_key = ? AND pattern = ? AND queue = ?",
                (exchange, routing_key, pattern, queue),
            )

    def table(self, exchange: str) -> list[Binding]:
        with self.db.locked() as conn:
            rows = conn.execute(
                "SELECT routing_key, pattern, queue FROM bindings WHERE exchange = ?", (exchange,)
            ).fetchall()
        return [(str(key), str(pattern), str(queue)) for key, pattern, queue in rows]

"""The embedded SQLite file: where an ``embedded://`` URL puts it, and one connection to it per
process that any thread may use, reopened after a fork.

A fork waits until no other thread of the process is inside one of these connections: SQLite's
own process-wide mutexes are copied into the child as they are, and a child forked while another
thread held one (a prefork pool growing or replacing a child while the consumer polls the queue)
would block forever in its first SQLite call.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...exceptions import ConfigurationError, WorkerError
from .disk import BUSY_TIMEOUT, FULL_DISKS, WAL_LIMIT, is_full, storage_problem

__all__ = ["BUSY_TIMEOUT", "DEFAULT_FILE", "SCHEME", "Database", "resolve_path"]

logger = logging.getLogger(__name__)

SCHEME = "embedded"
DEFAULT_FILE = os.path.join(".worker", "embedded.db")
#: Seconds a checkpoint waits for readers before it gives up until the next try.
CHECKPOINT_WAIT = 0.1
#: Seconds a connection waits before trying again after readers made it give up.
CHECKPOINT_PAUSE = 1.0
_EXAMPLES = (
    "embedded:// (./.worker/embedded.db), embedded:///var/lib/app/queue.db or embedded://data/queue.db"
)

# Connections inherited through fork are parked here and never closed: closing a SQLite
# connection in a child can disturb the parent's locks on the same file.
_INHERITED: list[sqlite3.Connection] = []


#: every Database of this process by creation order (a fork takes their locks in this order)
_DATABASES: weakref.WeakValueDictionary[int, Database] = weakref.WeakValueDictionary()
_SERIALS = itertools.count()
_HELD_FOR_FORK: list[threading.RLock] = []


def _before_fork() -> None:
    for serial in sorted(_DATABASES.keys()):
        database = _DATABASES.get(serial)
        if database is not None and database._pid == os.getpid():
            lock = database._lock
            lock.acquire()
            _HELD_FOR_FORK.append(lock)


def _after_fork_in_parent() -> None:
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop().release()


def _after_fork_in_child() -> None:
    _HELD_FOR_FORK.clear()  # each Database makes a new lock on its first use here


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


def resolve_path(url: str) -> str:
    """The absolute file an ``embedded://`` URL names, its parent directories created.

    ``embedded://`` is ``<cwd>/.worker/embedded.db``; ``embedded:///abs/x.db`` is absolute;
    ``embedded://rel/x.db`` is relative to the current directory.
    """
    scheme, sep, rest = url.partition("://")
    if scheme != SCHEME or not sep:
        raise ConfigurationError(f"not an embedded transport URL: {url!r}; write it as {_EXAMPLES}")
    if "?" in rest or "#" in rest:
        raise ConfigurationError(
            f"embedded URL {url!r} has a query or fragment, which the embedded transport does not read; "
            f"name only the file ({_EXAMPLES}) and set options in broker_transport_options"
        )
    path = os.path.abspath(rest or DEFAULT_FILE)
    if rest.endswith("/") or os.path.isdir(path):
        raise ConfigurationError(
            f"embedded URL {url!r} names the directory {path!r}, not a file; "
            f"add a file name, as in {_EXAMPLES}"
        )
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the directory for the embedded database {path!r} (from {url!r}): {exc}"
        ) from None
    return path


class Database:
    """A SQLite file in WAL mode with a busy timeout, opened lazily in each process.

    :param setup: creates the caller's tables; run on every new connection (it must be idempotent).
    :param error: the exception raised when the file cannot be opened.
    :param unavailable: when given, raised instead of sqlite's ``OperationalError`` (a full disk,
        an I/O error, a lock held past the busy timeout), with :func:`storage_problem`'s message.
    """

    def __init__(
        self,
        path: str,
        setup: Callable[[sqlite3.Connection], None],
        *,
        error: type[WorkerError] = WorkerError,
        unavailable: type[WorkerError] | None = None,
    ) -> None:
        self.path = path
        self._setup = setup
        self._error = error
        self._unavailable = unavailable
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        self._next_checkpoint = 0.0
        _DATABASES[next(_SERIALS)] = self

    @contextmanager
    def locked(self) -> Iterator[sqlite3.Connection]:
        """This process's connection, held by the calling thread until the block ends."""
        self._after_fork()
        with self._lock:
            if self._connection is None:
                self._connection = self._open()
            connection = self._connection
            changes = connection.total_changes
            try:
                yield connection
            except sqlite3.OperationalError as exc:
                if connection.in_transaction:  # a failed COMMIT leaves its transaction open
                    connection.execute("ROLLBACK")
                raise self._failed(exc) from exc
            if connection.total_changes != changes and not connection.in_transaction:
                self._keep_log_small()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: the file's write lock is taken first (``BEGIN IMMEDIATE``), so what
        the block reads cannot change before it writes."""
        with self.locked() as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def _failed(self, exc: sqlite3.OperationalError) -> Exception:
        """What to raise for ``exc``; a full disk is remembered (see :class:`~.disk.FullDisks`)."""
        if is_full(self.path, exc):
            FULL_DISKS.found_full(self.path)
        if self._unavailable is None:
            return exc
        return self._unavailable(storage_problem(self.path, exc))

    def wal_size(self) -> int:
        """Bytes in the write-ahead log file (0 when there is none)."""
        try:
            return os.path.getsize(f"{self.path}-wal")
        except OSError:
            return 0

    def _keep_log_small(self) -> None:
        """After a write: once the write-ahead log passes :data:`WAL_LIMIT`, copy it into the
        database and start it over (``journal_size_limit`` cuts its file back to the limit).

        sqlite's own checkpoints (off here) copy the log without waiting for anyone, and the log
        starts over only at a moment when no other process reads, which processes polling their
        queues under load may never leave: it grew to 18 MB in seconds, and its file never
        shrank. This checkpoint waits for the readers, at most :data:`CHECKPOINT_WAIT`; a reader
        that keeps its transaction open longer (a sqlite3 shell, say) holds the log until it ends.
        """
        now = time.monotonic()
        if now < self._next_checkpoint or self.wal_size() <= WAL_LIMIT:
            return
        with self.locked() as connection:
            connection.execute(f"PRAGMA busy_timeout = {int(CHECKPOINT_WAIT * 1000)}")
            try:
                busy, log, _ = connection.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            except sqlite3.OperationalError as exc:  # the disk, say: the next write says so
                logger.debug("checkpoint of %s failed: %s", self.path, exc)
            else:
                # log -1: another process was checkpointing, which cost no wait.
                if busy and log != -1:
                    self._next_checkpoint = now + CHECKPOINT_PAUSE
            finally:
                connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")

    def close(self) -> None:
        """Close this process's connection; the next use opens a new one."""
        self._after_fork()
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _after_fork(self) -> None:
        if self._pid != os.getpid():
            # The parent's lock may have been held by a thread that does not exist here.
            self._lock = threading.RLock()
            if self._connection is not None:
                _INHERITED.append(self._connection)
            self._connection = None
            self._pid = os.getpid()

    def _open(self) -> sqlite3.Connection:
        deadline = time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                connection = sqlite3.connect(
                    self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
                )
            except sqlite3.Error as exc:
                raise self._error(f"cannot open the embedded database {self.path!r}: {exc}") from None
            try:
                self._configure(connection)
                return connection
            except sqlite3.OperationalError as exc:
                connection.close()
                # Switching a new file to WAL needs a moment alone with it; another process
                # creating the same file at the same time makes that fail without waiting.
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    if self._unavailable is not None:  # a full disk, say: worth retrying later
                        raise self._failed(exc) from None
                    raise self._error(f"cannot set up the embedded database {self.path!r}: {exc}") from None
                time.sleep(0.01)
            except sqlite3.DatabaseError as exc:
                connection.close()
                raise self._error(
                    f"cannot use {self.path!r} as the embedded database: {exc}; point the URL at "
                    f"another file, as in embedded:///var/lib/app/queue.db"
                ) from None

    def _configure(self, connection: sqlite3.Connection) -> None:
        (mode,) = connection.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode).lower() != "wal":
            logger.warning(
                "embedded database %s runs in %s journal mode (WAL unavailable on this file "
                "system): readers and writers will block each other",
                self.path,
                mode,
            )
        # With WAL, NORMAL survives any process crash; only a power cut can drop the last commits.
        connection.execute("PRAGMA synchronous=NORMAL")
        # The write-ahead log is checkpointed after writes (_keep_log_small), not by sqlite, and
        # its file is cut back to WAL_LIMIT each time it starts over.
        connection.execute("PRAGMA wal_autocheckpoint = 0")
        connection.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT}")
        self._setup(connection)

"""The PostgreSQL result backend, in Celery's database backend's layout (``celery_taskmeta``,
``celery_tasksetmeta``): a Celery client with ``result_backend = "db+postgresql://..."`` reads what
this worker stores and the reverse; this project's client waits on ``LISTEN`` (:mod:`.waiting`);
chords are counted in the database (:mod:`.chords`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import ResultDecodeError, ResultError, ResultTimeout
from worker_core.redaction import redact_url
from worker_core.results import READY_STATES, ResultCodec, make_meta, pending_meta

from .chords import PostgresChords
from .database import behind_pooler, connect, connection_errors
from .options import BACKEND_OPTIONS, conninfo_of, read_options
from .schema import LATEST, Names, migrate, versions
from .waiting import listener_for

if TYPE_CHECKING:
    from worker_core import Settings
    from worker_core.slots import JoinsChords, ResultBackend, SavesGroups, SuccessIsFinal

__all__ = ["PostgresBackend"]

logger = logging.getLogger(__name__)

#: Seconds between deletions of expired results (expired ones are not read meanwhile).
PRUNE_INTERVAL = 60.0
#: Seconds a waiter reads the row again even without a notification (a notification is never
#: lost while the listening connection lives; this bounds the wait if it is being made again).
REREAD = 5.0
#: How often a statement is tried when the connection is lost, and the pause between tries.
RETRIES, RETRY_PAUSE = 20, 0.5

_COLUMNS = (
    "task_id, status, result, date_done, traceback, children, name, args, kwargs, worker, retries, queue, "
    "parent_id, group_id, content_type"
)


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc).isoformat()


def _bytes(value: str | bytes | None) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else value


class PostgresBackend(PostgresChords):
    """Task states and results in ``<schema>.celery_taskmeta`` (the result, children, args and
    kwargs each in ``result_serializer``, as Celery's database backend writes them), saved
    groups in ``celery_tasksetmeta``; results are not read, and are deleted, once older than
    ``result_expires``; a SUCCESS is never overwritten.

    ``result_backend_transport_options``: ``schema`` (``public``), ``listen_url``,
    ``prepare_threshold``, ``migrate``. Thread-safe; a forked child connects again.
    """

    success_is_final: ClassVar[bool] = True

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.conninfo = conninfo_of(url)
        options = read_options(
            settings.result_backend_transport_options, BACKEND_OPTIONS, "result_backend_transport_options"
        )
        self.names = Names(options["schema"])
        self.migrate = options["migrate"]
        self.prepare_threshold = options["prepare_threshold"]
        listen_url = options["listen_url"]
        self.listen_conninfo = self.conninfo if listen_url is None else conninfo_of(listen_url)
        self.listen_given = listen_url is not None
        self.expires = settings.result_expires
        self.extended = settings.result_extended
        self.codec = ResultCodec.from_settings(settings)
        self.chord_expires = (
            settings.result_expires
            if settings.result_chord_expires is None
            else settings.result_chord_expires
        )
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._connection: Any = None
        self._next_prune = 0.0
        t = self.names.taskmeta
        self._store_sql = f"""INSERT INTO {t} AS t ({_COLUMNS}) VALUES
            (%(task_id)s, %(status)s, %(result)s, %(date_done)s, %(traceback)s, %(children)s, %(name)s,
             %(args)s, %(kwargs)s, %(worker)s, %(retries)s, %(queue)s, %(parent_id)s, %(group_id)s,
             %(content_type)s)
            ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, result = excluded.result,
                date_done = excluded.date_done, traceback = excluded.traceback,
                children = excluded.children, name = excluded.name, args = excluded.args,
                kwargs = excluded.kwargs, worker = excluded.worker, retries = excluded.retries,
                queue = excluded.queue, parent_id = excluded.parent_id,
                group_id = excluded.group_id, content_type = excluded.content_type
            WHERE t.status IS DISTINCT FROM 'SUCCESS' OR {self._expired("t")}"""
        self._read_sql = f"SELECT {_COLUMNS} FROM {t} WHERE task_id = %s AND NOT {self._expired(t)}"

    def __repr__(self) -> str:
        return f"<PostgresBackend {redact_url(self.conninfo)} schema={self.names.schema_name}>"

    def _expired(self, table: str) -> str:
        """SQL true for a row of ``table`` older than ``result_expires``."""
        if not self.expires:
            return "false"
        return (
            f"coalesce({table}.date_done < (now() AT TIME ZONE 'UTC') - {float(self.expires)!r} "
            f"* interval '1 second', false)"
        )

    # -- connections -----------------------------------------------------------------------------

    def _run(self, action: str, call: Callable[[Any], Any], *, transaction: bool = False) -> Any:
        """``call(connection)`` on this process's connection, for one thread at a time (in a
        transaction when asked); a lost connection is made again and ``call`` tried again (up to
        :data:`RETRIES` times)."""
        import psycopg

        for attempt in range(1, RETRIES + 1):
            with self._lock:
                try:
                    connection = self._current()
                    if not transaction:
                        return call(connection)
                    with connection.transaction():
                        return call(connection)
                except connection_errors() as exc:
                    self._drop()
                    if attempt == RETRIES:
                        raise ResultError(
                            f"cannot {action} in PostgreSQL at {redact_url(self.conninfo)}: "
                            f"{str(exc).strip()}"
                        ) from exc
                    logger.warning(
                        "cannot %s in PostgreSQL (%s); retry %d/%d in %gs",
                        action,
                        str(exc).strip(),
                        attempt,
                        RETRIES,
                        RETRY_PAUSE,
                    )
                except psycopg.Error as exc:
                    raise ResultError(
                        f"cannot {action} in PostgreSQL: {type(exc).__name__}: {str(exc).strip()}"
                    ) from exc
            time.sleep(RETRY_PAUSE)
        raise AssertionError("unreachable")  # pragma: no cover

    def _current(self) -> Any:
        if self._pid != os.getpid():
            # After a fork the parent's connection stays untouched: this process opens its own.
            self._lock = threading.RLock()
            self._connection = None
            self._pid = os.getpid()
        connection = self._connection
        if connection is None or connection.closed:
            connection = connect(self.conninfo, role="results", prepare_threshold=self.prepare_threshold)
            self._ensure_tables(connection)
            self._connection = connection
        return connection

    def _ensure_tables(self, connection: Any) -> None:
        if self.migrate:
            migrate(connection, self.names, ("results",))
            return
        found = versions(connection, self.names)["results"]
        if found != LATEST["results"]:
            raise ResultError(
                f"the result tables in schema {self.names.schema_name!r} are at version {found}, "
                f"not {LATEST['results']}, and migrate is off: run `workerctl postgres migrate`"
            )

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._drop()
            else:
                self._connection = None

    # -- worker side -----------------------------------------------------------------------------

    def _encode(self, value: Any, serializer: str | None, task_id: str, what: str) -> bytes | None:
        try:
            return _bytes(self.codec.encode(value, serializer))
        except Exception as exc:
            raise ResultError(
                f"cannot encode the {what} of task {task_id}: {type(exc).__name__}: {exc}"
            ) from exc

    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Mapping[str, Any] | None = None,
        *,
        serializer: str | None = None,
    ) -> None:
        meta = make_meta(task_id, state, result, traceback, request, extended=self.extended)
        used = serializer or self.codec.serializer
        params = {
            "task_id": task_id,
            "status": state,
            "traceback": traceback,
            "parent_id": meta.get("parent_id"),
            "group_id": meta.get("group_id"),
            "content_type": None if used == "json" else self._content_type(used),
            "result": self._encode(meta["result"], serializer, task_id, "result"),
            "date_done": datetime.now(timezone.utc).replace(tzinfo=None) if state in READY_STATES else None,
            "children": self._encode(meta["children"], serializer, task_id, "children")
            if meta["children"]
            else None,
            "name": meta.get("name"),
            "worker": meta.get("worker"),
            "retries": meta.get("retries"),
            "queue": meta.get("queue"),
            "args": None
            if meta.get("args") is None
            else self._encode(meta["args"], serializer, task_id, "args"),
            "kwargs": None
            if meta.get("kwargs") is None
            else self._encode(meta["kwargs"], serializer, task_id, "kwargs"),
        }
        self._run(f"store the result of task {task_id}", lambda db: db.execute(self._store_sql, params))
        self._maybe_prune()

    # -- client side -----------------------------------------------------------------------------

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        row = self._run(
            f"read the result of task {task_id}", lambda db: db.execute(self._read_sql, (task_id,)).fetchone()
        )
        if row is None:
            return pending_meta(task_id)
        return self._meta(row)

    def _meta(self, row: tuple[Any, ...]) -> dict[str, Any]:
        (
            task_id,
            status,
            result,
            date_done,
            traceback,
            children,
            name,
            args,
            kwargs,
            worker,
            retries,
            queue,
            parent_id,
            group_id,
            content_type,
        ) = row

        def decoded(value: Any, what: str) -> Any:
            if value is None:
                return None
            return self._decode(bytes(value), content_type, f"the {what} of task {task_id}")

        meta: dict[str, Any] = {
            "status": status,
            "result": decoded(result, "stored result"),
            "traceback": traceback,
            "children": decoded(children, "children") or [],
            "date_done": _iso(date_done),
            "task_id": task_id,
        }
        if parent_id is not None:
            meta["parent_id"] = parent_id
        if group_id is not None:
            meta["group_id"] = group_id
        if self.extended or name is not None:
            meta.update(
                name=name,
                args=decoded(args, "arguments"),
                kwargs=decoded(kwargs, "keyword arguments"),
                worker=worker,
                retries=retries,
                queue=queue,
            )
        return meta

    def _content_type(self, serializer: str) -> str:
        from kombu.serialization import dumps

        content_type, _, _ = dumps(None, serializer=serializer)
        return str(content_type)

    def _decode(self, value: bytes, content_type: str | None, what: str) -> Any:
        """A stored value: in the ``content_type`` a task's own serializer wrote, when the row
        names one, else as :meth:`ResultCodec.decode_value` reads it."""
        if content_type is None:
            return self.codec.decode_value(value, what)
        from kombu.serialization import loads, registry

        if content_type not in self.codec.accept:
            accepted = ", ".join(sorted(self.codec.accept))
            name = registry.type_to_name.get(content_type, content_type)
            raise ResultDecodeError(
                f"{what} is stored in {name} ({content_type}), which this app does not accept "
                f"for results (accepted: {accepted}); add {name!r} to the "
                f"result_accept_content setting to read it"
            )

        try:
            return loads(value, content_type, "binary", accept=self.codec.accept)
        except Exception as exc:
            raise ResultDecodeError(
                f"{what} cannot be read as {content_type}: {type(exc).__name__}: {exc}"
            ) from None

    def _listens(self) -> bool:
        """Whether results are waited for on ``LISTEN``: not through a pooler, unless
        ``listen_url`` says where (this process's connection tells whether there is one)."""
        if self.listen_given:
            return True
        self._run("connect", lambda db: None)
        return not behind_pooler(self.listen_conninfo)

    def on_task_call(self, task_id: str) -> None:
        """Start listening for results now, so the wait that follows has nothing to set up."""
        if self._listens():
            listener_for(self.listen_conninfo, self.names.result_channel).start()

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Wait on ``LISTEN`` (``interval`` is not used: nothing is polled), or, behind a pooler
        without a ``listen_url``, read the row every ``interval`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._listens():
            return self._poll_for(task_id, deadline, timeout, interval)
        listener = listener_for(self.listen_conninfo, self.names.result_channel)
        event = listener.watch(task_id, timeout=min(5.0, timeout) if timeout is not None else 5.0)

        def until_notified(seconds: float) -> None:
            event.wait(seconds)
            event.clear()  # (before the next read: a notification after it wakes the next wait)

        try:
            return self._read_until_ready(task_id, deadline, timeout, until_notified, REREAD)
        finally:
            listener.unwatch(task_id, event)

    def _poll_for(
        self, task_id: str, deadline: float | None, timeout: float | None, interval: float
    ) -> Mapping[str, Any]:
        return self._read_until_ready(task_id, deadline, timeout, time.sleep, interval)

    def _read_until_ready(
        self, task_id: str, deadline: float | None, timeout: float | None,
        pause: Callable[[float], object], every: float,
    ) -> Mapping[str, Any]:
        """Read the task's row until it is ready, pausing with ``pause`` (at most ``every``
        seconds, never past the deadline) between reads."""
        while True:
            meta = self.get_task_meta(task_id)
            if meta["status"] in READY_STATES:
                return meta
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ResultTimeout(
                    f"task {task_id} did not finish within {timeout:g}s (state: {meta['status']})"
                )
            pause(every if left is None else min(left, every))

    def forget(self, task_id: str) -> None:
        self._run(
            f"forget the result of task {task_id}",
            lambda db: db.execute(f"DELETE FROM {self.names.taskmeta} WHERE task_id = %s", (task_id,)),
        )

    # -- groups ----------------------------------------------------------------------------------

    def save_group(self, group_id: str, result: Any) -> None:
        """Celery's ``celery_tasksetmeta`` row: the group's tuple in ``result_serializer``."""
        value = self._encode(result, None, group_id, "group")
        self._run(f"save group {group_id}", lambda db: self._save_group(db, group_id, value))

    def _save_group(self, connection: Any, group_id: str, value: bytes | None) -> None:
        connection.execute(
            f"""INSERT INTO {self.names.tasksetmeta} (taskset_id, result, date_done)
                VALUES (%s, %s, now() AT TIME ZONE 'UTC')
                ON CONFLICT (taskset_id) DO UPDATE SET result = excluded.result,
                    date_done = excluded.date_done""",
            (group_id, value),
        )

    def restore_group(self, group_id: str) -> Any | None:
        g = self.names.tasksetmeta
        row = self._run(
            f"restore group {group_id}",
            lambda db: db.execute(
                f"SELECT result FROM {g} WHERE taskset_id = %s AND NOT {self._expired(g)}", (group_id,)
            ).fetchone(),
        )
        if row is None or row[0] is None:
            return None
        return self.codec.decode_value(bytes(row[0]), f"the saved group {group_id}")

    def delete_group(self, group_id: str) -> None:
        self._run(
            f"delete group {group_id}",
            lambda db: db.execute(f"DELETE FROM {self.names.tasksetmeta} WHERE taskset_id = %s", (group_id,)),
        )

    # -- expiry ----------------------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        if not (self.expires or self.chord_expires) or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_INTERVAL
        try:
            self.cleanup()
        except ResultError as exc:
            # Housekeeping only: expired rows are not read anyway, and the next prune retries.
            logger.warning("%s", exc)

    def cleanup(self) -> None:
        """Delete the results and saved groups older than ``result_expires`` and the chords whose
        state expired, now (Celery's database backend's ``cleanup``). Every process storing
        results does it by itself at its first store and then every :data:`PRUNE_INTERVAL`
        seconds at most; meanwhile expired rows are not read.

        :raise ResultError: the database could not be reached.
        """

        def prune(db: Any) -> None:
            if self.expires:
                db.execute(f"DELETE FROM {self.names.taskmeta} AS t WHERE {self._expired('t')}")
                db.execute(f"DELETE FROM {self.names.tasksetmeta} AS t WHERE {self._expired('t')}")
            self.prune_chords(db)

        self._run("delete expired results", prune)


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _BACKEND: type[ResultBackend] = PostgresBackend
    _FINAL: type[SuccessIsFinal] = PostgresBackend
    _GROUPS: type[SavesGroups] = PostgresBackend
    _CHORDS: type[JoinsChords] = PostgresBackend

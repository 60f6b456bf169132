"""Task results in the embedded SQLite file (the embedded transport's file, its own table), in
Celery's format, saved group results in a second table and chords in two more; safe to use from
threads and from forked children."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import ResultError, ResultTimeout
from ..transports.embedded.database import Database, resolve_path
from .codec import ResultCodec
from .embedded_chords import CHORD_SCHEMA, EmbeddedChords
from .meta import READY_STATES, SUCCESS, make_meta, pending_meta

if TYPE_CHECKING:
    from ..app.settings import Settings
    from ..slots import JoinsChords, ResultBackend, SavesGroups, SuccessIsFinal

__all__ = ["EmbeddedBackend"]

logger = logging.getLogger(__name__)

#: Seconds between deletions of expired results (expired ones are invisible meanwhile).
PRUNE_INTERVAL = 60.0
#: The first pause of :meth:`EmbeddedBackend.wait_for`; it doubles up to ``interval``.
FIRST_POLL = 0.005

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS results (
    task_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    meta TEXT NOT NULL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS results_expiring ON results (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    meta TEXT NOT NULL,
    expires_at REAL
);
COMMIT;
"""
_VISIBLE = "(expires_at IS NULL OR expires_at > :now)"


def _create_table(connection: sqlite3.Connection) -> None:
    connection.executescript(_SCHEMA)
    connection.executescript(CHORD_SCHEMA)


class EmbeddedBackend(EmbeddedChords):
    """Stores each task's meta in ``result_serializer`` (kombu JSON by default: datetimes,
    UUIDs, Decimals and bytes round-trip), text or bytes as the serializer writes it, saved
    groups as Celery's ``{"result": <group tuple>}``, in the same serializer, and counts chords
    (:mod:`.embedded_chords`)."""

    #: Like Celery, a SUCCESS stays: a late duplicate run cannot overwrite it.
    success_is_final: ClassVar[bool] = True

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.path = resolve_path(url)
        self.expires = settings.result_expires
        self.extended = settings.result_extended
        self.codec = ResultCodec.from_settings(settings)
        self.chord_expires = (settings.result_expires if settings.result_chord_expires is None
                              else settings.result_chord_expires)
        self._db = Database(self.path, _create_table, error=ResultError)
        self._next_prune = 0.0

    def __repr__(self) -> str:
        return f"<EmbeddedBackend {self.path}>"

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
        try:
            payload = self.codec.encode(meta, serializer)
        except Exception as exc:
            raise ResultError(
                f"cannot encode the result of task {task_id}: {type(exc).__name__}: {exc}") from exc
        now = time.time()
        params = {
            "task_id": task_id,
            "status": state,
            "meta": payload,
            "now": now,
            "expires_at": None if self.expires is None else now + self.expires,
            "success": SUCCESS,
        }
        with self._using(f"store the result of task {task_id}") as conn:
            # Like Celery, a SUCCESS stays: a late duplicate run cannot overwrite it.
            conn.execute(
                """INSERT INTO results (task_id, status, meta, expires_at)
                    VALUES (:task_id, :status, :meta, :expires_at)
                    ON CONFLICT (task_id) DO UPDATE
                    SET status = excluded.status, meta = excluded.meta, expires_at = excluded.expires_at
                    WHERE results.status != :success OR results.expires_at <= :now""",
                params,
            )
        self._maybe_prune(now)

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        with self._using(f"read the result of task {task_id}") as conn:
            row = conn.execute(
                f"SELECT meta FROM results WHERE task_id = :task_id AND {_VISIBLE}",
                {"task_id": task_id, "now": time.time()},
            ).fetchone()
        if row is None:
            return pending_meta(task_id)
        return self.codec.decode(row[0], f"the stored result of task {task_id}")

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = min(FIRST_POLL, interval)
        while True:
            meta = self.get_task_meta(task_id)
            if meta["status"] in READY_STATES:
                return meta
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ResultTimeout(
                    f"task {task_id} did not finish within {timeout:g}s (state: {meta['status']})"
                )
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, interval)

    def on_task_call(self, task_id: str) -> None:
        """Nothing to subscribe to: :meth:`wait_for` polls the file."""

    def forget(self, task_id: str) -> None:
        with self._using(f"forget the result of task {task_id}") as conn:
            conn.execute("DELETE FROM results WHERE task_id = ?", (task_id,))

    def close(self) -> None:
        self._db.close()

    # -- groups ------------------------------------------------------------------------------------

    def save_group(self, group_id: str, result: Any) -> None:
        now = time.time()
        params = {"group_id": group_id, "meta": self.codec.encode({"result": result}),
                  "expires_at": None if self.expires is None else now + self.expires}
        with self._using(f"save group {group_id}") as conn:
            conn.execute("INSERT OR REPLACE INTO groups (group_id, meta, expires_at) "
                         "VALUES (:group_id, :meta, :expires_at)", params)
        self._maybe_prune(now)

    def restore_group(self, group_id: str) -> Any | None:
        with self._using(f"restore group {group_id}") as conn:
            row = conn.execute(f"SELECT meta FROM groups WHERE group_id = :group_id AND {_VISIBLE}",
                               {"group_id": group_id, "now": time.time()}).fetchone()
        if row is None:
            return None
        meta = self.codec.decode(row[0], f"the saved group {group_id}")
        if "result" not in meta:
            raise ResultError(
                f"the saved group {group_id} in {self.path!r} is not Celery's format: {row[0]!r}")
        return meta["result"]

    def delete_group(self, group_id: str) -> None:
        with self._using(f"delete group {group_id}") as conn:
            conn.execute("DELETE FROM groups WHERE group_id = ?", (group_id,))

    def _maybe_prune(self, now: float) -> None:
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_INTERVAL
        try:
            with self._using("delete expired results") as conn:
                conn.execute("DELETE FROM results WHERE expires_at <= ?", (now,))
                conn.execute("DELETE FROM groups WHERE expires_at <= ?", (now,))
                self.prune_chords(conn, now)
        except ResultError as exc:
            # Housekeeping only: expired rows are invisible anyway, and the next prune retries.
            logger.warning("%s", exc)

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        try:
            with self._db.transaction() as conn:
                yield conn
        except sqlite3.Error as exc:
            raise ResultError(f"cannot {action} in the embedded database {self.path!r}: {exc}") from exc

    @contextmanager
    def _using(self, action: str) -> Iterator[sqlite3.Connection]:
        try:
            with self._db.locked() as conn:
                yield conn
        except sqlite3.Error as exc:
            raise ResultError(f"cannot {action} in the embedded database {self.path!r}: {exc}") from exc


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _BACKEND: type[ResultBackend] = EmbeddedBackend
    _FINAL: type[SuccessIsFinal] = EmbeddedBackend
    _GROUPS: type[SavesGroups] = EmbeddedBackend
    _CHORDS: type[JoinsChords] = EmbeddedBackend

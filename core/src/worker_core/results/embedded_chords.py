"""Chords on the embedded result backend: the header's results counted in the SQLite file as
they are stored, with the steps and promises of Celery's Redis backend
(:class:`worker_core.slots.JoinsChords`): each part recorded once, the body claimed by one
worker, late copies ignored once the chord is done."""

from __future__ import annotations

import math
import sqlite3
import time
import uuid
from contextlib import AbstractContextManager
from typing import Any

from ..slots import ChordCount
from .codec import ResultCodec

__all__ = ["CHORD_SCHEMA", "DONE", "EmbeddedChords"]

#: The chord tables: one row per chord (its size, what was added, the claim or ``done``, and when
#: it expires), one per recorded header result (keyed by task id and place, so a copy counts
#: once), which goes with its chord's row.
CHORD_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS chords (
    group_id TEXT PRIMARY KEY,
    size INTEGER,
    added INTEGER NOT NULL DEFAULT 0,
    claim TEXT,
    claim_until REAL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS chord_parts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    group_id TEXT NOT NULL,
    part TEXT NOT NULL,
    position REAL NOT NULL,
    task_id TEXT NOT NULL,
    state TEXT NOT NULL,
    result TEXT NOT NULL,
    UNIQUE (group_id, part)
);
COMMIT;
"""

#: The claim's value once the chord's body was sent, kept :data:`DONE_SECONDS`.
DONE = "done"
DONE_SECONDS = 300.0


class EmbeddedChords:
    """The chord half of :class:`~worker_core.results.embedded.EmbeddedBackend`, whose file,
    settings and group table it uses (mixed into it)."""

    chord_expires: float | None
    expires: float | None
    codec: ResultCodec

    def _transaction(self, action: str) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # the backend's

    def _keep(self, now: float, seconds: float | None) -> float | None:
        return None if not seconds else now + seconds

    # -- client side -------------------------------------------------------------------------------

    def apply_chord(self, group_id: str, header: Any) -> None:
        """Save a header holding groups as a group (its shape is what the body gets); a header
        of plain tasks needs nothing."""
        _, children = header
        if not any(child[1] is not None for child in children):
            return
        now = time.time()
        with self._transaction(f"save the header of chord {group_id}") as conn:
            conn.execute("INSERT OR REPLACE INTO groups (group_id, meta, expires_at) VALUES (?, ?, ?)",
                         (group_id, self.codec.encode({"result": header}),
                          self._keep(now, self.chord_expires)))

    def set_chord_size(self, group_id: str, size: int) -> None:
        now = time.time()
        with self._transaction(f"set the size of chord {group_id}") as conn:
            self._forget_expired(conn, group_id, now)
            conn.execute(
                """INSERT INTO chords (group_id, size, expires_at) VALUES (?, ?, ?)
                   ON CONFLICT (group_id) DO UPDATE SET size = excluded.size, claim = NULL,
                   claim_until = NULL, expires_at = excluded.expires_at""",
                (group_id, size, self._keep(now, self.chord_expires)))

    # -- worker side -------------------------------------------------------------------------------

    def add_to_chord(self, group_id: str, count: int = 1) -> None:
        now = time.time()
        with self._transaction(f"add to chord {group_id}") as conn:
            self._forget_expired(conn, group_id, now)
            conn.execute(
                """INSERT INTO chords (group_id, added, expires_at) VALUES (?, ?, ?)
                   ON CONFLICT (group_id) DO UPDATE SET added = added + excluded.added""",
                (group_id, count, self._keep(now, self.chord_expires)))

    def count_chord_part(self, group_id: str, task_id: str, group_index: int | None, state: str,
                         result: Any, *, claim_seconds: float) -> ChordCount:
        now = time.time()
        keep = self._keep(now, self.chord_expires)
        position = math.inf if group_index is None else float(group_index)
        value = self.codec.encode({"result": result})
        with self._transaction(f"count a part of chord {group_id}") as conn:
            self._forget_expired(conn, group_id, now)
            row = conn.execute("SELECT size, added, claim, claim_until FROM chords WHERE group_id = ?",
                               (group_id,)).fetchone()
            if row is not None and row[2] == DONE:
                return ChordCount(-1, None)
            conn.execute(
                """INSERT OR IGNORE INTO chord_parts (group_id, part, position, task_id, state, result)
                   VALUES (?, ?, ?, ?, ?, ?)""",
                (group_id, f"{task_id}:{'+inf' if group_index is None else group_index}", position, task_id,
                 state, value))
            if row is None:
                conn.execute("INSERT INTO chords (group_id, expires_at) VALUES (?, ?)", (group_id, keep))
            else:
                conn.execute("UPDATE chords SET expires_at = ? WHERE group_id = ?", (keep, group_id))
            if keep is not None and self.expires:  # a saved header: never kept for less than results
                conn.execute("UPDATE groups SET expires_at = max(?, ?) WHERE group_id = ?",
                             (keep, now + self.expires, group_id))
            (ready,) = conn.execute("SELECT count(*) FROM chord_parts WHERE group_id = ?",
                                    (group_id,)).fetchone()
            size, added, claim, claim_until = row if row is not None else (None, 0, None, None)
            expected = None if size is None else size + added
            held = claim is not None and claim_until is not None and claim_until > now
            if expected is None or ready != expected or held:
                return ChordCount(ready, expected)
            token = uuid.uuid4().hex
            conn.execute("UPDATE chords SET claim = ?, claim_until = ? WHERE group_id = ?",
                         (token, now + claim_seconds, group_id))
            return ChordCount(ready, expected, token)

    def chord_parts(self, group_id: str) -> list[tuple[str, str, Any]]:
        with self._transaction(f"read the results of chord {group_id}") as conn:
            rows = conn.execute("SELECT task_id, state, result FROM chord_parts WHERE group_id = ? "
                                "ORDER BY position, seq", (group_id,)).fetchall()
        return [(task_id, state, self.codec.decode(value, f"a result of chord {group_id}")["result"])
                for task_id, state, value in rows]

    def finish_chord(self, group_id: str, claim: str, *, sent: bool) -> bool:
        now = time.time()
        with self._transaction(f"finish chord {group_id}") as conn:
            if not sent:
                conn.execute("UPDATE chords SET size = NULL WHERE group_id = ?", (group_id,))
                return True
            row = conn.execute("SELECT claim FROM chords WHERE group_id = ?", (group_id,)).fetchone()
            if row is None or row[0] != claim:
                return False
            conn.execute("DELETE FROM chord_parts WHERE group_id = ?", (group_id,))
            conn.execute("UPDATE chords SET size = NULL, added = 0, claim = ?, claim_until = ?, "
                         "expires_at = ? WHERE group_id = ?",
                         (DONE, now + DONE_SECONDS, now + DONE_SECONDS, group_id))
            return True

    @staticmethod
    def _forget_expired(conn: sqlite3.Connection, group_id: str, now: float) -> None:
        """A chord whose state has expired (or whose ``done`` has) starts again from nothing."""
        expired = conn.execute("SELECT 1 FROM chords WHERE group_id = ? AND expires_at <= ?",
                               (group_id, now)).fetchone()
        if expired is not None:
            conn.execute("DELETE FROM chords WHERE group_id = ?", (group_id,))
            conn.execute("DELETE FROM chord_parts WHERE group_id = ?", (group_id,))

    @staticmethod
    def prune_chords(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("DELETE FROM chords WHERE expires_at <= ?", (now,))
        conn.execute("DELETE FROM chord_parts WHERE group_id NOT IN (SELECT group_id FROM chords)")


"""Chords on the PostgreSQL result backend: the header's results counted in the database as they
are stored (:class:`worker_core.slots.JoinsChords`), each in one transaction that locks the
chord's row: a part is recorded once per task id and place, so a header task delivered again
counts once; the count that completes the chord claims its body, for ``claim_seconds``; once the
body is sent the chord says ``done`` for five minutes, so late copies change nothing.

``worker_chords`` holds one row per chord (its size, what was added, the claim, when it expires),
``worker_chord_parts`` one per recorded result. Celery's own database backend has no native
chords (it joins them with ``celery.chord_unlock``): a Celery worker sharing these results does
not count here.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

from worker_core.results import ResultCodec
from worker_core.slots import ChordCount

from .schema import Names

__all__ = ["DONE", "PostgresChords"]

#: The claim's value once the chord's body was sent, kept :data:`DONE_SECONDS`.
DONE = "done"
DONE_SECONDS = 300.0


class PostgresChords:
    """The chord half of :class:`~.backend.PostgresBackend` (mixed into it)."""

    names: Names
    codec: ResultCodec
    chord_expires: float | None
    expires: float | None

    def _run(self, action: str, call: Callable[[Any], Any], *, transaction: bool = False) -> Any:
        raise NotImplementedError  # the backend's

    def _save_group(self, connection: Any, group_id: str, value: bytes | None) -> None:
        raise NotImplementedError  # the backend's

    def _keep(self) -> str:
        """SQL for when a chord's state expires (NULL: never)."""
        seconds = self.chord_expires
        return "NULL" if not seconds else f"now() + {float(seconds)!r} * interval '1 second'"

    def _forget_expired(self, db: Any, group_id: str) -> None:
        """A chord whose state expired (or whose ``done`` did) starts again from nothing."""
        row = db.execute(
            f"DELETE FROM {self.names.chords} WHERE group_id = %s AND expires_at <= now() RETURNING group_id",
            (group_id,),
        ).fetchone()
        if row is not None:
            db.execute(f"DELETE FROM {self.names.chord_parts} WHERE group_id = %s", (group_id,))

    # -- client side -----------------------------------------------------------------------------

    def apply_chord(self, group_id: str, header: Any) -> None:
        """Save a header holding groups as a group (its shape is what the body gets); a header of
        plain tasks needs nothing."""
        _, children = header
        if not any(child[1] is not None for child in children):
            return
        value = self.codec.encode(header)
        encoded = value.encode() if isinstance(value, str) else value
        self._run(f"save the header of chord {group_id}", lambda db: self._save_group(db, group_id, encoded))

    def set_chord_size(self, group_id: str, size: int) -> None:
        def run(db: Any) -> None:
            self._forget_expired(db, group_id)
            db.execute(
                f"""INSERT INTO {self.names.chords} (group_id, size, expires_at)
                    VALUES (%s, %s, {self._keep()})
                    ON CONFLICT (group_id) DO UPDATE SET size = excluded.size, claim = NULL,
                    claim_until = NULL, expires_at = excluded.expires_at""",
                (group_id, size),
            )

        self._run(f"set the size of chord {group_id}", run, transaction=True)

    # -- worker side -----------------------------------------------------------------------------

    def add_to_chord(self, group_id: str, count: int = 1) -> None:
        def run(db: Any) -> None:
            self._forget_expired(db, group_id)
            db.execute(
                f"""INSERT INTO {self.names.chords} AS c (group_id, added, expires_at)
                    VALUES (%s, %s, {self._keep()})
                    ON CONFLICT (group_id) DO UPDATE SET added = c.added + excluded.added""",
                (group_id, count),
            )

        self._run(f"add to chord {group_id}", run, transaction=True)

    def count_chord_part(
        self,
        group_id: str,
        task_id: str,
        group_index: int | None,
        state: str,
        result: Any,
        *,
        claim_seconds: float,
    ) -> ChordCount:
        position = math.inf if group_index is None else float(group_index)
        value = self.codec.encode({"result": result})
        encoded = value.encode() if isinstance(value, str) else value
        part = f"{task_id}:{'+inf' if group_index is None else group_index}"
        chords, parts = self.names.chords, self.names.chord_parts

        def run(db: Any) -> ChordCount:
            self._forget_expired(db, group_id)
            db.execute(
                f"INSERT INTO {chords} (group_id, expires_at) VALUES (%s, {self._keep()}) "
                f"ON CONFLICT (group_id) DO NOTHING",
                (group_id,),
            )
            size, added, claim, held = db.execute(
                f"SELECT size, added, claim, coalesce(claim_until > now(), false) FROM {chords} "
                f"WHERE group_id = %s FOR UPDATE",
                (group_id,),
            ).fetchone()
            if claim == DONE:
                return ChordCount(-1, None)
            db.execute(
                f"""INSERT INTO {parts} (group_id, part, position, task_id, state, result)
                           VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                (group_id, part, position, task_id, state, encoded),
            )
            db.execute(f"UPDATE {chords} SET expires_at = {self._keep()} WHERE group_id = %s", (group_id,))
            if self.expires:  # a saved header: never kept for less than the results
                db.execute(
                    f"UPDATE {self.names.tasksetmeta} SET date_done = now() AT TIME ZONE 'UTC' "
                    f"WHERE taskset_id = %s",
                    (group_id,),
                )
            (ready,) = db.execute(f"SELECT count(*) FROM {parts} WHERE group_id = %s", (group_id,)).fetchone()
            expected = None if size is None else size + added
            if expected is None or ready != expected or (claim is not None and held):
                return ChordCount(int(ready), expected)
            token = uuid.uuid4().hex
            db.execute(
                f"UPDATE {chords} SET claim = %s, claim_until = now() + %s * interval '1 second' "
                f"WHERE group_id = %s",
                (token, claim_seconds, group_id),
            )
            return ChordCount(int(ready), expected, token)

        count: ChordCount = self._run(f"count a part of chord {group_id}", run, transaction=True)
        return count

    def chord_parts(self, group_id: str) -> list[tuple[str, str, Any]]:
        rows = self._run(
            f"read the results of chord {group_id}",
            lambda db: db.execute(
                f"SELECT task_id, state, result FROM {self.names.chord_parts} WHERE group_id = %s "
                f"ORDER BY position, seq",
                (group_id,),
            ).fetchall(),
        )
        return [
            (task_id, state, self.codec.decode(bytes(value), f"a result of chord {group_id}")["result"])
            for task_id, state, value in rows
        ]

    def finish_chord(self, group_id: str, claim: str, *, sent: bool) -> bool:
        chords = self.names.chords

        def run(db: Any) -> bool:
            if not sent:
                db.execute(f"UPDATE {chords} SET size = NULL WHERE group_id = %s", (group_id,))
                return True
            row = db.execute(
                f"SELECT claim FROM {chords} WHERE group_id = %s FOR UPDATE", (group_id,)
            ).fetchone()
            if row is None or row[0] != claim:
                return False
            db.execute(f"DELETE FROM {self.names.chord_parts} WHERE group_id = %s", (group_id,))
            db.execute(
                f"""UPDATE {chords} SET size = NULL, added = 0, claim = %s,
                           claim_until = now() + %s * interval '1 second',
                           expires_at = now() + %s * interval '1 second' WHERE group_id = %s""",
                (DONE, DONE_SECONDS, DONE_SECONDS, group_id),
            )
            return True

        finished: bool = self._run(f"finish chord {group_id}", run, transaction=True)
        return finished

    def prune_chords(self, db: Any) -> None:
        db.execute(f"DELETE FROM {self.names.chords} WHERE expires_at <= now()")
        db.execute(
            f"DELETE FROM {self.names.chord_parts} AS p WHERE NOT EXISTS "
            f"(SELECT 1 FROM {self.names.chords} AS c WHERE c.group_id = p.group_id)"
        )

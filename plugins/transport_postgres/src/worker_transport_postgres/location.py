"""What this process holds from one set of queue tables: the messages delivered and not settled
yet (their leases renewed by a thread of its own), and the acknowledgements not written yet.

A delivered row carries ``lease_owner`` (this process's token for the location) and
``lease_until``; any consumer gives it back to its queue once ``lease_until`` passes. While the
worker holds a message (waiting for a free slot, running), a daemon thread moves ``lease_until``
on every quarter of the visibility timeout, all held messages in one statement on a connection
of its own, so a loop busy with a task (the solo pool) does not stop it; a process that dies
stops renewing, and its messages come back after the timeout.

A delivery tag is ``<row id>.<delivery count>``: acknowledging, renewing or giving back a message
names both, so a copy delivered again after a lapsed lease is never settled by the holder of the
earlier copy (it is told, in a log line).

Held messages and acknowledgements are kept per location, not per connection: tasks kept across
a lost connection keep their leases, and their acknowledgements are written through the next
connection to the same tables.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Hashable, Iterable
from typing import Any

from .database import connect, connection_errors
from .schema import Names

__all__ = ["Location", "location_of", "locations", "parse_tag", "tag_arrays"]

logger = logging.getLogger(__name__)


def parse_tag(tag: str) -> tuple[int, int]:
    row, _, count = tag.partition(".")
    return int(row), int(count)


def tag_arrays(tags: Iterable[str]) -> tuple[list[int], list[int]]:
    """``(ids, delivery counts)`` of ``tags``, as the statements take them."""
    ids: list[int] = []
    counts: list[int] = []
    for tag in tags:
        row, count = parse_tag(tag)
        ids.append(row)
        counts.append(count)
    return ids, counts


class Location:
    """The messages held from one database's queue tables by this process."""

    def __init__(
        self,
        key: Hashable,
        conninfo: str,
        names: Names,
        visibility_timeout: float,
        prepare_threshold: int | None,
    ) -> None:
        self.key = key
        self.conninfo = conninfo
        self.names = names
        self.visibility_timeout = visibility_timeout
        self.prepare_threshold = prepare_threshold
        #: what ``lease_owner`` says for the rows this process holds
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        #: delivery tag -> the QoS counting it in its prefetch window
        self._held: dict[str, object] = {}
        self._acks: set[str] = set()
        self._requeues: set[str] = set()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._renewal: Any = None
        self._failing = False
        #: whether this process migrated (or checked) the tables already
        self.migrated = False
        #: the consumed queues' ``{"ready", "delayed", "taken"}`` as the last maintenance read
        #: them from SQL (the metrics' gauges)
        self.depths: dict[str, dict[str, int]] = {}

    def __len__(self) -> int:
        return len(self._held)

    # -- what is held ---------------------------------------------------------------------------

    def hold(self, tag: str, owner: object) -> None:
        self._held[tag] = owner
        if self._thread is None:
            self._start()

    def owner_of(self, tag: str) -> object | None:
        return self._held.get(tag)

    def already_here(self, tag: str) -> bool:
        """Whether the delivery ``tag`` is held here or acknowledged here and not written yet: a
        row taken again under the same tag lost the earlier take (see :meth:`Channel.taken_again`)."""
        with self._lock:
            return tag in self._held or tag in self._acks

    def release(self, tag: str) -> None:
        self._held.pop(tag, None)

    def held_by(self, owner: object) -> list[str]:
        return [tag for tag, holder in self._held.copy().items() if holder is owner]

    # -- acknowledgements and requeues not written yet -----------------------------------------

    def ack(self, tag: str) -> None:
        with self._lock:
            self._held.pop(tag, None)
            self._acks.add(tag)

    def requeue_later(self, tags: Iterable[str]) -> None:
        with self._lock:
            for tag in tags:
                self._held.pop(tag, None)
                self._requeues.add(tag)

    @property
    def unwritten(self) -> bool:
        return bool(self._acks or self._requeues)

    def write(self, connection: Any) -> None:
        """Write the acknowledgements and requeues kept so far on ``connection``; they stay kept
        if that fails (a connection error is raised for the caller to reconnect)."""
        with self._lock:
            acks, requeues = list(self._acks), list(self._requeues)
            self._acks.difference_update(acks)
            self._requeues.difference_update(requeues)
        try:
            if acks:
                ids, counts = tag_arrays(acks)
                cursor = connection.execute(
                    f"""DELETE FROM {self.names.messages} AS m
                        USING unnest(%s::bigint[], %s::int[]) AS a(id, n)
                        WHERE m.id = a.id AND m.delivered = a.n AND m.visible IS FALSE""",
                    (ids, counts),
                )
                if cursor.rowcount < len(acks):
                    self._lapsed_among(connection, ids, "acknowledged")
            if requeues:
                self.requeue(connection, requeues)
        except BaseException:
            with self._lock:
                self._acks.update(acks)
                self._requeues.update(requeues)
            raise

    def requeue(self, connection: Any, tags: list[str]) -> int:
        """Give ``tags`` back to their queues now, marked as delivered before; how many went."""
        ids, counts = tag_arrays(tags)
        cursor = connection.execute(
            f"""UPDATE {self.names.messages} AS m SET visible = true, lease_owner = NULL, lease_until = NULL
                FROM unnest(%s::bigint[], %s::int[]) AS a(id, n)
                WHERE m.id = a.id AND m.delivered = a.n AND m.visible IS FALSE""",
            (ids, counts),
        )
        for tag in tags:
            self._held.pop(tag, None)
        return int(cursor.rowcount)

    def _lapsed_among(self, connection: Any, ids: list[int], done: str) -> None:
        """Say how many of ``ids`` were settled in vain because another delivery of theirs is
        in the table now (rows deleted meanwhile, with their queue say, are no news)."""
        row = connection.execute(
            f"SELECT count(*) FROM {self.names.messages} WHERE id = ANY(%s)", (ids,)
        ).fetchone()
        if row[0]:
            self._lapsed(int(row[0]), done)

    def _lapsed(self, count: int, done: str) -> None:
        logger.warning(
            "%d message(s) %s here had lost their lease meanwhile (held past visibility_timeout=%gs without "
            "a renewal, as when the database could not be reached that long): another worker was given them "
            "and may run them again",
            count,
            done,
            self.visibility_timeout,
        )

    # -- renewing -------------------------------------------------------------------------------

    def interval(self) -> float:
        return max(self.visibility_timeout / 4, 0.05)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopping:
                return
            self._wake.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"postgres-leases-{id(self):x}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval())
            if self._stopping:
                break
            tags = list(self._held.copy())
            if tags:
                self._renew(tags)
        self._close_renewal()

    def _renew(self, tags: list[str]) -> None:
        try:
            if self._renewal is None or self._renewal.closed:
                self._renewal = connect(
                    self.conninfo,
                    role="leases",
                    prepare_threshold=self.prepare_threshold,
                    timeout=min(10.0, self.interval()),
                )
            ids, counts = tag_arrays(tags)
            rows = self._renewal.execute(
                f"""UPDATE {self.names.messages} AS m SET lease_until = now() + %s * interval '1 second'
                    FROM unnest(%s::bigint[], %s::int[]) AS a(id, n)
                    WHERE m.id = a.id AND m.delivered = a.n AND m.lease_owner = %s
                    RETURNING m.id, m.delivered""",
                (self.visibility_timeout, ids, counts, self.owner),
            ).fetchall()
        except connection_errors() as exc:
            self._close_renewal()
            if not self._failing:
                self._failing = True
                logger.warning(
                    "Could not renew the leases of %d held message(s) in PostgreSQL (%s: %s): if this lasts "
                    "longer than the visibility timeout (%gs), other workers are given them too; trying "
                    "again every %gs",
                    len(tags),
                    type(exc).__name__,
                    str(exc).strip(),
                    self.visibility_timeout,
                    self.interval(),
                )
            return
        if self._failing:
            self._failing = False
            logger.warning("Renewed the leases of %d held message(s) in PostgreSQL again", len(tags))
        renewed = {f"{row}.{count}" for row, count in rows}
        lost = [tag for tag in tags if tag not in renewed and tag in self._held]
        if lost:
            # (settled meanwhile, or given to another worker: only those still held here count)
            still = [tag for tag in lost if tag in self._held and tag not in self._acks]
            if still:
                self._lapsed(len(still), "held")

    def _close_renewal(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            try:
                renewal.close()
            except Exception:
                pass


_registry: dict[Hashable, Location] = {}
_registry_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child (a pool process) holds none of its parent's messages, and has no thread."""
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def locations() -> list[Location]:
    """Every location this process uses."""
    with _registry_lock:
        return list(_registry.values())


def location_of(
    key: Hashable, conninfo: str, names: Names, visibility_timeout: float, prepare_threshold: int | None
) -> Location:
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = Location(key, conninfo, names, visibility_timeout, prepare_threshold)
        return found

"""The ids of revoked tasks a worker remembers: a message that arrives with one of them is
discarded instead of run.

As in Celery, the set is per worker and bounded: at most :data:`REVOKES_MAX` ids (the oldest go
first) for :data:`REVOKE_EXPIRES` seconds each (10,800 s: three hours). With ``--statedb`` the
ids are kept in a file across restarts (see :mod:`worker_core.statedb`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from .statedb import State, read_state, write_state

__all__ = ["REVOKES_MAX", "REVOKE_EXPIRES", "RevokedIds"]

REVOKES_MAX = 50_000
REVOKE_EXPIRES = 10_800.0


class RevokedIds:
    """Task ids, each kept until it expires or ``maxlen`` newer ones push it out."""

    def __init__(self, maxlen: int = REVOKES_MAX, expires: float = REVOKE_EXPIRES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.maxlen = maxlen
        self.expires = expires
        self._clock = clock
        #: id -> when it was revoked, oldest first (a dict keeps insertion order)
        self._ids: dict[str, float] = {}

    def add(self, task_ids: Iterable[str]) -> None:
        now = self._clock()
        ids = self._ids
        for task_id in task_ids:
            ids.pop(task_id, None)  # revoked again: it moves to the back with a new time
            ids[task_id] = now
        self.purge(now)

    def purge(self, now: float | None = None) -> None:
        """Forget the expired ids and, past ``maxlen``, the oldest."""
        ids = self._ids
        deadline = (self._clock() if now is None else now) - self.expires
        excess = len(ids) - self.maxlen
        for task_id, revoked_at in list(ids.items()):
            if excess <= 0 and revoked_at > deadline:
                break
            del ids[task_id]
            excess -= 1

    def __contains__(self, task_id: object) -> bool:
        ids = self._ids
        if not ids:
            return False
        revoked_at = ids.get(task_id)  # type: ignore[call-overload]
        if revoked_at is None:
            return False
        if revoked_at <= self._clock() - self.expires:
            self.purge()
            return False
        return True

    def __len__(self) -> int:
        self.purge()
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        self.purge()
        return iter(list(self._ids))

    def state(self) -> dict[str, float]:
        """The ids that have not expired, each with the wall-clock time it was revoked."""
        self.purge()
        offset = time.time() - self._clock()
        return {task_id: revoked_at + offset for task_id, revoked_at in self._ids.items()}

    def restore(self, revoked: Mapping[str, float]) -> int:
        """Add ids with the wall-clock time each was revoked (see :meth:`state`); those expired
        are left out. Returns how many ids this holds then."""
        offset = time.time() - self._clock()
        for task_id, when in sorted(revoked.items(), key=lambda item: item[1]):
            self._ids.pop(task_id, None)
            self._ids[task_id] = when - offset
        self.purge()
        return len(self._ids)

    def save(self, path: str) -> None:
        """Write the ids and when they were revoked to the state file ``path`` (see
        :mod:`worker_core.statedb`, which keeps the logical clock there too)."""
        write_state(path, State(self.state()))

    def load(self, path: str) -> int:
        """Add the ids the state file ``path`` holds that have not expired; a missing file holds
        none. Raises ``ValueError`` naming the file when it is not one this worker wrote.
        Returns how many."""
        return self.restore(read_state(path).revoked)

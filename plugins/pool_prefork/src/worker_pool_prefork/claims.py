"""Which of the jobs written to a child it has started, so the parent can take back the others.

A job written behind a running one waits in the child's pipe. The child *claims* each job
before it starts it; the parent *withdraws* every job the child has not claimed yet, and the
child skips those when it reads them. One lock, shared through the fork, makes each of the two
a single step: a job is either started by the child or taken back by the parent, never both and
never neither. The child holds the lock for a few microseconds per job; the parent never waits
on it for long, so a child that died holding it cannot hang the parent.
"""

from __future__ import annotations

import mmap
import os
import struct

# The semaphore multiprocessing's Lock wraps (multiprocessing.synchronize itself would import
# tempfile, random, subprocess and more into the worker for nothing).
from _multiprocessing import SemLock  # type: ignore[import-not-found]  # (no stub)
from time import monotonic

__all__ = ["LOCK_WAIT", "Claims"]

#: How long the parent waits for a child's claims lock when taking jobs back off the hot path
#: (a warm stop, killing a child); a live child holds it for microseconds.
LOCK_WAIT = 0.05

#: The last job claimed (the child writes it), the newest job withdrawn: the child skips every
#: id up to it (the parent writes it), and the child's monotonic time when the job it runs now
#: started, 0.0 between jobs (the child writes it). Each field is written by one side only.
_CLAIMED = struct.Struct("=Q")
_FENCE = struct.Struct("=Q")
_STARTED = struct.Struct("=d")
_FENCE_AT = 8
_STARTED_AT = 16
_SIZE = 24
_SEMAPHORE = 1  # SemLock's kind for a plain (not recursive) lock


class Claims:
    """Shared by the parent and one child (mapped and made before the fork).

    Job ids written to one child only grow, so two numbers say everything: a job was claimed if
    its id is at most the last claimed, and was withdrawn if it is above that and at most the
    fence."""

    __slots__ = ("_lock", "_map")

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _SIZE)
        # a semaphore of one, unlinked at once: only the processes forked from here reach it
        self._lock = SemLock(_SEMAPHORE, 1, 1, f"/worker-claims-{os.getpid()}-{os.urandom(6).hex()}", True)

    # -- child side -------------------------------------------------------------------------------

    def claim(self, job_id: int) -> bool:
        """Start ``job_id`` unless the parent took it back; False means skip it."""
        with self._lock:
            if job_id <= _FENCE.unpack_from(self._map, _FENCE_AT)[0]:
                return False
            _CLAIMED.pack_into(self._map, 0, job_id)
        _STARTED.pack_into(self._map, _STARTED_AT, monotonic())
        return True

    def finished(self) -> None:
        """The job claimed last has ended."""
        _STARTED.pack_into(self._map, _STARTED_AT, 0.0)

    # -- parent side ------------------------------------------------------------------------------

    def withdraw(self, newest: int, wait: float) -> int | None:
        """Take back every job up to ``newest`` that the child has not claimed; the id of the last
        job it claimed (those above it are taken back), or None if the lock stayed taken for
        ``wait`` seconds (the child is claiming one right now, or died doing so)."""
        taken = self._lock.acquire(True, wait) if wait > 0 else self._lock.acquire(False)
        if not taken:
            return None
        try:
            if newest > _FENCE.unpack_from(self._map, _FENCE_AT)[0]:
                _FENCE.pack_into(self._map, _FENCE_AT, newest)
            return int(_CLAIMED.unpack_from(self._map, 0)[0])
        finally:
            self._lock.release()

    def running_since(self) -> float:
        """The child's monotonic time when the job it runs now started, 0.0 if it runs none;
        read without the lock: a hint, not a promise."""
        return float(_STARTED.unpack_from(self._map, _STARTED_AT)[0])

    def close(self) -> None:
        self._map.close()

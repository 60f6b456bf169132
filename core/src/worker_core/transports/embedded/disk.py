"""The disk under the embedded database: what a failed write says and what to do about it, and
whether a process that found the disk full has room to write again."""

from __future__ import annotations

import os
import sqlite3

__all__ = ["BUSY_TIMEOUT", "RESUME_ROOM", "WAL_LIMIT", "FullDisks", "free_bytes", "storage_problem"]

#: Seconds a statement waits for another process's write lock before failing.
BUSY_TIMEOUT = 30.0
#: Bytes the write-ahead log (the ``-wal`` file beside the database) may hold: past it, the next
#: write of any process copies it into the database and starts it over (sqlite's own default).
WAL_LIMIT = 4 << 20
#: Bytes that must be free on the file system before a process that found it full writes again:
#: writing as soon as a few bytes free up would fail again at once.
RESUME_ROOM = 2 * WAL_LIMIT


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged process may still write on the file system holding ``path``."""
    try:
        stat = os.statvfs(os.path.dirname(path))
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def size_text(count: int) -> str:
    """``count`` bytes for people: ``512 bytes``, ``1.5 MiB``."""
    if count < 1024:
        return f"{count} bytes"
    value, unit = count / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def _free_text(path: str) -> str:
    free = free_bytes(path)
    return "free space unknown" if free is None else f"{size_text(free)} free on its file system"


def _kind(exc: sqlite3.Error) -> str:
    name = str(getattr(exc, "sqlite_errorname", ""))  # Python 3.11+; the message before that
    text = str(exc)
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return "full"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return "locked"
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM")) or "readonly" in text:
        return "refused"
    return "failed"


def is_full(path: str, exc: sqlite3.Error) -> bool:
    """Whether ``exc`` means the disk holding ``path`` is full (an I/O error counts when it is
    nearly full: sqlite reports some failed writes of its shared-memory file that way)."""
    kind = _kind(exc)
    if kind == "full":
        return True
    free = free_bytes(path)
    return kind == "failed" and free is not None and free < RESUME_ROOM


def storage_problem(path: str, exc: sqlite3.Error) -> str:
    """What went wrong with the database file at ``path``, and what to do about it."""
    kind = _kind(exc)
    if kind == "full" or is_full(path, exc):
        return (f"the embedded database {path!r} cannot grow: {exc} ({_free_text(path)}); free "
                f"space there, or point the URL at a file on a disk with room")
    if kind == "locked":
        return (f"the embedded database {path!r} stayed locked by another process for more than "
                f"{BUSY_TIMEOUT:g}s: {exc}; look for a process holding a long transaction on it")
    if kind == "refused":
        return (f"the embedded database {path!r} cannot be written: {exc}; check the permissions of "
                f"the file, of its -wal and -shm files and of their directory")
    return f"the embedded database {path!r} failed: {exc} ({_free_text(path)}); check the disk it is on"


class FullDisks:
    """The database files this process found on a full disk, until it has room to write again.

    A full disk usually frees a little space now and then (a checkpoint shrinking the log, another
    program deleting a file): a process that wrote again as soon as one write fits would fail again
    at once. It waits for :data:`RESUME_ROOM` instead.
    """

    def __init__(self) -> None:
        self._paths: set[str] = set()

    def found_full(self, path: str) -> None:
        self._paths.add(path)

    def room_again(self, path: str) -> None:
        self._paths.discard(path)

    def lacking_room(self, path: str) -> str | None:
        """Why ``path`` may not be written yet (its disk was found full and has too little
        room), or None."""
        if path not in self._paths:
            return None
        free = free_bytes(path)
        if free is None or free >= RESUME_ROOM:
            return None
        return (f"the embedded database {path!r} is on a full disk ({size_text(free)} free on its "
                f"file system; writing resumes once {size_text(RESUME_ROOM)} are free): free space "
                f"there, or point the URL at a file on a disk with room")


#: for this process (a forked child inherits what its parent found; that is still true)
FULL_DISKS = FullDisks()

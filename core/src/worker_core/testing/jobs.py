"""Module-level job targets for pool tests: picklable by reference, so process pools can run them.

Blocking jobs wait for a file to appear rather than for an in-memory event, because the test
and the job may live in different processes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from worker_core.exceptions import SoftTimeLimitExceeded

__all__ = [
    "add",
    "allocate",
    "append_line",
    "busy_sleep",
    "catch_soft_limit",
    "echo",
    "fail",
    "initializations",
    "mark_initialized",
    "noop",
    "sleep",
    "touch",
    "wait_for_path",
    "whoami",
    "whoami_after",
]

_local = threading.local()


def add(a: Any, b: Any) -> Any:
    return a + b


def noop() -> None:
    return None


def echo(value: Any) -> Any:
    return value


def fail(message: str) -> None:
    raise ValueError(message)


def append_line(path: str, line: str, seconds: float = 0.0) -> str:
    """Sleep ``seconds``, then append ``line`` to ``path`` (one write: a record of each run)."""
    if seconds:
        time.sleep(seconds)
    with open(path, "a") as file:
        file.write(line + "\n")
    return line


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def sleep_ignoring_sigterm(seconds: float) -> float:
    """A task that installs its own SIGTERM handler, which ignores the signal, then sleeps."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return seconds


def wait_for_path(path: str, timeout: float = 30.0, value: Any = "released") -> Any:
    """Block until ``path`` exists (the test creates it to release the job), then return ``value``."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.005)
    return value


def mark_initialized(token: str = "") -> None:
    """A pool initializer (bind ``token`` with ``functools.partial``): counts how often it ran
    in this thread of this process for that token.

    Keyed by pid too, since a forked child inherits the forking thread's thread-locals; and by
    token, since one test thread may run several inline pools one after the other.
    """
    counts = _local.__dict__.setdefault("counts", {})
    key = (os.getpid(), token)
    counts[key] = counts.get(key, 0) + 1


def initializations(token: str = "") -> int:
    """How often :func:`mark_initialized` ran for ``token`` in the thread running this job."""
    return int(_local.__dict__.get("counts", {}).get((os.getpid(), token), 0))


def whoami(token: str = "") -> tuple[int, int, int]:
    """``(pid, thread ident, initializations for token in this thread)``."""
    return os.getpid(), threading.get_ident(), initializations(token)


def whoami_after(path: str, timeout: float = 30.0, token: str = "") -> tuple[int, int, int]:
    """:func:`whoami`, once ``path`` exists: holds an executor until the test releases it."""
    wait_for_path(path, timeout)
    return whoami(token)


_kept: list[bytearray] = []


def allocate(mebibytes: int) -> int:
    """Allocate and keep ``mebibytes`` MiB (touched, so resident) in this process; return the pid."""
    block = bytearray(mebibytes * 1024 * 1024)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    _kept.append(block)
    return os.getpid()


def catch_soft_limit(seconds: float) -> str:
    """Sleep; report whether the soft time limit interrupted it (the task catches it)."""
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "soft limit caught"
    return "finished"


def busy_sleep(seconds: float, ignore_soft: bool = True) -> str:
    """Sleep ``seconds`` in small steps, swallowing soft limits (to reach the hard one)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.01)
        except SoftTimeLimitExceeded:
            if not ignore_soft:
                raise
    return "finished"


def touch(path: str) -> None:
    Path(path).touch()

"""Which job took a loop process down: the marks a loop process keeps in memory it shares with
the worker (the job each of its threads runs, the loop's at each step of a coroutine), and the
report Python's ``faulthandler`` writes as it crashes (which thread crashed).

A process that crashed (a fatal signal of its own: a segfault, an abort) or exited by itself
(``os._exit``) was taken down by the job its crashing thread ran, or, without a report, by the one
job its threads were running then; one killed from outside (``SIGKILL``: the kernel out of
memory, a person) has no culprit, nor has a crash outside any job's step. The other jobs lost with
the process are its bystanders.
"""

from __future__ import annotations

import mmap
import os
import re
import signal
import threading

__all__ = ["CRASH_SIGNALS", "Marks", "culprit"]

#: signals a process raises against itself when it crashes
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT})

_CURRENT = re.compile(rb"Current thread 0x([0-9a-f]+)")
_WORD = 8


class Marks:
    """``slots`` pairs of (thread ident, job id) in anonymous shared memory, made before the fork:
    slot 0 is the loop's (the job whose coroutine steps), the others the threads' that run plain
    functions, each taken by its thread at its first job."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.memory = mmap.mmap(-1, 2 * _WORD * slots)
        self.words = memoryview(self.memory).cast("Q")
        self._taken = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def loop_thread(self) -> None:
        """Take slot 0 for the calling thread, the loop's."""
        self.words[0] = threading.get_ident()
        self._taken = 1

    def thread_slot(self) -> int:
        """The calling thread's slot (taken at its first call), or -1 when none is left."""
        slot: int | None = getattr(self._local, "slot", None)
        if slot is None:
            with self._lock:
                slot = self._taken if self._taken < self.slots else -1
                self._taken += slot >= 0
            if slot >= 0:
                self.words[2 * slot] = threading.get_ident()
            self._local.slot = slot
        return slot

    def pairs(self) -> list[tuple[int, int]]:
        words = self.words
        return [(words[2 * slot], words[2 * slot + 1]) for slot in range(self.slots)]

    def close(self) -> None:
        self.words.release()
        self.memory.close()


def culprit(status: int | None, marks: list[tuple[int, int]], report: bytes) -> int | None:
    """The id of the job that took its process down, from its ``waitpid`` status, its marks and
    its crash report; None when no job can be blamed."""
    if status is None or (os.WIFSIGNALED(status) and os.WTERMSIG(status) not in CRASH_SIGNALS):
        return None
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return None
    found = _CURRENT.search(report)
    if found is not None:
        ident = int(found.group(1), 16)
        return next((job for thread, job in marks if thread == ident and job), None)
    running = [job for _, job in marks if job]
    return running[0] if len(running) == 1 else None

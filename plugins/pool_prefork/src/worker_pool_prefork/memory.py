"""How much resident memory this process uses now, for ``max_memory_per_child``."""

from __future__ import annotations

import os
import resource
import sys

__all__ = ["ResidentMemory"]


class ResidentMemory:
    """Reads the *current* resident set size in KiB.

    On Linux this is ``/proc/self/statm`` (kept open and re-read with one ``pread``), so a child
    that allocated and freed memory is not recycled for its peak. Elsewhere it falls back to
    ``ru_maxrss``, which is the peak: the only figure those systems give cheaply.
    Create it in the process it measures: ``/proc/self`` is resolved when the file is opened.
    """

    def __init__(self) -> None:
        self._page_kib = max(os.sysconf("SC_PAGE_SIZE") // 1024, 1) if hasattr(os, "sysconf") else 4
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def kib(self) -> int:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page_kib
            except (OSError, ValueError, IndexError):
                self._fd = None
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak  # macOS reports bytes

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

"""Noticing a loop that does not turn: a thread of the loop process watches a time the loop
writes every few milliseconds, and names the task whose step has been running past a threshold
(a blocking call in a coroutine: ``time.sleep``, a synchronous client, a long computation), and
for how long, once when it passes the threshold and once when the loop turns again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from time import monotonic

__all__ = ["StallWatch"]

#: ``report(label or None, seconds, over)``
Report = Callable[[str | None, float, bool], None]


class StallWatch:
    """Watches ``loop`` from a daemon thread; ``label(task)`` names a task for the report."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        threshold: float,
        label: Callable[[asyncio.Task[object]], str | None],
        report: Report,
    ) -> None:
        self.loop = loop
        self.threshold = threshold
        self.label = label
        self.report = report
        self.beat = monotonic()
        self._interval = min(max(threshold / 5, 0.005), 0.1)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="worker-asyncio-stall-watch", daemon=True)

    def start(self) -> None:
        self.loop.call_soon(self._tick)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _tick(self) -> None:
        self.beat = monotonic()
        if not self._stopped.is_set():
            self.loop.call_later(self._interval, self._tick)

    def _watch(self) -> None:
        stalled_since: float | None = None
        culprit: str | None = None
        while not self._stopped.wait(self._interval):
            beat = self.beat
            late = monotonic() - beat - self._interval
            if stalled_since is None:
                if late >= self.threshold:
                    stalled_since = beat
                    task = asyncio.current_task(self.loop)
                    culprit = self.label(task) if task is not None else None
                    self.report(culprit, late, False)
            elif beat > stalled_since:  # the loop turned again
                self.report(culprit, max(beat - stalled_since - self._interval, late), True)
                stalled_since, culprit = None, None

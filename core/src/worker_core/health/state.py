"""The worker's own view of its health, answered without asking the broker: liveness from the
main loop's progress, readiness with the reason it is not ready.

The worker owns one :class:`Health` (``worker.health``). The event loop stamps its progress on
every turn and while it waits to reconnect; the consumer and other parts *hold* a reason while it
applies (``broker-disconnected``, ``consumer-stalled``, ``broker-blocked``) and release it after.
Readers (the probe listener's threads, the state file's writer) only read: every read is of one
attribute or one dictionary, each consistent on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ..worker.worker import Worker

__all__ = [
    "BOOTING",
    "BROKER_BLOCKED",
    "BROKER_DISCONNECTED",
    "CONSUMER_STALLED",
    "DRAINING",
    "LIVE",
    "READINESS_ORDER",
    "SERVING",
    "STARTING",
    "STUCK",
    "Health",
    "Verdict",
]

#: readiness: a stop was asked for; running tasks finish, nothing new is taken
DRAINING = "draining"
#: readiness: the connection to the broker is lost (or was never made) and being retried
BROKER_DISCONNECTED = "broker-disconnected"
#: readiness: the broker refuses writes for now (full memory or disk, a RabbitMQ alarm)
BROKER_BLOCKED = "broker-blocked"
#: readiness: the worker has not taken messages yet (its pool or consumer is starting)
STARTING = "starting"
#: readiness: messages wait and the worker has room, but it took none for a while
CONSUMER_STALLED = "consumer-stalled"
#: readiness: taking and running tasks
SERVING = "serving"
#: liveness: the main loop turns
LIVE = "live"
#: liveness and start-up: the worker loads its app and starts its pool (the start-up probe's time)
BOOTING = "booting"
#: liveness: the main loop has not turned for longer than the liveness timeout
STUCK = "stuck"

#: which reason readiness names when several apply: the first of these (other reasons a plugin
#: holds come after, oldest first)
READINESS_ORDER = (DRAINING, BROKER_DISCONNECTED, BROKER_BLOCKED, STARTING, CONSUMER_STALLED)

#: seconds without progress of the main loop before the worker is not live, by default
DEFAULT_LIVENESS_TIMEOUT = 60.0


@attrs.frozen
class Verdict:
    """One probe's answer: whether it passes, the reason word, and for how long that reason has
    held (seconds, 0 when not known)."""

    ok: bool
    reason: str
    since: float = 0.0

    def line(self) -> str:
        """``serving``, or ``broker-disconnected for 12s``."""
        return f"{self.reason} for {self.since:.0f}s" if self.since >= 1 else self.reason


class Health:
    """Liveness, start-up and readiness of one worker, from what its main process knows.

    - **live**: the main loop (or the consumer waiting to reconnect) made progress within
      :attr:`liveness_timeout` seconds; a worker that is still loading its app and starting its
      pool is live (``booting``: the start-up probe bounds that time). A broker outage never makes
      it not live: the loop keeps turning while it reconnects.
    - **started**: the consumer has begun (connected, or retrying its broker).
    - **ready**: taking tasks; else the first reason of :data:`READINESS_ORDER` that applies.
    """

    def __init__(self, worker: Worker, liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT) -> None:
        self._worker = worker
        self.liveness_timeout = liveness_timeout
        #: ``time.monotonic()`` of the main loop's last progress (one store per loop turn)
        self.progress = time.monotonic()
        #: when the consumer began (``None`` while booting)
        self.started_at: float | None = None
        #: reason -> since when; each change is one dictionary operation (atomic), so holding or
        #: releasing needs no lock: a signal handler may do it (a warm stop holds ``draining``)
        self._held: dict[str, float] = {}
        self._watchers: list[Callable[[], None]] = []

    # -- what the worker's parts tell it ----------------------------------------------------------

    def beat(self) -> None:
        """The main loop made progress (called on every turn: keep it one store)."""
        self.progress = time.monotonic()

    def consumer_started(self) -> None:
        """The consumer begins: the worker has booted."""
        self.progress = time.monotonic()
        if self.started_at is None:
            self.started_at = self.progress
            self.changed()

    def hold(self, reason: str, *, notify: bool = True) -> None:
        """``reason`` applies from now on (again: no change); the worker is not ready while any
        reason is held. Safe from any thread; from a signal handler, with ``notify=False`` (the
        watchers then read it at their next turn, within a second)."""
        if reason in self._held:
            return
        self._held.setdefault(reason, time.monotonic())
        if notify:
            self.changed()

    def release(self, reason: str) -> None:
        """``reason`` no longer applies (nothing happens if it was not held)."""
        if reason not in self._held:
            return
        self._held.pop(reason, None)
        self.changed()

    def holds(self, reason: str) -> bool:
        return reason in self._held

    def on_change(self, watcher: Callable[[], None]) -> None:
        """Call ``watcher()`` (from whichever thread changed it) when readiness may have changed."""
        self._watchers.append(watcher)

    def changed(self) -> None:
        """Readiness may have changed (a reason held or released, the worker ready or stopping)."""
        for watcher in list(self._watchers):
            watcher()

    # -- what the probes read ------------------------------------------------------------------------

    def live(self, now: float | None = None) -> Verdict:
        now = time.monotonic() if now is None else now
        if self.started_at is None:
            return Verdict(True, BOOTING)
        age = now - self.progress
        if age > self.liveness_timeout:
            return Verdict(False, STUCK, age)
        return Verdict(True, LIVE)

    def started(self, now: float | None = None) -> Verdict:
        now = time.monotonic() if now is None else now
        if self.started_at is None:
            return Verdict(False, BOOTING)
        return Verdict(True, "started", now - self.started_at)

    def ready(self, now: float | None = None) -> Verdict:
        now = time.monotonic() if now is None else now
        worker = self._worker
        held = dict(self._held)
        if worker.stopping or DRAINING in held:
            return Verdict(False, DRAINING, now - held.get(DRAINING, now))
        for reason in READINESS_ORDER:
            if reason == STARTING:
                if not worker.ready:
                    return Verdict(False, STARTING, now - worker.started_at)
            elif reason in held:
                return Verdict(False, reason, now - held[reason])
        if held:
            reason, since = min(held.items(), key=lambda item: item[1])
            return Verdict(False, reason, now - since)
        return Verdict(True, SERVING)

    def snapshot(self, now: float | None = None) -> dict[str, object]:
        """Everything a probe needs, as the state file holds it (see :mod:`.statefile`)."""
        now = time.monotonic() if now is None else now
        ready = self.ready(now)
        return {
            "pid": self._worker.pid,
            "hostname": self._worker.hostname,
            "written": now,
            "progress": self.progress,
            "liveness_timeout": self.liveness_timeout,
            "started": self.started_at is not None,
            "ready": ready.ok,
            "reason": ready.reason,
            "reason_since": now - ready.since,
        }

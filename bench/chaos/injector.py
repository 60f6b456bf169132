"""Faults at random intervals: SIGKILL a pool child, SIGKILL the whole worker and start it again, or
cut the broker connection for a while; every fault is logged with its time."""

from __future__ import annotations

import random
import time

import attrs
from faults import TcpProxy

from .fleet import Fleet

__all__ = ["KINDS", "FaultEvent", "Injector"]

KINDS = ("child-kill", "worker-kill", "connection-cut")


@attrs.frozen
class FaultEvent:
    """One fault: what, when (start and end, the same for kills), and who (pid, generation)."""

    kind: str
    started: float
    ended: float
    generation: int
    pid: int | None = None


@attrs.define
class Injector:
    """Chooses and performs faults; :meth:`due` says when the next one is."""

    fleet: Fleet
    proxy: TcpProxy
    rng: random.Random
    interval: tuple[float, float] = (0.5, 3.0)
    cut_length: tuple[float, float] = (0.2, 3.0)
    weights: tuple[float, float, float] = (5.0, 2.0, 3.0)
    events: list[FaultEvent] = attrs.Factory(list)
    next_at: float = 0.0

    def schedule(self) -> None:
        self.next_at = time.monotonic() + self.rng.uniform(*self.interval)

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def inject(self) -> FaultEvent | None:
        """Perform one random fault now and schedule the next."""
        kind = self.rng.choices(KINDS, weights=self.weights)[0]
        event = getattr(self, "_" + kind.replace("-", "_"))()
        if event is not None:
            self.events.append(event)
        self.schedule()
        return event

    def _child_kill(self) -> FaultEvent | None:
        children = self.fleet.children()
        if not children:
            return None
        pid = self.rng.choice(children)
        now = time.time()
        if not self.fleet.kill_child(pid):
            return None
        return FaultEvent("child-kill", now, now, self.fleet.generation, pid)

    def _worker_kill(self) -> FaultEvent:
        generation, pid = self.fleet.generation, self.fleet.pid
        now = time.time()
        self.fleet.kill()
        self.fleet.start()
        return FaultEvent("worker-kill", now, now, generation, pid)

    def _connection_cut(self) -> FaultEvent:
        started = time.time()
        self.proxy.cut()
        time.sleep(self.rng.uniform(*self.cut_length))
        self.proxy.restore()
        return FaultEvent("connection-cut", started, time.time(), self.fleet.generation)

    def count(self, kind: str) -> int:
        return sum(1 for event in self.events if event.kind == kind)

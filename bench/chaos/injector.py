"""Faults at random intervals: SIGKILL a pool child, SIGKILL a whole worker and start it again, SIGTERM
a worker and SIGKILL it a few seconds later (a grace period shorter than a task, as Kubernetes
gives) and start it again, cut the broker connection for a while, stop a worker and all its
processes (SIGSTOP, as a paused VM) for longer than Redis's visibility timeout, or step a worker's
wall clock (libfaketime) an hour or minutes either way, or back to the right time; every fault is
logged with its time."""

from __future__ import annotations

import random
import time

import attrs
from faults import TcpProxy

from .fleet import Fleet

__all__ = ["KINDS", "FaultEvent", "Injector"]

KINDS = ("child-kill", "worker-kill", "connection-cut", "term-kill", "pause", "clock-step")
#: How often each kind is chosen, relative to the others.
WEIGHTS = {"child-kill": 5.0, "worker-kill": 2.0, "connection-cut": 3.0, "term-kill": 2.0, "pause": 2.0,
           "clock-step": 2.0}
#: the wall-clock offsets (seconds) a clock step chooses among (0: set right)
OFFSETS = (-3600.0, -600.0, 0.0, 600.0, 3600.0)


@attrs.frozen
class FaultEvent:
    """One fault: what, when (start and end, the same for kills), and who (pid, generation)."""

    kind: str
    started: float
    ended: float
    generation: int
    pid: int | None = None
    #: term-kill: whether the worker was still there for the SIGKILL (not done within the grace)
    killed: bool = True


@attrs.define
class Injector:
    """Chooses and performs faults; :meth:`due` says when the next one is."""

    fleet: Fleet
    proxy: TcpProxy
    rng: random.Random
    interval: tuple[float, float] = (0.5, 3.0)
    cut_length: tuple[float, float] = (0.2, 3.0)
    kinds: tuple[str, ...] = KINDS
    #: seconds between the SIGTERM and the SIGKILL of a term-kill
    grace: float = 3.0
    #: how long a pause lasts: MIN,MAX seconds
    pause_length: tuple[float, float] = (10.0, 20.0)
    events: list[FaultEvent] = attrs.Factory(list)
    next_at: float = 0.0

    def schedule(self) -> None:
        self.next_at = time.monotonic() + self.rng.uniform(*self.interval)

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def inject(self) -> FaultEvent | None:
        """Perform one random fault now and schedule the next."""
        kind = self.rng.choices(self.kinds, weights=[WEIGHTS[kind] for kind in self.kinds])[0]
        event = getattr(self, "_" + kind.replace("-", "_"))()
        if event is not None:
            self.events.append(event)
        self.schedule()
        return event

    def _child_kill(self) -> FaultEvent | None:
        slot = self.rng.randrange(self.fleet.size)
        children = self.fleet.children(slot)
        if not children:
            return None
        pid = self.rng.choice(children)
        now = time.time()
        if not self.fleet.kill_child(pid):
            return None
        return FaultEvent("child-kill", now, now, self.fleet.generations[slot], pid)

    def _worker_kill(self) -> FaultEvent:
        slot = self.rng.randrange(self.fleet.size)
        generation, pid = self.fleet.generations[slot], self.fleet.pid(slot)
        started = time.time()
        self.fleet.kill(slot)
        # (its children are killed one by one: one may still record a run until its SIGKILL)
        ended = time.time()
        self.fleet.start(slot)
        return FaultEvent("worker-kill", started, ended, generation, pid)

    def _term_kill(self) -> FaultEvent:
        slot = self.rng.randrange(self.fleet.size)
        generation, pid = self.fleet.generations[slot], self.fleet.pid(slot)
        started = time.time()
        self.fleet.terminate(slot)
        time.sleep(self.grace)
        killed = self.fleet.alive(slot)
        ended = time.time()
        self.fleet.kill(slot)
        self.fleet.start(slot)
        return FaultEvent("term-kill", started, ended, generation, pid, killed)

    def _connection_cut(self) -> FaultEvent:
        started = time.time()
        self.proxy.cut()
        time.sleep(self.rng.uniform(*self.cut_length))
        self.proxy.restore()
        return FaultEvent("connection-cut", started, time.time(), -1)

    def _pause(self) -> FaultEvent | None:
        slot = self.rng.randrange(self.fleet.size)
        generation, pid = self.fleet.generations[slot], self.fleet.pid(slot)
        started = time.time()
        if not self.fleet.stop_all(slot):
            return None
        try:
            time.sleep(self.rng.uniform(*self.pause_length))  # the pause
        finally:
            self.fleet.resume_all(slot)
        return FaultEvent("pause", started, time.time(), generation, pid)

    def _clock_step(self) -> FaultEvent | None:
        slot = self.rng.randrange(self.fleet.size)
        now = self.fleet.clock_offset(slot)
        if now is None:
            return None
        offset = self.rng.choice([offset for offset in OFFSETS if offset != now])
        started = time.time()
        self.fleet.set_clock(slot, offset)
        return FaultEvent("clock-step", started, started, self.fleet.generations[slot], self.fleet.pid(slot))

    def count(self, kind: str) -> int:
        return sum(1 for event in self.events if event.kind == kind)

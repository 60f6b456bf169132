"""Soft and hard time limits, enforced by the parent with driver timers armed when a job starts.

The clock starts at the child's ACK (not when the job was queued or written): under fcfs a job
may wait in a busy child's pipe, and that wait is not the task's time. Before acting on a limit
the parent reads what the child already wrote, so a result sitting in the pipe wins over a limit
that expired a moment later.
"""

from __future__ import annotations

import os
import signal
from time import monotonic
from typing import TYPE_CHECKING

from worker_core.exceptions import TimeLimitExceeded

from .jobs import Job
from .outcomes import Events, fail, run_events

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["TimeLimits"]


class TimeLimits:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def arm(self, job: Job) -> None:
        """Schedule the job's limits from its start time (lock held)."""
        driver = self.engine.driver
        started = job.accepted
        if driver is None or started is None:
            return
        elapsed = max(monotonic() - started, 0.0)
        soft, hard = job.soft, job.hard
        if soft and job.soft_timer is None and not job.soft_sent:
            job.soft_timer = driver.call_later(soft - elapsed, self.on_soft, job)
        # A hard limit at or before the soft one comes right after the soft one, as in Celery's
        # prefork pool (the soft limit is signalled, then the process is killed): see on_soft.
        if hard and job.hard_timer is None and (not soft or hard > soft or job.soft_sent):
            job.hard_timer = driver.call_later(max(hard, soft or 0) - elapsed, self.on_hard, job)

    def on_soft(self, job: Job) -> None:
        engine = self.engine
        events: Events = []
        with engine.lock:
            job.soft_timer = None
            child = job.child
            if job.done or child is None:
                return
            engine.read(child, events)
            if not job.done and not child.eof and job.soft is not None:
                job.soft_sent = True
                child.slot.aim(job.id, job.soft)
                try:
                    os.kill(child.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
                if job.timeout_callback is not None:
                    events.append((job.timeout_callback, (True, job.soft)))
                driver = engine.driver
                if job.hard and job.hard <= job.soft and job.hard_timer is None and driver is not None:
                    job.hard_timer = driver.call_later(0, self.on_hard, job)
            engine.dispatch(events)
        run_events(events)

    def on_hard(self, job: Job) -> None:
        engine = self.engine
        events: Events = []
        with engine.lock:
            job.hard_timer = None
            child = job.child
            if job.done or child is None:
                return
            engine.read(child, events)
            if not job.done and job.hard is not None:
                job.done = True
                job.cancel_timers()
                if child.jobs and child.jobs[0] is job:
                    child.jobs.popleft()
                if job.timeout_callback is not None:
                    events.append((job.timeout_callback, (False, job.hard)))
                events.append((fail, (job, TimeLimitExceeded(job.hard))))
                engine.supervisor.kill(child, events, controlled=True)
            engine.dispatch(events)
        run_events(events)

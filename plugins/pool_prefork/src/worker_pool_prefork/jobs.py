"""A job as the parent sees it: its frame, its callbacks, where it runs, and its timers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import JobWithdrawn, WorkerLostError

if TYPE_CHECKING:
    from .children import Child
    from .drivers import TimerHandle

__all__ = ["Job", "lost_in_child", "never_started", "withdrawn_unstarted"]


class Job:
    """One ``apply_async`` call, from submission until exactly one outcome was reported."""

    __slots__ = (
        "accept_callback",
        "accepted",
        "callback",
        "child",
        "done",
        "error_callback",
        "hard",
        "hard_timer",
        "id",
        "payload",
        "soft",
        "soft_sent",
        "soft_timer",
        "timeout_callback",
    )

    def __init__(self, payload: bytes, callback: Callable[[Any], None] | None,
                 error_callback: Callable[[BaseException], None] | None,
                 accept_callback: Callable[[int, float], None] | None,
                 timeout_callback: Callable[[bool, float], None] | None,
                 soft: float | None, hard: float | None) -> None:
        #: Given anew each time the job is written to a child (see :mod:`.claims`); 0 until then.
        self.id = 0
        #: The pickled ``(target, args, kwargs)``.
        self.payload = payload
        self.callback = callback
        self.error_callback = error_callback
        self.accept_callback = accept_callback
        self.timeout_callback = timeout_callback
        self.soft = soft
        self.hard = hard
        self.child: Child | None = None
        #: The child's monotonic time when the job started (from its ACK), or None.
        self.accepted: float | None = None
        self.done = False
        self.soft_sent = False  # SIGUSR1 went out: never again, even if the driver changes
        self.soft_timer: TimerHandle | None = None
        self.hard_timer: TimerHandle | None = None

    def cancel_timers(self) -> None:
        if self.soft_timer is not None:
            self.soft_timer.cancel()
            self.soft_timer = None
        if self.hard_timer is not None:
            self.hard_timer.cancel()
            self.hard_timer = None

    def __repr__(self) -> str:
        return f"<Job {self.id} {'done' if self.done else 'accepted' if self.accepted else 'pending'}>"


def lost_in_child(job: Job, status: str) -> WorkerLostError:
    """Celery's wording, so log readers and alerting rules keep working."""
    return WorkerLostError(f"Worker exited prematurely: {status} Job: {job.id}.")


def never_started(job: Job, why: str) -> WorkerLostError:
    return WorkerLostError(f"Job {job.id} never started: {why}.")


def withdrawn_unstarted(job: Job) -> JobWithdrawn:
    return JobWithdrawn(f"Job {job.id} was given back before a child process started it.")

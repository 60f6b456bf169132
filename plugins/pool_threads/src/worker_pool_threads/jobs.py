"""A job waiting for, or running in, one of the pool's threads."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from worker_core.exceptions import JobWithdrawn, WorkerLostError

__all__ = ["Job", "abandoned", "never_started", "withdrawn_unstarted"]


class Job:
    __slots__ = ("accept_callback", "args", "callback", "error_callback", "id", "kwargs", "target")

    def __init__(self, job_id: int, target: Callable[..., Any], args: Sequence[Any],
                 kwargs: Mapping[str, Any] | None, callback: Callable[[Any], None] | None,
                 error_callback: Callable[[BaseException], None] | None,
                 accept_callback: Callable[[int, float], None] | None) -> None:
        self.id = job_id
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self.callback = callback
        self.error_callback = error_callback
        self.accept_callback = accept_callback


def never_started(job: Job) -> WorkerLostError:
    return WorkerLostError(f"Job {job.id} never started: the threads pool was terminated first.")


def abandoned(job: Job) -> WorkerLostError:
    return WorkerLostError(
        f"Job {job.id} was still running when the threads pool was terminated; a thread cannot be "
        "killed, so it was abandoned and its result will be ignored.")


def withdrawn_unstarted(job: Job) -> JobWithdrawn:
    return JobWithdrawn(f"Job {job.id} was given back before a thread started it.")

"""Example tasks for the quickstart.

From this directory::

    workerctl worker -A tasks -l INFO          # in one shell
    workerctl call tasks.add --args '[2, 3]' --wait   # in another
"""

from __future__ import annotations

import time

from worker_core import App

app = App("tasks")


@app.task
def add(x: float, y: float) -> float:
    return x + y


@app.task
def mul(x: float, y: float) -> float:
    return x * y


@app.task
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@app.task(bind=True, max_retries=3, default_retry_delay=0.2)
def flaky(self, succeed_after: int = 2) -> str:
    """Fails ``succeed_after`` times, retrying itself each time, then succeeds."""
    if self.request.retries < succeed_after:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries + 1} failed"))
    return f"succeeded after {self.request.retries} retries"


@app.task
def sleep(seconds: float = 1.0) -> float:
    time.sleep(seconds)
    return seconds

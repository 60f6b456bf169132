"""Tasks for the ``rpc://`` result backend's tests on this worker (``apps.celery_rpc`` has the same
tasks for a Celery worker): values, failures, retries, and the states a client sees while a task
runs. The broker and result backend come from WORKER_BROKER_URL and WORKER_RESULT_BACKEND."""

from __future__ import annotations

import time
from pathlib import Path

from worker_core import App

app = App("rpc")


class Boom(Exception):
    """A task's own exception type (the same on both workers), raised with several arguments."""


def appeared(path: Path, timeout: float) -> bool:
    """Whether ``path`` exists within ``timeout`` seconds (the test opens the gate)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    """Block until ``path`` exists; raise after ``timeout`` seconds."""
    if not appeared(path, timeout):
        raise TimeoutError(f"{path} never appeared")


@app.task(name="apps.rpc.add")
def add(x, y):
    return x + y


@app.task(name="apps.rpc.boom")
def boom(message, code):
    raise Boom(message, code)


@app.task(name="apps.rpc.flaky", bind=True, max_retries=3, default_retry_delay=0.05)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"))
    return self.request.retries


@app.task(name="apps.rpc.stages", bind=True)
def stages(self, gates):
    """STARTED (with task_track_started) until the file ``<gates>/1`` exists, then PROGRESS
    ``{"step": 1}`` until ``<gates>/2`` exists; returns "done".

    PROGRESS is sent again every 0.1 s while it waits, as a task reporting progress does: a
    Celery client polling ``state`` over Redis puts the STARTED message it read back at the end
    of its reply queue (kombu's requeue is an LPUSH), behind a PROGRESS that arrived meanwhile,
    takes STARTED for the newer state and drops that PROGRESS; the next one reaches it."""
    wait_for_file(Path(gates) / "1")
    last = Path(gates) / "2"
    deadline = time.monotonic() + 30
    self.update_state(state="PROGRESS", meta={"step": 1})
    while not appeared(last, 0.1):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{last} never appeared")
        self.update_state(state="PROGRESS", meta={"step": 1})
    return "done"

"""``async def`` tasks for the tests of every pool; the broker comes from WORKER_BROKER_URL."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from pathlib import Path

from worker_core import App
from worker_core.exceptions import SoftTimeLimitExceeded

app = App("aio")

#: a context variable each task sets: another coroutine on the same loop never sees its value
tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="unset")


@app.task
async def add(x, y):
    await asyncio.sleep(0)
    return x + y


@app.task
async def nap(seconds, value=None):
    await asyncio.sleep(seconds)
    return value


@app.task
def plain(x):
    return [x, threading.current_thread().name, os.getpid()]


@app.task(bind=True)
async def whoami(self, seconds, marker):
    """Sets a context variable, sleeps, and reports what it sees as its own afterwards."""
    tenant.set(marker)
    await asyncio.sleep(seconds)
    return {"id": self.request.id, "args": self.request.args, "tenant": tenant.get(), "pid": os.getpid(),
            "loop": id(asyncio.get_running_loop()), "thread": threading.current_thread().name}


@app.task
async def loop_identity():
    return [os.getpid(), threading.current_thread().name, id(asyncio.get_running_loop())]


class Flaky(Exception):
    pass


@app.task(bind=True, autoretry_for=(Flaky,), max_retries=3, default_retry_delay=0.05)
async def flaky(self, failures):
    await asyncio.sleep(0)
    if self.request.retries < failures:
        raise Flaky(f"attempt {self.request.retries}")
    return self.request.retries


@app.task(bind=True, max_retries=2, default_retry_delay=0.05)
async def retrying(self, failures):
    await asyncio.sleep(0)
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"))
    return self.request.retries


@app.task
async def fails(message):
    await asyncio.sleep(0)
    raise ValueError(message)


@app.task(soft_time_limit=0.5)
async def soft_limited(seconds):
    try:
        await asyncio.sleep(seconds)
    except SoftTimeLimitExceeded:
        await asyncio.sleep(0)  # it may still await while it cleans up
        return "soft limit caught"
    return "finished"


@app.task(time_limit=0.5)
async def hard_limited(seconds):
    await asyncio.sleep(seconds)
    return "finished"


@app.task
async def run_until(path, seconds=30.0, started=None):
    """Writes ``started`` (a file) once it runs, then awaits until ``path`` exists."""
    if started:
        Path(started).touch()
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return "gave up"
        await asyncio.sleep(0.01)
    return "released"


@app.task
async def swallow_cancel(started, seconds=30.0):
    """Ignores its cancellation: keeps sleeping whatever happens."""
    Path(started).touch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            Path(started + ".cancelled").touch()
    return "outlived"


@app.task
async def block_loop(seconds):
    time.sleep(seconds)  # blocks the event loop: what the worker reports
    return "blocked"


@app.task(bind=True, acks_late=True)
async def long_once(self, path, seconds):
    """Appends its id to ``path`` once per run (to count runs), then awaits ``seconds``."""
    with open(path, "a") as file:
        file.write(f"{self.request.id}\n")
    await asyncio.sleep(seconds)
    return "done"


@app.task
async def cancellable(started, marker, seconds=30.0):
    """Awaits until cancelled, and writes ``marker`` as it unwinds."""
    Path(started).touch()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        Path(marker).touch()
        raise
    return "not cancelled"


@app.task
async def pid():
    return os.getpid()

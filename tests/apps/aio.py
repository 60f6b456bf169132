"""``async def`` tasks for the tests of every pool; the broker comes from WORKER_BROKER_URL."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import threading
import time
from pathlib import Path

from worker_core import App, Task
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


@app.task(acks_late=True)
async def late_nap(seconds, value=None):
    await asyncio.sleep(seconds)
    return value


@app.task(rate_limit="4/s")
async def limited():
    await asyncio.sleep(0)
    return time.time()


@app.task
async def started_at():
    await asyncio.sleep(0)
    return time.time()


def _note(path, text):
    with open(path, "a") as file:
        file.write(f"{text}\n")


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
async def crash_once(self, marker):
    """Takes its process down the first time it runs (as a crash in a C extension would), and
    succeeds when it runs again."""
    _note(marker, os.getpid())
    if len(Path(marker).read_text().split()) == 1:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return "survived"


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
async def crash_always(self, counter):
    """Takes its process down every time it runs: a poison message."""
    _note(counter, os.getpid())
    await asyncio.sleep(0.2)  # its neighbours are running when it crashes
    import ctypes

    ctypes.string_at(0)


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
async def bystander(self, runs, seconds):
    """Notes each of its runs, then awaits: a coroutine running beside one that crashes."""
    _note(runs, self.request.id)
    await asyncio.sleep(seconds)
    return "done"


@app.task(bind=True, acks_late=True)
async def late_until_cancelled(self, started, cancelled, seconds=60.0):
    """Notes its start, awaits, and notes its cancellation as it unwinds."""
    _note(started, self.request.id)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _note(cancelled, self.request.id)
        raise
    return "not cancelled"


class Around(Task):
    """Handlers that set and read a context variable and the request around an ``async def``
    task: they run in the task's own context, wherever the pool runs them."""

    def before_start(self, task_id, args, kwargs):
        tenant.set(f"set before {task_id}")

    def on_success(self, retval, task_id, args, kwargs):
        _note(args[0], json.dumps({"tenant": tenant.get(), "request": self.request.id,
                                   "thread": threading.current_thread().name}))


@app.task(base=Around, bind=True)
async def around(self, path):
    seen = tenant.get()
    await asyncio.sleep(0.05)
    return [seen, self.request.id]


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
def crash_once_plain(self, marker):
    """:func:`crash_once` as a plain function, in a thread of the loop process."""
    _note(marker, os.getpid())
    if len(Path(marker).read_text().split()) == 1:
        import ctypes

        ctypes.string_at(0)
    return "survived"

"""Tasks that lean on Celery's own machinery: the request, retries, handlers, update_state,
soft time limits caught as Celery's exception, and Celery's signals, recorded to a file."""

from __future__ import annotations

import os
import time

from celery import Task, signals
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded

from .celery import app

SIGNALS_LOG = os.environ.get("CELERY_PROJ_SIGNALS")


def record(line: str) -> None:
    if SIGNALS_LOG:
        with open(SIGNALS_LOG, "a") as handle:
            handle.write(f"{os.getpid()} {line}\n")


@app.task
def add(x, y):
    return x + y


@app.task(bind=True)
async def async_add(self, x, y):
    """An ``async def`` Celery task: run to completion where the pool runs it."""
    import asyncio

    await asyncio.sleep(0.01)
    return {"sum": x + y, "id": self.request.id}


@app.task(bind=True)
def whoami(self):
    request = self.request
    return {"id": request.id, "task": request.task, "hostname": request.hostname, "retries": request.retries,
            "delivery_info": request.delivery_info, "custom": getattr(request, "x_custom", None),
            "called_directly": request.called_directly, "is_eager": request.is_eager}


class Boom(Exception):
    pass


@app.task
def boom(message="boom"):
    raise Boom(message)


@app.task(bind=True, max_retries=3, default_retry_delay=0.05)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"))
    return self.request.retries


@app.task(bind=True, autoretry_for=(KeyError,), retry_kwargs={"max_retries": 2, "countdown": 0.05})
def autoretried(self, succeed_on):
    if self.request.retries < succeed_on:
        raise KeyError(self.request.retries)
    return f"ok after {self.request.retries}"


@app.task(bind=True)
def progress(self, steps):
    for step in range(steps):
        self.update_state(state="PROGRESS", meta={"step": step})
    return steps


@app.task(bind=True)
def slow_progress(self, path):
    self.update_state(state="PROGRESS", meta={"pid": os.getpid()})
    while not os.path.exists(path):
        time.sleep(0.01)
    return "done"


@app.task
def nap(seconds):
    time.sleep(seconds)
    return seconds


@app.task(soft_time_limit=0.3)
def catches_soft_limit():
    try:
        time.sleep(5)
    except SoftTimeLimitExceeded:
        return "caught"
    return "not caught"


@app.task
def ignored():
    raise Ignore()


@app.task
def rejected():
    raise Reject("no thanks", requeue=False)


@app.task
def shout(text):
    print(f"printed: {text}")
    return text


class Handled(Task):
    """A Task subclass with every handler, each recording that it ran."""

    def before_start(self, task_id, args, kwargs):
        record(f"before_start {self.name} {task_id}")

    def on_success(self, retval, task_id, args, kwargs):
        record(f"on_success {retval!r} {task_id}")

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        record(f"on_failure {type(exc).__name__} {task_id}")

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        record(f"on_retry {type(exc).__name__} {task_id}")

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        record(f"after_return {status} {task_id}")


@app.task(base=Handled, bind=True, max_retries=1, default_retry_delay=0.05)
def handled(self, outcome):
    if outcome == "fail":
        raise Boom("handled failure")
    if outcome == "retry" and self.request.retries == 0:
        raise self.retry(exc=Boom("once more"))
    return outcome


# -- Celery's signals, each recorded with its process ----------------------------------------------

WORKER_SIGNALS = ("celeryd_init", "worker_init", "celeryd_after_setup", "worker_ready", "heartbeat_sent",
                  "worker_shutting_down", "worker_shutdown", "worker_process_init", "worker_process_shutdown",
                  "after_setup_logger", "after_setup_task_logger")
TASK_SIGNALS = ("task_prerun", "task_postrun", "task_success", "task_failure", "task_retry", "task_received",
                "task_revoked")


def _recorder(name):
    def receiver(sender=None, **kwargs):
        if name.startswith("task_"):
            task_id = (kwargs.get("task_id") or getattr(kwargs.get("request"), "id", None)
                       or getattr(getattr(sender, "request", None), "id", None))
            record(f"{name} {getattr(sender, 'name', sender)} {task_id}")
        else:
            record(name)
    return receiver


for _name in WORKER_SIGNALS + TASK_SIGNALS:
    getattr(signals, _name).connect(_recorder(_name), weak=False)


# -- canvas ------------------------------------------------------------------------------------------


@app.task
def tsum(numbers):
    return sum(numbers)


@app.task
def mul(x, y):
    return x * y


@app.task
def identity(value):
    return value


@app.task(bind=True)
def replaced(self, value):
    """Replaces itself with ``mul(value, 10)``."""
    raise self.replace(mul.s(value, 10))


@app.task(bind=True)
def grows_chord(self, value):
    """Adds ``identity(value * 100)`` to the chord it is part of."""
    self.add_to_chord(identity.s(value * 100))
    return value


@app.task(acks_late=True)
def segfault():
    """Takes its whole worker down every time: a poison message for every pool."""
    import ctypes

    record("segfault")
    ctypes.string_at(0)


@app.task
def on_error(request, exc, traceback):
    """An errback Celery calls with the failed task's request, exception and traceback."""
    record(f"errback {request.id} {type(exc).__name__}")


@app.task
def on_error_id(task_id):
    """An errback sent as a task with the failed task's id."""
    record(f"errback-id {task_id}")
    return task_id

"""Tasks for end-to-end tests; the broker comes from WORKER_BROKER_URL."""

from __future__ import annotations

import gc
import logging
import os
import time
from pathlib import Path

from worker_core import App, Task

app = App("basic")


class Boom(Exception):
    """A task's own exception type, to check it comes back as itself."""


@app.task
def add(x, y):
    return x + y


@app.task
def boom(message="boom"):
    raise Boom(message)


@app.task
def fail_value(message):
    raise ValueError(message)


@app.task(bind=True, max_retries=5, default_retry_delay=0.05)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"))
    return self.request.retries


@app.task(bind=True, max_retries=2, default_retry_delay=0.05)
def always_retry(self):
    raise self.retry(exc=Boom(f"gave up after {self.request.retries} retries"))


@app.task(bind=True, autoretry_for=(ZeroDivisionError,), max_retries=3, retry_backoff=0.05,
          retry_backoff_max=0.2, retry_jitter=False)
def divide(self, x, y):
    return x / y


@app.task
def sleep(seconds):
    time.sleep(seconds)
    return seconds


@app.task(acks_late=True)
def sleep_late(seconds):
    time.sleep(seconds)
    return seconds


@app.task
def record(path, value):
    """Append ``value`` to a file: proof that the task ran (and how many times)."""
    with open(path, "a") as handle:
        handle.write(f"{value}\n")
    return value


@app.task(rate_limit="5/s")
def record_limited(path, value):
    """``record`` at most five times a second per worker."""
    with open(path, "a") as handle:
        handle.write(f"{value}\n")
    return value


@app.task(acks_late=True)
def record_start_and_end(path, value, seconds):
    """Append ``start-value`` to a file as it starts and ``end-value`` once ``seconds`` passed: a
    task seen running, and how many times it started."""
    with open(path, "a") as handle:
        handle.write(f"start-{value}\n")
    time.sleep(seconds)
    with open(path, "a") as handle:
        handle.write(f"end-{value}\n")
    return value


class NotesRetries(Task):
    """Logs where ``on_retry`` runs (the worker's main process for a task it cancels)."""

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        logging.getLogger("apps.basic").warning("on_retry of %s in process %s: %r", task_id, os.getpid(), exc)


@app.task(acks_late=True, base=NotesRetries)
def record_slowly(path, value, seconds):
    time.sleep(seconds)
    with open(path, "a") as handle:
        handle.write(f"{value}\n")
    return value


@app.task
def wait_for_path(path, timeout=60.0):
    """Run until ``path`` exists (a gate the test opens), at most ``timeout`` seconds; apps
    load light, so not through worker_core.testing's job of the same name."""
    for _ in range(int(timeout / 0.01)):
        if os.path.exists(path):
            return path
        time.sleep(0.01)
    raise TimeoutError(f"{path} did not appear within {timeout}s")


@app.task
def pause_then_record(path, value, seconds):
    """``record`` after a pause, acknowledged when it starts (the default)."""
    time.sleep(seconds)
    with open(path, "a") as handle:
        handle.write(f"{value}\n")
    return value


@app.task(bind=True)
def whoami(self):
    return {"id": self.request.id, "retries": self.request.retries, "hostname": self.request.hostname,
            "pid": os.getpid(), "queue": self.request.delivery_info.get("routing_key")}


@app.task(bind=True)
def my_request(self, *args, **kwargs):
    """Everything ``self.request`` holds, as plain data."""
    return self.request.as_dict()


def lines(path):
    file = Path(path)
    return file.read_text().split() if file.exists() else []


@app.task
def pid():
    return os.getpid()


@app.task(acks_late=True, reject_on_worker_lost=True)
def die_once(marker):
    """SIGKILLs its own process the first time; succeeds when run again."""
    import signal

    path = Path(marker)
    if not path.exists():
        path.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


@app.task
def die(marker):
    import signal

    Path(marker).write_text("died")
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(soft_time_limit=0.5)
def soft_limited(seconds):
    from worker_core.exceptions import SoftTimeLimitExceeded

    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "cleaned up after the soft limit"
    return "finished"


@app.task(time_limit=0.5)
def hard_limited(seconds):
    time.sleep(seconds)
    return "finished"


_hoard = []


@app.task
def hog(megabytes):
    _hoard.append(bytearray(megabytes * 1024 * 1024))
    return os.getpid()


@app.task(acks_late=True, reject_on_worker_lost=True)
def always_die(counter):
    """Kills its process every time: a poison message."""
    import signal

    with open(counter, "a") as handle:
        handle.write("x")
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(acks_late=True)
def segfault(counter):
    """Takes its whole worker down every time (as a crash in a C extension would): a poison
    message for every pool, not only prefork."""
    import ctypes

    with open(counter, "a") as handle:
        handle.write("x")
    ctypes.string_at(0)  # reads address 0: SIGSEGV in the thread that runs it


@app.task
def echo(value):
    """Return its argument: proof that an unusual but valid argument arrived intact."""
    return value


@app.task(rate_limit="4/s")
def limited():
    """Return when it started: at most four starts a second per worker."""
    return time.time()


@app.task
def collector():
    """The garbage collector as the process that runs tasks sees it."""
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


# -- canvas (the same tasks are in apps.celery_basic for a Celery worker) ----------------------


@app.task
def mul(x, y):
    return x * y


@app.task
def tsum(numbers):
    """The sum of a chord header's results."""
    return sum(numbers)


@app.task
def note_failure(task_id, path):
    """An errback: append the failed task's id to ``path``."""
    with open(path, "a") as handle:
        handle.write(f"{task_id}\n")
    return task_id


@app.task
def log_error(request, exc, traceback, path):
    """An errback called where the task failed, with its request, exception and traceback."""
    with open(path, "a") as handle:
        handle.write(f"{request.id} {type(exc).__name__}:{exc} {'Traceback' in (traceback or '')}\n")


@app.task(bind=True)
def replaced(self, x, kind):
    """Replaces itself with a task, a chain or a group, whose result is its own."""
    from worker_core import group

    if kind == "task":
        return self.replace(add.s(x, x))
    if kind == "chain":
        return self.replace(add.s(x, x) | mul.s(10))
    return self.replace(group(add.s(x, x), mul.s(x, x)))


@app.task(bind=True)
def grow_chord(self, x):
    """A chord header task that adds one more task to its chord."""
    self.add_to_chord(add.si(x, 100))
    return x


@app.task(acks_late=True)
def slow_add(x, y, seconds):
    """A chord header task that takes a while (acknowledged once it finished)."""
    time.sleep(seconds)
    return x + y


@app.task(bind=True)
def hop(self, trail):
    """A step of a chain that says which worker ran it."""
    return [*trail, self.request.hostname]


@app.task
def collect(values, path):
    """A chord's body that records each time it runs."""
    import json

    with open(path, "a") as handle:
        handle.write(json.dumps(values) + "\n")
    return sum(values)


@app.task
def unsendable():
    """Returns what JSON cannot carry: the next step of its chain cannot be sent with it."""
    return {1, 2}


_counters = {}


def _counter(url):
    import redis

    if url not in _counters:
        _counters[url] = redis.Redis.from_url(url)
    return _counters[url]


@app.task
def count(url, key, value):
    """Count a run in Redis (hash ``key``, field ``value``): how many times each task ran."""
    _counter(url).hincrby(key, value, 1)
    return value


@app.task(acks_late=True)
def count_slowly(url, key, value, seconds):
    """Count a run in Redis, then take ``seconds`` (acknowledged once it finished)."""
    _counter(url).hincrby(key, value, 1)
    time.sleep(seconds)
    return value


def runs(url, key):
    """How many times each value was counted (see :func:`count`)."""
    return {int(field): int(times) for field, times in _counter(url).hgetall(key).items()}


@app.task
def reject_for_good(reason):
    """Reject its message without requeueing it (stored FAILURE, as Celery 5.7 does)."""
    from worker_core.exceptions import Reject

    raise Reject(reason, requeue=False)

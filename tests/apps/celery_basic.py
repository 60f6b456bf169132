"""The same tasks as apps.basic, for a real Celery worker (the interop tests run it)."""

from __future__ import annotations

import inspect
import json
import os

from celery import Celery

from apps.basic import Boom, lines  # noqa: F401  (the same exception type on both sides)

app = Celery("celery_basic", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                # a test's own queue: where this worker sends the next steps of a workflow too
                task_default_queue=os.environ.get("CELERY_DEFAULT_QUEUE", "celery"),
                result_extended=os.environ.get("CELERY_RESULT_EXTENDED") == "1",
                broker_transport_options=json.loads(os.environ.get("CELERY_BROKER_TRANSPORT_OPTIONS", "{}")),
                # a kombu transport class of a plugin (the Redis Cluster's), else the URL's scheme
                broker_transport=os.environ.get("CELERY_BROKER_TRANSPORT"))


@app.task(name="apps.basic.add")
def add(x, y):
    return x + y


@app.task(name="apps.basic.boom")
def boom(message="boom"):
    raise Boom(message)


@app.task(name="apps.basic.flaky", bind=True, max_retries=5, default_retry_delay=0.05)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"))
    return self.request.retries


@app.task(name="apps.basic.record")
def record(path, value):
    with open(path, "a") as handle:
        handle.write(f"{value}\\n")
    return value


@app.task(name="apps.basic.count")
def count(url, key, value):
    from apps.basic import _counter

    _counter(url).hincrby(key, value, 1)
    return value


@app.task(name="apps.basic.mul")
def mul(x, y):
    return x * y


@app.task(name="apps.basic.tsum")
def tsum(numbers):
    return sum(numbers)


@app.task(name="apps.basic.echo")
def echo(value):
    return value


@app.task(name="apps.basic.note_failure")
def note_failure(task_id, path):
    with open(path, "a") as handle:
        handle.write(f"{task_id}\n")
    return task_id


@app.task(name="apps.basic.log_error")
def log_error(request, exc, traceback, path):
    with open(path, "a") as handle:
        handle.write(f"{request.id} {type(exc).__name__}:{exc} {'Traceback' in (traceback or '')}\n")


@app.task(name="apps.basic.replaced", bind=True)
def replaced(self, x, kind):
    from celery import group

    if kind == "task":
        return self.replace(add.s(x, x))
    if kind == "chain":
        return self.replace(add.s(x, x) | mul.s(10))
    return self.replace(group(add.s(x, x), mul.s(x, x)))


@app.task(name="apps.basic.grow_chord", bind=True)
def grow_chord(self, x):
    self.add_to_chord(add.si(x, 100))
    return x


@app.task(name="apps.basic.slow_add", acks_late=True)
def slow_add(x, y, seconds):
    import time

    time.sleep(seconds)
    return x + y


@app.task(name="apps.basic.hop", bind=True)
def hop(self, trail):
    return [*trail, self.request.hostname]


@app.task(name="apps.basic.collect")
def collect(values, path):
    import json

    with open(path, "a") as handle:
        handle.write(json.dumps(values) + "\n")
    return sum(values)


def client_app(**conf):
    """A Celery app of its own with the canvas tasks above, for a test's Celery client (its
    broker, backend and default queue set as the test needs, nothing cached from other tests)."""
    other = Celery("celery_basic_client", set_as_current=False)
    other.conf.update(broker_connection_retry_on_startup=True, **conf)
    for task in (add, boom, mul, tsum, echo, note_failure, log_error, flaky, replaced, grow_chord, slow_add,
                 hop, collect):
        bound = inspect.ismethod(task.run)  # a bound task's run is its function bound to the task
        other.task(name=task.name, bind=bound)(task.run.__func__ if bound else task.run)
    return other

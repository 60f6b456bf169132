"""Tasks written with Celery's task API beyond plain functions: the message's own headers, shadow
names, progress states, handlers, base classes, class-based tasks and result serializers of
their own. Handlers note where they ran (pid, thread) and with what in a file the test names."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from worker_core import App, Task

app = App("taskapi")


def note(path: str, **fields: object) -> None:
    """Append one JSON line to ``path``: ``fields``, where this runs, and the attempt (retries)."""
    fields.update(pid=os.getpid(), thread=threading.get_ident(),
                  main_thread=threading.current_thread() is threading.main_thread(),
                  attempt=handled.request.retries)
    with open(path, "a") as handle:
        handle.write(json.dumps(fields, default=repr) + "\n")


def notes(path: str) -> list[dict]:
    file = Path(path)
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


# -- headers and shadow names ---------------------------------------------------------------------


@app.task(bind=True)
def headers_seen(self):
    request = self.request
    return {"headers": request.headers, "tenant": getattr(request, "tenant", None),
            "get": request.get("tenant"), "shadow": request.shadow}


@app.task(bind=True, max_retries=1, default_retry_delay=0)
def headers_after_retry(self):
    if self.request.retries == 0:
        raise self.retry()
    return {"headers": self.request.headers, "shadow": self.request.shadow, "retries": self.request.retries}


@app.task(shadow_name=lambda task, args, kwargs, options: f"report.{args[0]}")
def report(kind):
    return kind


# -- progress ----------------------------------------------------------------------------------------


@app.task(bind=True)
def progress(self, steps, gate):
    """Report PROGRESS ``steps`` times, then wait for the file ``gate`` before returning."""
    for done in range(1, steps + 1):
        self.update_state(state="PROGRESS", meta={"done": done, "total": steps})
    deadline = time.monotonic() + 20
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return steps


# -- handlers ------------------------------------------------------------------------------------------


class Recorded(Task):
    """Notes every handler call in the file its task's ``record`` argument names."""

    def before_start(self, task_id, args, kwargs):
        note(kwargs["record"], handler="before_start", task_id=task_id, args=list(args),
             request_id=self.request.id)

    def on_success(self, retval, task_id, args, kwargs):
        note(kwargs["record"], handler="on_success", retval=retval, task_id=task_id, args=list(args))
        if kwargs.get("raise_in") == "on_success":
            raise RuntimeError("on_success broke on purpose")

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        note(kwargs["record"], handler="on_failure", exc=repr(exc), task_id=task_id,
             einfo=type(einfo).__name__, einfo_exception=einfo.exception is exc,
             traceback_names_it=type(exc).__name__ in str(einfo), request_id=self.request.id)

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        note(kwargs["record"], handler="on_retry", exc=repr(exc), task_id=task_id,
             retries=self.request.retries, einfo=type(einfo).__name__)

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        note(kwargs["record"], handler="after_return", status=status, retval=repr(retval), task_id=task_id,
             einfo=einfo)


@app.hook
def task_success(task, task_id, request):
    if task.name == handled.name:
        note(request.kwargs["record"], handler="task_success", task_id=task_id,
             stored=task.AsyncResult(task_id).state)


@app.hook
def task_failure(task, task_id, exception, request):
    if task.name == handled.name:
        note(request.kwargs["record"], handler="task_failure", task_id=task_id, exc=repr(exception),
             stored=task.AsyncResult(task_id).state)


@app.task(base=Recorded, bind=True, max_retries=1, default_retry_delay=0)
def handled(self, outcome, record, raise_in=None):
    note(record, handler="run", task_id=self.request.id, retries=self.request.retries)
    if outcome == "fail":
        raise ValueError("failed on purpose")
    if outcome == "retry" and self.request.retries == 0:
        raise self.retry(exc=KeyError("again"))
    if outcome == "sleep":
        time.sleep(30)
    return f"{outcome} done"


# -- base classes and class-based tasks ---------------------------------------------------------------


class Sturdy(Task):
    """A base whose class attributes are its tasks' defaults, with methods of its own."""

    autoretry_for = (ConnectionError,)
    max_retries = 3
    default_retry_delay = 0
    acks_late = True
    rate_limit = "1000/s"
    greeting = "hello"

    @property
    def shout(self):
        return self.greeting.upper()

    def tagged(self, value):
        return f"{self.name}:{value}"


@app.task(base=Sturdy, bind=True)
def sturdy(self, failures, counter):
    with open(counter, "a") as handle:
        handle.write("x")
    if len(Path(counter).read_text()) <= failures:
        raise ConnectionError("the network is flaky")
    return {"retries": self.request.retries, "shout": self.shout, "tagged": self.tagged(1),
            "acks_late": self.acks_late, "max_retries": self.max_retries, "rate_limit": self.rate_limit}


@app.task(base=Sturdy, bind=True, greeting="hi", max_retries=0, acks_late=False)
def sturdy_overridden(self):
    return {"shout": self.shout, "max_retries": self.max_retries, "acks_late": self.acks_late}


class Multiply(Task):
    """A class-based task, registered as in Celery."""

    name = "taskapi.multiply"

    def run(self, x, y):
        return {"product": x * y, "request_id": self.request.id}


app.register_task(Multiply())


class Wrapping(Task):
    """A base that wraps every run in a ``__call__`` of its own."""

    def __call__(self, *args, **kwargs):
        return {"wrapped": super().__call__(*args, **kwargs), "request_id": self.request.id}


@app.task(base=Wrapping, bind=True)
def wrapped(self, x):
    return {"x": x, "request_id": self.request.id}


# -- result serializers of a task's own ----------------------------------------------------------------


class Refused(Exception):
    """A task's own exception, stored and read back in each serializer."""


@app.task(result_serializer="msgpack")
def in_msgpack(fail=False):
    if fail:
        raise Refused("msgpack", 1)
    return {"serializer": "msgpack", "items": [1, 2.5, None, "x"]}


@app.task(result_serializer="yaml")
def in_yaml(fail=False):
    if fail:
        raise Refused("yaml", 2)
    return {"serializer": "yaml", "items": [1, 2.5, None, "x"]}


@app.task(result_serializer="pickle")
def in_pickle(fail=False):
    if fail:
        raise Refused("pickle", 3)
    return {"serializer": "pickle", "items": [1, 2.5, None, "x"], "set": {1, 2}}


@app.task
def plain(fail=False):
    """Stored with the result_serializer setting."""
    if fail:
        raise Refused("plain", 4)
    return {"serializer": "setting", "items": [1, 2.5, None, "x"]}

"""The canvas benchmark's tasks for the Celery worker, and the Celery clients that send them to
both workers (broker from BENCH_BROKER, results in BENCH_BACKEND)."""

import os

from celery import Celery

app = Celery("bench-canvas", broker=os.environ["BENCH_BROKER"], backend=os.environ["BENCH_BACKEND"])
app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
                task_default_queue=os.environ.get("BENCH_QUEUE", "bench-canvas"))


@app.task(name="canvas.add")
def add(x, y):
    return x + y


@app.task(name="canvas.tsum")
def tsum(values):
    return sum(values)


def client():
    """A Celery client of its own with these tasks: a new one for each workflow timed, so that
    what an earlier one subscribed to (every header task of a chord) does not slow the next."""
    other = Celery("bench-canvas-client", broker=os.environ["BENCH_BROKER"],
                   backend=os.environ["BENCH_BACKEND"], set_as_current=False)
    other.conf.update(broker_connection_retry_on_startup=True,
                      task_default_queue=os.environ.get("BENCH_QUEUE", "bench-canvas"))
    return other, other.task(name="canvas.add")(add.run), other.task(name="canvas.tsum")(tsum.run)

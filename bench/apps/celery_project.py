"""One Celery app for both workers (``celery worker`` and ``workerctl worker`` through
worker-celery): the same task body, results on (BENCH_RESULTS names the result backend) or off."""

import os

import sink
from celery import Celery

results = os.environ.get("BENCH_RESULTS") or None
app = Celery("bench_project", broker=os.environ["BENCH_BROKER"], backend=results)
app.conf.update(task_ignore_result=not results, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)


@app.task(name="bench.noop")
def noop():
    sink.noop()

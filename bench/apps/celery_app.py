"""The benchmark tasks for the Celery worker (broker from BENCH_BROKER)."""

import os

import sink
from celery import Celery

app = Celery("bench", broker=os.environ["BENCH_BROKER"])
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)


@app.task(name="bench.noop", ignore_result=True)
def noop():
    sink.noop()


@app.task(name="bench.latency", ignore_result=True)
def latency(sent_at):
    sink.latency(sent_at)


@app.task(name="bench.sleep", ignore_result=True)
def sleep(seconds):
    sink.sleep(seconds)

"""The sleep benchmark's task for Celery: a plain function (Celery runs no ``async def``), which
sleeps in its thread (``-P threads``) or greenlet (``-P gevent``, whose monkey-patching makes
``time.sleep`` cooperative); its result stored on the broker's Redis."""

import os
import time

import sleep_marks
from celery import Celery

app = Celery("bench-sleep", broker=os.environ["BENCH_BROKER"], backend=os.environ["BENCH_BROKER"])
app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(name="bench.sleep1")
def sleep1(seconds):
    sleep_marks.started()
    time.sleep(seconds)
    sleep_marks.done()

"""The rpc:// benchmark task for the Celery worker (broker from BENCH_BROKER)."""

import os

import sink
from celery import Celery

app = Celery("bench-rpc", broker=os.environ["BENCH_BROKER"], backend="rpc://")
app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(name="bench.rpc_echo")
def echo(n):
    sink.noop()
    return n

"""The rpc:// benchmark task for this project's worker (broker from BENCH_BROKER): counts itself
as a no-op does and returns its argument, which goes back to the client as a message."""

import os

import sink

from worker_core import App

app = App("bench-rpc", broker=os.environ["BENCH_BROKER"], backend="rpc://")


@app.task(name="bench.rpc_echo")
def echo(n):
    sink.noop()
    return n

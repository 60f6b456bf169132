"""The canvas benchmark's tasks for this project's worker (broker from BENCH_BROKER, results in
BENCH_BACKEND)."""

import os

from worker_core import App

app = App("bench-canvas", broker=os.environ["BENCH_BROKER"], backend=os.environ["BENCH_BACKEND"],
          task_default_queue=os.environ.get("BENCH_QUEUE", "bench-canvas"))


@app.task(name="canvas.add")
def add(x, y):
    return x + y


@app.task(name="canvas.tsum")
def tsum(values):
    return sum(values)

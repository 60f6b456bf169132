"""The sleep benchmark's task for this project's worker: ``async def``, awaited on the asyncio
pool's loop; its result (None) stored on the broker's Redis."""

import asyncio
import os

import sleep_marks

from worker_core import App

app = App("bench-sleep", broker=os.environ["BENCH_BROKER"], result_backend=os.environ["BENCH_BROKER"])


@app.task(name="bench.sleep1")
async def sleep1(seconds):
    sleep_marks.started()
    await asyncio.sleep(seconds)
    sleep_marks.done()

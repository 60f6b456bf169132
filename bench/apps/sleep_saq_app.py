"""The sleep benchmark's task for SAQ on Redis (it keeps each job's state and result there)."""

import asyncio
import os

import sleep_marks
from saq import Queue

queue = Queue.from_url(os.environ["BENCH_BROKER"], name="bench_sleep",
                       max_connections=int(os.environ.get("BENCH_CONCURRENCY", "10")) + 100)


async def sleep1(ctx, *, seconds):
    sleep_marks.started()
    await asyncio.sleep(seconds)
    sleep_marks.done()


settings = {"queue": queue, "functions": [sleep1],
            "concurrency": int(os.environ.get("BENCH_CONCURRENCY", "10"))}

"""The sleep benchmark's task for streaQ on Redis streams (its results kept there too), on
uvloop as streaQ's own benchmarks run it."""

import asyncio
import os

import sleep_marks
from streaq import Worker

worker = Worker(redis_url=os.environ["BENCH_BROKER"], queue_name="bench_sleep",
                concurrency=int(os.environ.get("BENCH_CONCURRENCY", "10")), anyio_kwargs={"use_uvloop": True})


@worker.task()
async def sleep1(seconds: float) -> None:
    sleep_marks.started()
    await asyncio.sleep(seconds)
    sleep_marks.done()

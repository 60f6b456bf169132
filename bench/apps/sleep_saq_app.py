"""The sleep benchmark's task for SAQ on Redis (it keeps each job's state and result there)."""

import asyncio
import os

import sleep_marks
from redis import asyncio as aioredis
from saq.queue.redis import RedisQueue


def new_queue() -> RedisQueue:
    # one connection per running job and a few more: redis-py's pool refuses more than it allows
    client = aioredis.from_url(os.environ["BENCH_BROKER"],
                               max_connections=int(os.environ.get("BENCH_CONCURRENCY", "10")) + 100)
    return RedisQueue(client, name="bench_sleep")


queue = new_queue()


async def sleep1(ctx, *, seconds):
    sleep_marks.started()
    await asyncio.sleep(seconds)
    sleep_marks.done()


settings = {"queue": queue, "functions": [sleep1],
            "concurrency": int(os.environ.get("BENCH_CONCURRENCY", "10"))}

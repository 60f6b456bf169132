"""The sleep benchmark's task for taskiq: its Redis list broker and Redis result backend."""

import asyncio
import os

import sleep_marks
from taskiq_redis import ListQueueBroker, RedisAsyncResultBackend

broker = ListQueueBroker(os.environ["BENCH_BROKER"], queue_name="bench_sleep").with_result_backend(
    RedisAsyncResultBackend(os.environ["BENCH_BROKER"], result_ex_time=3600))


@broker.task(task_name="bench.sleep1")
async def sleep1(seconds):
    sleep_marks.started()
    await asyncio.sleep(seconds)
    sleep_marks.done()

"""The sleep benchmark's floor: only the work no worker can avoid, in one bare asyncio loop
(uvloop when installed). It takes this project's (Celery's) messages from the Redis list in
batches, decodes each (the message, then its body), awaits the task's sleep, and stores its
result on the same Redis in Celery's key (the results that wait are written together, in one
pipeline), at most BENCH_CONCURRENCY at once, on two connections. No acknowledgement, lease,
retry, time limit, supervision or log: what a worker adds to this is the price of its
guarantees.

    BENCH_BROKER=redis://... BENCH_MARK_DIR=... BENCH_CONCURRENCY=1000 python sleep_floor.py
"""

import asyncio
import base64
import json
import os
import signal

import sleep_marks
from redis import asyncio as aioredis

QUEUE = "bench_sleep"


async def main() -> None:
    concurrency = int(os.environ.get("BENCH_CONCURRENCY", "10"))
    url = os.environ["BENCH_BROKER"]
    fetching, storing = aioredis.from_url(url), aioredis.from_url(url)
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    free = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()
    finished: list[str] = []
    wake = asyncio.Event()

    async def run(raw: bytes) -> None:
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        sleep_marks.started()
        await asyncio.sleep(args[0])
        sleep_marks.done()
        finished.append(message["headers"]["id"])
        wake.set()

    async def store() -> None:
        while True:
            await wake.wait()
            wake.clear()
            ids = finished[:]
            del finished[:]
            async with storing.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    meta = {"status": "SUCCESS", "result": None, "traceback": None, "children": [],
                            "date_done": None, "task_id": task_id}
                    pipe.set(f"celery-task-meta-{task_id}", json.dumps(meta), ex=86400)
                await pipe.execute()
            for _ in ids:
                free.release()

    writer = asyncio.create_task(store())
    while not stopped.is_set():
        await free.acquire()
        taken = 1
        while taken < concurrency and not free.locked():  # as many as there are free slots
            await free.acquire()
            taken += 1
        batch = await fetching.rpop(QUEUE, taken) or []
        for _ in range(taken - len(batch)):
            free.release()
        if not batch:
            try:
                await asyncio.wait_for(stopped.wait(), 0.05)
            except TimeoutError:
                pass
            continue
        for raw in batch:
            task = asyncio.create_task(run(raw))
            running.add(task)
            task.add_done_callback(running.discard)
    writer.cancel()
    await fetching.aclose()
    await storing.aclose()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())

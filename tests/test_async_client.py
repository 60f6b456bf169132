"""The awaitable client: an asyncio program sends tasks (``adelay``, ``aapply_async``,
``asend_task``) and awaits their results (``aget``, ``await result``) without blocking its loop,
on Redis (results on Redis), RabbitMQ (results on ``rpc://``) and the embedded transport."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from apps import aio
from conftest import AMQP_TEST_URL, REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server
from workers import TESTS

from worker_core.exceptions import ResultTimeout


@pytest.fixture(scope="module", params=["redis", "amqp", "embedded"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp(f"client-{request.param}")
    if request.param == "redis":
        require_server(REDIS_PORT, "Redis")
        url = backend = empty_redis(redis_db(5))
    elif request.param == "amqp":
        require_server(5672, "RabbitMQ")
        url, backend = AMQP_TEST_URL, "rpc://"
    else:
        url = f"embedded://{root}/queue.db"
        backend = f"embedded://{root}/results.db"
    queue = f"client-{request.param}-{root.name}"
    aio.app.conf.update(broker_url=url, result_backend=backend, task_default_queue=queue)
    factory = WorkerFactory(root)
    try:
        factory.start("-c", "20", "-Q", queue, app="apps.aio", pool="asyncio", broker=url, backend=backend,
                      env={"PYTHONPATH": str(TESTS)})
        yield request.param
    finally:
        factory.cleanup()
        aio.app.close()
        aio.app.conf.update(broker_url=None, result_backend=None, task_default_queue="celery")


async def _ticking(awaited: asyncio.Future[object] | object) -> tuple[object, int]:
    """What ``awaited`` gives, and how many 10 ms ticks the loop ran meanwhile."""
    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    try:
        value = await awaited  # type: ignore[misc]
    finally:
        done = True
        await ticker
    return value, ticks


def test_tasks_are_sent_and_their_results_awaited_without_blocking_the_loop(broker: str) -> None:
    async def main() -> None:
        result = await aio.add.adelay(2, 3)
        assert await result.aget(timeout=20) == 5
        # a task of 0.5 s: the loop keeps running while its result is awaited
        value, ticks = await _ticking(aio.nap.adelay(0.5, "napped"))
        value, ticks = await _ticking(value.aget(timeout=20))
        assert value == "napped"
        assert ticks >= 3, f"the loop ticked {ticks} times in a 0.5 s wait (blocked, it would not)"
        sent = await aio.app.asend_task("apps.aio.add", (20, 22))
        assert await sent == 42
        many = await asyncio.gather(*(aio.add.aapply_async((n, n)) for n in range(20)))
        assert await asyncio.gather(*(each.aget(timeout=20) for each in many)) == [2 * n for n in range(20)]

    asyncio.run(main())


def test_a_failure_is_raised_as_itself_and_a_wait_times_out(broker: str) -> None:
    async def main() -> None:
        failed = await aio.fails.adelay("it broke")
        with pytest.raises(ValueError, match="it broke"):
            await failed.aget(timeout=20)
        slow = await aio.nap.adelay(5, None)
        with pytest.raises(ResultTimeout):
            await slow.aget(timeout=0.3)

    asyncio.run(main())

"""``async def`` tasks in every pool: awaited on the asyncio pool's loop, run to completion on a
loop of their own process or thread (kept for the next one) in prefork, threads and solo, never
returning a coroutine; ``self.request`` and context variables are each coroutine's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import aio
from conftest import WorkerFactory
from workers import TESTS, WorkerProcess

from worker_core.exceptions import TimeLimitExceeded

POOLS = ["asyncio", "prefork", "threads", "solo"]


@pytest.fixture(scope="module", params=POOLS)
def pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def worker(pool: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    root = tmp_path_factory.mktemp(f"aio-{pool}")
    url = f"embedded://{root}/queue.db"
    aio.app.conf.update(broker_url=url, result_backend=None)
    factory = WorkerFactory(root)
    concurrency = {"asyncio": "50", "prefork": "2", "threads": "2", "solo": "1"}[pool]
    try:
        yield factory.start("-c", concurrency, app="apps.aio", pool=pool, broker=url,
                            env={"PYTHONPATH": str(TESTS)})
    finally:
        factory.cleanup()
        aio.app.close()


def test_an_async_task_returns_its_value_not_a_coroutine(worker: WorkerProcess) -> None:
    assert aio.add.delay(2, 3).get(timeout=20) == 5
    assert aio.nap.delay(0.01, {"a": [1]}).get(timeout=20) == {"a": [1]}


def test_each_coroutine_sees_its_own_request_and_context_variables(worker: WorkerProcess, pool: str) -> None:
    results = [aio.whoami.delay(0.3, f"marker-{index}") for index in range(6)]
    seen = [result.get(timeout=30) for result in results]
    for index, (result, info) in enumerate(zip(results, seen, strict=True)):
        assert info["id"] == result.id
        assert info["args"] == [0.3, f"marker-{index}"]
        assert info["tenant"] == f"marker-{index}"
    if pool == "asyncio":  # they ran at once, on one loop of one process
        assert len({(info["pid"], info["loop"]) for info in seen}) == 1


def test_the_handlers_around_a_coroutine_run_in_its_own_context(worker: WorkerProcess, pool: str,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "handlers"
    results = [aio.around.delay(str(path)) for _ in range(4)]
    seen = [result.get(timeout=20) for result in results]
    assert seen == [[f"set before {result.id}", result.id] for result in results]  # before_start's variable
    notes = {note["request"]: note for note in map(json.loads, path.read_text().splitlines())}
    assert sorted(notes) == sorted(result.id for result in results)
    assert all(note["tenant"] == f"set before {task_id}" for task_id, note in notes.items())
    if pool == "asyncio":  # off the loop, in a thread of the loop process
        assert all("-io" in note["thread"] for note in notes.values()), notes


def test_the_loop_of_a_process_or_thread_is_kept_for_the_next_task(worker: WorkerProcess, pool: str) -> None:
    seen = [tuple(aio.loop_identity.delay().get(timeout=20)) for _ in range(6)]
    executors: dict[tuple[int, str], set[int]] = {}
    for pid, thread, loop in seen:
        executors.setdefault((pid, thread), set()).add(loop)
    assert all(len(loops) == 1 for loops in executors.values()), seen


def test_a_plain_task_runs_beside_async_ones(worker: WorkerProcess, pool: str) -> None:
    value, thread, _pid = aio.plain.delay(7).get(timeout=20)
    assert value == 7
    if pool == "asyncio":  # in a thread of the loop process, not on its loop
        assert "-thread" in thread


def test_an_async_task_retries_and_autoretries(worker: WorkerProcess) -> None:
    assert aio.flaky.delay(2).get(timeout=20) == 2
    assert aio.retrying.delay(1).get(timeout=20) == 1


def test_an_async_tasks_exception_comes_back_as_itself(worker: WorkerProcess) -> None:
    with pytest.raises(ValueError, match="it broke"):
        aio.fails.delay("it broke").get(timeout=20)


def test_the_soft_time_limit_raises_inside_the_coroutine(worker: WorkerProcess, pool: str) -> None:
    if pool == "threads":
        pytest.skip("the threads pool cannot interrupt a task (it logs the limit as ignored)")
    assert aio.soft_limited.delay(5).get(timeout=20) == "soft limit caught"


def test_the_hard_time_limit_stops_the_coroutine(worker: WorkerProcess, pool: str) -> None:
    if pool == "threads":
        pytest.skip("the threads pool cannot stop a task (it logs the limit as ignored)")
    with pytest.raises(TimeLimitExceeded):
        aio.hard_limited.delay(5).get(timeout=20)
    assert aio.add.delay(1, 1).get(timeout=20) == 2  # and the worker carries on


def test_no_coroutine_was_left_unawaited(worker: WorkerProcess) -> None:
    assert aio.add.delay(0, 0).get(timeout=20) == 0
    assert "was never awaited" not in worker.log()
    assert "coroutine object" not in worker.log()


"""The asyncio pool's guarantees with real workers: a long coroutine keeps its Redis lease, a
revoke with terminate cancels it, one that swallows its cancellation has its process replaced,
a blocking call that stalls the loop is reported, and a warm shutdown lets hundreds of running
coroutines finish while it gives the rest back at once."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps import aio
from conftest import WorkerFactory
from faults import RedisServer
from workers import TESTS, WorkerProcess, wait_for

from worker_core.exceptions import TaskRevokedError, TimeLimitExceeded

VISIBILITY = 2
OPTIONS = json.dumps({"visibility_timeout": VISIBILITY, "unacked_restore_interval": 0.5})
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": OPTIONS}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    aio.app.conf.update(broker_url=server.url, result_backend=server.url,
                        broker_transport_options={"visibility_timeout": VISIBILITY})
    yield server
    aio.app.close()
    aio.app.conf.update(broker_url=None, result_backend=None, broker_transport_options={})
    server.stop()


@pytest.fixture(scope="module")
def worker(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One asyncio worker for the tests that leave it as they found it."""
    factory = WorkerFactory(tmp_path_factory.mktemp("asyncio"))
    try:
        yield factory.start("-c", "100", "--asyncio-cancel-grace", "0.5", "--asyncio-stall-after", "0.3",
                            app="apps.aio", pool="asyncio", broker=server.url, backend=server.url, env=ENV)
    finally:
        factory.cleanup()


def _flush(server: RedisServer) -> None:
    redis.Redis.from_url(server.url).flushdb()


def test_a_long_coroutine_past_the_visibility_timeout_runs_once(server: RedisServer, tmp_path: Path) -> None:
    _flush(server)
    factory = WorkerFactory(tmp_path)
    try:
        for _ in range(2):  # each one restores what it finds older than the timeout twice a second
            factory.start("-c", "20", app="apps.aio", pool="asyncio", broker=server.url, backend=server.url,
                          env=ENV)
        runs = tmp_path / "runs"
        results = [aio.long_once.delay(str(runs), 3 * VISIBILITY) for _ in range(30)]
        assert [result.get(timeout=40) for result in results] == ["done"] * 30
        wait_for(lambda: redis.Redis.from_url(server.url).hlen("unacked") == 0, message="every ack")
        assert sorted(runs.read_text().split()) == sorted(result.id for result in results)
        for worker in factory.started:
            assert "came back from Redis" not in worker.log()
    finally:
        factory.cleanup()


def test_revoke_with_terminate_cancels_the_running_coroutine_alone(worker: WorkerProcess,
                                                                   tmp_path: Path) -> None:
    started, marker = tmp_path / "started", tmp_path / "cancelled"
    neighbour = aio.nap.delay(1.5, "neighbour")
    before = aio.pid.delay().get(timeout=20)
    result = aio.cancellable.delay(str(started), str(marker))
    wait_for(started.exists, timeout=20, message="the coroutine to start")
    result.revoke(terminate=True)
    wait_for(marker.exists, timeout=20, message="the coroutine to see its cancellation")
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert neighbour.get(timeout=20) == "neighbour"  # the other coroutine of that loop went on
    assert aio.pid.delay().get(timeout=20) == before  # and so did the process
    assert f"{result.id}] is still running" not in worker.log()


def test_a_coroutine_that_swallows_its_cancellation_is_reported_and_its_process_replaced(
        worker: WorkerProcess, tmp_path: Path) -> None:
    started = tmp_path / "started"
    before = aio.pid.delay().get(timeout=20)
    neighbour = aio.nap.delay(2.0, "finished where it began")
    result = aio.swallow_cancel.apply_async((str(started), 30.0), time_limit=1)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=20)
    wait_for(lambda: Path(f"{started}.cancelled").exists(), message="the coroutine to be cancelled")
    worker.wait_log("apps.aio.swallow_cancel", timeout=10)
    worker.wait_log("is still running 0.5s after it was cancelled", timeout=10)
    assert f"pid:{before} is replaced" in worker.log()
    assert neighbour.get(timeout=20) == "finished where it began"
    wait_for(lambda: aio.pid.delay().get(timeout=20) != before, timeout=20, message="a new loop process")
    # the replaced process is gone once only the coroutine that ignored its cancellation is left
    wait_for(lambda: not os.path.exists(f"/proc/{before}"), timeout=20, message="the old process to end")


def test_a_blocking_call_in_a_coroutine_is_reported_with_its_task_and_the_stalled_time(
        worker: WorkerProcess) -> None:
    assert aio.block_loop.delay(1.2).get(timeout=20) == "blocked"

    def reported() -> list[str]:  # (the loop of a loaded machine may be reported for other stalls too)
        return [line for line in worker.log().splitlines()
                if "apps.aio.block_loop" in line and "event loop" in line]

    wait_for(lambda: any("ran again after" in line for line in reported()), message="the loop's report")
    lines = reported()
    assert any("has blocked the event loop of AsyncioLoop-" in line for line in lines), lines
    over = next(line for line in lines if "ran again after" in line)
    seconds = float(over.split("ran again after ")[1].split("s ")[0])
    assert 0.9 <= seconds <= 5, over


def test_warm_shutdown_with_500_coroutines_running_lets_them_finish_and_gives_back_the_rest(
        server: RedisServer, tmp_path: Path) -> None:
    _flush(server)
    queue = f"warm-{uuid.uuid4().hex[:8]}"
    factory = WorkerFactory(tmp_path)
    try:
        worker = factory.start("-c", "500", "-Q", queue, app="apps.aio", pool="asyncio", broker=server.url,
                               backend=server.url, env=ENV)
        started = tmp_path / "started"
        started.mkdir()
        running = [aio.long_once.apply_async((str(started / "runs"), 4.0), queue=queue) for _ in range(500)]
        wait_for(lambda: (started / "runs").exists() and len((started / "runs").read_text().split()) == 500,
                 timeout=30, message="500 coroutines to start")
        held = [aio.nap.apply_async((30, "late"), queue=queue) for _ in range(100)]
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: client.llen(queue) == 0 and client.hlen("unacked") == 600, timeout=20,
                 message="the worker to take the 100 more")
        worker.signal(signal.SIGTERM)
        wait_for(lambda: client.llen(queue) == 100, timeout=10, message="the 100 not started to go back")
        # back while the 500 still run: at once, not after them
        assert worker.process.poll() is None and not any(result.ready() for result in running)
        assert worker.process.wait(timeout=30) == 0
        assert [result.get(timeout=10) for result in running] == ["done"] * 500
        assert all(result.state == "PENDING" for result in held)
        assert client.llen(queue) == 100 and client.hlen("unacked") == 0
        worker.wait_log("Warm shutdown: waiting for 500 running task(s); 100 not started went back")
    finally:
        factory.cleanup()

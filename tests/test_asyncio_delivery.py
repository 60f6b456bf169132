"""The asyncio pool's delivery guarantees with a real worker on a redis-server of its own: a
result held up in the backend holds up no other task and its message stays unacknowledged until
it is stored; rate limits and ETAs; a coroutine that crashes its process runs again with its
neighbours, and one that crashes it every time is capped alone; a cold shutdown cancels the
running coroutines and gives every message back."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps import aio
from conftest import WorkerFactory
from faults import RedisServer, TcpProxy
from workers import TESTS, WorkerProcess, wait_for

from worker_core.exceptions import WorkerLostError

LIMIT = 2
ENV = {"PYTHONPATH": str(TESTS), "WORKER_WORKER_REDELIVERY_LIMIT": str(LIMIT)}


class Gate:
    """Holds back, in the proxy in front of the result backend, what a client sends about one
    task (its result's store) until :meth:`release`."""

    def __init__(self) -> None:
        self.key: bytes | None = None
        self.holding = threading.Event()
        self.open = threading.Event()
        self.open.set()

    def hold(self, task_id: str) -> None:
        self.key = task_id.encode()
        self.holding.clear()
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    def __call__(self, chunk: bytes) -> None:
        if self.key is not None and self.key in chunk and not self.open.is_set():
            self.holding.set()
            self.open.wait(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    aio.app.conf.update(broker_url=server.url, result_backend=server.url)
    yield server
    aio.app.close()
    aio.app.conf.update(broker_url=None, result_backend=None)
    server.stop()


@pytest.fixture(scope="module")
def gate() -> Gate:
    return Gate()


@pytest.fixture(scope="module")
def worker(server: RedisServer, gate: Gate,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One asyncio worker whose result backend is behind a proxy the tests can hold up."""
    proxy = TcpProxy("127.0.0.1", server.port, client_data=gate)
    factory = WorkerFactory(tmp_path_factory.mktemp("asyncio"))
    try:
        yield factory.start("-c", "50", app="apps.aio", pool="asyncio", broker=server.url,
                            backend=f"redis://127.0.0.1:{proxy.port}/0", env=ENV)
    finally:
        gate.release()
        factory.cleanup()
        proxy.close()


def _unacked(client: redis.Redis, task_id: str) -> bool:
    return any(task_id.encode() in value for value in client.hvals("unacked"))


def test_a_result_held_up_in_the_backend_holds_up_no_other_task_and_its_message_stays_unacknowledged(
        server: RedisServer, worker: WorkerProcess, gate: Gate) -> None:
    client = redis.Redis.from_url(server.url)
    task_id = uuid.uuid4().hex
    gate.hold(task_id)
    try:
        held = aio.late_nap.apply_async((0, "held"), task_id=task_id)
        wait_for(gate.holding.is_set, timeout=20, message="the held result's store to reach the backend")
        # the loop and the other threads that store results go on meanwhile
        others = [aio.nap.delay(0, n) for n in range(10)]
        assert [result.get(timeout=20) for result in others] == list(range(10))
        assert held.state == "PENDING"
        assert _unacked(client, task_id)  # acknowledged once its result is stored, not before
    finally:
        gate.release()
    assert held.get(timeout=20) == "held"
    wait_for(lambda: not _unacked(client, task_id), timeout=20, message="the held task's acknowledgement")


def test_a_rate_limited_coroutine_starts_at_most_at_its_rate(worker: WorkerProcess) -> None:
    starts = sorted(result.get(timeout=30) for result in [aio.limited.delay() for _ in range(6)])
    # four a second with a bucket of one: the first at once, then one every 0.25 s
    assert starts[-1] - starts[0] >= 5 * 0.25 * 0.9


def test_a_coroutine_with_a_countdown_starts_at_its_eta_while_the_others_run(worker: WorkerProcess) -> None:
    sent = time.time()
    later = aio.started_at.apply_async(countdown=1.5)
    assert aio.nap.delay(0, "now").get(timeout=20) == "now"
    assert not later.ready()
    assert later.get(timeout=20) >= sent + 1.5 - 0.05


@pytest.mark.parametrize("crasher", ["crash_once", "crash_once_plain"])
def test_with_acks_late_a_task_that_crashed_its_process_runs_again_with_its_neighbours(
        worker: WorkerProcess, tmp_path: Path, crasher: str) -> None:
    runs = tmp_path / "runs"
    neighbours = [aio.bystander.delay(str(runs), 2.0) for _ in range(5)]
    wait_for(lambda: runs.exists() and len(runs.read_text().split()) == 5, timeout=20,
             message="the neighbours to start")
    marker = tmp_path / "crashed"
    assert getattr(aio, crasher).delay(str(marker)).get(timeout=40) == "survived"
    first, second = marker.read_text().split()
    assert first != second  # a new loop process ran it again
    assert [result.get(timeout=40) for result in neighbours] == ["done"] * 5
    ids = runs.read_text().split()
    assert sorted(set(ids)) == sorted(result.id for result in neighbours)
    assert all(ids.count(result.id) == 2 for result in neighbours)  # lost with the process, run again
    worker.wait_log(f"exited with 'signal 11 (SIGSEGV)' while running task apps.aio.{crasher} (job ")
    assert "Fatal Python error: Segmentation fault" in worker.log()  # the crash report, in the worker's log
    lines = worker.log().splitlines()
    for result in neighbours:  # lost with it, and sent again without counting toward the poison cap
        assert any(result.id in line and "took its process down" in line and "not counted" in line
                   for line in lines), result.id


def test_a_coroutine_that_crashes_its_process_every_time_is_capped_and_its_neighbour_is_not(
        worker: WorkerProcess, tmp_path: Path) -> None:
    runs, counter = tmp_path / "runs", tmp_path / "crashes"
    neighbour = aio.bystander.delay(str(runs), 8.0)
    wait_for(runs.exists, timeout=20, message="the neighbour to start")
    poisoned = aio.crash_always.delay(str(counter))
    with pytest.raises(WorkerLostError, match=r"not run again \(worker_redelivery_limit=2\)"):
        poisoned.get(timeout=60)
    assert len(counter.read_text().split()) == LIMIT + 1  # the first run and LIMIT more
    # lost with its process each time, and sent again each time without counting toward the cap
    assert neighbour.get(timeout=60) == "done"
    assert len(runs.read_text().split()) >= 2
    assert aio.nap.delay(0, "still up").get(timeout=20) == "still up"


def test_cold_shutdown_cancels_the_running_coroutines_and_gives_every_message_back(
        server: RedisServer, tmp_path: Path) -> None:
    client = redis.Redis.from_url(server.url)
    queue = f"cold-{uuid.uuid4().hex[:8]}"
    factory = WorkerFactory(tmp_path)
    try:
        worker = factory.start("-c", "20", "-Q", queue, app="apps.aio", pool="asyncio", broker=server.url,
                               backend=server.url, env=ENV)
        started, cancelled = tmp_path / "started", tmp_path / "cancelled"
        running = [aio.late_until_cancelled.apply_async((str(started), str(cancelled)), queue=queue)
                   for _ in range(20)]
        wait_for(lambda: started.exists() and len(started.read_text().split()) == 20, timeout=30,
                 message="20 coroutines to start")
        waiting = [aio.late_nap.apply_async((30, "late"), queue=queue) for _ in range(5)]
        wait_for(lambda: client.llen(queue) == 0 and client.hlen("unacked") == 25, timeout=20,
                 message="the worker to take the 5 more")
        worker.signal(signal.SIGQUIT)
        assert worker.process.wait(timeout=30) == 0
        assert sorted(cancelled.read_text().split()) == sorted(result.id for result in running)
        wait_for(lambda: client.llen(queue) == 25 and client.hlen("unacked") == 0, timeout=20,
                 message="every message to go back")
        assert all(result.state == "PENDING" for result in running + waiting)
        assert "Cold shutdown" in worker.log()
    finally:
        factory.cleanup()

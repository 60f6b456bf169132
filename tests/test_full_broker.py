"""A full or busy broker is a state, not a lost connection: Redis out of memory (``maxmemory``
reached under ``noeviction``) or busy with a long script while tasks run with results on. The
worker keeps its connection, logs the refusal once when it starts and once when it ends, takes
no task meanwhile, and stores every result once Redis takes writes again. Each test has its own
redis-server (broker and results); runs are counted in another Redis."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from apps import basic
from conftest import REDIS_TEST_URL
from faults import RedisServer
from workers import TESTS, ask, wait_for

FAST_RETRY = '{"interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}'
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": FAST_RETRY}
TASKS = 40
#: how long Redis refuses (a sleep that is the fault under test)
REFUSING = 4.0


@pytest.fixture
def server(tmp_path: Path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def client(server: RedisServer):
    basic.app.conf.update(broker_url=server.url, result_backend=server.url)
    yield basic.app
    basic.app.close()
    basic.app.conf.update(broker_url=None, result_backend=None)


def _unexpected(log: str) -> list[str]:
    """The log's warnings and errors."""
    return [line for line in log.splitlines()
            if line.startswith("[") and any(level in line for level in ("WARNING/", "ERROR/", "CRITICAL/"))]


def _out_of_memory(url: str) -> None:
    broker = redis.Redis.from_url(url)
    broker.config_set("maxmemory-policy", "noeviction")
    broker.config_set("maxmemory", 1)  # below what it uses: every write that may grow it is refused


def _busy(url: str, seconds: float) -> threading.Thread:
    """Keep Redis busy with a script for ``seconds``; others get ``BUSY`` after 0.1 s of it."""
    broker = redis.Redis.from_url(url, socket_timeout=seconds + 30)  # (redis-py's default is shorter)
    broker.config_set("busy-reply-threshold", 100)
    script = "local t = redis.call('TIME')[1] while redis.call('TIME')[1] - t < tonumber(ARGV[1]) do end"
    thread = threading.Thread(target=broker.eval, args=(script, 0, int(seconds)), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fault", ["out-of-memory", "busy"])
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_refusing_redis_is_waited_out_with_one_line_each_way_and_every_result_stored(
        workers, server, client, pool, fault):
    worker = workers.start("-c", "2", pool=pool, broker=server.url, backend=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    results = [basic.count_slowly.delay(REDIS_TEST_URL, key, n, 0.3) for n in range(TASKS)]
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) >= 6, timeout=20, message="some tasks to run")
    if fault == "out-of-memory":
        _out_of_memory(server.url)
        worker.wait_log("MainProcess] Redis refuses work: out of memory", timeout=10)
        time.sleep(REFUSING)  # the fault under test
        redis.Redis.from_url(server.url).config_set("maxmemory", 0)
    else:
        # twice as long: the worker sees it by a write of its own (its probe runs every 2 s)
        busy = _busy(server.url, 2 * REFUSING)
        worker.wait_log("MainProcess] Redis refuses work: it is busy running a script", timeout=10)
        busy.join(timeout=2 * REFUSING + 10)
    worker.wait_log("The broker takes work again after", timeout=20)
    assert [result.get(timeout=60) for result in results] == list(range(TASKS))
    assert basic.runs(REDIS_TEST_URL, key) == dict.fromkeys(range(TASKS), 1)
    log = worker.log()
    assert log.count("MainProcess] Redis refuses work") == 1
    assert log.count("The broker takes work again after") == 1
    assert "Connection to broker lost" not in log
    # one line each way for the consumer, and for the result backend in each process that stores
    assert len(_unexpected(log)) <= 2 + 2 * 3, "\n".join(_unexpected(log))
    state = ask(basic.app, "stats", worker=worker.name)["broker_state"]
    assert state["refusing"] is None and state["refusals"] == 1 and state["refused_seconds"] > 1
    assert worker.stop() == 0


def test_a_result_redis_refuses_past_the_bound_is_stored_as_failure_with_the_reason(workers, server, client):
    # results may be refused for 2 s: then the task's result is FAILURE, stored once Redis takes it
    env = {**ENV, "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": '{"refused_retry_seconds": 2}'}
    worker = workers.start("-c", "1", pool="threads", broker=server.url, backend=server.url, env=env)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    result = basic.count_slowly.delay(REDIS_TEST_URL, key, 7, 1.0)
    wait_for(lambda: basic.runs(REDIS_TEST_URL, key) == {7: 1}, message="the task to start")
    _out_of_memory(server.url)  # before it returns: its result is refused
    try:
        worker.wait_log("the task returned but its result could not be stored", timeout=20)
    finally:
        redis.Redis.from_url(server.url).config_set("maxmemory", 0)
    wait_for(lambda: result.state == "FAILURE", timeout=20, message="the FAILURE to be stored")
    assert "it refused for 2s: out of memory" in str(result.result)
    assert basic.runs(REDIS_TEST_URL, key) == {7: 1}
    assert worker.log().count("The result backend's Redis refuses work") == 1


def test_a_worker_started_on_a_read_only_replica_waits_for_it_to_take_writes(
        workers, server, tmp_path, client):
    # The worker's Redis is a replica of another: it refuses the worker's writes (READONLY) from
    # the start. The worker says so once, tries again with a growing delay (no reconnect loop), and
    # starts as soon as the replica is promoted.
    directory = tmp_path / "replica"
    directory.mkdir()
    replica = RedisServer(directory).start()
    try:
        replica_client = redis.Redis.from_url(replica.url)
        replica_client.replicaof("127.0.0.1", server.port)
        wait_for(lambda: replica_client.info("replication")["master_link_status"] == "up", timeout=20,
                 message="the replica to follow its master")
        worker = workers.start("-c", "1", pool="threads", broker=replica.url, backend=replica.url, env=ENV,
                               ready=False)
        worker.wait_log("MainProcess] Redis refuses work: it is a read-only replica", timeout=20)
        time.sleep(REFUSING)  # the fault under test: the worker waits it out
        assert " ready." not in worker.log()
        replica_client.replicaof("NO", "ONE")
        worker.wait_ready(timeout=30)
        worker.wait_log("The broker takes work again after", timeout=10)
        basic.app.conf.update(broker_url=replica.url, result_backend=replica.url)
        basic.app.close()
        assert basic.add.delay(2, 3).get(timeout=20) == 5
        log = worker.log()
        assert log.count("MainProcess] Redis refuses work") == 1
        assert "Connection to broker lost" not in log
        assert len(_unexpected(log)) <= 3, "\n".join(_unexpected(log))
    finally:
        replica.stop()

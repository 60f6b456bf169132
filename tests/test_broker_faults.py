"""Lost brokers, failover and killed workers, with servers and proxies the tests control
(never the shared Redis or RabbitMQ themselves)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from apps import basic
from conftest import REDIS_TEST_URL, amqp_url_on, delete_queue
from faults import RedisServer, TcpProxy
from workers import TESTS, ask, wait_for

FAST_RETRY = '{"interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}'
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": FAST_RETRY}


@pytest.fixture
def redis_server(tmp_path: Path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def second_redis(tmp_path: Path):
    directory = tmp_path / "second"
    directory.mkdir()
    server = RedisServer(directory).start()
    yield server
    server.stop()


@pytest.fixture
def amqp_behind_proxy(amqp_url: str):
    """(proxy, queue, url): a TCP proxy the test controls in front of RabbitMQ, a queue of the
    test's own (deleted afterwards) and the URL that goes through the proxy."""
    proxy = TcpProxy("127.0.0.1", 5672)
    queue = f"faults-{uuid.uuid4().hex[:8]}"
    yield proxy, queue, amqp_url_on(proxy.port)
    proxy.close()
    delete_queue(amqp_url, queue)


@pytest.fixture
def client():
    yield basic.app
    basic.app.close()


# prefork: the reconnect resets the hub, so the pool's pipes must be registered with it again
# (else results are never read, and once as many tasks as processes ran, nothing runs)
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_the_worker_reconnects_after_a_redis_restart_and_resumes_on_the_same_queues(
        workers, redis_server, client, redis_url, pool):
    client.conf.update(broker_url=redis_server.url, result_backend=REDIS_TEST_URL)
    worker = workers.start("-Q", "celery,second", "-c", "2", pool=pool, broker=redis_server.url,
                           backend=REDIS_TEST_URL, env=ENV)
    assert basic.add.delay(1, 1).get(timeout=20) == 2
    redis_server.stop()
    worker.wait_log("Connection to broker lost")
    worker.wait_log("Trying again in 0.20 seconds... (1/100)")
    redis_server.start()
    worker.wait_log("Connected to redis://127.0.0.1", timeout=20)
    client.close()
    assert basic.add.delay(2, 2).get(timeout=20) == 4
    assert basic.add.apply_async((3, 3), queue="second").get(timeout=20) == 6
    results = [basic.add.delay(n, n) for n in range(8)]  # more than the pool has processes
    assert [result.get(timeout=20) for result in results] == [2 * n for n in range(8)]
    assert worker.stop() == 0  # the warm shutdown is not left waiting for results never read


def test_the_worker_reconnects_through_a_cut_amqp_connection(
        workers, amqp_url, amqp_behind_proxy, redis_url, client):
    proxy, queue, url = amqp_behind_proxy
    client.conf.update(broker_url=amqp_url, result_backend=REDIS_TEST_URL)
    worker = workers.start("-Q", queue, pool="threads", broker=url, backend=REDIS_TEST_URL, env=ENV)
    assert basic.add.apply_async((1, 1), queue=queue).get(timeout=20) == 2
    proxy.cut()
    worker.wait_log("Connection to broker lost")
    worker.wait_log("Trying again in")
    proxy.restore()
    worker.wait_log("Connected to amqp://guest:**@127.0.0.1", timeout=20)
    assert basic.add.apply_async((5, 5), queue=queue).get(timeout=20) == 10


def test_tasks_received_but_not_started_when_an_amqp_connection_is_cut_run_once(
        workers, amqp_url, amqp_behind_proxy, redis_url, client, tmp_path):
    # Their delivery tags died with the channel: RabbitMQ delivers them again after the
    # reconnect, so the copies the worker still holds must not run as well.
    proxy, queue, url = amqp_behind_proxy
    ran = tmp_path / "ran"
    client.conf.update(broker_url=amqp_url, result_backend=REDIS_TEST_URL)
    worker = workers.start("-Q", queue, "-c", "1", pool="threads", broker=url, backend=REDIS_TEST_URL,
                           env=ENV)
    blocker = basic.sleep.apply_async((2.0,), queue=queue)
    records = [basic.record.apply_async((str(ran), n), queue=queue) for n in range(3)]
    wait_for(lambda: worker.log().count(" received") >= 4, message="all four tasks received")
    proxy.cut()
    worker.wait_log("Dropped 3 task(s) received but not started before the connection was lost")
    proxy.restore()
    worker.wait_log("Connected to amqp://guest:**@127.0.0.1", timeout=20)
    assert blocker.get(timeout=20) == 2.0
    assert sorted(result.get(timeout=20) for result in records) == [0, 1, 2]
    time.sleep(1.0)  # room for a second run, if there were one
    assert sorted(basic.lines(ran)) == ["0", "1", "2"]


def test_a_running_acks_late_task_is_cancelled_on_amqp_connection_loss_when_asked_and_runs_once(
        workers, amqp_url, amqp_behind_proxy, redis_url, client, tmp_path):
    proxy, queue, url = amqp_behind_proxy
    ran = tmp_path / "ran"
    env = dict(ENV, WORKER_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS="true")
    client.conf.update(broker_url=amqp_url, result_backend=REDIS_TEST_URL)
    worker = workers.start("-Q", queue, "-c", "1", pool="prefork", broker=url, backend=REDIS_TEST_URL,
                           env=env)
    result = basic.record_slowly.apply_async((str(ran), "done", 3.0), queue=queue)
    wait_for(lambda: ask(client, "query_task", ids=[result.id]).get(result.id, [None])[0] == "active",
             message="the task to run in the pool")
    proxy.cut()
    worker.wait_log("cannot be acknowledged after a connection loss since late acknowledgement is "
                    "enabled for it.\nTerminating it instead.")
    worker.wait_log(f"on_retry of {result.id} in process {worker.pid}: ")  # as in Celery
    proxy.restore()
    worker.wait_log("Connected to amqp://guest:**@127.0.0.1", timeout=20)
    assert result.get(timeout=30) == "done"  # delivered again and run to the end
    time.sleep(1.0)  # a negative: room for the first run to write too, had it not been stopped
    assert basic.lines(ran) == ["done"]  # the first run was stopped before it wrote


def test_a_missed_amqp_heartbeat_is_a_lost_connection(
        workers, amqp_url, amqp_behind_proxy, redis_url, client):
    proxy, queue, url = amqp_behind_proxy
    client.conf.update(broker_url=amqp_url, result_backend=REDIS_TEST_URL)
    env = dict(ENV, WORKER_BROKER_HEARTBEAT="2", WORKER_BROKER_CONNECTION_TIMEOUT="1")
    worker = workers.start("-Q", queue, pool="threads", broker=url, backend=REDIS_TEST_URL, env=env)
    assert basic.add.apply_async((1, 1), queue=queue).get(timeout=20) == 2
    proxy.blackhole()  # the TCP connection stays open; nothing gets through
    started = time.monotonic()
    worker.wait_log("Connection to broker lost", timeout=20)
    assert time.monotonic() - started < 12
    proxy.restore()
    worker.wait_log("Connected to amqp://guest:**@127.0.0.1", timeout=30)
    assert basic.add.apply_async((2, 3), queue=queue).get(timeout=20) == 5


def test_failover_moves_to_the_next_redis_and_priority_moves_back(
        workers, redis_server, second_redis, redis_url):
    first, second = redis_server.url, second_redis.url
    env = dict(ENV, WORKER_BROKER_FAILBACK_INTERVAL="0.5")
    worker = workers.start("--failover", "priority", pool="threads", broker=f"{first};{second}",
                           backend=REDIS_TEST_URL, env=env)
    try:
        basic.app.conf.update(broker_url=first, result_backend=REDIS_TEST_URL)
        assert basic.add.delay(1, 1).get(timeout=20) == 2
        redis_server.stop()
        worker.wait_log(f"switching broker from {first} to {second}", timeout=20)
        basic.app.conf.update(broker_url=second, result_backend=REDIS_TEST_URL)
        assert basic.add.delay(2, 2).get(timeout=20) == 4
        redis_server.start()
        worker.wait_log(f"broker {first} answers again; moving back to it from {second}", timeout=20)
        worker.wait_log("Connected to " + first, timeout=20)
        basic.app.conf.update(broker_url=first, result_backend=REDIS_TEST_URL)
        assert basic.add.delay(3, 3).get(timeout=20) == 6
    finally:
        basic.app.close()


def test_round_robin_failover_keeps_going_to_the_next_broker(workers, redis_server, second_redis, redis_url):
    first, second = redis_server.url, second_redis.url
    worker = workers.start(pool="threads", broker=f"{first};{second}", backend=REDIS_TEST_URL, env=ENV)
    try:
        redis_server.stop()
        worker.wait_log(f"switching broker from {first} to {second}", timeout=20)
        basic.app.conf.update(broker_url=second, result_backend=REDIS_TEST_URL)
        assert basic.add.delay(4, 4).get(timeout=20) == 8
        assert "moving back" not in worker.log()
    finally:
        basic.app.close()


def test_a_broker_restart_with_running_tasks_reduces_the_prefetch_then_restores_it(
        workers, redis_server, redis_url, tmp_path):
    basic.app.conf.update(broker_url=redis_server.url, result_backend=REDIS_TEST_URL)
    worker = workers.start("-c", "2", "--prefetch-multiplier", "2", pool="threads", broker=redis_server.url,
                           backend=REDIS_TEST_URL, env=ENV)
    try:
        running = [basic.sleep.delay(3) for _ in range(2)]
        wait_for(lambda: len(ask(basic.app, "active")) == 2, message="two tasks running")
        redis_server.stop()
        redis_server.start()
        worker.wait_log("Temporarily reducing the prefetch count to 2 to avoid over-fetching since 2 tasks "
                        "are currently being processed.", timeout=20)
        worker.wait_log("The prefetch count will be gradually restored to 4 as the tasks complete "
                        "processing.")
        assert [r.get(timeout=30) for r in running] == [3, 3]
        worker.wait_log("Resuming normal operations following a restart.\n"
                        "Prefetch count has been restored to the maximum of 4", timeout=20)
    finally:
        basic.app.close()


def test_after_kill_9_of_a_whole_worker_its_acks_late_tasks_run_on_another_one_redis(
        workers, redis_url, tmp_path):
    env = dict(ENV, WORKER_BROKER_TRANSPORT_OPTIONS='{"visibility_timeout": 3}')
    basic.app.conf.update(broker_url=redis_url, result_backend=redis_url)
    try:
        first = workers.start("-c", "2", pool="prefork", broker=redis_url, backend=redis_url, env=env)
        proof = tmp_path / "ran.txt"
        results = [basic.record_slowly.delay(str(proof), n, 2) for n in range(4)]
        # All four received (two running, two waiting): a message an idle worker's BRPOP has just
        # taken is only in its socket until the worker records it, and a kill in that instant
        # loses it, with kombu as here (see the README).
        wait_for(lambda: first.log().count(" received") >= 4, message="all four tasks received")
        first.crash()
        assert basic.lines(proof) == []
        workers.start("-c", "2", pool="prefork", broker=redis_url, backend=redis_url, env=env)
        assert sorted(r.get(timeout=60) for r in results) == [0, 1, 2, 3]
        assert sorted(map(int, basic.lines(proof))) == [0, 1, 2, 3]
    finally:
        basic.app.close()


def test_after_kill_9_of_a_whole_worker_its_acks_late_tasks_run_on_another_one_rabbitmq(
        workers, amqp_url, redis_url, tmp_path):
    queue = f"faults-{uuid.uuid4().hex[:8]}"
    basic.app.conf.update(broker_url=amqp_url, result_backend=redis_url)
    try:
        first = workers.start("-c", "2", "-Q", queue, pool="prefork", broker=amqp_url, backend=redis_url,
                              env=ENV)
        proof = tmp_path / "ran.txt"
        results = [basic.record_slowly.apply_async((str(proof), n, 2), queue=queue) for n in range(4)]
        wait_for(lambda: first.log().count(" received") >= 2, message="tasks to start")
        first.crash()
        assert basic.lines(proof) == []
        workers.start("-c", "2", "-Q", queue, pool="prefork", broker=amqp_url, backend=redis_url, env=ENV)
        assert sorted(r.get(timeout=60) for r in results) == [0, 1, 2, 3]
        assert sorted(map(int, basic.lines(proof))) == [0, 1, 2, 3]
    finally:
        basic.app.close()
        workers.cleanup()
        delete_queue(amqp_url, queue)

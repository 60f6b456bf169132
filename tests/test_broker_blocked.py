"""A RabbitMQ node of the test's own raises its memory alarm while a worker runs tasks, then
clears it: the worker, which publishes (its task events), is blocked (``connection.blocked``),
logs it once, is not ready and says so in its metrics while it lasts, logs its end with its
duration, keeps its connection, and every task runs once with its result stored."""

from __future__ import annotations

import secrets
import time
import urllib.error
import urllib.request
import uuid

import pytest
from apps import basic
from conftest import REDIS_TEST_URL
from faults import free_port
from rabbit_cluster import _Node
from workers import TESTS, wait_for

TASKS = 30
#: how long the alarm lasts (a sleep that is the fault under test)
ALARM = 3.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    name, cookie = f"alarm-{uuid.uuid4().hex[:8]}", secrets.token_hex(16).upper()
    rabbit = _Node(tmp_path_factory.mktemp("rabbit"), name, cookie)
    rabbit.start()
    try:
        rabbit.wait()
        rabbit.ctl("await_startup")
        yield rabbit
    finally:
        rabbit.stop()


@pytest.fixture
def client(node: _Node):
    basic.app.conf.update(broker_url=node.url, result_backend=REDIS_TEST_URL)
    yield basic.app
    basic.app.close()
    basic.app.conf.update(broker_url=None, result_backend=None)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode().strip()


def _ready(port: int) -> tuple[int, str]:
    return _get(port, "/readyz")


def _refusing(port: int) -> float:
    """The worker's ``worker_broker_refusing`` gauge."""
    for line in _get(port, "/metrics")[1].splitlines():
        if line.startswith("worker_broker_refusing{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no worker_broker_refusing in the metrics")


def _alarm(node: _Node, raised: bool) -> None:
    """Raise or clear the node's memory alarm, as its memory monitor does past the watermark."""
    call = "set_alarm({{resource_limit, memory, node()}, []})" if raised else \
        "clear_alarm({resource_limit, memory, node()})"
    node.ctl("eval", f"rabbit_alarm:{call}.")


def test_a_memory_alarm_blocks_the_worker_which_is_not_ready_until_it_clears_and_loses_nothing(
        workers, node, client):
    port = free_port()
    worker = workers.start("-c", "2", "-E", "--metrics-listen", f"127.0.0.1:{port}", pool="threads",
                           broker=node.url, backend=REDIS_TEST_URL, env={"PYTHONPATH": str(TESTS)})
    wait_for(lambda: _ready(port)[0] == 200, message="the worker to be ready")
    key = f"runs-{uuid.uuid4().hex[:8]}"
    results = [basic.count_slowly.delay(REDIS_TEST_URL, key, n, 0.2) for n in range(TASKS)]
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) >= 4, timeout=20, message="some tasks to run")
    _alarm(node, raised=True)
    try:
        worker.wait_log("RabbitMQ blocks the connection", timeout=15)
        assert _ready(port) == (503, "broker-blocked")
        assert _refusing(port) == 1
        time.sleep(ALARM)  # the fault under test
        assert _ready(port)[0] == 503
    finally:
        _alarm(node, raised=False)
    worker.wait_log("The broker takes work again after", timeout=15)
    wait_for(lambda: _ready(port)[0] == 200, message="the worker to be ready again")
    assert _refusing(port) == 0
    assert [result.get(timeout=60) for result in results] == list(range(TASKS))
    assert basic.runs(REDIS_TEST_URL, key) == dict.fromkeys(range(TASKS), 1)
    log = worker.log()
    assert log.count("] RabbitMQ blocks the connection") == 1
    assert log.count("The broker takes work again after") == 1
    assert "Connection to broker lost" not in log
    assert worker.stop() == 0

"""The remote-control commands a worker answers, reply for reply with Celery's: a worker of this
project's App on Redis, asked with this project's client and with Celery's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from apps import basic
from conftest import REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server
from workers import TESTS, wait_for

from worker_core.control.client import broadcast

pytestmark = pytest.mark.timeout(120)

REDIS_URL = redis_db(5)  # this file's own database of the suite's Redis


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_server(REDIS_PORT, "Redis")
    empty_redis(REDIS_URL)
    factory = WorkerFactory(tmp_path_factory.mktemp("control"))
    yield factory.start("--heartbeat-interval", "0.5", broker=REDIS_URL,
                        env={"PYTHONPATH": str(TESTS)})
    factory.cleanup()


@pytest.fixture
def client(worker: Any) -> Iterator[Any]:
    basic.app.conf.update(broker_url=REDIS_URL, result_backend=None)
    wait_for(lambda: broadcast(basic.app, "ping", destination=[worker.name], timeout=0.5), timeout=20,
             message="the worker to answer a ping")
    yield basic.app
    basic.app.close()


def ask(client: Any, worker: Any, command: str, **arguments: Any) -> Any:
    [reply] = broadcast(client, command, arguments, destination=[worker.name], timeout=5)
    return reply[worker.name]


def test_the_logical_clock_moves_on_with_each_request_and_each_event(worker, client):
    first = ask(client, worker, "clock")["clock"]
    second = ask(client, worker, "clock")["clock"]
    assert second > first  # the request itself moved it on
    # heartbeats go out every 0.5 s: between two requests the clock moves by more than one
    readings = [second]

    def moved_by_events() -> bool:
        readings.append(ask(client, worker, "clock")["clock"])
        return readings[-1] - readings[-2] > 1

    wait_for(moved_by_events, timeout=10, interval=0.6, message="a heartbeat to move the clock")
    stats = ask(client, worker, "stats")
    assert isinstance(stats["clock"], str) and int(stats["clock"]) > readings[-1]  # a string, as Celery's

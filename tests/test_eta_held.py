"""Tasks held for their ETA or countdown, on Redis and RabbitMQ: ``worker_eta_task_limit`` caps
how many the worker takes (the rest stay in the broker until room frees), and held tasks are
listed by ``inspect scheduled`` and revoked at once."""

from __future__ import annotations

import time
import uuid

import kombu
import pytest
from apps import basic
from conftest import delete_queue
from workers import TESTS, wait_for

from worker_core.control.client import broadcast


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("redis_url" if request.param == "redis" else "amqp_url")
    basic.app.conf.update(broker_url=url, result_backend=None)
    yield url
    basic.app.close()


@pytest.fixture
def queue(broker: str) -> str:
    name = f"eta-{uuid.uuid4().hex[:8]}"
    yield name
    delete_queue(broker, name)


def _ask(worker_name: str, command: str, **arguments: object) -> object:
    [reply] = broadcast(basic.app, command, arguments, destination=[worker_name], timeout=5, limit=1)
    return reply[worker_name]


def _ready(broker: str, queue: str) -> int:
    """Messages of ``queue`` the broker has not delivered (a passive declare on RabbitMQ; on
    Redis a passive one fails once the list is empty)."""
    with kombu.Connection(broker) as connection:
        passive = broker.startswith("amqp")
        return int(connection.default_channel.queue_declare(queue, passive=passive).message_count)


def _start(workers, broker: str, queue: str, *, limit: int | None = None):
    name = f"eta-{uuid.uuid4().hex[:8]}@localhost"
    env = {"PYTHONPATH": str(TESTS), "WORKER_WORKER_PREFETCH_MULTIPLIER": "1"}
    if limit is not None:
        env["WORKER_WORKER_ETA_TASK_LIMIT"] = str(limit)
    worker = workers.start("-Q", queue, "-c", "1", "-n", name, broker=broker, env=env)
    return worker, name


def test_worker_eta_task_limit_holds_that_many_and_the_rest_wait_in_the_broker(workers, broker, queue,
                                                                            tmp_path):
    proof = tmp_path / "ran"
    worker, name = _start(workers, broker, queue, limit=3)
    for n in range(8):
        basic.record.apply_async((str(proof), n), countdown=3, queue=queue)
    wait_for(lambda: len(_ask(name, "scheduled")) == 3, message="three tasks held")  # type: ignore[arg-type]
    time.sleep(0.5)  # room for a worker past its limit to take more (it must not)
    assert len(_ask(name, "scheduled")) == 3  # type: ignore[arg-type]
    assert _ready(broker, queue) == 5
    assert _ask(name, "stats")["prefetch_count"] == 3  # type: ignore[index]
    # the held ones come due and run; the room they free brings the rest, each run once
    wait_for(lambda: len(basic.lines(proof)) >= 8, timeout=20, message="the eight tasks to run")
    assert sorted(basic.lines(proof), key=int) == [str(n) for n in range(8)]
    assert _ready(broker, queue) == 0
    worker.stop()
    assert len(basic.lines(proof)) == 8


def test_a_backlog_of_countdown_tasks_is_taken_without_waiting_on_the_loop_timer(workers, broker, queue):
    # Each held task widens the window by one; on RabbitMQ the messages a wider window lets
    # through can come with the broker's answer, where the loop does not see them: taken a few
    # per turn of its timer (two seconds), 400 took minutes.
    worker, name = _start(workers, broker, queue)
    for n in range(400):
        basic.add.apply_async((n, n), countdown=60, queue=queue)
    wait_for(lambda: _ask(name, "stats")["prefetch_count"] == 401,  # type: ignore[index]
             timeout=15, interval=0.2, message="the 400 tasks held")
    assert len(_ask(name, "scheduled")) == 400  # type: ignore[arg-type]
    assert _ready(broker, queue) == 0
    worker.stop()

"""A warm shutdown gives back at once: the messages a worker holds and has not started (queued in
its pool, waiting for their countdown or their rate limit) go back to the broker as the shutdown
begins, while its running tasks finish; a SIGKILL after that leaves only the running ones to the
broker. Real workers on a redis-server of the test's own and on the shared RabbitMQ."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import kombu
import pytest
import redis
from apps import basic
from conftest import AMQP_TEST_URL, delete_queue, require_server
from faults import RedisServer
from workers import TESTS, WorkerProcess, wait_for

#: kombu's own paths only (every fast path off)
STOCK = os.environ.get("WORKER_STOCK_KOMBU", "") not in ("", "0")
#: how long each of the two running tasks takes
LONG = 4.0
QUICK, LIMITED, COUNTDOWN = 70, 10, 20
#: what the worker holds without starting it
NOT_STARTED = QUICK + LIMITED + COUNTDOWN
#: Redis gives a message of a dead worker back after this long (looked for every half second)
VISIBILITY = 8


class Broker(Protocol):
    """The broker a test's workers use, with one queue of the test's own, seen from outside."""

    url: str
    queue: str
    #: the workers' environment for it
    env: dict[str, str]

    def waiting(self) -> int:
        """Messages in the queue, ready to be delivered."""

    def taken(self) -> int | None:
        """Messages of the queue delivered and not acknowledged (None: the broker does not tell)."""

    def consumers(self) -> int | None:
        """Consumers of the queue (None: the broker does not tell)."""


class RedisBroker:
    def __init__(self, server: RedisServer, queue: str) -> None:
        self.url, self.queue = server.url, queue
        options = {"visibility_timeout": VISIBILITY, "unacked_restore_interval": 0.5,
                   "unacked_restore_throttle": 1}
        self.env = {"WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps(options)}
        self.client = redis.Redis.from_url(server.url)

    def waiting(self) -> int:
        return int(self.client.llen(self.queue))

    def taken(self) -> int:
        # kombu's unacked records: [envelope, exchange, routing key] (a control reply may be
        # among them: only those of the test's queue count)
        records = (json.loads(record) for record in self.client.hvals("unacked"))
        return sum(1 for record in records if record[2] == self.queue)

    def consumers(self) -> None:
        return None


class RabbitBroker:
    def __init__(self, queue: str) -> None:
        self.url, self.queue, self.env = AMQP_TEST_URL, queue, {}
        self.connection = kombu.Connection(AMQP_TEST_URL)

    def _declared(self) -> tuple[int, int]:
        # passive: only asks, and fails if the queue is not there
        ok = self.connection.default_channel.queue_declare(self.queue, passive=True)
        return ok.message_count, ok.consumer_count

    def waiting(self) -> int:
        return self._declared()[0]

    def taken(self) -> None:
        return None

    def consumers(self) -> int:
        return self._declared()[1]


class EmbeddedBroker:
    def __init__(self, path: Path, queue: str) -> None:
        self.path, self.queue = path, queue
        self.url = f"embedded://{path}"
        # a dead worker's reservations go back at its next check (every second)
        self.env = {"WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps({"visibility_timeout": VISIBILITY})}

    def _count(self, state: str) -> int:
        # the queue file's rows: ready while their tag is NULL, reserved by a consumer otherwise
        if not self.path.exists():
            return 0
        with sqlite3.connect(self.path, timeout=10) as db:
            [(count,)] = db.execute(f"SELECT COUNT(*) FROM messages WHERE queue = ? AND tag IS {state}",
                                    (self.queue,)).fetchall()
        return int(count)

    def waiting(self) -> int:
        return self._count("NULL")

    def taken(self) -> int:
        return self._count("NOT NULL")

    def consumers(self) -> None:
        return None


@pytest.fixture(params=["redis", "rabbitmq", "embedded"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    queue = f"warm-{uuid.uuid4().hex[:8]}"
    if request.param == "embedded":
        yield EmbeddedBroker(tmp_path / "queue.db", queue)
        return
    if request.param == "redis":
        server = RedisServer(tmp_path).start()
        redis_broker = RedisBroker(server, queue)
        yield redis_broker
        redis_broker.client.close()
        server.stop()
        return
    require_server(5672, "RabbitMQ")
    rabbit = RabbitBroker(queue)
    yield rabbit
    rabbit.connection.release()
    delete_queue(AMQP_TEST_URL, queue)


@pytest.fixture
def client(broker: Broker) -> Iterator[object]:
    basic.app.conf.update(broker_url=broker.url, result_backend=None)
    yield basic.app
    basic.app.close()


def start_worker(workers, broker: Broker, pool: str, *args: str) -> WorkerProcess:
    return workers.start("-c", "2", "-Q", broker.queue, *args, pool=pool, broker=broker.url,
                         env={"PYTHONPATH": str(TESTS), **broker.env})


def hold_a_hundred(worker: WorkerProcess, broker: Broker, tmp_path: Path,
                   seconds: float = LONG) -> tuple[Path, Path]:
    """Two long tasks running, and behind them a hundred the worker holds without starting them:
    queued for the pool, waiting for a rate limit, waiting for their countdown. Returns the files
    the long and the other tasks write to."""
    running, others = tmp_path / "running.txt", tmp_path / "others.txt"
    for n in range(2):
        basic.record_start_and_end.apply_async((str(running), n, seconds), queue=broker.queue)
    wait_for(lambda: len(basic.lines(running)) == 2, timeout=20, message="both long tasks to start")
    for n in range(QUICK):
        basic.record.apply_async((str(others), n), queue=broker.queue)
    for n in range(LIMITED):
        basic.record_limited.apply_async((str(others), f"limited-{n}"), queue=broker.queue)
    for n in range(COUNTDOWN):
        basic.record.apply_async((str(others), f"countdown-{n}"), countdown=120, queue=broker.queue)
    wait_for(lambda: worker.log().count(" received") == 2 + NOT_STARTED, timeout=20,
             message="the worker to receive every task")
    assert broker.waiting() == 0
    assert broker.taken() in (None, 2 + NOT_STARTED)
    assert basic.lines(others) == []
    return running, others


def given_back(broker: Broker) -> bool:
    return broker.waiting() == NOT_STARTED and broker.taken() in (None, 2)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_warm_shutdown_gives_back_what_has_not_started_at_once_while_running_tasks_finish(
        broker, workers, client, tmp_path, pool):
    worker = start_worker(workers, broker, pool, "--prefetch-multiplier", "50")
    running, others = hold_a_hundred(worker, broker, tmp_path)
    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    wait_for(lambda: given_back(broker), timeout=1.0, interval=0.01,
             message=f"the {NOT_STARTED} tasks not started to be back in the queue")
    assert time.monotonic() - began < 1.0
    assert broker.consumers() in (None, 0)  # nothing more is delivered to this worker
    assert worker.process.poll() is None
    assert sorted(basic.lines(running)) == ["start-0", "start-1"]  # still running
    assert worker.process.wait(timeout=LONG + 20) == 0
    assert sorted(basic.lines(running)) == ["end-0", "end-1", "start-0", "start-1"]
    assert broker.waiting() == NOT_STARTED  # not taken again by the stopping worker
    assert broker.taken() in (None, 0)
    assert basic.lines(others) == []
    log = worker.log()
    assert f"waiting for 2 running task(s); {NOT_STARTED} not started went back to the broker" in log
    # none was delivered after the consumer went, to be put back once more (kombu's and
    # py-amqp's warnings); with the fast paths off, kombu's BRPOP in flight may take one
    bounced = log.count("Requeuing undeliverable message")
    assert bounced <= (1 if STOCK and isinstance(broker, RedisBroker) else 0)
    assert "no callbacks" not in log


def test_a_shutdown_asked_with_workerctl_gives_back_at_once_too(broker, workers, client, tmp_path):
    name = f"warm-{uuid.uuid4().hex[:8]}@localhost"
    worker = start_worker(workers, broker, "threads", "--prefetch-multiplier", "50", "-n", name)
    running, _ = hold_a_hundred(worker, broker, tmp_path, seconds=30)
    done = subprocess.run([sys.executable, "-m", "worker_core", "control", "shutdown", "-d", name,
                           "-b", broker.url, "-t", "10"],
                          capture_output=True, text=True, timeout=30, cwd=TESTS)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: given_back(broker), timeout=1.0, interval=0.01,
             message=f"the {NOT_STARTED} tasks not started to be back in the queue")
    assert "Got shutdown from remote" in worker.log()
    assert worker.process.poll() is None
    assert sorted(basic.lines(running)) == ["start-0", "start-1"]  # still running


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_after_sigterm_then_sigkill_another_worker_runs_what_had_not_started_at_once(
        broker, workers, client, tmp_path, pool):
    first = start_worker(workers, broker, pool, "--prefetch-multiplier", "50")
    running, others = hold_a_hundred(worker=first, broker=broker, tmp_path=tmp_path)
    first.signal(signal.SIGTERM)
    # a grace period shorter than the running tasks, then the kill (Kubernetes' SIGKILL)
    time.sleep(2.0)  # the grace period under test
    first.crash()
    assert sorted(basic.lines(running)) == ["start-0", "start-1"]
    assert broker.waiting() >= NOT_STARTED  # RabbitMQ adds the two running ones as it sees the kill
    assert broker.taken() in (None, 2)  # on Redis, only the running ones wait for the timeout
    second = start_worker(workers, broker, pool)
    ready = time.monotonic()
    wait_for(lambda: len(basic.lines(others)) == QUICK + LIMITED, timeout=10,
             message="the second worker to run every task the first had not started")
    wait_for(lambda: second.log().count(" received") >= NOT_STARTED, timeout=5,
             message="the second worker to hold the countdown tasks too")
    assert time.monotonic() - ready < VISIBILITY
    assert sorted(basic.lines(others)) == sorted(
        [str(n) for n in range(QUICK)] + [f"limited-{n}" for n in range(LIMITED)])  # once each
    # the running ones come back as the broker allows: at once on RabbitMQ, after the
    # visibility timeout on Redis; then they run to the end
    wait_for(lambda: basic.lines(running).count("end-0") + basic.lines(running).count("end-1") == 2,
             timeout=VISIBILITY + LONG + 15, message="the two interrupted tasks to run again")
    assert sorted(basic.lines(running)) == ["end-0", "end-1", "start-0", "start-0", "start-1", "start-1"]

"""The poison cap in every pool: a task that takes its whole worker down (a segfault under
``-P threads`` or ``-P solo``) comes back after each restart only ``worker_redelivery_limit``
times, then fails with the reason and goes to the dead-letter queue, and the worker stays up.

Each test is its own supervisor: it starts a worker, sees it die of the task (exit -11), and
starts it again, on a Redis server of its own, the embedded transport, PostgreSQL (its counters
table), and RabbitMQ (a quorum queue counts on the broker; a classic one in the Redis result
backend)."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AMQP_TEST_URL, delete_queue, redis_db, require_server
from faults import RedisServer
from workers import TESTS, WorkerProcess, wait_for

from worker_core import App
from worker_core.app import deadletters
from worker_core.app.broker import connection_for
from worker_core.canvas import signature
from worker_core.exceptions import WorkerLostError

LIMIT = 2
AMQP = AMQP_TEST_URL


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def _env(queue: str, **extra: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(TESTS),
        "WORKER_WORKER_REDELIVERY_LIMIT": str(LIMIT),
        "WORKER_WORKER_DEAD_LETTER_QUEUE": f"{queue}.dead",
        **extra,
    }


def _run_until_capped(start) -> tuple[WorkerProcess, list[int]]:
    """Start the worker again each time it dies, as a supervisor would; return the worker that
    stayed up and the exit codes of those that died."""
    exits: list[int] = []
    for _ in range(LIMIT + 2):
        worker = start()
        wait_for(lambda worker=worker: worker.process.poll() is not None or "poison message" in worker.log(),
                 timeout=20, message="the worker to die of the task or to refuse it")
        if worker.process.poll() is None:
            return worker, exits
        exits.append(worker.process.returncode)
    raise AssertionError(f"the worker died {len(exits)} times: {exits}")


def _check_capped(workers, broker: str, backend: str | None, pool: str, tmp_path: Path, env: dict[str, str],
                  queue: str, counted_by: str, **client_settings) -> None:
    client = App("poison-client", broker_url=broker, result_backend=backend, **client_settings)
    counter, errbacks = tmp_path / "runs", tmp_path / "errbacks"
    errback = signature("apps.basic.note_failure", (str(errbacks),), options={"queue": queue}, app=client)
    poisoned = client.send_task("apps.basic.segfault", (str(counter),), queue=queue, link_error=errback)
    # received with it (the prefetch window holds 4) and lost with the worker each time it dies
    good = [client.send_task("apps.basic.add", (1, n), queue=queue) for n in range(3)]

    worker, exits = _run_until_capped(
        lambda: workers.start("-Q", queue, "-c", "1", pool=pool, broker=broker, backend=backend, env=env,
                              ready=False))

    assert exits == [-signal.SIGSEGV] * (LIMIT + 1)
    assert counter.read_text() == "x" * (LIMIT + 1)  # the first run and LIMIT more
    with pytest.raises(WorkerLostError, match=r"taken for a poison message, not run again "
                                              r"\(worker_redelivery_limit=2\)"):
        poisoned.get(timeout=10)
    # the errback creates the file, then writes its line
    wait_for(lambda: errbacks.exists() and errbacks.read_text().endswith("\n"), timeout=10,
             message="the errback to run")
    assert errbacks.read_text().split() == [poisoned.id]  # what follows a failure, followed
    assert [result.get(timeout=20) for result in good] == [1, 2, 3]
    worker.wait_log(f"to the dead-letter queue '{queue}.dead'")
    assert worker.stop() == 0
    with connection_for(client.plugins, broker, client.settings) as connection:
        [letter] = deadletters.browse(connection, f"{queue}.dead")
    assert letter.task_id == poisoned.id
    reason = f"WorkerLostError: 3 earlier deliveries ended without an outcome ({counted_by})"
    assert letter.reason.startswith(reason)
    assert letter.reason.endswith("(worker_redelivery_limit=2)")
    client.close()


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_task_that_takes_its_worker_down_on_redis_stops_after_the_limit(
        workers, redis_server, tmp_path, pool):
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    broker = redis_server.url
    backend = f"redis://127.0.0.1:{redis_server.port}/1"
    # a dead worker's messages come back after a second
    options = json.dumps({"visibility_timeout": 1, "unacked_restore_interval": 1})
    env = _env(queue, WORKER_BROKER_TRANSPORT_OPTIONS=options)
    _check_capped(workers, broker, backend, pool, tmp_path, env, queue, "3 counted on the broker")


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_task_that_takes_its_worker_down_on_the_embedded_transport_stops_after_the_limit(
        workers, tmp_path, pool):
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    broker = f"embedded://{tmp_path}/queue.db"
    env = _env(queue)
    _check_capped(workers, broker, None, pool, tmp_path, env, queue, "3 counted on the broker")


def test_a_task_that_takes_its_worker_down_on_postgresql_stops_after_the_limit(workers, tmp_path):
    from postgres import POSTGRES_URL, temporary_schema

    require_server(5432, "PostgreSQL")
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    with temporary_schema(prefix="poison") as schema:
        # a dead worker's leases lapse after a second; the next worker looks five times a second
        broker_options = {"schema": schema, "visibility_timeout": 1, "polling_interval": 0.2}
        backend_options = {"schema": schema}
        env = _env(queue, WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps(broker_options),
                   WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS=json.dumps(backend_options))
        _check_capped(workers, POSTGRES_URL, POSTGRES_URL, "threads", tmp_path, env, queue,
                      "3 counted on the broker", broker_transport_options=broker_options,
                      result_backend_transport_options=backend_options)
        workers.cleanup()  # (before the schema goes)


def test_a_task_that_takes_its_worker_down_on_a_rabbitmq_quorum_queue_stops_after_the_broker_count(
        workers, tmp_path):
    require_server(5672, "RabbitMQ")
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    # the broker counts every return, a message prefetched with it too: receive one at a time
    env = _env(queue, WORKER_TASK_CREATE_MISSING_QUEUE_TYPE="quorum", WORKER_WORKER_PREFETCH_MULTIPLIER="1")
    try:
        _check_capped(workers, AMQP, redis_db(11), "threads", tmp_path, env, queue, "x-delivery-count 3",
                      task_create_missing_queue_type="quorum")
    finally:
        delete_queue(AMQP, queue)
        delete_queue(AMQP, f"{queue}.dead")


def test_a_task_that_takes_its_worker_down_on_a_rabbitmq_classic_queue_is_counted_in_the_result_backend(
        workers, tmp_path):
    require_server(5672, "RabbitMQ")
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    env = _env(queue)
    try:
        _check_capped(workers, AMQP, redis_db(11), "solo", tmp_path, env, queue,
                      "3 counted in the result backend")
    finally:
        delete_queue(AMQP, queue)
        delete_queue(AMQP, f"{queue}.dead")


def test_a_classic_rabbitmq_queue_with_nothing_to_count_on_says_the_cap_does_not_hold_there(workers):
    require_server(5672, "RabbitMQ")
    queue = f"uncapped-{uuid.uuid4().hex[:8]}"
    worker = workers.start("-Q", queue, pool="threads", broker=AMQP, env=_env(queue))
    try:
        assert (f"worker_redelivery_limit=2 cannot hold on queue {queue} for a task that takes its whole "
                f"worker down") in worker.log()
        assert "make it a quorum queue (queue_type='quorum'" in worker.log()
        assert worker.log().count("cannot hold on queue") == 1
        worker.stop()
    finally:
        delete_queue(AMQP, queue)


def test_a_celery_apps_task_that_takes_its_worker_down_fails_through_celerys_backend_and_calls_its_errback(
        workers, redis_server, tmp_path):
    from celery import Celery

    broker, backend = redis_server.url, f"redis://127.0.0.1:{redis_server.port}/1"
    signals = tmp_path / "signals.log"
    env = {"PYTHONPATH": str(TESTS), "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": backend,
           "CELERY_PROJ_SIGNALS": str(signals), "WORKER_WORKER_REDELIVERY_LIMIT": str(LIMIT),
           "WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps({"visibility_timeout": 1,
                                                          "unacked_restore_interval": 1})}
    client = Celery("client", broker=broker, backend=backend)
    client.conf.update(broker_connection_retry_on_startup=True,
                       broker_transport_options={"visibility_timeout": 1})
    tasks = "apps.celery_proj.tasks"
    poisoned = client.send_task(f"{tasks}.segfault", link_error=client.signature(f"{tasks}.on_error_id"))

    worker, exits = _run_until_capped(
        lambda: workers.start("-c", "1", app="apps.celery_proj", pool="threads", env=env, ready=False))

    assert exits == [-signal.SIGSEGV] * (LIMIT + 1)
    with pytest.raises(Exception, match=r"worker_redelivery_limit=2") as failed:
        poisoned.get(timeout=10)
    assert type(failed.value).__name__ == "WorkerLostError"
    wait_for(lambda: f"errback-id {poisoned.id}" in signals.read_text(), timeout=10, message="the errback")
    assert signals.read_text().count(f"errback-id {poisoned.id}") == 1  # Celery's backend called it, once
    assert [line.split()[1] for line in signals.read_text().splitlines()].count("segfault") == LIMIT + 1
    assert client.send_task(f"{tasks}.add", (2, 3)).get(timeout=10) == 5
    assert worker.stop() == 0
    client.close()

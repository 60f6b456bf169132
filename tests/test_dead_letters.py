"""Messages the worker would discard land in the dead-letter queue with the reason, the worker and
the time (Redis: a list; RabbitMQ: through an exchange; PostgreSQL: rows of the queue table), and
workerctl dead-letters finds them, requeues them and purges them; quorum queues' countdowns wait
on RabbitMQ; the broker's delivery count feeds the poison cap."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import kombu
import pytest
from apps import basic
from conftest import AMQP_TEST_URL, delete_queue, redis_db
from workers import TESTS, ask, wait_for

from worker_core import App
from worker_core.app import deadletters
from worker_core.app.broker import connection_for
from worker_core.exceptions import ResultTimeout

RESULTS = redis_db(11)


def _workerctl(*args: str, broker: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker_core", *args, "-b", broker],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _client(broker: str, **settings) -> App:
    client = App("dead-client", broker_url=broker, result_backend=RESULTS, **settings)
    client.task(name="apps.basic.add")(basic.add.run)
    return client


@pytest.fixture(params=["redis", "amqp", "embedded", "postgres"])
def broker(request, tmp_path, monkeypatch):
    if request.param == "embedded":
        return f"embedded://{tmp_path}/queue.db"
    if request.param == "redis":
        from conftest import empty_redis

        return empty_redis(redis_db(12))
    from conftest import require_server

    if request.param == "postgres":
        from postgres import POSTGRES_URL, drop_schema, schema_name

        require_server(5432, "PostgreSQL")
        schema = schema_name("dead_letters")
        # (read by the workers, workerctl and the client's App alike)
        monkeypatch.setenv("WORKER_BROKER_TRANSPORT_OPTIONS", json.dumps({"schema": schema}))
        request.addfinalizer(lambda: drop_schema(POSTGRES_URL, schema))
        return POSTGRES_URL

    require_server(5672, "RabbitMQ")
    return AMQP_TEST_URL


@pytest.fixture
def amqp_url_or_none():
    from conftest import require_server

    require_server(5672, "RabbitMQ")
    return AMQP_TEST_URL


def test_an_unknown_task_lands_in_the_dead_letter_queue_and_workerctl_lists_requeues_and_purges_it(
    workers, broker
):
    queue = f"dl-{uuid.uuid4().hex[:8]}"
    dead = f"{queue}.dead"
    env = {"PYTHONPATH": str(TESTS), "WORKER_WORKER_DEAD_LETTER_QUEUE": dead}
    worker = workers.start("-Q", queue, broker=broker, backend=RESULTS, env=env)
    name = worker.name
    client = _client(broker, worker_dead_letter_queue=dead)
    lost = client.send_task("proj.no_such_task", (1,), queue=queue)
    worker.wait_log(f"to the dead-letter queue {dead!r}")
    assert f"Sent 'proj.no_such_task'['{lost.id}'] from queue {queue!r}" in worker.log()
    with pytest.raises(Exception, match=r"proj\.no_such_task"):
        lost.get(timeout=10)  # its result failed with the reason, as before

    listed = _workerctl("dead-letters", "list", "--json", "-q", dead, broker=broker)
    assert listed.returncode == 0, listed.stderr
    [letter] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert letter["id"] == lost.id and letter["task"] == "proj.no_such_task"
    assert letter["reason"].startswith(
        "unknown task 'proj.no_such_task': this worker has no task of that name"
    )
    assert letter["worker"] == name and letter["routing_key"] == queue and letter["time"]
    shown = _workerctl("dead-letters", "show", lost.id, "-q", dead, broker=broker)
    assert json.loads(shown.stdout)["body"] == [
        [1],
        {},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
    # listing leaves it there
    assert (
        len(_workerctl("dead-letters", "list", "--json", "-q", dead, broker=broker).stdout.splitlines()) == 1
    )

    worker.stop()
    requeued = _workerctl("dead-letters", "requeue", lost.id, "-q", dead, broker=broker)
    assert requeued.returncode == 0, requeued.stderr
    assert "1 requeued." in requeued.stdout
    with connection_for(client.plugins, broker, client.settings) as connection:
        message = connection.SimpleQueue(queue).get(timeout=10)
        assert message.headers["id"] == lost.id and deadletters.REASON not in message.headers
        message.ack()
    assert _workerctl("dead-letters", "list", "--json", "-q", dead, broker=broker).stdout == ""

    # a refused message again, then purged
    client.send_task("proj.no_such_task", (2,), queue=queue)
    worker = workers.start("-Q", queue, broker=broker, backend=RESULTS, env=env)
    worker.wait_log("to the dead-letter queue")
    worker.stop()
    purged = _workerctl("dead-letters", "purge", "--all", "-q", dead, broker=broker)
    assert "1 deleted" in purged.stdout, purged.stderr
    assert _workerctl("dead-letters", "list", "--json", "-q", dead, broker=broker).stdout == ""
    delete_queue(broker, queue)
    delete_queue(broker, dead)


def test_without_a_dead_letter_queue_a_refused_message_is_discarded_as_in_celery(workers, redis_url):
    queue = f"dl-{uuid.uuid4().hex[:8]}"
    worker = workers.start(
        "-Q",
        queue,
        broker=redis_url,
        backend=RESULTS,
        env={"PYTHONPATH": str(TESTS), "WORKER_WORKER_DEAD_LETTER_QUEUE": ""},
    )
    _client(redis_url).send_task("proj.no_such_task", queue=queue)
    worker.wait_log("Rejected message 'proj.no_such_task'")
    assert "dead-letter" not in worker.log()


def test_a_celery_clients_countdown_on_a_quorum_queue_waits_on_rabbitmq_not_in_the_worker(
    workers, amqp_url_or_none
):
    from celery import Celery
    from kombu import Exchange, Queue

    amqp_url = amqp_url_or_none
    queue, exchange = f"delay-{uuid.uuid4().hex[:8]}", f"delay-ex-{uuid.uuid4().hex[:8]}"
    queues = [
        {
            "name": queue,
            "exchange": exchange,
            "exchange_type": "topic",
            "routing_key": "job.#",
            "queue_type": "quorum",
        }
    ]
    worker = workers.start(
        "-Q",
        queue,
        broker=amqp_url,
        backend=RESULTS,
        env={"PYTHONPATH": str(TESTS), "WORKER_TASK_QUEUES": json.dumps(queues)},
    )
    name = worker.name
    celery = Celery("client", broker=amqp_url, backend=RESULTS)
    celery.conf.task_queues = [
        Queue(queue, Exchange(exchange, "topic"), "job.#", queue_arguments={"x-queue-type": "quorum"})
    ]
    try:
        sent = time.monotonic()
        result = celery.send_task("apps.basic.add", (20, 22), queue=queue, countdown=3)
        client = _client(amqp_url)
        time.sleep(0.5)  # a negative: time for a wrongly routed message to reach the worker
        assert ask(client, "scheduled", worker=name) == []  # held by RabbitMQ, not by the worker
        assert result.get(timeout=30) == 42
        assert time.monotonic() - sent >= 2.5
        # this project's client holds it on RabbitMQ the same way
        ours = _client(amqp_url, task_queues=queues)
        later = ours.send_task("apps.basic.add", (1, 1), queue=queue, countdown=2)
        with pytest.raises(ResultTimeout):
            later.get(timeout=1)
        assert later.get(timeout=30) == 2
    finally:
        celery.close()
    worker.stop()
    delete_queue(amqp_url, queue)
    delete_queue(amqp_url, exchange)


def test_a_quorum_message_delivered_more_often_than_the_limit_goes_to_the_dead_letter_queue(
    workers, amqp_url_or_none
):
    amqp_url = amqp_url_or_none
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    dead = f"{queue}.dead"
    client = _client(amqp_url, task_default_queue_type="quorum", task_create_missing_queue_type="quorum")
    result = client.send_task("apps.basic.add", (1, 2), queue=queue)
    with kombu.Connection(amqp_url) as connection:
        channel = connection.channel()
        for _ in range(3):  # three deliveries that ended without an outcome, as a dying worker's would
            message = wait_for(lambda: kombu.Queue(queue, channel=channel).get(no_ack=False),
                               message=f"a delivery from {queue}")
            message.reject(requeue=True)
    worker = workers.start(
        "-Q",
        queue,
        broker=amqp_url,
        backend=RESULTS,
        env={
            "PYTHONPATH": str(TESTS),
            "WORKER_WORKER_REDELIVERY_LIMIT": "2",
            "WORKER_WORKER_DEAD_LETTER_QUEUE": dead,
            "WORKER_TASK_CREATE_MISSING_QUEUE_TYPE": "quorum",
        },
    )
    worker.wait_log(f"to the dead-letter queue {dead!r}")
    assert ("3 earlier deliveries ended without an outcome (x-delivery-count 3), its worker or process dying "
            "each time: taken for a poison message" in worker.log())
    with pytest.raises(Exception, match="poison message"):
        result.get(timeout=10)
    worker.stop()
    delete_queue(amqp_url, queue)
    delete_queue(amqp_url, dead)


def test_a_retry_with_a_countdown_on_a_quorum_topic_queue_waits_on_rabbitmq_and_comes_back(
    workers, amqp_url_or_none
):
    amqp_url = amqp_url_or_none
    queue, exchange = f"again-{uuid.uuid4().hex[:8]}", f"again-ex-{uuid.uuid4().hex[:8]}"
    queues = [{"name": queue, "exchange": exchange, "exchange_type": "topic", "routing_key": "job.#",
               "queue_type": "quorum"}]
    env = {"PYTHONPATH": str(TESTS), "WORKER_TASK_QUEUES": json.dumps(queues)}
    worker = workers.start("-Q", queue, app="apps.routed", broker=amqp_url, backend=RESULTS, env=env)
    client = App("again-client", broker_url=amqp_url, result_backend=RESULTS, task_queues=queues)
    result = client.send_task("routed.again", queue=queue)
    retries, came_by, key = result.get(timeout=30)
    # each retry went through the delay levels, the second from a message that came out of them:
    # it comes out of the delivery exchange, its routing key carrying the delay's bits before
    # the queue's own (once)
    assert retries == 2 and came_by == "celery_delayed_delivery"
    assert key.endswith(".job.#") and set(key.split(".")[:28]) <= {"0", "1"} and len(key.split(".")) == 30
    assert "Countdowns" not in worker.log()
    worker.stop()
    delete_queue(amqp_url, queue)
    delete_queue(amqp_url, exchange)

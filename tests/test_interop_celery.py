"""Two-way interop with the real Celery (a test dependency only), over Redis and RabbitMQ:
a Celery client feeds ``workerctl worker``, and this project's client feeds ``celery worker``."""

from __future__ import annotations

import time
import uuid

import pytest
from apps import basic
from conftest import REDIS_TEST_URL, delete_queue
from workers import wait_for


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    request.getfixturevalue("redis_url")  # results live in Redis either way
    return request.getfixturevalue("amqp_url")


@pytest.fixture
def queue(broker: str, workers):
    """A queue of the test's own, deleted once the test's workers are gone."""
    name = f"interop-{uuid.uuid4().hex[:8]}"
    yield name
    workers.cleanup()
    delete_queue(broker, name)


@pytest.fixture
def celery_client(broker: str):
    from celery import Celery

    app = Celery("interop-client", broker=broker, backend=REDIS_TEST_URL)
    app.conf.update(broker_connection_retry_on_startup=True)
    yield app
    app.close()


@pytest.fixture
def our_client(broker: str):
    basic.app.conf.update(broker_url=broker, result_backend=REDIS_TEST_URL)
    yield basic.app
    basic.app.close()


def answering(client, name: str) -> None:
    """Wait until the worker ``name`` answers a Celery client's ping. On Redis remote control is
    pub/sub: a broadcast sent between a worker's "ready." and its first poll, which subscribes
    it, reaches nobody (a Celery worker's as well as ours)."""
    wait_for(lambda: client.control.ping(destination=[name], timeout=0.5), timeout=20,
             message=f"{name} to answer a ping")


def test_a_celery_client_feeds_our_worker_and_reads_values_and_exceptions(
        workers, broker, queue, celery_client):
    from celery.exceptions import TaskRevokedError

    workers.start("-Q", queue, broker=broker, backend=REDIS_TEST_URL)
    assert celery_client.send_task("apps.basic.add", (2, 3), queue=queue).get(timeout=20) == 5
    with pytest.raises(basic.Boom, match="from celery"):
        celery_client.send_task("apps.basic.boom", ("from celery",), queue=queue).get(timeout=20)
    sent = time.monotonic()
    assert celery_client.send_task("apps.basic.add", (1, 1), queue=queue, countdown=1).get(timeout=20) == 2
    assert time.monotonic() - sent >= 1
    assert celery_client.send_task("apps.basic.flaky", (2,), queue=queue).get(timeout=20) == 2
    expired = celery_client.send_task("apps.basic.add", (1, 1), queue=queue, countdown=1.5, expires=0.5)
    with pytest.raises(TaskRevokedError):
        expired.get(timeout=20)


def test_our_client_feeds_a_celery_worker_and_reads_values_and_exceptions(workers, broker, queue, our_client):
    from worker_core.exceptions import TaskRevokedError

    workers.start_celery("-Q", queue, broker=broker, backend=REDIS_TEST_URL)
    assert basic.add.apply_async((2, 3), queue=queue).get(timeout=20) == 5
    with pytest.raises(basic.Boom, match="from us"):
        basic.boom.apply_async(("from us",), queue=queue).get(timeout=20)
    sent = time.monotonic()
    assert basic.add.apply_async((1, 1), queue=queue, countdown=1).get(timeout=20) == 2
    assert time.monotonic() - sent >= 1
    assert basic.flaky.apply_async((2,), queue=queue).get(timeout=20) == 2
    expired = basic.add.apply_async((1, 1), queue=queue, countdown=1.5, expires=0.5)
    with pytest.raises(TaskRevokedError):
        expired.get(timeout=20)


def test_a_celery_clients_get_wakes_on_our_result_without_polling(workers, broker, queue, celery_client):
    workers.start("-Q", queue, broker=broker, backend=REDIS_TEST_URL)
    celery_client.send_task("apps.basic.add", (0, 0), queue=queue).get(timeout=20)  # warm up
    started = time.monotonic()
    for n in range(20):
        assert celery_client.send_task("apps.basic.add", (n, n), queue=queue).get(timeout=20) == 2 * n
    # 20 round trips; a polling client (interval 0.5 s) would need seconds
    assert time.monotonic() - started < 2


def test_with_result_extended_a_celery_client_reads_the_tasks_name_args_and_worker(
        workers, broker, queue, celery_client):
    hostname = f"extended-{uuid.uuid4().hex[:8]}@localhost"
    workers.start("-Q", queue, "-c", "1", "-n", hostname, pool="prefork", broker=broker,
                  backend=REDIS_TEST_URL, env={"WORKER_RESULT_EXTENDED": "true"})
    celery_client.conf.result_extended = True
    result = celery_client.send_task("apps.basic.add", (2, 3), kwargs={}, queue=queue)
    assert result.get(timeout=20) == 5
    assert (result.name, result.args, result.kwargs, result.retries, result.queue) == (
        "apps.basic.add", [2, 3], {}, 0, queue)
    assert result.worker == hostname
    failed = celery_client.send_task("apps.basic.boom", ("extended",), queue=queue)
    with pytest.raises(basic.Boom):
        failed.get(timeout=20)
    assert (failed.name, failed.args) == ("apps.basic.boom", ["extended"])


def test_celery_inspect_reaches_our_worker_and_our_inspect_reaches_celerys(
        workers, broker, queue, celery_client):
    from worker_core import App
    from worker_core.control.client import broadcast

    ours = workers.start("-Q", queue, "-n", f"ours-{queue}@localhost", broker=broker, backend=REDIS_TEST_URL)
    theirs = workers.start_celery("-Q", queue, broker=broker, backend=REDIS_TEST_URL)
    ours_name = f"ours-{queue}@localhost"
    answering(celery_client, ours_name)
    answering(celery_client, theirs.name)
    replies = celery_client.control.inspect(timeout=3, destination=[ours_name]).ping()
    assert replies == {ours_name: {"ok": "pong"}}
    registered = celery_client.control.inspect(timeout=3, destination=[ours_name]).registered()
    assert registered is not None, ours.log()[-3000:]
    assert "apps.basic.add" in registered[ours_name]
    conf = celery_client.control.inspect(timeout=3, destination=[ours_name]).conf()
    assert conf[ours_name]["broker_url"] == broker.replace(":guest@", ":**@")
    client = App(broker=broker)
    try:
        names = {name for reply in broadcast(client, "ping", timeout=3) for name in reply}
    finally:
        client.close()
    assert ours_name in names
    assert any(name.startswith("celery-") for name in names)
    assert ours.process.poll() is None and theirs.process.poll() is None
    # answering (which declares the reply exchange on the live connection) left the worker whole
    assert "Connection to broker lost" not in ours.log()
    workers.cleanup()  # stop the Celery worker so our worker takes the next task
    ours = workers.start("-Q", queue, broker=broker, backend=REDIS_TEST_URL)
    celery_client.control.inspect(timeout=3).registered()
    assert celery_client.send_task("apps.basic.add", (20, 1), queue=queue).get(timeout=20) == 21


def test_a_celery_clients_revoke_reaches_our_worker(workers, broker, queue, celery_client, tmp_path):
    from celery.exceptions import TaskRevokedError

    name = f"ours-{queue}@localhost"
    ours = workers.start("-Q", queue, "-n", name, broker=broker, backend=REDIS_TEST_URL)
    proof = tmp_path / "ran"
    first = celery_client.send_task("apps.basic.record", (str(proof), "x"), queue=queue, countdown=30)
    second = celery_client.send_task("apps.basic.record", (str(proof), "y"), queue=queue, countdown=30)
    for result in (first, second):
        ours.wait_log(f"[{result.id}] received")
    first.revoke()  # as users do: no reply asked for
    replies = celery_client.control.revoke(second.id, destination=[name], reply=True, timeout=3)
    assert replies == [{name: {"ok": f"tasks { {second.id} } flagged as revoked"}}]
    for result in (first, second):
        with pytest.raises(TaskRevokedError):
            result.get(timeout=10)
        ours.wait_log(f"Discarding revoked task: apps.basic.record[{result.id}] (revoked)")
    assert celery_client.send_task("apps.basic.add", (1, 2), queue=queue).get(timeout=20) == 3
    assert not proof.exists()


def test_our_revoke_reaches_a_celery_worker(workers, broker, queue, our_client, tmp_path):
    from worker_core.exceptions import TaskRevokedError

    theirs = workers.start_celery("-Q", queue, broker=broker, backend=REDIS_TEST_URL)
    result = basic.record.apply_async((str(tmp_path / "ran"), "x"), queue=queue, countdown=30)
    theirs.wait_log(result.id)
    result.revoke()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=10)
    theirs.wait_log(f"Tasks flagged as revoked: {result.id}")
    assert basic.add.apply_async((2, 2), queue=queue).get(timeout=20) == 4


def test_a_celery_clients_rate_limit_and_time_limit_reach_our_worker(workers, broker, queue, celery_client):
    name = f"ours-{queue}@localhost"
    ours = workers.start("-Q", queue, "-n", name, broker=broker, backend=REDIS_TEST_URL)
    answering(celery_client, name)
    replies = celery_client.control.rate_limit("apps.basic.add", "2/s", destination=[name], reply=True,
                                               timeout=3)
    assert replies == [{name: {"ok": "new rate limit set successfully"}}]
    sent = time.monotonic()
    results = [celery_client.send_task("apps.basic.add", (n, n), queue=queue) for n in range(3)]
    assert [result.get(timeout=20) for result in results] == [0, 2, 4]
    assert time.monotonic() - sent >= 0.9  # two a second, the first at once
    ours.wait_log("New rate limit for tasks of type apps.basic.add: 2/s.")
    replies = celery_client.control.time_limit("apps.basic.add", soft=10, hard=20, destination=[name],
                                               reply=True, timeout=3)
    assert replies == [{name: {"ok": "time limits set successfully"}}]
    ours.wait_log("New time limits for tasks of type apps.basic.add: soft=10 hard=20")


def test_celerys_event_receiver_follows_our_worker_and_its_tasks(workers, broker, queue, celery_client):
    """What Flower and ``celery events`` do: a Celery receiver builds its state from our events."""
    import threading

    from celery.events.state import State

    state, seen = State(), []
    stop = threading.Event()

    def on_event(event):
        seen.append(event)
        state.event(event)

    def capture():
        with celery_client.connection_for_read() as connection:
            receiver = celery_client.events.Receiver(connection, handlers={"*": on_event})
            receiver.should_stop = False
            threading.Thread(target=lambda: (stop.wait(), setattr(receiver, "should_stop", True)),
                             daemon=True).start()
            receiver.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    try:
        with celery_client.events.default_dispatcher() as dispatcher:  # sent until one is heard

            def probe_heard() -> bool:
                dispatcher.send("test-probe")  # no event Celery's state knows of
                return any(event["type"] == "test-probe" for event in list(seen))

            wait_for(probe_heard, interval=0.1, message="the receiver to hear an event (its queue bound)")
        name = f"ours-{queue}@localhost"
        ours = workers.start("-Q", queue, "-n", name, "-E", "--heartbeat-interval", "0.5", broker=broker,
                             backend=REDIS_TEST_URL)
        added = celery_client.send_task("apps.basic.add", (2, 3), queue=queue)
        failed = celery_client.send_task("apps.basic.boom", ("from celery",), queue=queue)
        assert added.get(timeout=20) == 5
        with pytest.raises(basic.Boom):
            failed.get(timeout=20)

        def kinds() -> set[tuple[str, str | None]]:
            return {(event["type"], event.get("uuid")) for event in list(seen)}

        wanted = {("worker-online", None), ("worker-heartbeat", None), ("task-received", added.id),
                  ("task-started", added.id), ("task-succeeded", added.id), ("task-failed", failed.id)}
        wait_for(lambda: wanted <= kinds(), interval=0.05,
                 message=lambda: f"the events {sorted(wanted - kinds())} (heard: {sorted(kinds())})")
        assert state.workers[name].alive
        task = state.tasks[added.id]
        assert (task.name, task.state, task.args, task.result, task.worker.hostname) == (
            "apps.basic.add", "SUCCESS", "(2, 3)", "5", name)
        assert task.runtime >= 0
        boom = state.tasks[failed.id]
        assert boom.state == "FAILURE" and boom.exception == "Boom('from celery')"
        assert "Boom" in boom.traceback
        ours.stop()
        wait_for(lambda: ("worker-offline", None) in kinds(), interval=0.05, message="worker-offline")
        assert not state.workers[name].alive
    finally:
        stop.set()
        thread.join(timeout=10)


def test_a_celery_clients_add_consumer_and_cancel_consumer_reach_our_worker(workers, broker, queue,
                                                                            celery_client):
    name = f"ours-{queue}@localhost"
    other = f"{queue}-more"
    workers.start("-Q", queue, "-n", name, broker=broker, backend=REDIS_TEST_URL)
    answering(celery_client, name)
    try:
        replies = celery_client.control.add_consumer(other, destination=[name], reply=True, timeout=3)
        assert replies == [{name: {"ok": f"add consumer {other}"}}]
        assert celery_client.send_task("apps.basic.add", (4, 4), queue=other).get(timeout=20) == 8
        active = celery_client.control.inspect(timeout=3, destination=[name]).active_queues()
        assert [q["name"] for q in active[name]] == [queue, other]
        replies = celery_client.control.cancel_consumer(other, destination=[name], reply=True, timeout=3)
        assert replies == [{name: {"ok": f"no longer consuming from {other}"}}]
    finally:
        workers.cleanup()
        delete_queue(broker, other)

"""A real ``workerctl worker`` process on the embedded transport, driven from the test."""

from __future__ import annotations

import os
import signal
import time

import kombu
import pytest
from apps import basic
from workers import TESTS, WorkerProcess, wait_for

from worker_core.exceptions import NotRegistered, ResultTimeout, TaskRevokedError

POOLS = ["solo", "threads", "prefork"]


@pytest.fixture(params=POOLS)
def pool(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def start_worker(workers, embedded_broker: str, pool: str):
    def start(*args: str, ready: bool = True) -> WorkerProcess:
        return workers.start(*args, pool=pool, broker=embedded_broker, ready=ready,
                             env={"PYTHONPATH": str(TESTS)})

    return start


def test_a_task_runs_and_its_result_comes_back(start_worker):
    start_worker()
    assert basic.add.delay(2, 3).get(timeout=20) == 5


def test_tasks_run_with_the_collector_on_and_the_start_up_heap_frozen(start_worker):
    # The CLI keeps the cyclic collector off while the worker starts; it is on again for tasks
    # (prefork children forked during the start included), with the start's objects frozen.
    start_worker()
    seen = basic.collector.delay().get(timeout=20)
    assert seen["enabled"] is True
    assert seen["frozen"] > 1000


def test_a_failure_comes_back_as_the_tasks_own_exception_type(start_worker):
    start_worker()
    result = basic.boom.delay("it broke")
    with pytest.raises(basic.Boom, match="it broke"):
        result.get(timeout=20)
    assert result.state == "FAILURE" and "Boom: it broke" in result.traceback
    with pytest.raises(ValueError, match="plain"):
        basic.fail_value.delay("plain").get(timeout=20)


def _assert_retries_logged(worker: WorkerProcess, count: int) -> None:
    # the main process logs a retry once its executor reports it, which may come after the retried
    # run already stored its outcome
    wait_for(lambda: worker.log().count("retry: Retry in") >= count, message=f"{count} retries logged")
    assert worker.log().count("retry: Retry in") == count


def test_retry_republishes_with_one_more_retry_until_it_succeeds(start_worker):
    worker = start_worker()
    assert basic.flaky.delay(3).get(timeout=20) == 3
    _assert_retries_logged(worker, 3)


def test_a_task_that_keeps_retrying_fails_with_its_exception_after_max_retries(start_worker):
    start_worker()
    with pytest.raises(basic.Boom, match="gave up after 2 retries"):
        basic.always_retry.delay().get(timeout=20)


def test_autoretry_with_backoff_retries_then_fails(start_worker):
    worker = start_worker()
    started = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        basic.divide.delay(1, 0).get(timeout=20)
    # backoff 0.05, 0.1, 0.2 (capped): at least 0.35 s of countdowns
    assert time.monotonic() - started >= 0.3
    _assert_retries_logged(worker, 3)
    assert basic.divide.delay(6, 3).get(timeout=20) == 2


def test_a_countdown_task_waits_without_blocking_the_others(start_worker):
    start_worker()
    sent = time.monotonic()
    later = basic.add.apply_async((1, 1), countdown=1.5)
    assert basic.add.delay(2, 2).get(timeout=20) == 4
    assert time.monotonic() - sent < 1.5  # the countdown task did not hold the other one up
    assert later.get(timeout=20) == 2
    assert time.monotonic() - sent >= 1.5


def test_an_expired_task_is_revoked_not_run(start_worker, tmp_path):
    proof = tmp_path / "ran.txt"
    # The worker first: a message that expired before any worker took it is dropped by the
    # broker (its AMQP expiration), as RabbitMQ drops it, and no worker sees it to revoke it.
    start_worker()
    result = basic.record.apply_async((str(proof), "x"), countdown=2, expires=1)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert result.state == "REVOKED"
    assert not proof.exists()


# solo receives nothing while a task runs inline: the broker drops the expired message itself
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_task_that_expires_while_waiting_for_an_executor_is_revoked_not_run(start_worker, tmp_path):
    # threads: it waits in the pool's shared queue; prefork: in the worker's own queue
    proof = tmp_path / "ran.txt"
    worker = start_worker("-c", "1")
    blocker = basic.sleep.delay(1.5)
    wait_for(lambda: " received" in worker.log(), message="the blocker to arrive")
    result = basic.record.apply_async((str(proof), "x"), expires=0.5)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert blocker.get(timeout=20) == 1.5
    assert result.state == "REVOKED"
    assert not proof.exists()
    assert "(expired)" in worker.log()


def test_an_unknown_task_is_rejected_with_one_line_and_the_worker_goes_on(start_worker):
    worker = start_worker()
    unknown = basic.app.send_task("apps.basic.ad", (1, 2))
    with pytest.raises(NotRegistered):
        unknown.get(timeout=20)
    worker.wait_log("unknown task 'apps.basic.ad'")
    assert "Did you mean 'apps.basic.add'?" in worker.log()
    assert basic.add.delay(1, 2).get(timeout=20) == 3


def _publish_raw(broker: str, body, headers, content_type="application/json") -> None:
    from worker_core.app.broker import connection_for, task_queue

    settings = basic.app.settings
    with connection_for(basic.app.plugins, broker, settings) as connection:
        producer = kombu.Producer(connection)
        producer.publish(body, routing_key="celery", exchange="", headers=headers,
                         content_type=content_type, content_encoding="utf-8",
                         declare=[task_queue("celery", settings)])


def test_malformed_messages_are_rejected_one_line_each_and_good_tasks_still_complete(
        start_worker, embedded_broker):
    worker = start_worker()
    bad = [
        (b"[[1, 2], {}, {}]", {"task": 42, "id": "bad-name"}, "application/json"),
        (b"not json at all", {"task": "apps.basic.add", "id": "bad-body"}, "application/json"),
        (b"[[1, 2], {}, {}]", {"task": "apps.basic.add", "id": "bad-eta", "eta": "soon"}, "application/json"),
        (b"\x80\x04K\x01.", {"task": "apps.basic.add", "id": "pickled"}, "application/x-python-serialize"),
        (b"{\"no\": \"task\"}", {}, "application/json"),
        (b"[[1], {\"x\": 1}, {}]", {"task": "apps.basic.add", "id": "bad-limit", "timelimit": "ten"},
         "application/json"),
    ]
    for body, headers, content_type in bad:
        _publish_raw(embedded_broker, body, headers, content_type)
    assert basic.add.delay(20, 22).get(timeout=20) == 42
    log = worker.log()
    assert log.count("Rejected message") == len(bad)
    assert "header 'task' must be a string (got 42" in log
    assert "body cannot be decoded as application/json" in log
    assert "header 'eta' is not an ISO 8601 date-time" in log
    assert "content type 'application/x-python-serialize' is not accepted" in log
    assert "has no 'task' header and its body is not a version 1 task" in log
    assert "header 'timelimit' must be [hard, soft]" in log
    assert worker.process.poll() is None


def test_queued_messages_survive_until_a_worker_starts(start_worker, tmp_path):
    proof = tmp_path / "ran.txt"
    results = [basic.record.delay(str(proof), n) for n in range(5)]
    worker = start_worker()
    assert [r.get(timeout=20) for r in results] == list(range(5))
    assert sorted(map(int, basic.lines(proof))) == list(range(5))
    assert worker.stop() == 0


def test_warm_shutdown_finishes_running_tasks_and_gives_the_rest_back(start_worker, tmp_path):
    proof = tmp_path / "ran.txt"
    results = [basic.record_start_and_end.delay(str(proof), n, 0.6) for n in range(6)]
    worker = start_worker()
    wait_for(lambda: basic.lines(proof), message="a task to start")  # (a solo worker answers no ask then)
    assert worker.stop(signal.SIGTERM) == 0
    log = worker.log()
    assert "Warm shutdown" in log
    done_before = [line for line in basic.lines(proof) if line.startswith("end-")]
    assert 1 <= len(done_before) < 6
    # the rest were given back: a new worker runs them, and every task ran exactly once
    start_worker()
    assert sorted(r.get(timeout=30) for r in results) == list(range(6))
    assert sorted(basic.lines(proof)) == sorted(f"{mark}-{n}" for n in range(6) for mark in ("start", "end"))


def test_a_second_signal_stops_cold_and_acks_late_tasks_run_again(start_worker, tmp_path):
    proof = tmp_path / "ran.txt"
    result = basic.record_start_and_end.delay(str(proof), "late", 3)
    worker = start_worker()
    wait_for(lambda: basic.lines(proof) == ["start-late"], message="the task to start")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    worker.wait_log("Warm shutdown")
    assert worker.stop(signal.SIGTERM, timeout=10) == 0
    assert time.monotonic() - started < 2.5  # the 3 s task was abandoned
    assert "Cold shutdown" in worker.log()
    assert basic.lines(proof) == ["start-late"]
    start_worker()
    assert result.get(timeout=30) == "late"
    assert basic.lines(proof) == ["start-late", "start-late", "end-late"]


def test_the_request_carries_id_retries_hostname_and_queue(start_worker):
    start_worker("-n", "alpha@testhost")
    result = basic.whoami.delay()
    info = result.get(timeout=20)
    assert info["id"] == result.id and info["retries"] == 0
    assert info["hostname"] == "alpha@testhost" and info["queue"] == "celery"


def test_every_field_of_the_message_reaches_the_tasks_request(start_worker):
    start_worker("-n", "beta@testhost")
    result = basic.my_request.apply_async((1, "two"), {"three": 3}, countdown=0.05, time_limit=30,
                                          soft_time_limit=20)
    request = result.get(timeout=20)
    assert (request["id"], request["task"], request["args"], request["kwargs"]) == (
        result.id, "apps.basic.my_request", [1, "two"], {"three": 3})
    assert (request["retries"], request["timelimit"], request["root_id"], request["correlation_id"]) == (
        0, [30, 20], result.id, result.id)
    assert isinstance(request["eta"], str) and request["expires"] is None
    assert (request["parent_id"], request["group"], request["group_index"]) == (None, None, None)
    assert isinstance(request["origin"], str) and request["hostname"] == "beta@testhost"
    assert request["delivery_info"]["routing_key"] == "celery" and request["ignore_result"] is False
    assert (request["is_eager"], request["called_directly"]) == (False, False)


def test_get_times_out_when_no_worker_runs(embedded_broker):
    with pytest.raises(ResultTimeout):
        basic.add.delay(1, 1).get(timeout=0.3)


def test_banner_lists_transport_pool_queues_and_tasks(start_worker, pool):
    worker = start_worker("-Q", "celery,other", "-c", "2")
    log = worker.log()
    assert "transport  embedded://" in log
    assert f"pool       concurrency {1 if pool == 'solo' else 2}" in log and f"[{pool} (worker_" in log
    assert "queues     celery, other" in log
    assert ". apps.basic.add" in log


def test_bad_options_and_unimportable_apps_stop_before_anything_starts(tmp_path, embedded_broker):
    env = dict(os.environ, WORKER_BROKER_URL=embedded_broker)
    for args, expected in [
        (["-A", "apps.nothere"], "cannot import the app module 'apps.nothere'"),
        (["-A", "apps.basic:nothing"], "apps.basic:nothing is not an App"),
        (["-A", "apps.basic", "-c", "-3"], "--concurrency must be 0 or more, or auto (got -3)"),
        (["-A", "apps.basic", "--prefetch-multiplier", "0"], "--prefetch-multiplier must be greater than 0"),
        (["-A", "apps.basic", "-b", "nope"], "has no scheme"),
        ([], "needs the app"),
    ]:
        worker = WorkerProcess(args, env, tmp_path / "bad.log", cwd=TESTS)
        try:
            assert worker.process.wait(timeout=20) == 2, worker.log()
            assert expected in worker.log()
            assert "Traceback" not in worker.log()
        finally:
            worker.kill()

"""Celery's task API, as a real Celery 5.7 client and this project's client use it against
``workerctl worker``: the message's own headers, shadow names in log lines and events, progress
reported with ``update_state``, the handlers (run where the task runs), base classes,
class-based tasks, a task's own result serializer and ``result_extended``.

One worker per broker and pool serves the whole module (Redis with prefork and with threads,
RabbitMQ with prefork), with task events on and ``result_extended``; each test uses task ids,
files and queues of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from apps import taskapi
from conftest import AMQP_TEST_URL, WorkerFactory, delete_queue, empty_redis, redis_db, require_server
from event_listener import Listener
from workers import WorkerProcess, wait_for

TASKAPI_URL = redis_db(6)  # this module's database of the shared Redis: the Redis broker and the results
SERVED = [("redis", "prefork"), ("redis", "threads"), ("amqp", "prefork")]


@attrs.frozen
class Served:
    """A worker running ``apps.taskapi`` and a Celery client of it."""

    broker: str
    pool: str
    queue: str
    hostname: str
    worker: WorkerProcess
    celery: object

    def send(self, name: str, args=(), kwargs=None, **options):
        return self.celery.send_task(f"apps.taskapi.{name}", args, kwargs, queue=self.queue, **options)


@pytest.fixture(scope="module", params=SERVED, ids=[f"{broker}-{pool}" for broker, pool in SERVED])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from celery import Celery

    kind, pool = request.param
    results = empty_redis(TASKAPI_URL)
    if kind == "redis":
        broker = results
    else:
        require_server(5672, "RabbitMQ")
        broker = AMQP_TEST_URL
    queue = f"taskapi-{uuid.uuid4().hex[:8]}"
    hostname = f"taskapi-{kind}-{pool}@localhost"
    factory = WorkerFactory(tmp_path_factory.mktemp(f"taskapi-{kind}-{pool}"))
    celery = Celery("taskapi-client", broker=broker, backend=results)
    celery.conf.update(broker_connection_retry_on_startup=True, result_extended=True)
    try:
        worker = factory.start("-Q", queue, "-c", "2", "-E", "-n", hostname, app="apps.taskapi", pool=pool,
                               broker=broker, backend=results,
                               env={"WORKER_RESULT_EXTENDED": "true",
                                    "WORKER_RESULT_ACCEPT_CONTENT": "json,msgpack,yaml,pickle"})
        yield Served(broker, pool, queue, hostname, worker, celery)
    finally:
        celery.close()
        factory.cleanup()
        delete_queue(broker, queue)


@pytest.fixture
def ours(served: Served) -> Iterator[object]:
    """This project's client of the same worker."""
    taskapi.app.conf.update(broker_url=served.broker, result_backend=TASKAPI_URL,
                            result_accept_content=["json", "msgpack", "yaml", "pickle"])
    yield taskapi.app
    taskapi.app.close()


# -- the message's own headers ------------------------------------------------------------------------


def test_a_celery_clients_own_headers_reach_the_task_as_request_headers_and_attributes(
        served: Served) -> None:
    sent = {"tenant": "acme", "trace": {"id": 7, "spans": [1, 2]}, "x-priority-class": 3}
    seen = served.send("headers_seen", headers=sent).get(timeout=20)
    assert seen == {"headers": sent, "tenant": "acme", "get": "acme", "shadow": None}
    assert served.send("headers_seen").get(timeout=20)["headers"] is None  # none sent: None, as in Celery


def test_our_clients_own_headers_reach_the_task_and_go_with_its_retry(served: Served, ours) -> None:
    seen = taskapi.headers_seen.apply_async(queue=served.queue, headers={"tenant": "ours"}).get(timeout=20)
    assert (seen["headers"], seen["tenant"]) == ({"tenant": "ours"}, "ours")
    by_name = ours.send_task("apps.taskapi.headers_seen", queue=served.queue, headers={"tenant": "named"})
    assert by_name.get(timeout=20)["tenant"] == "named"
    retried = served.send("headers_after_retry", headers={"tenant": "kept"}, shadow="kept.shadow")
    assert retried.get(timeout=20) == {"headers": {"tenant": "kept"}, "shadow": "kept.shadow", "retries": 1}


# -- shadow names ------------------------------------------------------------------------------------------


def test_a_shadow_name_is_what_the_workers_log_lines_and_task_events_show(served: Served, ours) -> None:
    listener = Listener(served.broker)
    try:
        shadowed = served.send("headers_seen", shadow="reports.nightly")
        assert shadowed.get(timeout=20)["shadow"] == "reports.nightly"
        named = taskapi.report.apply_async(("weekly",), queue=served.queue)  # the task's shadow_name
        assert named.get(timeout=20) == "weekly"
        for result, shown in ((shadowed, "reports.nightly"), (named, "report.weekly")):
            served.worker.wait_log(f"Task {shown}[{result.id}] received")
            served.worker.wait_log(f"Task {shown}[{result.id}] succeeded")

            def received(task_id: str = result.id) -> list[dict]:
                return [event for event in listener.events("task-received") if event.get("uuid") == task_id]

            listener.until(lambda: received())
            assert [event["name"] for event in received()] == [shown]
    finally:
        listener.close()


# -- progress ---------------------------------------------------------------------------------------------


def test_progress_from_update_state_is_read_by_a_celery_client_and_by_ours(served: Served, ours,
                                                                          tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    result = served.send("progress", (3, str(gate)))
    mine = ours.AsyncResult(result.id)
    wait_for(lambda: result.state == "PROGRESS" and result.info == {"done": 3, "total": 3}, timeout=20,
             message="PROGRESS with done=3")
    assert (mine.state, mine.info) == ("PROGRESS", {"done": 3, "total": 3})
    assert not mine.ready()
    gate.touch()
    assert result.get(timeout=20) == 3
    assert (mine.state, mine.get(timeout=5)) == ("SUCCESS", 3)


# -- handlers ----------------------------------------------------------------------------------------------


def _where(note: dict) -> tuple[int, int]:
    return note["pid"], note["thread"]


def _assert_ran_in_the_executor(notes: list[dict], served: Served) -> None:
    [run] = [note for note in notes if note["handler"] == "run"]
    for note in notes:
        assert _where(note) == _where(run), notes  # the process and thread that ran the task
    if served.pool == "prefork":
        assert run["pid"] != served.worker.pid
    else:
        assert run["pid"] == served.worker.pid and not run["main_thread"]


def test_handlers_run_where_the_task_runs_with_celerys_arguments_on_success(served: Served,
                                                                            tmp_path: Path) -> None:
    record = tmp_path / "record"
    result = served.send("handled", ("ok",), {"record": str(record)})
    assert result.get(timeout=20) == "ok done"
    notes = wait_for(lambda: len(taskapi.notes(str(record))) == 5 and taskapi.notes(str(record)),
                     message="five notes")
    # Celery's order: the result stored, on_success, the task_success signal (hook), after_return
    assert [note["handler"] for note in notes] == ["before_start", "run", "on_success", "task_success",
                                                   "after_return"]
    before, _, success, hook, after = notes
    assert (hook["task_id"], hook["stored"]) == (result.id, "SUCCESS")
    assert (before["task_id"], before["args"], before["request_id"]) == (result.id, ["ok"], result.id)
    assert (success["retval"], success["task_id"], success["args"]) == ("ok done", result.id, ["ok"])
    assert (after["status"], after["retval"], after["einfo"]) == ("SUCCESS", "'ok done'", None)
    _assert_ran_in_the_executor(notes, served)


def test_handlers_of_a_failed_task_get_the_exception_and_its_traceback(served: Served,
                                                                        tmp_path: Path) -> None:
    record = tmp_path / "record"
    result = served.send("handled", ("fail",), {"record": str(record)})
    with pytest.raises(ValueError, match="failed on purpose"):
        result.get(timeout=20)
    notes = wait_for(lambda: len(taskapi.notes(str(record))) == 5 and taskapi.notes(str(record)),
                     message="five notes")
    assert [note["handler"] for note in notes] == ["before_start", "run", "on_failure", "task_failure",
                                                   "after_return"]
    failure, hook, after = notes[2], notes[3], notes[4]
    assert (hook["exc"], hook["stored"]) == ("ValueError('failed on purpose')", "FAILURE")
    assert failure["exc"] == "ValueError('failed on purpose')" and failure["task_id"] == result.id
    assert (failure["einfo"], failure["einfo_exception"], failure["traceback_names_it"]) == (
        "ExceptionInfo", True, True)
    assert failure["request_id"] == result.id
    assert (after["status"], after["retval"]) == ("FAILURE", "ValueError('failed on purpose')")
    _assert_ran_in_the_executor(notes, served)


def test_on_retry_gets_the_reason_and_the_retried_run_succeeds(served: Served, tmp_path: Path) -> None:
    record = tmp_path / "record"
    result = served.send("handled", ("retry",), {"record": str(record)})
    assert result.get(timeout=20) == "retry done"
    assert result.retries == 1
    notes = wait_for(lambda: len(taskapi.notes(str(record))) == 8 and taskapi.notes(str(record)),
                     message="eight notes")
    # the retry may start in another process before the first attempt's on_retry is noted
    first = [note for note in notes if note["attempt"] == 0]
    second = [note for note in notes if note["attempt"] == 1]
    assert [note["handler"] for note in first] == ["before_start", "run", "on_retry"]
    assert [note["handler"] for note in second] == ["before_start", "run", "on_success", "task_success",
                                                    "after_return"]
    retry = first[2]
    assert (retry["exc"], retry["retries"], retry["einfo"]) == ("KeyError('again')", 0, "ExceptionInfo")
    _assert_ran_in_the_executor(first, served)
    _assert_ran_in_the_executor(second, served)


def test_a_handler_that_raises_is_logged_and_the_result_is_kept(served: Served, tmp_path: Path) -> None:
    record = tmp_path / "record"
    result = served.send("handled", ("ok",), {"record": str(record), "raise_in": "on_success"})
    assert result.get(timeout=20) == "ok done"
    served.worker.wait_log(f"Task apps.taskapi.handled[{result.id}] on_success handler raised: "
                           f"RuntimeError('on_success broke on purpose')")
    notes = wait_for(lambda: len(taskapi.notes(str(record))) == 5 and taskapi.notes(str(record)),
                     message="five notes")
    assert [note["handler"] for note in notes[-2:]] == ["task_success", "after_return"]  # still ran
    assert result.state == "SUCCESS"


def test_after_a_hard_time_limit_on_failure_runs_in_the_workers_main_process(served: Served,
                                                                             tmp_path: Path) -> None:
    if served.pool != "prefork":
        pytest.skip("hard time limits are the prefork pool's")
    record = tmp_path / "record"
    result = served.send("handled", ("sleep",), {"record": str(record)}, time_limit=1)
    with pytest.raises(Exception) as failed:
        result.get(timeout=20)
    assert type(failed.value).__name__ == "TimeLimitExceeded"
    notes = wait_for(lambda: len(taskapi.notes(str(record))) == 4 and taskapi.notes(str(record)),
                     message="four notes")
    assert [note["handler"] for note in notes] == ["before_start", "run", "on_failure", "after_return"]
    failure = notes[2]
    assert failure["pid"] == served.worker.pid and failure["main_thread"]
    assert "TimeLimitExceeded" in failure["exc"] and failure["request_id"] == result.id
    assert notes[3]["status"] == "FAILURE"


# -- base classes and class-based tasks -----------------------------------------------------------------


def test_a_base_classs_attributes_are_its_tasks_defaults_and_its_methods_are_theirs(served: Served,
                                                                                     tmp_path: Path) -> None:
    counter = tmp_path / "attempts"
    result = served.send("sturdy", (2, str(counter)))  # two ConnectionErrors: autoretry_for, from the base
    assert result.get(timeout=20) == {"retries": 2, "shout": "HELLO", "tagged": "apps.taskapi.sturdy:1",
                                      "acks_late": True, "max_retries": 3, "rate_limit": "1000/s"}
    assert counter.read_text() == "xxx"
    overridden = served.send("sturdy_overridden").get(timeout=20)
    assert overridden == {"shout": "HI", "max_retries": 0, "acks_late": False}


def test_a_class_based_task_and_a_base_with_its_own_call_run_with_the_workers_request(served: Served) -> None:
    product = served.celery.send_task("taskapi.multiply", (6, 7), queue=served.queue)
    assert product.get(timeout=20) == {"product": 42, "request_id": product.id}
    wrapped = served.send("wrapped", (5,))
    assert wrapped.get(timeout=20) == {"wrapped": {"x": 5, "request_id": wrapped.id},
                                       "request_id": wrapped.id}


# -- result serializers of a task's own ------------------------------------------------------------------


@pytest.mark.parametrize("serializer", ["msgpack", "yaml", "pickle"])
def test_a_tasks_own_result_serializer_is_read_by_a_celery_client_set_to_it_and_by_ours(
        served: Served, ours, serializer: str) -> None:
    from celery import Celery

    client = Celery(f"taskapi-{serializer}", broker=served.broker, backend=TASKAPI_URL)
    client.conf.update(broker_connection_retry_on_startup=True, result_serializer=serializer,
                       result_accept_content=[serializer])
    try:
        name = f"apps.taskapi.in_{serializer}"
        value = client.send_task(name, queue=served.queue).get(timeout=20)
        expected = {"serializer": serializer, "items": [1, 2.5, None, "x"]}
        if serializer == "pickle":
            expected["set"] = {1, 2}  # what only pickle keeps
        assert value == expected
        with pytest.raises(taskapi.Refused) as refused:
            client.send_task(name, (True,), queue=served.queue).get(timeout=20)
        assert refused.value.args[0] == serializer
        mine = ours.send_task(name, queue=served.queue)
        assert mine.get(timeout=20) == expected
        with pytest.raises(taskapi.Refused):
            ours.send_task(name, (True,), queue=served.queue).get(timeout=20)
    finally:
        client.close()


# -- result_extended ---------------------------------------------------------------------------------------


def test_result_extended_is_read_by_a_celery_client_and_by_ours(served: Served, ours, tmp_path: Path) -> None:
    record = tmp_path / "record"
    result = served.send("handled", ("retry",), {"record": str(record)})
    assert result.get(timeout=20) == "retry done"
    expected = ("apps.taskapi.handled", ["retry"], {"record": str(record)}, served.hostname, 1, served.queue)
    assert (result.name, result.args, result.kwargs, result.worker, result.retries, result.queue) == expected
    mine = ours.AsyncResult(result.id)
    assert (mine.name, mine.args, mine.kwargs, mine.worker, mine.retries, mine.queue) == expected
    failed = served.send("handled", ("fail",), {"record": str(record)})
    with pytest.raises(ValueError):
        failed.get(timeout=20)
    assert (failed.name, failed.retries, failed.queue) == ("apps.taskapi.handled", 0, served.queue)


def test_the_module_worker_logged_no_internal_errors(served: Served) -> None:
    log = served.worker.log()  # the worker served every test above: nothing went wrong inside it
    assert "Internal error" not in log and "could not store state" not in log, log[-3000:]

"""``workerctl worker -A proj`` with an unchanged Celery project (worker-celery): each task runs
through Celery's tracer in a prefork child, so the request, retries, handlers, update_state,
results, canvas and signals behave as under ``celery worker``. A real Celery client sends the
tasks and reads the results; the worker runs real processes on real Redis (and RabbitMQ)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AMQP_TEST_URL, REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server
from workers import wait_for

pytestmark = pytest.mark.timeout(120)

BROKER = redis_db(3)
RESULTS = redis_db(4)
PROJ = "apps.celery_proj.tasks"


def client(broker: str = BROKER, backend: str = RESULTS):
    """A Celery client of its own (not the project's app): it sends by name, as a producer in
    another code base would."""
    from celery import Celery

    app = Celery("client", broker=broker, backend=backend)
    app.conf.update(broker_connection_retry_on_startup=True, result_extended=True)
    return app


@pytest.fixture(scope="module")
def signals_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("signals") / "signals.log"


@pytest.fixture(scope="module")
def proj(tmp_path_factory: pytest.TempPathFactory, signals_log: Path) -> Iterator[object]:
    """The project under ``workerctl worker -P prefork -c 2 -E`` on Redis, results on Redis."""
    require_server(REDIS_PORT, "Redis")
    empty_redis(BROKER)
    empty_redis(RESULTS)
    factory = WorkerFactory(tmp_path_factory.mktemp("proj"))
    worker = factory.start("-c", "2", "-E", "--heartbeat-interval", "0.5", app="apps.celery_proj",
                           pool="prefork", env={"CELERY_BROKER_URL": BROKER, "CELERY_RESULT_BACKEND": RESULTS,
                                                "CELERY_PROJ_SIGNALS": str(signals_log)})
    app = client()
    yield worker
    app.close()
    factory.cleanup()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# -- the task itself -----------------------------------------------------------------------------


def test_a_task_runs_in_a_pool_child_with_celerys_request_and_its_result_is_stored_by_celerys_backend(proj):
    app = client()
    assert app.send_task(f"{PROJ}.add", (2, 3)).get(timeout=10) == 5
    seen = app.send_task(f"{PROJ}.whoami", headers={"x_custom": "carried"}).get(timeout=10)
    assert seen["task"] == f"{PROJ}.whoami" and seen["custom"] == "carried"
    assert seen["hostname"] == proj.name
    assert seen["delivery_info"]["routing_key"] == "celery"
    assert seen["called_directly"] is False and seen["is_eager"] is False
    result = app.send_task(f"{PROJ}.async_add", (2, 3))  # async def: its value, not a coroutine
    assert result.get(timeout=10) == {"sum": 5, "id": result.id}
    result = app.send_task(f"{PROJ}.add", (1, 1))
    result.get(timeout=10)
    meta = result.backend.get_task_meta(result.id)
    assert meta["name"] == f"{PROJ}.add" and meta["args"] == [1, 1]  # the project's result_extended


def test_a_failure_is_stored_as_celery_stores_it_and_raised_in_the_client(proj):
    from apps.celery_proj.tasks import Boom

    app = client()
    result = app.send_task(f"{PROJ}.boom", ("kaput",))
    with pytest.raises(Boom, match="kaput"):
        result.get(timeout=10)
    assert result.state == "FAILURE"
    assert "raise Boom(message)" in result.traceback
    proj.wait_log(f"Task {PROJ}.boom[{result.id}] raised unexpected: Boom('kaput')")


def test_an_unknown_task_is_refused_and_its_result_failed_through_celerys_backend(proj):
    from celery.exceptions import NotRegistered

    app = client()
    result = app.send_task(f"{PROJ}.no_such_task", (1,))
    with pytest.raises(NotRegistered):
        result.get(timeout=10)
    proj.wait_log(f"Rejected message '{PROJ}.no_such_task'")


def test_retries_autoretry_and_update_state_go_through_celerys_task(proj):
    app = client()
    assert app.send_task(f"{PROJ}.flaky", (2,)).get(timeout=10) == 2
    assert app.send_task(f"{PROJ}.autoretried", (2,)).get(timeout=10) == "ok after 2"
    with pytest.raises(KeyError):
        app.send_task(f"{PROJ}.autoretried", (5,)).get(timeout=10)  # max_retries=2, then the error
    assert app.send_task(f"{PROJ}.progress", (3,)).get(timeout=10) == 3
    gate = Path(proj.log_path).with_suffix(".gate")
    running = app.send_task(f"{PROJ}.slow_progress", (str(gate),))
    wait_for(lambda: running.state == "PROGRESS", 10, message="the PROGRESS state")
    assert running.info["pid"] != proj.pid  # stored from the pool child
    gate.touch()
    assert running.get(timeout=10) == "done"


def test_ignore_and_reject_are_celerys(proj):
    app = client()
    ignored = app.send_task(f"{PROJ}.ignored")
    rejected = app.send_task(f"{PROJ}.rejected")
    proj.wait_log(f"Task {PROJ}.rejected[{rejected.id}] rejected itself (requeue=False)")
    assert ignored.state == "PENDING"  # Ignore stores nothing
    # as Celery 5.7: a message rejected for good never runs again, so its result is FAILURE
    wait_for(lambda: rejected.state == "FAILURE", 10, message="the rejected task's FAILURE")
    assert type(rejected.result).__name__ == "Reject"


def test_a_task_subclass_runs_every_handler_and_the_task_signals_run_in_the_child(proj, signals_log):
    from apps.celery_proj.tasks import Boom

    app = client()
    ok = app.send_task(f"{PROJ}.handled", ("ok",))
    assert ok.get(timeout=10) == "ok"
    failed = app.send_task(f"{PROJ}.handled", ("fail",))
    with pytest.raises(Boom):
        failed.get(timeout=10)
    retried = app.send_task(f"{PROJ}.handled", ("retry",))
    assert retried.get(timeout=10) == "retry"

    def of(task_id: str) -> list[str]:  # what ran where the task ran (task_received is the main process's)
        return [line.split(" ", 1)[1] for line in lines(signals_log)
                if task_id in line and " task_received " not in line]

    wait_for(lambda: any(line.startswith("task_postrun") for line in of(ok.id)), 5, message="postrun")
    assert [line.split()[0] for line in of(ok.id)] == [
        "task_prerun", "before_start", "on_success", "task_success", "after_return", "task_postrun"]
    assert "after_return SUCCESS " + ok.id in of(ok.id)
    wait_for(lambda: any(line.startswith("task_postrun") for line in of(failed.id)), 5, message="postrun")
    assert [line.split()[0] for line in of(failed.id)] == [
        "task_prerun", "before_start", "on_failure", "task_failure", "after_return", "task_postrun"]
    wait_for(lambda: len([line for line in of(retried.id) if line.startswith("task_postrun")]) == 2, 5,
             message="both runs")
    # as in Celery, after_return is not called for a retry. The retry may start in the other child
    # before this run's on_retry is logged: this run's lines are those of its own process
    retrying = [line.split() for line in lines(signals_log)
                if retried.id in line and " task_received " not in line]
    [pid] = {fields[0] for fields in retrying if fields[1] == "on_retry"}
    assert [fields[1] for fields in retrying if fields[0] == pid][:5] == [
        "task_prerun", "before_start", "on_retry", "task_retry", "task_postrun"]
    pids = {line.split()[0] for line in lines(signals_log) if ok.id in line and " task_received " not in line}
    assert str(proj.pid) not in pids  # the task and its signals ran in a pool child


def test_a_soft_time_limit_is_caught_as_celerys_exception_and_a_hard_one_fails_the_task(proj):
    app = client()
    assert app.send_task(f"{PROJ}.catches_soft_limit").get(timeout=10) == "caught"
    killed = app.send_task(f"{PROJ}.nap", (10,), time_limit=0.5)
    from billiard.exceptions import TimeLimitExceeded

    with pytest.raises(TimeLimitExceeded):
        killed.get(timeout=10)


def test_a_task_over_its_hard_time_limit_calls_each_errback_once(proj, signals_log):
    """The failure is decided in the worker's main process and stored through Celery's backend,
    which calls the errbacks: the worker's own follow-up adds nothing."""
    from billiard.exceptions import TimeLimitExceeded

    app = client()
    killed = app.send_task(f"{PROJ}.nap", (10,), time_limit=0.5, link_error=[
        app.signature(f"{PROJ}.on_error"), app.signature(f"{PROJ}.on_error_id")])
    with pytest.raises(TimeLimitExceeded):
        killed.get(timeout=10)
    wait_for(lambda: f"errback-id {killed.id}" in signals_log.read_text(), timeout=10,
             message="the errback sent as a task")
    proj.wait_log(f"{PROJ}.on_error_id[")  # it ran; any second copy would have come with it
    log = signals_log.read_text()
    assert log.count(f"errback {killed.id} TimeLimitExceeded") == 1
    assert log.count(f"errback-id {killed.id}") == 1


def test_print_in_a_task_goes_to_the_log_as_celerys_worker_redirects_it(proj):
    app = client()
    assert app.send_task(f"{PROJ}.shout", ("hello there",)).get(timeout=10) == "hello there"
    proj.wait_log("WARNING/ForkPoolWorker")
    proj.wait_log("printed: hello there")


def test_a_revoked_task_is_stored_revoked_through_celerys_backend(proj, signals_log):
    app = client()
    result = app.send_task(f"{PROJ}.add", (1, 2), countdown=30)
    proj.wait_log(f"{result.id}] received")
    result.revoke()
    wait_for(lambda: result.state == "REVOKED", 10, message="REVOKED")
    # Celery's main-process task signals, in the worker's process
    wait_for(lambda: f"{proj.pid} task_revoked" in signals_log.read_text(), 5, message="task_revoked")
    mine = [line.split()[:2] for line in lines(signals_log) if result.id in line]
    assert mine == [[str(proj.pid), "task_received"], [str(proj.pid), "task_revoked"]]


# -- the worker's signals ------------------------------------------------------------------------------


def test_celerys_worker_signals_come_at_the_matching_moments(tmp_path, workers):
    require_server(REDIS_PORT, "Redis")
    log = tmp_path / "signals.log"
    env = {"CELERY_BROKER_URL": empty_redis(redis_db(6)), "CELERY_PROJ_SIGNALS": str(log)}
    worker = workers.start("-c", "2", "--heartbeat-interval", "0.3", app="apps.celery_proj", pool="prefork",
                           env=env)
    wait_for(lambda: any("heartbeat_sent" in line for line in lines(log)), 10, message="a heartbeat")
    main = str(worker.pid)
    worker.stop(signal.SIGTERM)
    seen = [line.split() for line in lines(log)]
    in_main = [name for pid, name, *_ in seen if pid == main]
    in_children = [name for pid, name, *_ in seen if pid != main]
    first = ["celeryd_init", "worker_init", "after_setup_logger", "after_setup_task_logger",
             "celeryd_after_setup"]
    assert in_main[:5] == first
    # worker-online goes out as the consumer starts, as Celery's Heart step sends it, then ready
    # (the heart beats every 0.3 s: on a loaded machine a beat may come before ready, or between the
    # start of the shutdown and the consumer's stop, as in Celery)
    assert in_main[5] == "heartbeat_sent"
    assert _without_beats(in_main[5:])[:2] == ["heartbeat_sent", "worker_ready"]
    # then worker-offline as the consumer stops, the children's worker_process_shutdown as the pool
    # stops, and worker_shutdown last, as in Celery
    stopping = in_main[in_main.index("worker_shutting_down"):]
    assert _without_beats(stopping) == ["worker_shutting_down", "heartbeat_sent", "worker_shutdown"]
    children_done = max(i for i, (pid, name, *_) in enumerate(seen) if name == "worker_process_shutdown")
    assert children_done < max(i for i, (pid, name, *_) in enumerate(seen) if name == "worker_shutdown")
    assert in_children.count("worker_process_init") == 2
    assert in_children.count("worker_process_shutdown") == 2
    assert "worker_process_init" not in in_main


def _without_beats(names: list[str]) -> list[str]:
    """The signals' names with each run of heartbeats folded into one."""
    return [name for i, name in enumerate(names)
            if not (name == "heartbeat_sent" and names[i - 1:i] == [name])]


# -- configuration -------------------------------------------------------------------------------


def test_the_apps_configuration_is_the_workers_and_the_command_line_wins(tmp_path, workers):
    require_server(REDIS_PORT, "Redis")
    broker = empty_redis(redis_db(6))
    env = {"CELERY_BROKER_URL": broker}
    worker = workers.start(app="apps.celery_configured", pool="prefork", env=env)
    log = worker.log()
    assert "  queues     high, low" in log  # task_queues, without -Q
    assert "  pool       concurrency 3" in log  # worker_concurrency
    assert "prefetch   6 (3 x 2)" in log  # worker_prefetch_multiplier
    assert "Celery setting worker_direct: not supported; no per-worker queue is consumed" in log
    app = client(broker, broker)
    assert app.send_task("apps.celery_configured.where", queue="low").get(timeout=10) == "low"
    assert app.send_task("apps.celery_configured.where", queue="high").get(timeout=10) == "high"
    # task_acks_late and task_reject_on_worker_lost: a task whose process dies runs again
    marker = tmp_path / "died"
    assert app.send_task("apps.celery_configured.dies_once", (str(marker),), queue="low").get(
        timeout=20) == "second run"
    assert marker.exists()
    worker.wait_log("lost its process")
    worker.stop()
    again = workers.start("-Q", "high", "-c", "1", "--prefetch-multiplier", "5", app="apps.celery_configured",
                          pool="prefork", env=env)
    log = again.log()
    assert "  queues     high\n" in log and "concurrency 1" in log and "prefetch   5 (1 x 5)" in log


def test_a_celery_app_with_its_loader_blocked_is_refused_naming_the_block(tmp_path):
    import subprocess

    command = [sys.executable, "-m", "worker_core", "worker", "-A", "apps.celery_proj.celery:app", "-p",
               "no:celery"]
    result = subprocess.run(command, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, CELERY_BROKER_URL=redis_db(6)))
    assert result.returncode == 2
    assert "names a Celery app (celery.app.base.Celery)" in result.stderr
    assert "blocked by -p no:celery" in result.stderr


# -- RabbitMQ ------------------------------------------------------------------------------------------


def test_the_project_runs_on_rabbitmq_with_results_on_redis(workers):
    require_server(5672, "RabbitMQ")
    require_server(REDIS_PORT, "Redis")
    import uuid

    from conftest import delete_queue

    queue = f"proj-{uuid.uuid4().hex[:8]}"
    results = empty_redis(redis_db(6))
    worker = workers.start("-c", "2", app="apps.celery_proj", pool="prefork",
                           env={"CELERY_BROKER_URL": AMQP_TEST_URL, "CELERY_RESULT_BACKEND": results,
                                "CELERY_PROJ_QUEUE": queue})
    app = client(AMQP_TEST_URL, results)
    try:
        assert app.send_task(f"{PROJ}.add", (20, 22), queue=queue).get(timeout=10) == 42
        assert app.send_task(f"{PROJ}.flaky", (1,), queue=queue).get(timeout=10) == 1
    finally:
        app.close()
        worker.stop()
        delete_queue(AMQP_TEST_URL, queue)


# -- the one-round-trip store on Celery's Redis backend -------------------------------------------


def test_the_atomic_store_writes_and_publishes_what_celerys_redis_backend_does_and_keeps_a_success():
    require_server(REDIS_PORT, "Redis")
    import redis
    from celery import Celery
    from worker_celery.results import AtomicRedisBackend, atomic_backend_for

    url = empty_redis(redis_db(6))
    app = Celery("atomic", backend=url)
    app.conf.result_expires = 600
    backend = atomic_backend_for(app)
    assert isinstance(backend, AtomicRedisBackend)
    raw = redis.Redis.from_url(url)
    listener = raw.pubsub()
    listener.subscribe("celery-task-meta-t1")
    listener.get_message(timeout=1)
    raw.script_flush()  # the script is loaded when the server does not know it
    backend.store_result("t1", {"step": 1}, "PROGRESS")
    assert app.backend.get_task_meta("t1")["result"] == {"step": 1}
    backend.store_result("t1", 42, "SUCCESS")
    published = listener.get_message(timeout=1)
    assert published is not None and b'"status": "PROGRESS"' in published["data"]
    assert 590 < raw.ttl("celery-task-meta-t1") <= 600
    backend.store_result("t1", Boom("late"), "FAILURE")  # a duplicate run: the SUCCESS stays
    meta = app.backend.get_task_meta("t1")
    assert (meta["status"], meta["result"]) == ("SUCCESS", 42)
    assert app.AsyncResult("t1").get(timeout=1) == 42
    listener.close()
    raw.close()
    assert atomic_backend_for(Celery("other", backend="rpc://")) is None


def test_the_atomic_store_writes_the_same_meta_as_celerys_redis_backend():
    require_server(REDIS_PORT, "Redis")
    import json

    import redis
    from celery import Celery
    from celery.app.task import Context
    from worker_celery.results import atomic_backend_for

    url = empty_redis(redis_db(6))
    app = Celery("atomic-same", backend=url)
    app.conf.update(result_extended=True, result_expires=600)
    request = Context({"id": "x", "task": "proj.add", "args": [1, 2], "kwargs": {"k": "v"}, "hostname": "w@h",
               "retries": 2, "delivery_info": {"routing_key": "q"}, "group": "g1", "parent_id": "p1"})
    app.backend.store_result("by-celery", {"n": [1, 2.5, None]}, "SUCCESS", request=request)
    atomic_backend_for(app).store_result("by-atomic", {"n": [1, 2.5, None]}, "SUCCESS", request=request)
    raw = redis.Redis.from_url(url)
    stored = [json.loads(raw.get(f"celery-task-meta-{key}")) for key in ("by-celery", "by-atomic")]
    ttls = [raw.ttl(f"celery-task-meta-{key}") for key in ("by-celery", "by-atomic")]
    raw.close()
    for meta in stored:
        meta.pop("date_done"), meta.pop("task_id")
    assert stored[0] == stored[1]
    assert stored[0]["name"] == "proj.add" and stored[0]["group_id"] == "g1"
    assert all(590 < ttl <= 600 for ttl in ttls)


def test_the_atomic_store_is_off_on_the_libraries_own_paths_and_when_celery_changed(monkeypatch, caplog):
    from celery import Celery
    from celery.backends.base import BaseKeyValueStoreBackend
    from worker_celery import results

    app = Celery("atomic-off", backend=redis_db(6))
    monkeypatch.setenv("WORKER_STOCK_KOMBU", "1")
    results.forget()
    assert results.atomic_backend_for(app) is None
    monkeypatch.delenv("WORKER_STOCK_KOMBU")

    def changed(self, task_id, result, state, traceback=None, request=None, replace=False, **kwargs):
        return result

    monkeypatch.setattr(BaseKeyValueStoreBackend, "_store_result", changed)
    results.forget()
    with caplog.at_level("WARNING", logger=results.logger.name):
        assert results.atomic_backend_for(app) is None
    assert "the one-round-trip result store is off" in caplog.text
    assert "_store_result takes" in caplog.text and "two round trips" in caplog.text
    monkeypatch.undo()
    results.forget()
    assert results.atomic_backend_for(app) is not None


class Boom(Exception):
    pass


def test_each_setting_of_the_celery_app_is_translated_or_listed_with_what_the_worker_does_instead():
    from datetime import timedelta

    from celery import Celery
    from worker_celery import CeleryApp

    celery = Celery("translated", broker="redis://127.0.0.1:1/0", backend="redis://127.0.0.1:1/1")
    celery.conf.update(result_expires=timedelta(hours=1), task_time_limit=60, task_soft_time_limit=50,
                       broker_heartbeat=None, accept_content=["json", "pickle"], task_acks_late=True,
                       worker_max_tasks_per_child=100, worker_pool="gevent", worker_prefetch_multiplier=0,
                       task_default_priority=-1, worker_direct=True, worker_proc_alive_timeout=9,
                       broker_connection_max_retries=None, worker_eta_task_limit=500)
    celery.finalize()
    app = CeleryApp(celery, "translated")
    settings = app.settings
    assert settings.result_expires == 3600
    assert (settings.task_time_limit, settings.task_soft_time_limit) == (60, 50)
    assert settings.accept_content == ("json", "pickle") and settings.task_acks_late is True
    assert settings.broker_heartbeat == 0 and settings.broker_connection_max_retries is None
    assert settings.worker_max_tasks_per_child == 100 and settings.worker_eta_task_limit == 500
    assert settings.broker_url == "redis://127.0.0.1:1/0"
    assert settings.result_backend == "celery://translated"
    assert settings.worker_pool is None and settings.worker_prefetch_multiplier == 4
    notes = "\n".join(app.notes)
    assert "worker_pool='gevent': not a pool here; the default pool runs instead" in notes
    assert "worker_prefetch_multiplier=0: an unlimited prefetch is not offered" in notes
    assert "task_default_priority=-1: not taken, the worker's default is used instead" in notes
    assert "worker_direct: not supported; no per-worker queue is consumed" in notes
    assert "worker_proc_alive_timeout: not supported" in notes
    assert "worker_eta_task_limit" not in notes
    assert app.tasks["celery.chord_unlock"].celery is celery.tasks["celery.chord_unlock"]


@pytest.mark.parametrize("pool", ["threads", "solo", "asyncio"])
def test_the_threads_solo_and_asyncio_pools_run_celery_tasks_too(pool, workers, tmp_path):
    require_server(REDIS_PORT, "Redis")
    from apps.celery_proj.tasks import Boom

    broker, results = empty_redis(redis_db(6)), empty_redis(redis_db(7))
    log = tmp_path / "signals.log"
    worker = workers.start("-c", "2", app="apps.celery_proj", pool=pool,
                           env={"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results,
                                "CELERY_PROJ_SIGNALS": str(log)})
    app = client(broker, results)
    try:
        assert app.send_task(f"{PROJ}.add", (2, 2)).get(timeout=10) == 4
        result = app.send_task(f"{PROJ}.async_add", (2, 2))
        assert result.get(timeout=10) == {"sum": 4, "id": result.id}
        assert app.send_task(f"{PROJ}.flaky", (1,)).get(timeout=10) == 1
        with pytest.raises(Boom):
            app.send_task(f"{PROJ}.boom").get(timeout=10)
    finally:
        app.close()
    inits = [line for line in lines(log) if line.endswith(" worker_process_init")]
    # as Celery's pools: solo sends worker_process_init once, in the worker's process; threads never
    if pool != "asyncio":
        assert inits == ([f"{worker.pid} worker_process_init"] if pool == "solo" else [])


@pytest.mark.parametrize("spec", ["apps.celery_proj", "apps.celery_proj.celery",
                                  "apps.celery_proj.celery:app"])
def test_a_spec_names_the_celery_app_as_celerys_own_a_option_resolves_it(spec):
    from apps.celery_proj.celery import app as celery
    from worker_celery import CeleryApp

    from worker_core.app.loader import load_app

    app = load_app(spec)
    assert isinstance(app, CeleryApp) and app.celery is celery and app.spec == spec
    assert f"{PROJ}.add" in app.tasks and "celery.chord_unlock" in app.tasks


def test_the_celery_apps_backend_honours_the_result_backend_contract():
    """The worker's own stores (revoked, refused, a lost process) and reads (workerctl call
    --wait) through a Celery app's backend keep the slot's contract, in Celery's format."""
    require_server(REDIS_PORT, "Redis")
    from worker_celery import CeleryLoader, CeleryResultBackend

    from worker_core.testing import result_backend_contract

    empty_redis(redis_db(7))
    assert CeleryLoader.load("apps.celery_results") is not None
    # every check but the one that gives the backend other result_serializer settings: the Celery
    # app's own configuration chooses its serializers, not the worker's settings
    checks = [result_backend_contract.check_name(check) for check in result_backend_contract.CHECKS
              if check.__name__ != "check_results_are_stored_in_each_result_serializer"]
    result_backend_contract.run_all(CeleryResultBackend, "celery://apps.celery_results", only=checks)

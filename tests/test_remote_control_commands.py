"""The remote-control commands a worker answers, reply for reply with Celery's: a worker of this
project's App on Redis, asked with this project's client and with Celery's."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from apps import basic
from conftest import REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server
from workers import TESTS, ask, wait_for

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


def test_the_logical_clock_moves_on_with_each_request_and_each_event(worker, client):
    first = ask(client, "clock", worker=worker.name)["clock"]
    second = ask(client, "clock", worker=worker.name)["clock"]
    assert second > first  # the request itself moved it on
    # heartbeats go out every 0.5 s: between two requests the clock moves by more than one
    readings = [second]

    def moved_by_events() -> bool:
        readings.append(ask(client, "clock", worker=worker.name)["clock"])
        return readings[-1] - readings[-2] > 1

    wait_for(moved_by_events, timeout=10, interval=0.6, message="a heartbeat to move the clock")
    stats = ask(client, "stats", worker=worker.name)
    assert isinstance(stats["clock"], str) and int(stats["clock"]) > readings[-1]  # a string, as Celery's


def test_report_memsample_and_memdump_answer_as_celerys(worker, client):
    report = ask(client, "report", worker=worker.name)["ok"]
    assert "\nsoftware -> worker-core:" in report and "settings -> transport:redis results:disabled" in report
    assert f"broker_url: '{REDIS_URL}'" in report  # the settings follow, as Celery's report shows them
    samples = [ask(client, "memsample", worker=worker.name) for _ in range(2)]
    assert all(sample.endswith("MB") and float(sample[:-2]) > 1 for sample in samples)
    dump = ask(client, "memdump", worker=worker.name)
    assert dump.startswith("- rss (sample):\n") and f"-    > {samples[0]},\n" in dump
    assert dump.splitlines()[-1].startswith("- rss (end): ")
    # the samples were forgotten
    assert ask(client, "memdump", worker=worker.name).startswith("- rss (end): ")


def test_objgraph_draws_a_picture_of_the_workers_requests(worker, client):
    pytest.importorskip("objgraph")
    reply = ask(client, "objgraph", worker=worker.name, type="RevokedIds", num=5, max_depth=2)
    with open(reply["filename"], "rb") as picture:
        assert picture.read(8) == b"\x89PNG\r\n\x1a\n"
    os.unlink(reply["filename"])


def test_objgraph_without_the_library_answers_what_to_install(monkeypatch):
    from worker_core.control.debugging import objgraph

    monkeypatch.setitem(sys.modules, "objgraph", None)  # import objgraph now raises ImportError
    assert objgraph(None) == {"error": "objgraph is not installed on this worker: pip install objgraph (and "
                                       "Graphviz for the picture) in the worker's environment"}


def test_registered_shows_the_task_info_items_as_celery_formats_them(worker, client):
    listed = ask(client, "registered", worker=worker.name)
    assert "apps.basic.record_limited [rate_limit=5/s]" in listed and "apps.basic.add" in listed
    asked = ask(client, "registered", worker=worker.name,
                taskinfoitems=["rate_limit", "max_retries", "_secret"])
    assert "apps.basic.record_limited [rate_limit=5/s max_retries=3]" in asked
    assert "apps.basic.always_retry [max_retries=2]" in asked


def test_stats_has_celerys_field_types(worker, client):
    stats = ask(client, "stats", worker=worker.name)
    assert isinstance(stats["uptime"], int) and isinstance(stats["clock"], str) and stats["pid"] == worker.pid
    assert stats["broker"]["transport"] == "redis"  # named as Celery names it, not a class
    assert {"utime", "stime", "maxrss", "minflt", "nvcsw", "nivcsw"} <= set(stats["rusage"])
    assert isinstance(stats["prefetch_count"], int) and isinstance(stats["total"], dict)


def test_scheduled_entries_carry_celerys_priority_and_request_fields(worker, client):
    result = basic.add.apply_async((1, 2), countdown=60, priority=5)
    worker.wait_log(f"[{result.id}] received")
    [entry] = [entry for entry in ask(client, "scheduled", worker=worker.name)
               if entry["request"]["id"] == result.id]
    assert entry["priority"] == 6  # Celery's ETA timer entries' priority
    assert set(entry["request"]) == {"id", "name", "args", "kwargs", "type", "hostname", "time_start",
                                     "acknowledged", "delivery_info", "worker_pid"}
    assert entry["request"]["args"] == [1, 2] and entry["request"]["delivery_info"]["priority"] == 5
    ask(client, "revoke", worker=worker.name, task_id=[result.id])


def test_pool_restart_is_refused_without_worker_pool_restarts(worker, client):
    assert ask(client, "pool_restart", worker=worker.name) == {
        "error": "pool restarts are not enabled on this worker: set worker_pool_restarts = True in its "
                 "configuration (WORKER_WORKER_POOL_RESTARTS=true) to allow pool_restart"}


def test_old_names_of_commands_are_answered(worker, client):
    assert ask(client, "dump_tasks", worker=worker.name) == ask(client, "registered", worker=worker.name)
    assert ask(client, "dump_conf", worker=worker.name)["broker_url"] == REDIS_URL


def test_hello_trades_revoked_ids_and_the_clock_with_a_starting_celery_worker(worker, client):
    reply = ask(client, "hello", worker=worker.name, from_node="celery@elsewhere", revoked=["from-celery"])
    assert "from-celery" in reply["revoked"] and isinstance(reply["clock"], int)
    assert "from-celery" in ask(client, "revoked", worker=worker.name)


@pytest.fixture(scope="module")
def prefork(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_server(REDIS_PORT, "Redis")
    factory = WorkerFactory(tmp_path_factory.mktemp("restarts"))
    yield factory.start("-c", "2", "-Q", "restarts", pool="prefork", broker=REDIS_URL,
                        env={"PYTHONPATH": str(TESTS), "WORKER_WORKER_POOL_RESTARTS": "true"})
    factory.cleanup()


def test_pool_restart_replaces_every_process_once_its_task_is_done(prefork, client, tmp_path):
    wait_for(lambda: broadcast(basic.app, "ping", destination=[prefork.name], timeout=0.5), timeout=20,
             message="the prefork worker to answer a ping")
    before = set(ask(client, "stats", worker=prefork.name)["pool"]["processes"])
    running = basic.sleep.apply_async((1.5,), queue="restarts")
    prefork.wait_log(f"[{running.id}] received")
    assert ask(client, "pool_restart", worker=prefork.name) == {"ok": "reload started"}

    def replaced() -> bool:
        now = set(ask(client, "stats", worker=prefork.name)["pool"]["processes"])
        return len(now) == 2 and not now & before

    wait_for(replaced, timeout=20, interval=0.3, message="two new pool processes")
    after = basic.add.apply_async((2, 3), queue="restarts")
    prefork.wait_log(f"Task apps.basic.add[{after.id}] succeeded", timeout=20)  # the new processes run it
    prefork.wait_log(f"Task apps.basic.sleep[{running.id}] succeeded")  # not killed by the restart


#: what workerctl sends each command with (the words after its name)
WORDS = {
    "query_task": ["no-such-task"], "registered": ["rate_limit"], "conf": ["false"], "memdump": ["3"],
    "objgraph": ["LogicalClock", "1", "1"], "rate_limit": ["apps.basic.add", "100/m"],
    "time_limit": ["apps.basic.add", "10", "20"], "revoke": ["no-such-task"],
    "terminate": ["TERM", "no-such-task"], "revoke_by_stamped_headers": ["batch=none"],
    "autoscale": ["2", "1"], "pool_grow": ["1"], "pool_shrink": ["1"], "add_consumer": ["workerctl-extra"],
    "cancel_consumer": ["workerctl-extra"],
}


def test_workerctl_sends_every_command_celerys_command_line_lists(worker, client):
    import json

    from celery.worker.control import Panel
    from click.testing import CliRunner

    from worker_core.cli.group import main

    if "objgraph" not in sys.modules and importlib.util.find_spec("objgraph") is None:
        WORDS.pop("objgraph")
    for name, info in sorted(Panel.meta.items()):
        if not info.visible or name == "shutdown":
            continue
        words = WORDS.get(name, [])
        result = CliRunner().invoke(main, [info.type, name.replace("_", "-"), *words, "-b", REDIS_URL, "-d",
                                           worker.name, "--json", "-t", "10"], catch_exceptions=False)
        assert result.exit_code == 0, f"workerctl {info.type} {name}: {result.output}"
        reply = json.loads(result.stdout)
        assert worker.name in reply, f"{name}: {result.stdout}"
        if name == "objgraph":
            os.unlink(reply[worker.name]["filename"])

"""Celery's monitoring events on the wire: worker heartbeats by default, task events with -E or
once asked by ``enable_events``. (A Celery receiver reading them: ``test_interop_celery.py``.)"""

from __future__ import annotations

import os

import pytest
from apps import basic
from conftest import REDIS_TEST_URL
from event_listener import Listener
from workers import TESTS, WorkerProcess, ask


@pytest.fixture
def listener(redis_url):
    listener = Listener(redis_url)
    yield listener
    listener.close()


@pytest.fixture
def app_on_redis(redis_url):
    basic.app.conf.update(broker_url=redis_url, result_backend=REDIS_TEST_URL)
    yield basic.app
    basic.app.close()


def test_heartbeats_by_default_and_task_events_once_enabled(workers, listener, app_on_redis):
    name = "events-test@localhost"
    worker = workers.start("-n", name, "--heartbeat-interval", "0.3", broker=listener.connection.as_uri(),
                           backend=REDIS_TEST_URL)
    listener.until(lambda: len(listener.events("worker-heartbeat")) >= 2)
    online, beat = listener.events("worker-online")[0], listener.events("worker-heartbeat")[0]
    assert online["hostname"] == beat["hostname"] == name and online["pid"] == worker.pid
    assert beat["freq"] == 0.3 and beat["sw_ident"] == "py-worker" and len(beat["loadavg"]) == 3
    assert beat["clock"] > online["clock"] and isinstance(beat["timestamp"], float)
    first = listener.messages[0]
    assert first.content_type == "application/json" and first.headers == {"hostname": name}

    assert basic.add.delay(1, 1).get(timeout=20) == 2  # no task events without -E
    assert ask(basic.app, "enable_events") == {"ok": "task events enabled"}
    assert ask(basic.app, "enable_events") == {"ok": "task events already enabled"}
    result = basic.add.delay(2, 2)
    assert result.get(timeout=20) == 4
    listener.until(lambda: listener.events("task-succeeded"))
    tasks = [e for e in listener.events() if e["type"].startswith("task-")]
    assert [e["type"] for e in tasks] == ["task-received", "task-started", "task-succeeded"]
    assert {e["uuid"] for e in tasks} == {result.id}
    assert tasks[0]["name"] == "apps.basic.add" and tasks[0]["args"] == "(2, 2)"
    assert tasks[2]["result"] == "4" and tasks[2]["runtime"] >= 0
    assert worker.log().count("Events of group {task} enabled by remote") == 1

    assert ask(basic.app, "disable_events") == {"ok": "task events disabled"}
    assert basic.add.delay(3, 3).get(timeout=20) == 6
    beats = len(listener.events("worker-heartbeat"))
    assert ask(basic.app, "heartbeat") is None  # sends one now, answers nothing
    listener.until(lambda: len(listener.events("worker-heartbeat")) > beats)
    assert len([e for e in listener.events() if e["type"].startswith("task-")]) == 3
    worker.stop()
    listener.until(lambda: listener.events("worker-offline"))


def test_without_heartbeat_no_worker_events_and_with_e_task_events_from_the_start(
        workers, listener, app_on_redis):
    workers.start("--without-heartbeat", "-E", broker=listener.connection.as_uri(), backend=REDIS_TEST_URL)
    result = basic.boom.delay("on the wire")
    with pytest.raises(basic.Boom):
        result.get(timeout=20)
    listener.until(lambda: listener.events("task-failed"))
    [failed] = listener.events("task-failed")
    assert failed["exception"] == "Boom('on the wire')" and "raise Boom(message)" in failed["traceback"]
    assert not [e for e in listener.events() if e["type"].startswith("worker-")]


def test_a_bad_heartbeat_interval_stops_before_anything_starts(tmp_path, embedded_broker):
    env = dict(os.environ, WORKER_BROKER_URL=embedded_broker)
    for value in ("0", "soon"):
        worker = WorkerProcess(["-A", "apps.basic", "--heartbeat-interval", value], env, tmp_path / "bad.log",
                               cwd=TESTS)
        try:
            assert worker.process.wait(timeout=20) == 2, worker.log()
            assert "--heartbeat-interval" in worker.log() and "must be a number of seconds" in worker.log()
        finally:
            worker.kill()


def test_the_event_options_appear_in_help_as_plain_switches():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "worker_core", "worker", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "-E, --task-events, --events Send task events" in text and "--without-heartbeat Send no" in text
    assert "[default: (" not in text  # a plugin option's name is not a default to show

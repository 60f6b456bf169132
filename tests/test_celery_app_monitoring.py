"""Remote control and monitoring of a Celery project under ``workerctl worker`` (worker-celery):
Celery's own ``inspect``/``control`` client, ``workerctl inspect -A proj`` and Flower (started on
a free port, asked through its HTTP API) see the worker as they see one running this project's
App, Celery's built-in tasks included."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server
from tls_servers import stop_process
from workers import wait_for

pytestmark = pytest.mark.timeout(120)

PROJ = "apps.celery_proj.tasks"
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def broker() -> str:
    require_server(REDIS_PORT, "Redis")
    return empty_redis(redis_db(3))


@pytest.fixture(scope="module")
def worker(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    results = empty_redis(redis_db(4))
    factory = WorkerFactory(tmp_path_factory.mktemp("monitored"))
    env = {"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results}
    yield factory.start("-c", "2", "-E", "--heartbeat-interval", "0.5", app="apps.celery_proj",
                        pool="prefork", env=env)
    factory.cleanup()


def node(worker: Any) -> str:
    return str(worker.name)


@pytest.fixture
def client(broker: str) -> Iterator[Any]:
    from celery import Celery

    app = Celery("monitor", broker=broker, backend=redis_db(4))
    app.conf.broker_connection_retry_on_startup = True
    yield app
    app.close()


def test_celerys_inspect_sees_the_project_and_its_built_in_tasks(worker, client):
    name = node(worker)
    inspect = client.control.inspect(destination=[name], timeout=5)
    assert inspect.ping() == {name: {"ok": "pong"}}
    registered = inspect.registered()[name]
    assert f"{PROJ}.add" in registered
    builtins = {"celery.chord_unlock", "celery.map", "celery.starmap", "celery.chunks"}
    assert not builtins & set(registered)  # as Celery: the built-in tasks only when asked for
    asked = client.control.broadcast("registered", arguments={"builtins": True}, destination=[name],
                                     reply=True, timeout=5)
    assert builtins <= set(asked[0][name])
    stats = inspect.stats()[name]
    assert stats["pool"]["max-concurrency"] == 2
    assert [queue["name"] for queue in inspect.active_queues()[name]] == ["celery"]


def test_celerys_control_changes_a_rate_limit_and_revokes(worker, client):
    name = node(worker)
    replies = client.control.rate_limit(f"{PROJ}.add", "100/m", destination=[name], reply=True, timeout=5)
    assert "ok" in replies[0][name]
    worker.wait_log(f"New rate limit for tasks of type {PROJ}.add: 100/m.")
    client.control.rate_limit(f"{PROJ}.add", "0", destination=[name], reply=True, timeout=5)
    waiting = client.send_task(f"{PROJ}.add", (1, 1), countdown=60)
    worker.wait_log(f"{waiting.id}] received")
    client.control.revoke(waiting.id, destination=[name], reply=True, timeout=5)
    wait_for(lambda: waiting.state == "REVOKED", 10, message="REVOKED")


def test_workerctl_inspect_reaches_the_worker_through_the_celery_app(worker, broker):
    command = [sys.executable, "-m", "worker_core", "inspect", "registered", "-A", "apps.celery_proj",
               "-d", node(worker), "--json"]
    result = subprocess.run(command, cwd=TESTS, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, CELERY_BROKER_URL=broker))
    assert result.returncode == 0, result.stderr
    assert f"{PROJ}.whoami" in json.loads(result.stdout)[node(worker)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_flower_sees_the_worker_and_its_tasks(worker, client, broker, tmp_path):
    port = _free_port()
    log = (tmp_path / "flower.log").open("wb")
    command = [sys.executable, "-m", "celery", "--broker", broker, "flower", f"--port={port}",
               "--address=127.0.0.1"]
    flower = subprocess.Popen(command, cwd=TESTS, stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, FLOWER_UNAUTHENTICATED_API="true"))
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return bool(_get(f"{base}/api/workers?refresh=1").get(node(worker)))
            except OSError:
                return False

        wait_for(up, 30, interval=0.3, message="Flower to list the worker")
        listed = _get(f"{base}/api/workers?refresh=1")[node(worker)]
        # each name as Celery lists it, with its info items ("proj.add [rate_limit=0]" once lifted)
        assert f"{PROJ}.add" in [item.split(" [")[0] for item in listed["registered"]]
        assert listed["stats"]["pool"]["max-concurrency"] == 2
        result = client.send_task(f"{PROJ}.add", (40, 2))
        assert result.get(timeout=10) == 42

        def seen() -> Any:
            task = _get(f"{base}/api/tasks").get(result.id)
            return task if task and task.get("state") == "SUCCESS" else None

        task = wait_for(seen, 15, interval=0.3, message="Flower to see the task succeed")
        assert task["name"] == f"{PROJ}.add" and task["worker"] == node(worker)
        assert task["result"] == "42"
    finally:
        stop_process(flower)
        log.close()

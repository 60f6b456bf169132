"""Each way a broker refuses the worker is one log line saying what was refused and the fix: a
login (the worker stops), a virtual host that is missing or not allowed (retried as Celery
retries it, one line per attempt), a TLS handshake, a host that does not answer; and an app or
task module that fails to import names its file and line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AMQP_VHOST, require_server
from faults import RedisServer, free_port
from workers import TESTS, WorkerProcess

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = '{"interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}'


def start(tmp_path: Path, broker: str, *args: str, app: str = "apps.basic") -> WorkerProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    env.update(WORKER_BROKER_URL=broker, WORKER_BROKER_TRANSPORT_OPTIONS=FAST_RETRY,
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS)]))
    log = tmp_path / f"{uuid.uuid4().hex}.log"
    return WorkerProcess(["-A", app, "-P", "solo", "-l", "INFO", *args], env, log)


@pytest.fixture
def refused(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.kill()


def lines(worker: WorkerProcess, text: str) -> list[str]:
    return [line for line in worker.log().splitlines() if text in line]


def assert_stops_with_one_line(worker: WorkerProcess, expected: str) -> None:
    assert worker.process.wait(timeout=60) == 1, worker.log()
    assert "Traceback" not in worker.log()
    (line,) = lines(worker, "worker stopped:")
    assert expected in line, line


def assert_retried_one_line_each(worker: WorkerProcess, expected: str) -> None:
    worker.wait_log(" seconds... (2/100)", timeout=60)
    attempts = lines(worker, "consumer: Cannot connect to")
    assert len(attempts) >= 2, attempts
    assert all(expected in line and "Trying again in" in line for line in attempts), attempts
    assert "Traceback" not in worker.log() and "\nTrying again" not in worker.log()


def test_a_wrong_rabbitmq_password_stops_the_worker_with_one_line(tmp_path: Path, refused: list) -> None:
    require_server(5672, "RabbitMQ")
    refused.append(worker := start(tmp_path, f"amqp://guest:wrong@127.0.0.1:5672/{AMQP_VHOST}"))
    assert_stops_with_one_line(worker, "cannot connect to amqp://guest:**@127.0.0.1:5672/")
    (line,) = lines(worker, "worker stopped:")
    assert line.endswith("RabbitMQ refused the login of user 'guest' (ACCESS_REFUSED): check the user name "
                         "and password in the broker URL")
    assert "wrong" not in worker.log()


def test_a_missing_virtual_host_is_retried_as_celery_retries_it_one_line_each(tmp_path: Path,
                                                                              refused: list) -> None:
    require_server(5672, "RabbitMQ")
    vhost = f"missing-{uuid.uuid4().hex[:8]}"
    refused.append(worker := start(tmp_path, f"amqp://guest:guest@127.0.0.1:5672/{vhost}"))
    assert_retried_one_line_each(worker, f"RabbitMQ has no virtual host '{vhost}' (NOT_ALLOWED): create "
                                         f"it (rabbitmqctl add_vhost {vhost}) or fix the broker URL's path")
    assert worker.stop() == 0


@pytest.fixture
def forbidden_vhost() -> Iterator[str]:
    program = shutil.which("rabbitmqctl")
    if program is None:
        pytest.skip("rabbitmqctl is not installed")
    vhost = f"forbidden-{uuid.uuid4().hex[:8]}"
    subprocess.run([program, "-q", "add_vhost", vhost], check=True, capture_output=True, timeout=60)
    yield vhost
    subprocess.run([program, "-q", "delete_vhost", vhost], capture_output=True, timeout=60)


def test_a_virtual_host_the_user_may_not_use_says_how_to_grant_it(tmp_path: Path, refused: list,
                                                                  forbidden_vhost: str) -> None:
    refused.append(worker := start(tmp_path, f"amqp://guest:guest@127.0.0.1:5672/{forbidden_vhost}"))
    assert_retried_one_line_each(
        worker, f"RabbitMQ does not let user 'guest' use virtual host '{forbidden_vhost}' (NOT_ALLOWED): "
                f"grant it (rabbitmqctl set_permissions -p {forbidden_vhost} guest '.*' '.*' '.*')")
    assert worker.stop() == 0


def test_a_refused_tls_handshake_is_one_line_per_attempt(tmp_path: Path, refused: list) -> None:
    require_server(5672, "RabbitMQ")
    refused.append(worker := start(tmp_path, f"amqps://guest:guest@127.0.0.1:5672/{AMQP_VHOST}"))
    assert_retried_one_line_each(worker, "the TLS handshake failed ([SSL: WRONG_VERSION_NUMBER]")
    assert worker.stop() == 0


def test_a_host_that_does_not_answer_is_one_line_per_attempt(tmp_path: Path, refused: list) -> None:
    refused.append(worker := start(tmp_path, f"amqp://guest:guest@127.0.0.1:{free_port()}//"))
    assert_retried_one_line_each(worker, "Connection refused")
    assert worker.stop() == 0


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, password="s3cret").start()
    yield server
    server.stop()


def test_a_wrong_or_missing_redis_password_stops_the_worker_with_one_line(
        tmp_path: Path, refused: list, redis_with_password: RedisServer) -> None:
    port = redis_with_password.port
    refused.append(wrong := start(tmp_path, f"redis://:nope@127.0.0.1:{port}/0"))
    assert_stops_with_one_line(wrong, "Redis refused the login (invalid username-password pair")
    refused.append(missing := start(tmp_path, f"redis://127.0.0.1:{port}/0"))
    assert_stops_with_one_line(missing, "Redis asks for a password and the broker URL gives none")
    refused.append(right := start(tmp_path, f"redis://:s3cret@127.0.0.1:{port}/0"))
    right.wait_ready()
    assert right.stop() == 0


# -- import errors ----------------------------------------------------------------------------------


def broken_project(tmp_path: Path) -> Path:
    package = tmp_path / "brokenproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "app.py").write_text(textwrap.dedent("""\
        from worker_core import App

        app = App("brokenproj")
        from brokenproj import tasks  # noqa: E402,F401
        """))
    (package / "tasks.py").write_text(textwrap.dedent("""\
        from brokenproj.app import app


        @app.task
        def add(x, y):
            return x + y

        settings = load_settings()  # a name the module never defined
        """))
    (package / "celeryapp.py").write_text(textwrap.dedent("""\
        from celery import Celery

        app = Celery("brokenproj", include=["brokenproj.celerytasks"])
        """))
    (package / "celerytasks.py").write_text("import requests_that_are_not_installed\n")
    return package


def workerctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    return subprocess.run([sys.executable, "-m", "worker_core", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_an_import_error_in_a_task_module_names_the_file_and_line(tmp_path: Path) -> None:
    package = broken_project(tmp_path)
    done = workerctl(tmp_path, "worker", "-A", "brokenproj.app", "-b", "embedded://")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"Error: the app module 'brokenproj.app' failed to import: NameError: name 'load_settings' is not "
        f"defined ({package / 'tasks.py'}:8)")
    debug = workerctl(tmp_path, "worker", "-A", "brokenproj.app", "-b", "embedded://", "-l", "DEBUG")
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert f'File "{package / "tasks.py"}", line 8, in <module>' in debug.stderr
    assert debug.stderr.rstrip().endswith(f"({package / 'tasks.py'}:8)")


def test_an_import_error_in_a_celery_app_s_task_module_names_the_file_and_line(tmp_path: Path) -> None:
    package = broken_project(tmp_path)
    done = workerctl(tmp_path, "worker", "-A", "brokenproj.celeryapp", "-b", "embedded://")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "Error: a task module of the Celery app 'brokenproj.celeryapp' (imports, include, autodiscovery) "
        "failed to import: ModuleNotFoundError: No module named 'requests_that_are_not_installed' "
        f"({package / 'celerytasks.py'}:1)")


def test_an_include_module_that_fails_names_it(tmp_path: Path) -> None:
    package = broken_project(tmp_path)
    done = workerctl(tmp_path, "worker", "-A", "brokenproj.celeryapp", "-I", "brokenproj.tasks", "-b",
                     "embedded://")
    assert "the module 'brokenproj.tasks' (--include) failed to import: NameError" in done.stderr
    assert f"({package / 'tasks.py'}:8)" in done.stderr
    missing = workerctl(tmp_path, "worker", "-A", "brokenproj.celeryapp", "-I", "brokenproj.nothere")
    assert "--include brokenproj.nothere: no such module" in missing.stderr

"""``workerctl call --wait`` gives up after ``--timeout`` (60 s unless told), naming the task it
waited for and what to check, and waits for ever with ``--timeout 0``.

Each case runs the real ``workerctl`` in a subprocess against an embedded queue of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workers import TESTS, wait_for

from worker_core import App
from worker_core.app.broker import connection_for, transport_for
from worker_core.cli.call_cmd import DEFAULT_WAIT

#: runs ``workerctl`` with a shorter default wait, so a test of the default does not take a minute
SHORT_DEFAULT = """
import sys
from worker_core.cli import call_cmd
call_cmd.DEFAULT_WAIT = float(sys.argv.pop(1))
from worker_core.cli import run
sys.argv[0] = "workerctl"
run()
"""


@pytest.fixture
def broker(tmp_path: Path) -> str:
    return f"embedded://{tmp_path}/queue.db"


def environment(broker: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    env.update(PYTHONPATH=str(TESTS), WORKER_BROKER_URL=broker)
    return env


def call(broker: str, *args: str, default_wait: float | None = None,
         timeout: float = 20) -> subprocess.CompletedProcess[str]:
    program = ["-m", "worker_core"] if default_wait is None else ["-c", SHORT_DEFAULT, str(default_wait)]
    return subprocess.run([sys.executable, *program, "call", "apps.basic.add", "--args", "[1, 2]", *args],
                          cwd=TESTS, env=environment(broker), capture_output=True, text=True, timeout=timeout)


def waiting(broker: str, queue: str = "celery") -> int:
    app = App("probe", broker=broker, result_backend="disabled")
    try:
        with connection_for(app.plugins, broker, app.settings) as connection:
            return int(transport_for(app.plugins, broker, app.settings).queue_depth(connection, queue))
    finally:
        app.close()


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("Error:")]


def test_wait_with_no_worker_gives_up_after_the_timeout_naming_the_task_and_what_to_check(
        broker: str) -> None:
    started = time.monotonic()
    done = call(broker, "--wait", "--timeout", "0.5")
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 15
    task_id = done.stdout.strip()
    assert len(task_id) == 36, done.stdout
    assert error_lines(done) == [
        f"Error: no worker finished task apps.basic.add[{task_id}] within 0.5s (state: PENDING): "
        f"is a worker running on {broker} and consuming queue 'celery'? Wait longer with "
        f"--timeout SECONDS, or --timeout 0 to wait for ever"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert waiting(broker) == 1  # sent, and still there for a worker to take


def test_the_timeout_line_names_the_queue_the_task_went_to(broker: str) -> None:
    done = call(broker, "--wait", "--timeout", "0.2", "-Q", "reports")
    assert done.returncode == 1, done.stderr
    assert "consuming queue 'reports'?" in error_lines(done)[0]
    assert waiting(broker, "reports") == 1


def test_wait_without_timeout_gives_up_after_the_default(broker: str) -> None:
    assert DEFAULT_WAIT == 60
    done = call(broker, "--wait", default_wait=0.3)
    assert done.returncode == 1, done.stderr
    assert f"apps.basic.add[{done.stdout.strip()}] within 0.3s (state: PENDING)" in error_lines(done)[0]


def test_help_says_what_the_timeout_defaults_to_and_how_to_wait_for_ever() -> None:
    done = subprocess.run([sys.executable, "-m", "worker_core", "call", "--help"], capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert "(default 60; 0 waits for ever)" in " ".join(done.stdout.split())


def test_timeout_zero_waits_past_the_default_until_a_worker_finishes_the_task(broker: str, workers) -> None:
    default = 0.1
    program = [sys.executable, "-c", SHORT_DEFAULT, str(default), "call", "apps.basic.add",
               "--args", "[1, 2]", "--wait", "--timeout", "0"]
    caller = subprocess.Popen(program, cwd=TESTS, env=environment(broker), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: waiting(broker) == 1, message="the task in the queue")
        sent = time.monotonic()
        workers.start(broker=broker, env={"PYTHONPATH": str(TESTS)})
        assert time.monotonic() - sent > default  # the worker came after the default wait was over
        out, err = caller.communicate(timeout=30)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
    assert caller.returncode == 0, err
    assert out.splitlines()[1:] == ["3"]

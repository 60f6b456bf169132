"""Runs ``hooks_app`` under a real worker on Redis, sends it two tasks, and asks its command.

    python examples/plugins/run_hooks_app.py

The worker is a process of its own, as ``workerctl worker -A hooks_app -P solo -l INFO`` starts
it; the command is sent with Celery's client, which reaches this worker's remote control as it
reaches a Celery worker's. Needs Redis on 127.0.0.1:6379 (``HOOKS_APP_BROKER`` names another).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if os.environ.get("WORKER_TEST_REDIS"):  # the test suite's own Redis
    os.environ.setdefault("HOOKS_APP_BROKER", f"redis://{os.environ['WORKER_TEST_REDIS']}/12")

import hooks_app  # noqa: E402


def main() -> int:
    worker = subprocess.Popen([sys.executable, "-m", "worker_core", "worker", "-A", "hooks_app", "-P", "solo",
                               "-l", "INFO", "-n", f"hooks-{os.getpid()}@localhost"], cwd=HERE)
    try:
        print(hooks_app.add.delay(2, 3).get(timeout=30), hooks_app.add.delay(4, 5).get(timeout=30))
        from celery import Celery

        control = Celery(broker=hooks_app.BROKER).control
        name = f"hooks-{os.getpid()}@localhost"
        deadline = time.monotonic() + 30
        while not control.ping(destination=[name], timeout=0.5):  # subscribed once it answers
            if time.monotonic() > deadline:
                raise SystemExit("the worker does not answer ping")
        [reply] = control.broadcast("tasks_seen", destination=[name], reply=True, timeout=5)
        print(reply)
        assert reply[name] == {"ok": {"hooks_app.add": 2}}, reply
        return 0
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())

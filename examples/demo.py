"""Run a worker on the embedded transport (no server needed) and watch it complete tasks.

    python examples/demo.py [--pool NAME] [--concurrency N]

The worker runs as a separate process, exactly as ``workerctl worker -A tasks -l INFO`` would;
this script sends it work through the same queue file and prints the results, then stops the
worker with SIGTERM (a warm shutdown).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def say(text: str) -> None:
    print(f"demo> {text}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", help="pool to run (default: the worker's default)")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="worker-demo-") as tmp:
        broker = f"embedded://{tmp}/queue.db"
        os.environ["WORKER_BROKER_URL"] = broker
        command = [sys.executable, "-m", "worker_core", "worker", "-A", "tasks", "-l", "INFO",
                   "-c", str(args.concurrency)]
        if args.pool:
            command += ["-P", args.pool]
        say(f"starting: workerctl {' '.join(command[3:])}  (broker {broker})")
        worker = subprocess.Popen(command, cwd=HERE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            return run_client(worker)
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()


def run_client(worker: subprocess.Popen[bytes]) -> int:
    sys.path.insert(0, str(HERE))
    import tasks

    started = time.monotonic()
    sent = {
        "add(2, 3)": tasks.add.delay(2, 3),
        "mul(6, 7)": tasks.mul.delay(6, 7),
        "add(40, 2) with a 1 s countdown": tasks.add.apply_async((40, 2), countdown=1),
        "flaky(succeed_after=2)": tasks.flaky.delay(2),
        "sleep(0.5)": tasks.sleep.delay(0.5),
    }
    failing = tasks.fail.delay("this task fails on purpose")
    say(f"sent {len(sent) + 1} tasks")
    for label, result in sent.items():
        value = result.get(timeout=60)
        say(f"{label} = {value!r}   [{result.state}, {time.monotonic() - started:.2f}s]")
    try:
        failing.get(timeout=60)
    except ValueError as exc:
        say(f"fail(...) raised {type(exc).__name__}({exc}) in the worker, re-raised here   [{failing.state}]")
    say("stopping the worker with SIGTERM (warm shutdown)")
    worker.send_signal(signal.SIGTERM)
    code = worker.wait(timeout=30)
    say(f"worker exited with status {code}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

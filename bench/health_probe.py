"""What one exec probe costs: ``workerctl health ready`` against this worker, beside ``celery
inspect ping``, the usual exec probe of a Celery worker, both running the same Celery app.

    python bench/health_probe.py --broker redis://127.0.0.1:6379/15 --repeat 10

Both workers run ``apps/celery_project.py`` (this one through worker-celery) with the solo pool.
Each row is the median over ``--repeat`` probes of the probe process's wall time, from spawning it
to its exit, and of its CPU time (user and system), and whether every probe passed. The
probe of this worker reads the state file the worker keeps (``--health-file``); Celery's imports
the app, connects to the broker and waits for the worker's reply.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float, bool]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=APPS, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode == 0


def wait_until(check: list[str], env: dict[str, str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not timed(check, env)[2]:
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker never answered {' '.join(check)}")
        time.sleep(0.5)


def measure(name: str, worker: list[str], probe: list[str], env: dict[str, str], repeat: int) -> None:
    log = open(Path(tempfile.gettempdir()) / f"bench-probe-{name}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(worker, cwd=APPS, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(probe, env)
        runs = [timed(probe, env) for _ in range(repeat)]
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
    walls, cpus, passed = zip(*runs, strict=True)
    print(f"{name:28} {statistics.median(walls) * 1000:>9.1f} {statistics.median(cpus) * 1000:>9.1f} "
          f"{'yes' if all(passed) else 'NO':>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_RESULTS="", PYTHONPATH=str(APPS))
    state = Path(tempfile.mkdtemp(prefix="bench-probe-")) / "health.json"
    node = f"probe-{uuid.uuid4().hex[:6]}@localhost"
    print(f"{'probe':28} {'wall ms':>9} {'CPU ms':>9} {'passed':>7}")
    measure("workerctl health ready",
            [sys.executable, "-m", "worker_core", "worker", "-A", "celery_project", "-P", "solo", "-n", node,
             "--without-heartbeat", "--health-file", str(state)],
            [sys.executable, "-m", "worker_core", "health", "ready", "--file", str(state)], env, args.repeat)
    measure("celery inspect ping",
            [sys.executable, "-m", "celery", "-A", "celery_project", "worker", "-P", "solo", "-n", node,
             "--without-heartbeat", "--without-gossip", "--without-mingle"],
            [sys.executable, "-m", "celery", "-A", "celery_project", "inspect", "ping", "-d", node,
             "--timeout", "5"], env, args.repeat)


if __name__ == "__main__":
    main()

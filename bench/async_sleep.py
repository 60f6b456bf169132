"""Thousands of I/O-bound tasks at once: N tasks that each wait one second (``await
asyncio.sleep(1)``, or ``time.sleep(1)`` where a worker runs no ``async def``), at concurrency C in
one worker process, side by side on one Redis: this worker's ``-P asyncio``, Celery ``-P threads``
and ``-P gevent``, taskiq and SAQ.

    python bench/async_sleep.py --broker redis://127.0.0.1:6379/15 --tasks 10000 -c 1000
    python bench/async_sleep.py --broker redis://127.0.0.1:6379/15 --tasks 20000 -c 1280   # streaQ's shape

How it measures, the same way for every contender (each stores every task's result on the same
Redis: this worker and Celery in Celery's format, taskiq with its Redis result backend, SAQ in its
job records; taskiq uses its Redis list broker):

- the tasks are queued while no worker runs, then the worker starts;
- wall time: from the first task's start to the last task's end (each task appends a byte to a
  file as it starts and as it ends; the driver reads their sizes every 2 ms), against the ideal
  of N / C seconds;
- CPU per task: CPU seconds of the worker's processes over that time, per task;
- memory per concurrent task: the largest PSS of the worker's processes (summed, read every 0.2
  s) while the tasks run, less their PSS when idle (the same worker started on an empty queue and
  read after 3 s), divided by C; the peak PSS is shown too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
sys.path.insert(0, str(HERE))

from compare import cpu_seconds, kill_tree, pss_mib, stop  # noqa: E402

QUEUE = "bench_sleep"
CONTENDERS = ("worker", "celery-threads", "celery-gevent", "taskiq", "saq")


def command(kind: str, concurrency: int, processes: int) -> list[str]:
    py = sys.executable
    if kind == "worker":
        extra = ["--asyncio-processes", str(processes)] if processes > 1 else []
        return [py, "-m", "worker_core", "worker", "-A", "sleep_worker_app", "-P", "asyncio",
                "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-heartbeat", *extra]
    if kind.startswith("celery"):
        return [py, "-m", "celery", "-A", "sleep_celery_app", "worker", "-P", kind.split("-")[1], "-c",
                str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat"]
    if kind == "taskiq":
        return [py, "-m", "taskiq", "worker", "sleep_taskiq_app:broker", "--workers", "1",
                "--max-async-tasks", str(concurrency), "--log-level", "WARNING"]
    saq = shutil.which("saq", path=str(Path(sys.executable).parent)) or "saq"
    return [saq, "sleep_saq_app.settings", "--workers", "1", "--quiet"]


def flush(broker: str) -> None:
    import redis

    redis.Redis.from_url(broker).flushdb()


def enqueue(kind: str, broker: str, tasks: int, seconds: float) -> None:
    os.environ["BENCH_BROKER"] = broker
    sys.path.insert(0, str(APPS))
    if kind in ("worker", "celery-threads", "celery-gevent"):
        from worker_core import App

        app = App("bench-sleep-driver", broker=broker, result_backend=broker)
        for _ in range(tasks):
            app.send_task("bench.sleep1", (seconds,), queue=QUEUE)
        app.close()
        return
    asyncio.run(_enqueue_async(kind, tasks, seconds))


async def _enqueue_async(kind: str, tasks: int, seconds: float) -> None:
    if kind == "taskiq":
        import sleep_taskiq_app

        await sleep_taskiq_app.broker.startup()
        for start in range(0, tasks, 500):
            batch = range(start, min(start + 500, tasks))
            await asyncio.gather(*(sleep_taskiq_app.sleep1.kiq(seconds) for _ in batch))
        await sleep_taskiq_app.broker.shutdown()
        return
    import sleep_saq_app

    queue = sleep_saq_app.queue
    await queue.connect()
    for start in range(0, tasks, 500):
        await asyncio.gather(*(queue.enqueue("sleep1", seconds=seconds, timeout=600)
                               for _ in range(start, min(start + 500, tasks))))
    await queue.disconnect()


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def spawn(kind: str, args: argparse.Namespace, marks: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_MARK_DIR=str(marks), PYTHONPATH=str(APPS),
               BENCH_CONCURRENCY=str(args.concurrency))
    return subprocess.Popen(command(kind, args.concurrency, args.processes), cwd=APPS, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def measure(kind: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    log = work / f"{kind}.log"
    flush(args.broker)
    marks = Path(tempfile.mkdtemp(dir=work))
    process = spawn(kind, args, marks, log)
    try:
        time.sleep(3.0)
        idle = pss_mib(process.pid)
    finally:
        stop(process)
    flush(args.broker)
    enqueue(kind, args.broker, args.tasks, args.seconds)
    marks = Path(tempfile.mkdtemp(dir=work))
    started, done = marks / "started", marks / "done"
    process = spawn(kind, args, marks, log)
    try:
        deadline = time.monotonic() + 120
        while size(started) == 0:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{kind}: no task started (see {log})")
            time.sleep(0.002)
        first = time.monotonic()
        cpu_first = cpu_seconds(process.pid)
        peak, in_flight, sampled = 0.0, 0, 0.0
        limit = first + max(20 * args.tasks * args.seconds / args.concurrency, 120)
        while size(done) < args.tasks:
            now = time.monotonic()
            if now > limit or process.poll() is not None:
                raise RuntimeError(f"{kind}: {size(done)} of {args.tasks} tasks done (see {log})")
            if now - sampled >= 0.2:
                sampled = now
                peak = max(peak, pss_mib(process.pid))
                in_flight = max(in_flight, size(started) - size(done))
            time.sleep(0.002)
        last = time.monotonic()
        cpu_last = cpu_seconds(process.pid)
    finally:
        stop(process)
        if process.poll() is None:
            kill_tree(process)
    ideal = args.tasks * args.seconds / args.concurrency
    wall = last - first
    return {"wall": wall, "ideal_pct": ideal / wall * 100,
            "cpu_ms": (cpu_last - cpu_first) / args.tasks * 1000, "peak": peak, "idle": idle,
            "per_task_kib": max(peak - idle, 0.0) * 1024 / args.concurrency, "in_flight": in_flight}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--concurrency", "-c", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0, help="how long each task waits")
    parser.add_argument("--processes", type=int, default=1, help="this worker's loop processes")
    parser.add_argument("--only", action="append", choices=CONTENDERS, help="run only these (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sleep-"))
    results: dict[str, dict[str, float] | str] = {}
    for kind in args.only or CONTENDERS:
        try:
            results[kind] = measure(kind, args, work)
        except (RuntimeError, ImportError, FileNotFoundError) as exc:
            results[kind] = str(exc)
        print(f"{kind}: {results[kind]}", flush=True)
    ideal = args.tasks * args.seconds / args.concurrency
    print(f"\n{args.tasks} tasks of {args.seconds:g} s at concurrency {args.concurrency} in one process "
          f"(ideal {ideal:.1f} s); logs in {work}\n")
    print("| contender | wall s | % of ideal | CPU/task ms | peak PSS MiB | KiB per concurrent task "
          "| most in flight |")
    print("|---|---|---|---|---|---|---|")
    for kind, row in results.items():
        if isinstance(row, str):
            print(f"| {kind} | failed: {row} |||||")
            continue
        print(f"| {kind} | {row['wall']:.2f} | {row['ideal_pct']:.0f} % | {row['cpu_ms']:.3f} "
              f"| {row['peak']:.1f} | {row['per_task_kib']:.1f} | {row['in_flight']:.0f} |")


if __name__ == "__main__":
    main()

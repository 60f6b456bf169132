"""Thousands of I/O-bound tasks at once: N tasks that each wait one second (``await
asyncio.sleep(1)``, or ``time.sleep(1)`` where a worker runs no ``async def``), at concurrency C in
one worker process, side by side on one Redis: this worker's ``-P asyncio``, Celery ``-P threads``
and ``-P gevent``, taskiq, SAQ and streaQ, beside a floor that does only the unavoidable work.

    python bench/async_sleep.py --broker redis://127.0.0.1:6379/15 --tasks 10000 -c 1000
    python bench/async_sleep.py --broker redis://127.0.0.1:6379/15 --tasks 20000 -c 1280   # streaQ's shape

The contenders run one after the other in each round (``--repeat`` rounds), so that each figure
of a round was taken on the same machine in the same minutes; the load average is read before
and after each run (``/proc/loadavg``), since on a shared machine every wall time grows with it.

How it measures, the same way for every contender (each stores every task's result on the same
Redis: this worker and Celery in Celery's format, taskiq with its Redis result backend, SAQ in its
job records, streaQ in its result keys; taskiq uses its Redis list broker, streaQ its streams):

- the tasks are queued while no worker runs, then the worker starts;
- wall time: from the first task's start to the last task's end (each task appends a byte to a
  file as it starts and as it ends; the driver reads their sizes every 2 ms), against the ideal
  of N / C seconds; "most in flight" is the most tasks seen started and not ended at once;
- CPU per task: CPU seconds of the worker's processes over that time, per task;
- memory per concurrent task: the growth of the worker's PSS (its processes summed, read every
  0.2 s) from idle (the same worker, read 2 s after it ran 50 short tasks, so that what it does
  once on its first tasks is not counted) to its peak while the tasks run, divided by the most
  tasks it held in flight; for this worker, also the
  growth of its loop process alone (the worker's main process holds the prefetched messages,
  ``-c`` times the prefetch multiplier, 4, waiting for a slot).

The floor (``apps/sleep_floor.py``) is one bare asyncio loop on uvloop holding C sleeping
coroutines that each decoded a message: it takes the messages from the Redis list in batches,
awaits the sleep and stores the result in Celery's key, with no acknowledgement, lease, retry,
time limit, supervision or log. The worker's figures over the floor's, from the same round, tell
what the worker costs on that day's machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
sys.path.insert(0, str(HERE))

from compare import processes_cpu, stop, tree  # noqa: E402

QUEUE = "bench_sleep"
CONTENDERS = ("floor", "worker", "celery-threads", "celery-gevent", "taskiq", "saq", "streaq")
CELERY_FORMAT = ("floor", "worker", "celery-threads", "celery-gevent")
#: short tasks each contender runs before its idle memory is read
WARM_UP = 50


def command(kind: str, concurrency: int, processes: int) -> list[str]:
    py = sys.executable
    if kind == "floor":
        return [py, str(APPS / "sleep_floor.py")]
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
    if kind == "streaq":
        return [_script("streaq"), "run", "sleep_streaq_app:worker", "--workers", "1"]
    return [_script("saq"), "sleep_saq_app.settings", "--workers", "1", "--quiet"]


def _script(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def flush(broker: str) -> None:
    import redis

    redis.Redis.from_url(broker).flushdb()


def enqueue(kind: str, broker: str, tasks: int, seconds: float) -> None:
    os.environ["BENCH_BROKER"] = broker
    if str(APPS) not in sys.path:
        sys.path.insert(0, str(APPS))
    if kind in CELERY_FORMAT:
        from worker_core import App

        app = App("bench-sleep-driver", broker=broker, result_backend=broker)
        for _ in range(tasks):
            app.send_task("bench.sleep1", (seconds,), queue=QUEUE)
        app.close()
        return
    asyncio.run(_enqueue_async(kind, tasks, seconds))


async def _enqueue_async(kind: str, tasks: int, seconds: float) -> None:
    batches = [range(start, min(start + 500, tasks)) for start in range(0, tasks, 500)]
    if kind == "taskiq":
        import sleep_taskiq_app

        await sleep_taskiq_app.broker.startup()
        for batch in batches:
            await asyncio.gather(*(sleep_taskiq_app.sleep1.kiq(seconds) for _ in batch))
        await sleep_taskiq_app.broker.shutdown()
        return
    if kind == "streaq":
        import sleep_streaq_app

        async with sleep_streaq_app.worker:
            for batch in batches:
                await sleep_streaq_app.worker.enqueue_many([sleep_streaq_app.sleep1.enqueue(seconds)
                                                            for _ in batch])
        return
    import sleep_saq_app

    queue = sleep_saq_app.new_queue()  # its own: a queue is bound to the loop it first ran on
    await queue.connect()
    for batch in batches:
        await asyncio.gather(*(queue.enqueue("sleep1", seconds=seconds, timeout=600) for _ in batch))
    await queue.disconnect()


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def pss(pids: list[int]) -> float:
    """PSS in MiB of these processes, summed."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def spawn(kind: str, args: argparse.Namespace, marks: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_MARK_DIR=str(marks), PYTHONPATH=str(APPS),
               BENCH_CONCURRENCY=str(args.concurrency))
    return subprocess.Popen(command(kind, args.concurrency, args.processes), cwd=APPS, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def idle_memory(kind: str, args: argparse.Namespace, work: Path, log: Path) -> tuple[float, float]:
    """PSS of the whole worker and of its processes but the first, idle after a few short tasks
    (so what it does once, on its first tasks, is not counted as the tasks' memory)."""
    flush(args.broker)
    enqueue(kind, args.broker, WARM_UP, 0.01)
    marks = Path(tempfile.mkdtemp(dir=work))
    process = spawn(kind, args, marks, log)
    try:
        deadline = time.monotonic() + 120
        while size(marks / "done") < WARM_UP:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{kind}: the {WARM_UP} warm-up tasks did not end (see {log})")
            time.sleep(0.01)
        time.sleep(2.0)
        pids = tree(process.pid)
        return pss(pids), pss(pids[1:])
    finally:
        stop(process)


def measure(kind: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    log = work / f"{kind}.log"
    load_before = loadavg()
    idle, idle_children = idle_memory(kind, args, work, log)
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
        pids = tree(process.pid)
        cpu_first = processes_cpu(pids)
        peak = peak_children = 0.0
        in_flight, sampled = 0, 0.0
        limit = first + max(20 * args.tasks * args.seconds / args.concurrency, 120)
        while size(done) < args.tasks:
            now = time.monotonic()
            if now > limit or process.poll() is not None:
                raise RuntimeError(f"{kind}: {size(done)} of {args.tasks} tasks done (see {log})")
            in_flight = max(in_flight, size(started) - size(done))
            if now - sampled >= 0.2:
                sampled = now
                pids = tree(process.pid)
                peak, peak_children = max(peak, pss(pids)), max(peak_children, pss(pids[1:]))
            time.sleep(0.002)
        last = time.monotonic()
        cpu_last = processes_cpu(tree(process.pid))
    finally:
        stop(process)
    ideal = args.tasks * args.seconds / args.concurrency
    wall = last - first
    row = {"wall": wall, "ideal_pct": ideal / wall * 100,
           "cpu_ms": (cpu_last - cpu_first) / args.tasks * 1000, "peak": peak, "idle": idle,
           "in_flight": in_flight,
           "per_task_kib": max(peak - idle, 0.0) * 1024 / max(in_flight, 1),
           "load_before": load_before, "load_after": loadavg()}
    if kind == "worker":
        row["loop_kib"] = max(peak_children - idle_children, 0.0) * 1024 / max(in_flight, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--concurrency", "-c", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0, help="how long each task waits")
    parser.add_argument("--processes", type=int, default=1, help="this worker's loop processes")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, each running every contender once")
    parser.add_argument("--only", action="append", choices=CONTENDERS, help="run only these (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sleep-"))
    kinds = args.only or CONTENDERS
    rounds: list[dict[str, dict[str, float] | str]] = []
    for number in range(args.repeat):
        results: dict[str, dict[str, float] | str] = {}
        for kind in kinds:
            try:
                results[kind] = measure(kind, args, work)
            except (RuntimeError, ImportError, FileNotFoundError) as exc:
                results[kind] = str(exc)
            print(f"round {number + 1} {kind}: {results[kind]}", flush=True)
        rounds.append(results)
    ideal = args.tasks * args.seconds / args.concurrency
    print(f"\n{args.tasks} tasks of {args.seconds:g} s at concurrency {args.concurrency} in one process "
          f"(ideal {ideal:.1f} s); logs in {work}")
    for number, results in enumerate(rounds, 1):
        print(f"\nround {number}\n")
        table(results)
    if len(rounds) > 1:
        print(f"\nmedians of {len(rounds)} rounds\n")
        table({kind: {key: statistics.median(row[kind][key] for row in rounds)  # type: ignore[index]
                      for key in rounds[0][kind]}  # type: ignore[union-attr]
               for kind in kinds if all(isinstance(row[kind], dict) for row in rounds)})


def table(results: dict[str, dict[str, float] | str]) -> None:
    floor = results.get("floor")
    print("| contender | wall s | % of ideal | x floor | CPU/task ms | peak PSS MiB | KiB per task in flight "
          "| most in flight | load before -> after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, row in results.items():
        if isinstance(row, str):
            print(f"| {kind} | failed: {row} ||||||||")
            continue
        ratio = f"{row['wall'] / floor['wall']:.2f}" if isinstance(floor, dict) else "-"
        memory = f"{row['per_task_kib']:.1f}"
        if "loop_kib" in row:
            memory += f" (loop process {row['loop_kib']:.1f})"
        print(f"| {kind} | {row['wall']:.2f} | {row['ideal_pct']:.0f} % | {ratio} | {row['cpu_ms']:.3f} "
              f"| {row['peak']:.1f} | {memory} | {row['in_flight']:.0f} "
              f"| {row['load_before']:.1f} -> {row['load_after']:.1f} |")


if __name__ == "__main__":
    main()

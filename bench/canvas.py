"""Workflows on this project's worker side by side with the Celery worker: a chain of 100 tasks
and a chord of 1,000 header tasks, sent by one Celery client, time to the final result, at the
same pool and concurrency.

    python bench/canvas.py --broker redis://127.0.0.1:6379/15 -P prefork -c 2 --repeat 3
    python bench/canvas.py --broker amqp://guest:guest@127.0.0.1:5672// --backend redis://127.0.0.1:6379/15

How it measures (the same way for both workers): the worker is started on the benchmark's queue
and warmed up (a chain of 10 and a chord of 10 run first, so every pool process has run tasks);
then each workflow is sent by a Celery 5.7 client (``apply_async()``; a new client each time,
as a Redis client keeps every task it sent subscribed), and the time is taken from just before
that call to the return of ``get()`` on the workflow's result (the client waits on the Redis
result backend's pub/sub). The chain's steps are ``add.s(0, 1)`` then
``add.s(1)`` 99 times (each step is sent by the worker that ran the one before); the chord's
header is ``add.s(i, i)`` for 1,000 values of ``i`` and its body ``tsum.s()`` (the worker that
stores the last header result sends it). Results are stored (the chord needs them), in Redis,
with Celery's keys for both workers. Each worker is started ``--repeat`` times, the two taking
turns, and runs each workflow once each time; the table shows the median.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
QUEUE = "bench-canvas"
CHAIN_LENGTH = 100
CHORD_SIZE = 1000


def command(kind: str, pool: str, concurrency: int) -> list[str]:
    if kind == "celery":
        return [sys.executable, "-m", "celery", "-A", "canvas_celery_app", "worker", "-P", pool,
                "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat"]
    return [sys.executable, "-m", "worker_core", "worker", "-A", "canvas_worker_app", "-P", pool,
            "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-heartbeat"]


def spawn(kind: str, args: argparse.Namespace, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_BACKEND=args.backend, BENCH_QUEUE=QUEUE,
               PYTHONPATH=str(APPS))
    return subprocess.Popen(command(kind, args.pool, args.concurrency), cwd=APPS, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def purge(app: Any) -> None:
    """Empty the benchmark's queue, declared as both workers declare it (a durable queue bound to
    the direct exchange of its name)."""
    from kombu import Exchange, Queue

    with app.connection_for_write() as connection:
        queue = Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE, durable=True)
        bound = queue(connection.default_channel)
        bound.declare()
        bound.purge()


def empty_results(backend: str) -> None:
    """Drop the results of earlier runs (the benchmark's own Redis database)."""
    import redis

    client = redis.Redis.from_url(backend)
    try:
        client.flushdb()
    finally:
        client.close()


def chain_of(tasks: Any, n: int) -> tuple[Any, int]:
    """``add.s(0, 1) | add.s(1) | ...``, ``n`` steps: the signature and the value it gives."""
    import celery

    add, _ = tasks
    return celery.chain(add.s(0, 1), *[add.s(1) for _ in range(n - 1)]), n


def chord_of(tasks: Any, n: int) -> tuple[Any, int]:
    """``chord([add.s(i, i) for i < n], tsum.s())``: the signature and the value it gives."""
    import celery

    add, tsum = tasks
    return celery.chord([add.s(i, i) for i in range(n)], tsum.s()), n * (n - 1)


#: the workflows timed, each with its size
SHAPES = {"chain": (chain_of, CHAIN_LENGTH), "chord": (chord_of, CHORD_SIZE)}


def run_once(sig: Any, expected: int, timeout: float) -> float:
    """Send ``sig`` and wait for its final result: the seconds it took."""
    began = time.perf_counter()
    value = sig.apply_async().get(timeout=timeout)
    elapsed = time.perf_counter() - began
    if value != expected:
        raise AssertionError(f"the workflow gave {value!r}, not {expected!r}")
    return elapsed


def timed(build: Any, size: int, timeout: float) -> float:
    """``build``'s workflow of ``size`` sent by a new Celery client (closed afterwards)."""
    import canvas_celery_app

    client, *tasks = canvas_celery_app.client()
    try:
        return run_once(*build(tasks, size), timeout=timeout)
    finally:
        client.close()


def measure(kind: str, args: argparse.Namespace, app: Any, log: Path) -> dict[str, float]:
    """One run of ``kind``'s worker: started, warmed up, each workflow timed once, stopped."""
    purge(app)
    empty_results(args.backend)
    process = spawn(kind, args, log)
    try:
        for build, _ in SHAPES.values():  # warm up: every pool process has run tasks
            timed(build, 10, 120)
        return {name: timed(build, size, args.timeout) for name, (build, size) in SHAPES.items()}
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--backend", default=None,
                        help="the Redis result backend (default: the broker when it is Redis, else "
                             "redis://127.0.0.1:6379/15)")
    parser.add_argument("--pool", "-P", default="prefork")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one workflow may take")
    parser.add_argument("--only", choices=("worker", "celery"))
    args = parser.parse_args()
    if args.backend is None:
        args.backend = args.broker if args.broker.startswith("redis") else "redis://127.0.0.1:6379/15"

    sys.path.insert(0, str(APPS))
    os.environ.update(BENCH_BROKER=args.broker, BENCH_BACKEND=args.backend, BENCH_QUEUE=QUEUE)
    import canvas_celery_app

    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-canvas.log"))
    kinds = [args.only] if args.only else ["worker", "celery"]
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeat):
        # the contenders take turns, first one then the other, so a change in the machine's
        # load falls on both
        for kind in kinds if repeat % 2 == 0 else reversed(kinds):
            runs[kind].append(measure(kind, args, canvas_celery_app.app, log))
            print(f"  run {repeat + 1}/{args.repeat} {kind}: "
                  + ", ".join(f"{name} {seconds:.3f}s" for name, seconds in runs[kind][-1].items()),
                  file=sys.stderr)
    median = {kind: {name: statistics.median(run[name] for run in kind_runs) for name in SHAPES}
              for kind, kind_runs in runs.items()}

    print(f"\nbroker {args.broker}, results {args.backend}, pool {args.pool}, "
          f"concurrency {args.concurrency}, sent by a Celery client, median of {args.repeat} runs")
    header = f"{'':40}" + "".join(f"{kind:>12}" for kind in kinds)
    if "worker" in kinds and "celery" in kinds:
        header += f"{'vs celery':>13}"
    print(header)
    labels = {"chain": f"chain of {CHAIN_LENGTH} tasks (s)",
              "chord": f"chord of {CHORD_SIZE:,} header tasks (s)"}
    for name, label in labels.items():
        cells = "".join(f"{median[kind][name]:>12.3f}" for kind in kinds)
        if "worker" in kinds and "celery" in kinds:
            cells += f"{median['celery'][name] / median['worker'][name]:>12.2f}x"
        print(f"{label:40}{cells}")
    print("vs celery: how many times sooner this worker gives the final result")


if __name__ == "__main__":
    main()

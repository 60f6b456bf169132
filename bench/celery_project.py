"""The same Celery app under ``celery worker`` and under ``workerctl worker`` (worker-celery),
side by side on one broker: no-op throughput and CPU per task, with results off and on.

    python bench/celery_project.py --broker redis://127.0.0.1:6379/15 --results redis://127.0.0.1:6379/15
    python bench/celery_project.py --broker amqp://guest:guest@127.0.0.1:5672// \\
        --results redis://127.0.0.1:6379/15

Both workers run ``apps/celery_project.py`` unchanged, prefork ``-c 2`` by default, with their
default prefetch multiplier (4) and without heartbeat events (Celery also without gossip and
mingle). ``--tasks`` no-op tasks are queued while no worker runs, then the worker starts; tasks
per second from the first task seen done to the last, as ``compare.py`` measures (the task adds
one to a counter in shared memory that the driver polls). With results on, each task's SUCCESS is
stored by the Celery app's own backend (``--results``), from the pool's processes under both
workers. CPU per task is that of all the worker's processes over the run. The median of
``--repeat`` runs, the contenders taking turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from compare import APPS, QUEUE, Producer, Sink, compile_sources, cpu_seconds, stop

QUEUE_ARGS = ("-Q", QUEUE, "-l", "WARNING", "--without-heartbeat")


def command(kind: str, pool: str, concurrency: int) -> list[str]:
    if kind == "celery":
        return [sys.executable, "-m", "celery", "-A", "celery_project", "worker", "-P", pool,
                "-c", str(concurrency), *QUEUE_ARGS, "--without-gossip", "--without-mingle"]
    return [sys.executable, "-m", "worker_core", "worker", "-A", "celery_project", "-P", pool,
            "-c", str(concurrency), *QUEUE_ARGS]


class ResultsProducer(Producer):
    """The same protocol v2 messages for both workers, asking for a result when results are on."""

    def __init__(self, broker: str, results: bool) -> None:
        super().__init__(broker)
        self.results = results

    def send(self, name: str, args: tuple[Any, ...] = ()) -> None:
        self.app.send_task(name, args, queue=QUEUE, ignore_result=not self.results)


def run(kind: str, args: argparse.Namespace, results: str | None, sink: Sink, producer: ResultsProducer,
        log: Path) -> dict[str, float]:
    return drain(kind, [command(kind, args.pool, args.concurrency)], args, results, sink, producer, log)


def drain(kind: str, commands: list[list[str]], args: argparse.Namespace, results: str | None, sink: Sink,
          producer: ResultsProducer, log: Path) -> dict[str, float]:
    """Queue ``args.tasks`` no-op tasks, start ``commands`` (one contender's processes) and time
    them running all: tasks per second and CPU ms per task of every process they started."""
    if results:
        import redis

        redis.Redis.from_url(results).flushdb()
    producer.purge()
    for _ in range(args.tasks):
        producer.send("bench.noop")
    sink.reset()
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_RESULTS=results or "",
               BENCH_SINK_PORT=str(sink.port), BENCH_COUNT_DIR=sink.count_dir, PYTHONPATH=str(APPS))
    processes = [subprocess.Popen(each, cwd=APPS, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
                 for each in commands]
    try:
        first, first_count = sink.wait_count(1, 120)
        cpu_first = sum(cpu_seconds(process.pid) for process in processes)
        last, last_count = sink.wait_count(args.tasks, 900)
        cpu_last = sum(cpu_seconds(process.pid) for process in processes)
    finally:
        for process in processes:
            stop(process)
    if results:
        import redis

        stored = len(redis.Redis.from_url(results).keys("celery-task-meta-*"))
        if stored < args.tasks:
            raise RuntimeError(f"{kind}: {stored} of {args.tasks} results stored")
    done = last_count - first_count
    return {"throughput": done / (last - first), "cpu_ms": (cpu_last - cpu_first) / done * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--results", default="redis://127.0.0.1:6379/15",
                        help="the Celery app's result backend for the runs with results on (emptied first)")
    parser.add_argument("--pool", "-P", default="prefork")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    compile_sources()
    sink = Sink()
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-celery-project.log"))
    kinds = ["worker", "celery"]
    table: list[tuple[str, dict[str, dict[str, float]]]] = []
    for label, results in (("results off", None), ("results on", args.results)):
        producer = ResultsProducer(args.broker, results is not None)
        runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for repeat in range(args.repeat):
            for kind in kinds if repeat % 2 == 0 else reversed(kinds):
                runs[kind].append(run(kind, args, results, sink, producer, log))
                print(f"  {label} run {repeat + 1}/{args.repeat} {kind}: "
                      + ", ".join(f"{k}={v:.4g}" for k, v in runs[kind][-1].items()), file=sys.stderr)
        table.append((label, {kind: {key: statistics.median(r[key] for r in runs[kind])
                                     for key in runs[kind][0]} for kind in kinds}))

    print(f"\nthe same Celery app, broker {args.broker}, pool {args.pool} -c {args.concurrency}, "
          f"{args.tasks} no-op tasks, median of {args.repeat} runs")
    print(f"{'':14}{'workerctl tasks/s':>19}{'celery tasks/s':>16}{'ratio':>8}{'workerctl CPU ms':>18}"
          f"{'celery CPU ms':>15}")
    for label, median in table:
        ours, theirs = median["worker"], median["celery"]
        ratio = ours["throughput"] / theirs["throughput"]
        print(f"{label:14}{ours['throughput']:>19.0f}{theirs['throughput']:>16.0f}{ratio:>7.2f}x"
              f"{ours['cpu_ms']:>18.3f}{theirs['cpu_ms']:>15.3f}")


if __name__ == "__main__":
    main()

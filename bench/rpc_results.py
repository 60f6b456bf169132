"""Tasks with results on ``rpc://``: this project's worker side by side with the Celery worker,
on one broker, with the same pool and concurrency, each with its own client.

    python bench/rpc_results.py --broker redis://127.0.0.1:6379/15 -P prefork -c 2
    python bench/rpc_results.py --broker amqp://guest:guest@127.0.0.1:5672// -P threads -c 2

For each contender, ``--tasks`` tasks are queued by its own client (``result_backend='rpc://'``,
so each names the client's reply queue) while no worker runs; then the worker starts, and each
task counts itself as ``compare.py``'s no-op does and returns its argument, which the worker
sends to the client's reply queue. Measured:

- throughput: tasks per second from the first task seen done to the last (counters in shared
  memory, polled every millisecond), each task storing its result by publishing it;
- worker CPU per task over that run;
- reading: once every result waits in the reply queue, the client's ``get()`` of each, in the
  order they were sent (results per second).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import APPS, Sink, compile_sources, cpu_seconds, stop  # noqa: E402

QUEUE = "bench_rpc"


class Client:
    """A contender's own client, sending to QUEUE and reading its results."""

    def __init__(self, kind: str, broker: str) -> None:
        self.kind = kind
        if kind == "celery":
            from celery import Celery

            self.app: Any = Celery("bench-rpc-client", broker=broker, backend="rpc://", set_as_current=False)
            self.app.conf.update(broker_connection_retry_on_startup=True)
        else:
            from worker_core import App

            self.app = App("bench-rpc-client", broker=broker, backend="rpc://")

    def send(self, tasks: int) -> list[Any]:
        return [self.app.send_task("bench.rpc_echo", (n,), queue=QUEUE) for n in range(tasks)]

    @property
    def oid(self) -> str:
        """The name of this client's reply queue."""
        return str(self.app.thread_oid)

    def close(self) -> None:
        self.app.close()


def purge(broker: str) -> None:
    from worker_core import App
    from worker_core.app.broker import connection_for, task_queue

    app = App("bench-rpc-purge", broker=broker)
    with connection_for(app.plugins, broker, app.settings) as connection:
        queue = task_queue(QUEUE, app.settings)(connection.default_channel)
        queue.declare()
        queue.purge()


def wait_depth(broker: str, queue: str, count: int, timeout: float) -> None:
    """Wait until ``count`` messages wait in ``queue``."""
    from worker_core.app.broker import connection_for, transport_for
    from worker_core.app.settings import Settings
    from worker_core.plugins import PluginManager

    settings, plugins = Settings(broker_url=broker), PluginManager(autoload=False)
    transport = transport_for(plugins, broker, settings)
    deadline = time.time() + timeout
    with connection_for(plugins, broker, settings) as connection:
        while (depth := transport.queue_depth(connection, queue)) < count:
            if time.time() > deadline:
                raise TimeoutError(f"{depth} of {count} results in the reply queue {queue} after {timeout}s")
            time.sleep(0.05)


def command(kind: str, pool: str, concurrency: int) -> list[str]:
    if kind == "celery":
        return [sys.executable, "-m", "celery", "-A", "rpc_celery_app", "worker", "-P", pool,
                "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-O", "fair"]
    return [sys.executable, "-m", "worker_core", "worker", "-A", "rpc_worker_app", "-P", pool,
            "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "-O", "fair", "--without-heartbeat"]


def measure(kind: str, args: argparse.Namespace, sink: Sink, log: Path) -> dict[str, float]:
    purge(args.broker)
    client = Client(kind, args.broker)
    try:
        results = client.send(args.tasks)
        sink.reset()
        env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_SINK_PORT=str(sink.port),
                   BENCH_COUNT_DIR=sink.count_dir, PYTHONPATH=str(APPS))
        process = subprocess.Popen(command(kind, args.pool, args.concurrency), cwd=APPS, env=env,
                                   stdout=log.open("ab"), stderr=subprocess.STDOUT)
        try:
            first, first_count = sink.wait_count(1, 120)
            cpu_first = cpu_seconds(process.pid)
            last, last_count = sink.wait_count(args.tasks, 600)
            cpu_last = cpu_seconds(process.pid)
            wait_depth(args.broker, client.oid, args.tasks, 120)  # every result sent
        finally:
            stop(process)
        began = time.perf_counter()
        values = [result.get(timeout=60) for result in results]
        reading = time.perf_counter() - began
        if values != list(range(args.tasks)):
            raise AssertionError(f"{kind}: the results read back are not the values sent")
    finally:
        client.close()
    return {"throughput": (last_count - first_count) / (last - first),
            "cpu_ms": (cpu_last - cpu_first) / (last_count - first_count) * 1000,
            "reading": args.tasks / reading}


ROWS = [
    ("throughput", "tasks/s, each result sent (rpc://)", "{:.0f}", True),
    ("cpu_ms", "worker CPU per task (ms)", "{:.3f}", False),
    ("reading", "client get() of each result (results/s)", "{:.0f}", True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--pool", "-P", default="prefork")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("worker", "celery"))
    args = parser.parse_args()

    compile_sources()
    sink = Sink()
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-rpc.log"))
    kinds = [args.only] if args.only else ["worker", "celery"]
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeat):
        for kind in kinds if repeat % 2 == 0 else reversed(kinds):
            runs[kind].append(measure(kind, args, sink, log))
            print(f"  run {repeat + 1}/{args.repeat} {kind}: "
                  + ", ".join(f"{k}={v:.4g}" for k, v in runs[kind][-1].items()), file=sys.stderr)
    median = {kind: {key: statistics.median(r[key] for r in runs[kind]) for key in runs[kind][0]}
              for kind in kinds}
    print(f"\nbroker {args.broker}, pool {args.pool}, concurrency {args.concurrency}, {args.tasks} tasks "
          f"with results on rpc://, median of {args.repeat} runs")
    vs = "worker" in kinds and "celery" in kinds
    print(f"{'':42}" + "".join(f"{kind:>12}" for kind in kinds) + (f"{'vs celery':>13}" if vs else ""))
    for key, label, fmt, higher_better in ROWS:
        cells = "".join(f"{fmt.format(median[kind][key]):>12}" for kind in kinds)
        if vs:
            mine, theirs = median["worker"][key], median["celery"][key]
            cells += f"{(mine / theirs if higher_better else theirs / mine):>12.2f}x"
        print(f"{label:42}{cells}")
    print("vs celery: how many times better this worker (and its client) is than Celery's")


if __name__ == "__main__":
    main()

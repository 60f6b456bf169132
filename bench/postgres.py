"""PostgreSQL as a task queue, side by side in one run on the same PostgreSQL: this worker on
worker-transport-postgres (prefork ``-c 2``), Procrastinate's worker and pgqueuer's (each one
process running two tasks at once, their own model; pgqueuer also with its own defaults), and this
worker on Redis for scale.

    python bench/postgres.py --postgres postgresql://postgres@127.0.0.1:5432/worker_bench \\
        --redis redis://127.0.0.1:6379/15 -c 2 --repeat 3

For each contender, measured as ``compare.py`` measures (see its docstring): send-to-start
latency on the idle worker (p50 and p99 of ``--samples`` tasks, from the return of the publish
call to the task's first line), then no-op throughput and real-body throughput (``--tasks``
tasks queued while no worker runs, then a worker starts: tasks per second from the first done to
the last; a real body is one to two milliseconds of CPU on the benchmark machine: JSON and
hashing, ``apps/sink.py``), CPU per
no-op task and memory. Each contender uses its own client and tables: Procrastinate's and
pgqueuer's schemas are installed in the database first (it is created when missing), this
worker's tables are made on its first connection. Results are off for everyone.
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

from compare import APPS, Producer, Sink, compile_sources, cpu_seconds, pss_mib, stop

QUEUE = "bench"


class Ours(Producer):
    """This project's client (``compare.py``'s), to this worker's queue ``bench``."""

    def __init__(self, broker: str) -> None:
        super().__init__(broker)
        self.broker = broker

    def command(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "worker_core", "worker", "-A", "worker_app", "-P", "prefork",
                "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-heartbeat"]

    def env(self) -> dict[str, str]:
        return {"BENCH_BROKER": self.broker}


class Procrastinate:
    """Procrastinate's own client (``task.defer``) and worker."""

    def __init__(self, postgres: str) -> None:
        os.environ["BENCH_POSTGRES"] = postgres
        self.postgres = postgres
        import procrastinate_app

        self.module = procrastinate_app
        subprocess.run([sys.executable, "-m", "procrastinate", "--app=procrastinate_app.app", "schema",
                        "--apply"], cwd=APPS, env=dict(os.environ, PYTHONPATH=str(APPS)), capture_output=True)
        self.module.app.open()

    def send(self, name: str, args: tuple[Any, ...] = ()) -> None:
        task = getattr(self.module, name.split(".")[-1])
        task.defer(**({"sent_at": args[0]} if args else {}))

    def purge(self) -> None:
        import psycopg

        with psycopg.connect(self.postgres, autocommit=True) as db:
            db.execute("DELETE FROM procrastinate_events")
            db.execute("DELETE FROM procrastinate_jobs")

    def command(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "procrastinate", "--app=procrastinate_app.app", "worker",
                f"--concurrency={concurrency}", "--queues=bench"]

    def env(self) -> dict[str, str]:
        return {"BENCH_POSTGRES": self.postgres}


class Pgqueuer:
    """pgqueuer's own client (``SyncQueries.enqueue``) and worker (its supervisor, as ``pgq run``
    starts it: see ``apps/pgqueuer_app.py``)."""

    def __init__(self, postgres: str, defaults: bool = False) -> None:
        import psycopg
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        self.postgres = postgres
        self.defaults = defaults
        subprocess.run([sys.executable, "-m", "pgqueuer", "--pg-dsn", postgres, "install"],
                       capture_output=True)
        self.connection = psycopg.connect(postgres, autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.connection))

    def send(self, name: str, args: tuple[Any, ...] = ()) -> None:
        self.queries.enqueue(name, repr(args[0]).encode() if args else None)

    def purge(self) -> None:
        self.connection.execute("DELETE FROM pgqueuer")

    def command(self, concurrency: int) -> list[str]:
        return [sys.executable, "pgqueuer_app.py", "0" if self.defaults else str(concurrency)]

    def env(self) -> dict[str, str]:
        return {"BENCH_POSTGRES": self.postgres, "PGDSN": self.postgres}


def spawn(contender: Any, concurrency: int, sink: Sink, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, BENCH_SINK_PORT=str(sink.port), BENCH_COUNT_DIR=sink.count_dir,
               PYTHONPATH=str(APPS), BENCH_ASYNC="0", **contender.env())
    return subprocess.Popen(contender.command(concurrency), cwd=APPS, env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def throughput(contender: Any, name: str, args: argparse.Namespace, sink: Sink,
               log: Path) -> tuple[float, float]:
    """Tasks per second and CPU ms per task, ``args.tasks`` tasks of ``name`` queued first."""
    contender.purge()
    for _ in range(args.tasks):
        contender.send(name)
    sink.reset()
    process = spawn(contender, args.concurrency, sink, log)
    try:
        first, first_count = sink.wait_count(1, 120)
        cpu_first = cpu_seconds(process.pid)
        last, last_count = sink.wait_count(args.tasks, 900)
        cpu_last = cpu_seconds(process.pid)
        return ((last_count - first_count) / (last - first),
                (cpu_last - cpu_first) / (last_count - first_count) * 1000)
    finally:
        pss = pss_mib(process.pid)
        stop(process)
        contender.pss = pss


def measure(contender: Any, args: argparse.Namespace, sink: Sink, log: Path) -> dict[str, float]:
    result: dict[str, float] = {}
    contender.purge()
    sink.reset()
    process = spawn(contender, args.concurrency, sink, log)
    latencies: list[float] = []
    try:
        contender.send("bench.latency", (time.time(),))
        sink.wait(lambda: sink.latencies, 60)
        time.sleep(0.5)
        for _ in range(args.samples):
            sink.reset()
            contender.send("bench.latency", (time.time(),))
            sent = time.time()
            sink.wait(lambda: sink.latencies, 30)
            latencies.append(sink.latencies[0] - sent)
            time.sleep(0.005)
    finally:
        stop(process)
    latencies.sort()
    result["p50"] = statistics.median(latencies) * 1000
    result["p99"] = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    result["noop"], result["cpu_ms"] = throughput(contender, "bench.noop", args, sink, log)
    result["pss"] = contender.pss
    result["work"], _ = throughput(contender, "bench.work", args, sink, log)
    return result


ROWS = [
    ("noop", "no-op throughput (tasks/s)", "{:.0f}"),
    ("work", "real-body throughput (tasks/s)", "{:.0f}"),
    ("p50", "send-to-start p50 (ms)", "{:.2f}"),
    ("p99", "send-to-start p99 (ms)", "{:.2f}"),
    ("cpu_ms", "worker CPU per no-op task (ms)", "{:.3f}"),
    ("pss", "memory, PSS of all processes (MiB)", "{:.1f}"),
]


def ensure_database(url: str) -> None:
    import psycopg

    base, _, name = url.rpartition("/")
    name = name.split("?")[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as db:
        if db.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            db.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/worker_bench")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    contenders_ = ("worker-postgres", "worker-redis", "procrastinate", "pgqueuer", "pgqueuer-own")
    parser.add_argument("--only", choices=contenders_, action="append",
                        help="only these contenders (repeat); pgqueuer-own is pgqueuer with its own defaults "
                             "(fetches of 10, no bound on tasks at once)")
    args = parser.parse_args()

    sys.path.insert(0, str(APPS))
    ensure_database(args.postgres)
    compile_sources()
    sink = Sink()
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-postgres.log"))
    makers = {"worker-postgres": lambda: Ours(args.postgres),
              "procrastinate": lambda: Procrastinate(args.postgres),
              "pgqueuer": lambda: Pgqueuer(args.postgres),
              "pgqueuer-own": lambda: Pgqueuer(args.postgres, defaults=True),
              "worker-redis": lambda: Ours(args.redis)}
    kinds = args.only or list(makers)
    contenders = {kind: makers[kind]() for kind in kinds}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeat):
        for kind in kinds if repeat % 2 == 0 else reversed(kinds):
            load = Path("/proc/loadavg").read_text().split()[0]
            runs[kind].append(measure(contenders[kind], args, sink, log))
            print(f"  run {repeat + 1}/{args.repeat} {kind} (load average {load} -> "
                  f"{Path('/proc/loadavg').read_text().split()[0]}): "
                  + ", ".join(f"{k}={v:.4g}" for k, v in runs[kind][-1].items()), file=sys.stderr)
    median = {kind: {key: statistics.median(r[key] for r in runs[kind]) for key in runs[kind][0]}
              for kind in kinds}
    print(f"\nPostgreSQL {args.postgres}, Redis {args.redis}, concurrency {args.concurrency} (this worker: "
          f"prefork), {args.tasks} tasks per throughput run, {args.samples} latency samples, median of "
          f"{args.repeat} runs; load average (1, 5, 15 min) at the end "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"{'':36}" + "".join(f"{kind:>17}" for kind in kinds))
    for key, label, fmt in ROWS:
        print(f"{label:36}" + "".join(f"{fmt.format(median[kind][key]):>17}" for kind in kinds))


if __name__ == "__main__":
    main()

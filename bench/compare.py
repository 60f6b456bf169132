"""This project's worker side by side with the Celery worker (and, on RabbitMQ, Dramatiq), on
one broker, with the same pool and concurrency: no-op throughput, send-to-start latency, start-up
time, CPU per task, memory.

    python bench/compare.py --broker redis://127.0.0.1:6379/15 --pool prefork --concurrency 2
    python bench/compare.py --broker amqp://guest:guest@127.0.0.1:5672// --pool threads -c 2 --dramatiq

Dramatiq runs ``--processes N --threads 1`` for prefork, ``--processes 1 --threads N`` for threads
and ``--processes 1 --threads 1`` for solo, with its own client (its message format differs).
With ``-P asyncio`` this worker's no-op and latency tasks are ``async def`` (awaited on the loop)
and Celery, which has no asyncio pool, runs ``-P threads``.
Both workers dispatch to prefork children with fair scheduling, their default; ``-O fcfs`` runs
this worker with ``-O fcfs`` and Celery with its equivalent, ``-O default``.

How it measures (the same way for both workers; both run without heartbeat events,
``--without-heartbeat``, and the Celery worker also without gossip and mingle, which this worker
does not have):

- start-up: one task is queued, then the worker is spawned; the time until that task starts
  (every contender's code is byte-compiled first, as a regular install leaves it);
- latency: on the idle worker, one task at a time, from the moment the producer's publish call
  returned (the broker has the message) to the task's first line (p50 and p99 of ``--samples``
  tasks); "with the publish" also counts the publish call itself (the same client for both);
- throughput: ``--tasks`` no-op tasks are queued while no worker runs, then a worker starts;
  tasks per second from the first task seen done to the last (the driver polls the tasks'
  counters every millisecond);
- CPU per task: CPU seconds of the worker's processes over the throughput run, per task;
- memory: proportional set size (PSS) summed over the worker's processes after the run.

A no-op task only adds one to a counter in shared memory (no system call; the driver sums the
counters), a latency task sends the driver one UDP datagram (no round trip); results are off.
"""

from __future__ import annotations

import argparse
import atexit
import mmap
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
QUEUE = "bench"
TICKS = os.sysconf("SC_CLK_TCK")


class Sink:
    """Receives the latency and sleep tasks' datagrams in a thread, and sums the no-op tasks'
    shared memory counters (see ``apps/sink.py``)."""

    def __init__(self) -> None:
        self.count_dir = tempfile.mkdtemp(prefix="bench-count-")
        atexit.register(shutil.rmtree, self.count_dir, True)
        self.counters: dict[str, memoryview] = {}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024 * 1024)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Condition()
        self.noops: list[float] = []
        self.latencies: list[float] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            data = self.sock.recv(64)
            now = time.time()
            with self.lock:
                if data == b"n":
                    self.noops.append(now)
                else:
                    self.latencies.append(float(data[1:]))
                self.lock.notify_all()

    def reset(self) -> None:
        with self.lock:
            self.noops.clear()
            self.latencies.clear()
        self.counters.clear()
        for name in os.listdir(self.count_dir):
            os.unlink(os.path.join(self.count_dir, name))

    def count(self) -> int:
        """No-op tasks run since the last reset."""
        for name in os.listdir(self.count_dir):
            if name not in self.counters:
                with open(os.path.join(self.count_dir, name), "rb") as file:
                    if os.fstat(file.fileno()).st_size < 8:
                        continue  # not written yet: it counts nothing so far
                    counter = mmap.mmap(file.fileno(), 8, access=mmap.ACCESS_READ)
                    self.counters[name] = memoryview(counter).cast("Q")
        return sum(counter[0] for counter in self.counters.values())

    def wait_count(self, least: int, timeout: float) -> tuple[float, int]:
        """Poll the counters every millisecond until at least ``least`` no-op tasks ran; the
        time it was seen and the count then."""
        deadline = time.time() + timeout
        while (count := self.count()) < least:
            if time.time() > deadline:
                raise TimeoutError(f"timed out after {timeout}s ({count} of {least} no-op tasks ran)")
            time.sleep(0.001)
        return time.time(), count

    def wait(self, condition: Any, timeout: float) -> None:
        with self.lock:
            if not self.lock.wait_for(condition, timeout):
                raise TimeoutError(f"timed out after {timeout}s (noops={len(self.noops)}, "
                                   f"latencies={len(self.latencies)})")


def tree(pid: int) -> list[int]:
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            for child in (task / "children").read_text().split():
                pids.extend(tree(int(child)))
        except OSError:
            pass
    return pids


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and the processes under it."""
    return processes_cpu(tree(pid))


def processes_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes (each with all its threads; gone ones count nothing)."""
    total = 0
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS


def broker_pids() -> list[int]:
    """The local RabbitMQ's ``beam.smp`` processes (none when it runs elsewhere)."""
    found = subprocess.run(["pgrep", "-x", "beam.smp"], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def pss_mib(pid: int) -> float:
    total = 0
    for each in tree(pid):
        try:
            for line in Path(f"/proc/{each}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class DramatiqProducer:
    """Dramatiq's own client (its messages are not Celery's)."""

    def __init__(self, broker: str) -> None:
        sys.path.insert(0, str(APPS))
        os.environ["BENCH_BROKER"] = broker
        import dramatiq_app

        self.module = dramatiq_app

    def send(self, name: str, args: tuple[Any, ...] = ()) -> None:
        getattr(self.module, name.split(".")[-1]).send(*args)

    def purge(self) -> None:
        import pika.exceptions

        try:
            self.module.broker.flush(self.module.QUEUE)
        except pika.exceptions.AMQPError:
            # Its connection sat unused while the other contenders ran (minutes when a Celery
            # drain stalls) and RabbitMQ closed it: a new one, then purge again.
            del self.module.broker.connection  # its channel too; both are made again on use
            self.module.broker.flush(self.module.QUEUE)


class Producer:
    """Publishes protocol v2 messages (identical for both workers) with this project's client."""

    def __init__(self, broker: str) -> None:
        sys.path.insert(0, str(APPS))
        os.environ["BENCH_BROKER"] = broker
        from worker_core import App

        self.app = App("bench-driver", broker=broker, task_ignore_result=True, result_backend="disabled")

    def send(self, name: str, args: tuple[Any, ...] = ()) -> None:
        self.app.send_task(name, args, queue=QUEUE, ignore_result=True)

    def purge(self) -> None:
        from worker_core.app.broker import connection_for, task_queue

        with connection_for(self.app.plugins, self.app.broker_urls[0], self.app.settings) as connection:
            queue = task_queue(QUEUE, self.app.settings)(connection.default_channel)
            queue.declare()
            queue.purge()


#: ``--metrics``: each worker as a Prometheus set-up runs it (this worker serving its metrics,
#: Celery sending the task events its exporter reads)
WITH_METRICS = {"worker+metrics": ("worker", ["--metrics-listen", "127.0.0.1:0"]),
                "celery+events": ("celery", ["-E"])}
#: ``--otel``: each worker tracing every task with OpenTelemetry's SDK (a batch processor, an
#: exporter that drops the batches: ``apps/tracing.py``): this worker with worker-otel's
#: ``--otel``, Celery with opentelemetry-instrumentation-celery
WITH_OTEL = {"worker+otel": ("worker", ["--otel"]), "celery+otel": ("celery", [])}


def command(kind: str, pool: str, concurrency: int, scheduling: str = "fair") -> list[str]:
    if kind in WITH_METRICS or kind in WITH_OTEL:
        base, extra = {**WITH_METRICS, **WITH_OTEL}[kind]
        return command(base, pool, concurrency, scheduling) + extra
    if kind == "dramatiq":
        processes, threads = {"prefork": (concurrency, 1), "threads": (1, concurrency)}.get(pool, (1, 1))
        return [sys.executable, "-m", "dramatiq", "dramatiq_app", "--processes", str(processes),
                "--threads", str(threads), "--queues", "bench_dramatiq"]
    if kind == "celery":
        pool = "threads" if pool == "asyncio" else pool  # Celery has no asyncio pool: its nearest
        return [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", pool,
                "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-O", "fair" if scheduling == "fair" else "default"]
    return [sys.executable, "-m", "worker_core", "worker", "-A", "worker_app", "-P", pool,
            "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "-O", scheduling, "--without-heartbeat"]


def spawn(kind: str, args: argparse.Namespace, sink: Sink, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_SINK_PORT=str(sink.port),
               BENCH_COUNT_DIR=sink.count_dir, PYTHONPATH=str(APPS),
               BENCH_ASYNC="1" if args.pool == "asyncio" else "0",
               BENCH_OTEL="1" if kind in WITH_OTEL else "0")
    return subprocess.Popen(command(kind, args.pool, args.concurrency, args.scheduling), cwd=APPS, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(process)


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` and the processes under it, the youngest first, and wait for it."""
    for pid in reversed(tree(process.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def measure(kind: str, args: argparse.Namespace, sink: Sink, producer: Any, log: Path) -> dict[str, float]:
    result: dict[str, float] = {}
    producer.purge()
    sink.reset()
    producer.send("bench.latency", (time.time(),))
    started = time.time()
    process = spawn(kind, args, sink, log)
    latencies: list[float] = []
    try:
        sink.wait(lambda: sink.latencies, 60)
        result["startup"] = sink.latencies[0] - started
        time.sleep(0.5)
        with_publish: list[float] = []
        for _ in range(args.samples):
            sink.reset()
            before = time.time()
            producer.send("bench.latency", (before,))
            sent = time.time()
            sink.wait(lambda: sink.latencies, 30)
            latencies.append(sink.latencies[0] - sent)
            with_publish.append(sink.latencies[0] - before)
            time.sleep(0.002)
    finally:
        stop(process)
    latencies.sort()
    result["p50"] = statistics.median(latencies) * 1000
    result["p99"] = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    result["p50_publish"] = statistics.median(with_publish) * 1000

    producer.purge()
    for _ in range(args.tasks):
        producer.send("bench.noop")
    sink.reset()
    process = spawn(kind, args, sink, log)
    try:
        first, first_count = sink.wait_count(1, 120)
        cpu_first = cpu_seconds(process.pid)
        last, last_count = sink.wait_count(args.tasks, 600)
        cpu_last = cpu_seconds(process.pid)
        result["throughput"] = (last_count - first_count) / (last - first)
        result["cpu_ms"] = (cpu_last - cpu_first) / (last_count - first_count) * 1000
        result["pss"] = pss_mib(process.pid)
    finally:
        stop(process)
    return result


ROWS = [
    ("throughput", "no-op throughput (tasks/s)", "{:.0f}", True),
    ("p50", "send-to-start p50 (ms)", "{:.3f}", False),
    ("p99", "send-to-start p99 (ms)", "{:.3f}", False),
    ("p50_publish", "p50 with the publish call (ms)", "{:.3f}", False),
    ("startup", "start-up to first task (s)", "{:.3f}", False),
    ("cpu_ms", "worker CPU per task (ms)", "{:.3f}", False),
    ("pss", "memory, PSS of all processes (MiB)", "{:.1f}", False),
]


def compile_sources() -> None:
    """Byte-compile every contender's code first, as a regular (non-editable) install would: with
    PYTHONDONTWRITEBYTECODE set, an editable checkout is otherwise compiled again at every start."""
    import compileall
    import importlib.util

    for name in ("worker_core", "worker_pool_prefork", "worker_pool_threads", "worker_transport_redis",
                 "worker_transport_amqp", "celery", "kombu", "billiard", "dramatiq"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                compileall.compile_dir(location, quiet=1)
    compileall.compile_dir(str(APPS), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--pool", "-P", default="prefork")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scheduling", "-O", choices=("fair", "fcfs"), default="fair",
                        help="prefork dispatch: fair (both workers' default) or fcfs (Celery's -O default)")
    parser.add_argument("--only", choices=("worker", "celery", "dramatiq"))
    parser.add_argument("--dramatiq", action="store_true", help="also run Dramatiq (RabbitMQ only)")
    parser.add_argument("--metrics", action="store_true",
                        help="also run this worker serving Prometheus metrics (--metrics-listen) and Celery "
                             "sending task events (-E, what its exporter reads)")
    parser.add_argument("--otel", action="store_true",
                        help="also run both workers tracing every task with OpenTelemetry (this one with "
                             "worker-otel's --otel, Celery with opentelemetry-instrumentation-celery)")
    args = parser.parse_args()

    compile_sources()
    sink = Sink()
    ours = Producer(args.broker)
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-compare.log"))
    kinds = [args.only] if args.only else ["worker", "celery"] + (["dramatiq"] if args.dramatiq else [])
    kinds += list(WITH_METRICS) if args.metrics else []
    kinds += list(WITH_OTEL) if args.otel else []
    producers: dict[str, Any] = {kind: DramatiqProducer(args.broker) if kind == "dramatiq" else ours
                                 for kind in kinds}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeat):
        for kind in kinds if repeat % 2 == 0 else reversed(kinds):
            load = Path("/proc/loadavg").read_text().split()[0]
            runs[kind].append(measure(kind, args, sink, producers[kind], log))
            print(f"  run {repeat + 1}/{args.repeat} {kind} (load average {load} -> "
                  f"{Path('/proc/loadavg').read_text().split()[0]}): "
                  + ", ".join(f"{k}={v:.4g}" for k, v in runs[kind][-1].items()), file=sys.stderr)
    median = {kind: {key: statistics.median(r[key] for r in runs[kind]) for key in runs[kind][0]}
              for kind in kinds}

    print(f"\nbroker {args.broker}, pool {args.pool}, concurrency {args.concurrency}, "
          f"scheduling {args.scheduling}, {args.tasks} no-op tasks, {args.samples} latency samples, "
          f"median of {args.repeat} runs")
    others = [kind for kind in kinds if kind != "worker"] if "worker" in kinds else []
    header = f"{'':38}" + "".join(f"{kind:>12}" for kind in kinds)
    header += "".join(f"{'vs ' + other:>13}" for other in others)
    print(header)
    for key, label, fmt, higher_better in ROWS:
        cells = "".join(f"{fmt.format(median[kind][key]):>12}" for kind in kinds)
        for other in others:
            mine, theirs = median["worker"][key], median[other][key]
            value = (mine / theirs if higher_better else theirs / mine) if mine and theirs else float("nan")
            cells += f"{value:>12.2f}x"
        print(f"{label:38}{cells}")
    print("vs X: how many times better this worker is than X (higher throughput, lower everything else)")


if __name__ == "__main__":
    main()

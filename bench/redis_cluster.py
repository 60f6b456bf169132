"""No-op throughput on a Redis Cluster of three primaries against one redis-server, on this machine.

    python bench/redis_cluster.py [--tasks 20000] [--queues 1,3,12] [--workers 1,2,4] [-c 2]
                                  [--replicas 0] [--no-sharded] [--keep]

Starts a redis-server of its own and a Redis Cluster of its own (``tests/redis_cluster.py``:
three primaries on free ports, ``--replicas`` replicas each, none by default, so that both
brokers do the same work), never the shared Redis. For each broker, number of queues and number
of workers: ``--tasks`` no-op tasks are sent (this project's client, one thread, round robin over
the queues) while no worker runs, then the workers start (``-P prefork -c 2``, results off, every
worker consuming every queue). Tasks per second are counted from the moment the last worker is
ready (its ``worker_ready`` hook) until the last task ran, so start-up does not count; the tasks
done before that moment are shown. A no-op task adds one to a counter in shared memory
(``apps/sink.py``). The cluster's queues are named so that each primary serves as many of them
as the others (a name hashes to a slot: three names at random often share a primary). With
``--sharded`` (on by default) one more row per worker count: one queue sharded three ways
(``sharded_queues``), so one queue's traffic spreads over the three primaries.

Also shown: the publish rate of the one client thread; the CPU milliseconds of the redis-server
processes per task published, and per task run (over the counted window: fetches,
acknowledgements, wakes, lease renewals), and of the workers' processes per task run, from which
an estimate for separate machines can be made (the brokers and workers here share this
machine's cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"
TESTS = HERE.parent / "tests"
sys.path[:0] = [str(HERE), str(TESTS)]

from compare import cpu_seconds, kill_tree, processes_cpu, stop  # noqa: E402
from faults import RedisServer  # noqa: E402


def _tests_module(name: str) -> Any:
    """A module of tests/ whose name this script's own takes (``redis_cluster``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"tests_{name}", TESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (attrs looks its classes' module up)
    spec.loader.exec_module(module)
    return module


RedisCluster = _tests_module("redis_cluster").RedisCluster


class Counters:
    """The no-op tasks' shared memory counters (``apps/sink.py``) and the workers' ready marks."""

    def __init__(self, root: Path) -> None:
        self.count_dir = root / "count"
        self.ready_dir = root / "ready"
        self.views: dict[str, memoryview] = {}

    def reset(self) -> None:
        for directory in (self.count_dir, self.ready_dir):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        self.views.clear()

    def count(self) -> int:
        import mmap

        for path in self.count_dir.iterdir():
            if path.name not in self.views:
                with path.open("rb") as file:
                    if os.fstat(file.fileno()).st_size < 8:
                        continue  # not written yet: it counts nothing so far
                    self.views[path.name] = memoryview(
                        mmap.mmap(file.fileno(), 8, access=mmap.ACCESS_READ)
                    ).cast("Q")
        return sum(view[0] for view in self.views.values())

    def ready(self) -> int:
        return len(list(self.ready_dir.iterdir()))


def spread_names(cluster: RedisCluster, stem: str, count: int) -> list[str]:
    """``count`` queue names, each primary serving as many of them as the others (within one)."""
    from redis.crc import key_slot

    ranges = cluster.topology()
    primaries = sorted({primary for _, _, primary, _ in ranges})
    names: list[str] = []
    n = 0
    while len(names) < count:
        want = primaries[len(names) % len(primaries)]
        name = f"{stem}-{n}"
        n += 1
        slot = key_slot(name.encode())
        if next(primary for first, last, primary, _ in ranges if first <= slot <= last) == want:
            names.append(name)
    return names


def publish(url: str, queues: list[str], tasks: int, options: dict[str, Any]) -> float:
    """Send the no-op tasks round robin over ``queues``; the publish rate (tasks per second)."""
    from worker_core import App

    app = App("bench-cluster-driver", broker=url, result_backend="disabled", task_ignore_result=True,
              broker_transport_options=options)
    try:
        app.send_task("bench.noop", queue=queues[0], ignore_result=True)  # connects, declares
        started = time.perf_counter()
        for n in range(1, tasks):
            app.send_task("bench.noop", queue=queues[n % len(queues)], ignore_result=True)
        return (tasks - 1) / (time.perf_counter() - started)
    finally:
        app.close()


def measure(url: str, queues: list[str], workers: int, args: argparse.Namespace, counters: Counters,
            broker_pids: list[int], options: dict[str, Any], logs: Path) -> dict[str, float]:
    counters.reset()
    published_cpu = processes_cpu(broker_pids)
    publish_rate = publish(url, queues, args.tasks, options)
    published_cpu = processes_cpu(broker_pids) - published_cpu
    env = dict(os.environ, BENCH_BROKER=url, BENCH_COUNT_DIR=str(counters.count_dir),
               BENCH_READY_DIR=str(counters.ready_dir), BENCH_SINK_PORT="9", PYTHONPATH=str(APPS),
               WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps(options))
    tag = uuid.uuid4().hex[:6]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "worker_core", "worker", "-A", "worker_app", "-P", "prefork",
             "-c", str(args.concurrency), "-Q", ",".join(queues), "-l", "WARNING", "--without-heartbeat",
             "-n", f"bench{index}-{tag}@localhost"],
            cwd=APPS, env=env, stdout=(logs / f"worker-{tag}-{index}.log").open("ab"),
            stderr=subprocess.STDOUT)
        for index in range(workers)
    ]
    try:
        deadline = time.monotonic() + 120
        while counters.ready() < workers:
            if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
                raise RuntimeError(f"the workers did not all start; their logs are in {logs}")
            time.sleep(0.001)
        first, before = time.perf_counter(), counters.count()
        broker_cpu = processes_cpu(broker_pids)
        worker_cpu = sum(cpu_seconds(process.pid) for process in processes)
        deadline = time.monotonic() + 600
        while (done := counters.count()) < args.tasks:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{done} of {args.tasks} tasks ran in 600 s; logs in {logs}")
            time.sleep(0.001)
        last = time.perf_counter()
        counted = done - before
        broker_cpu = processes_cpu(broker_pids) - broker_cpu
        worker_cpu = sum(cpu_seconds(process.pid) for process in processes) - worker_cpu
    finally:
        for process in processes:
            stop(process)
            if process.poll() is None:
                kill_tree(process)
    if done != args.tasks:
        raise RuntimeError(f"{done} tasks ran, {args.tasks} were sent")
    return {
        "throughput": counted / (last - first) if counted else 0.0,
        "before": before,
        "publish": publish_rate,
        "publish_ms": published_cpu / args.tasks * 1000,
        "broker_ms": broker_cpu / counted * 1000 if counted else 0.0,
        "worker_ms": worker_cpu / counted * 1000 if counted else 0.0,
    }


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--queues", default="1,3,12", help="numbers of queues, comma-separated")
    parser.add_argument("--workers", default="1,2,4", help="numbers of workers, comma-separated")
    parser.add_argument("-c", "--concurrency", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=0, help="replicas of each primary")
    parser.add_argument("--no-sharded", dest="sharded", action="store_false",
                        help="leave out the row of one queue sharded over the three primaries")
    parser.add_argument("--keep", action="store_true", help="keep the workers' logs")
    args = parser.parse_args()
    queue_counts = [int(n) for n in args.queues.split(",")]
    worker_counts = [int(n) for n in args.workers.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-redis-cluster-"))
    counters = Counters(root)
    logs = root / "logs"
    logs.mkdir()
    print(f"{os.cpu_count()} cores shared by every redis-server, worker and this driver; "
          f"load average at start {load()}")
    server = RedisServer(root / "redis")
    (root / "redis").mkdir()
    cluster = RedisCluster(root / "cluster", primaries=3, replicas=args.replicas)
    rows: list[tuple[str, int, int, dict[str, float], dict[str, float] | None]] = []
    try:
        server.start()
        cluster.start()
        assert server.process is not None
        single_pids = [server.process.pid]
        cluster_pids = [node.process.pid for node in cluster.nodes if node.process is not None]
        layouts: list[tuple[str, int, bool]] = [(f"{n} queue{'s' if n > 1 else ''}", n, False)
                                                for n in queue_counts]
        if args.sharded:
            layouts.append(("1 queue, 3 shards", 1, True))
        for label, count, sharded in layouts:
            for workers in worker_counts:
                stem = f"b{uuid.uuid4().hex[:6]}"
                queues = spread_names(cluster, stem, count)
                options = {"sharded_queues": {queues[0]: 3}} if sharded else {}
                before = load()
                on_cluster = measure(cluster.url, queues, workers, args, counters, cluster_pids, options,
                                     logs)
                on_single = None
                if not sharded:  # (one redis-server has no shards: the same as one queue)
                    on_single = measure(server.url, queues, workers, args, counters, single_pids, {}, logs)
                rows.append((label, count, workers, on_cluster, on_single))
                single_text = f"{on_single['throughput']:,.0f}" if on_single else "-"
                print(f"  {label}, {workers} worker(s): cluster {on_cluster['throughput']:,.0f} tasks/s, "
                      f"one redis-server {single_text} (load average {before} -> {load()})", flush=True)
    finally:
        cluster.stop()
        server.stop()
        if args.keep:
            print(f"logs kept in {logs}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.tasks:,} no-op tasks per run, -P prefork -c {args.concurrency}, three primaries "
          f"with {args.replicas} replica(s) each; load average at the end {load()}\n")
    print("| queues | workers | cluster tasks/s | one redis-server tasks/s | cluster / one "
          "| done before the last worker was ready | publish/s, one client thread "
          "| broker CPU ms/publish | broker CPU ms/task run | worker CPU ms/task |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, _, workers, on_cluster, on_single in rows:
        def both(key: str, form: str, row: dict[str, float] = on_cluster,
                 other: dict[str, float] | None = on_single) -> str:
            return f"{form.format(row[key])}, {form.format(other[key]) if other else '-'}"

        ratio = f"{on_cluster['throughput'] / on_single['throughput']:.2f}" if on_single else "-"
        single_rate = f"{on_single['throughput']:,.0f}" if on_single else "-"
        print(f"| {label} | {workers} | {on_cluster['throughput']:,.0f} | {single_rate} | {ratio} "
              f"| {both('before', '{:,.0f}')} | {both('publish', '{:,.0f}')} "
              f"| {both('publish_ms', '{:.3f}')} | {both('broker_ms', '{:.3f}')} "
              f"| {both('worker_ms', '{:.3f}')} |")
    print("(pairs: the cluster, then the one redis-server)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

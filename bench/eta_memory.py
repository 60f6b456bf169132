"""What countdown tasks held for their ETA cost the worker's main process, this project's worker
side by side with the Celery worker, on one broker, with the same pool and concurrency.

    python bench/eta_memory.py --broker redis://127.0.0.1:6379/15
    python bench/eta_memory.py --broker amqp://guest:guest@127.0.0.1:5672// --tasks 50000

How it measures (the same way for both workers): the worker starts on an empty queue and runs one
no-op task (it is then ready); its main process's resident set size (RSS, from
``/proc/PID/status``) is read; ``--tasks`` no-op tasks with a countdown of ``--countdown`` seconds
(an hour: none comes due during the run) are published; once the queue has none ready (the worker
took them all, or ``--timeout`` passed: it is then measured on those it holds) and the main
process's RSS has stopped moving, RSS is read again. The difference over the number of tasks held
is the cost of one held task. The pool's processes are not counted: a held task never reaches
them. The messages are those this project's client makes, sent transient (the broker does not
write them to disk); they go back to the broker when the worker stops, and are deleted with their
queue (one per worker; on RabbitMQ the worker is killed, so that the broker takes them back in
one go). Classic queues: on RabbitMQ, quorum queues hand countdowns to the broker's delay queues.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from compare import APPS, Sink, compile_sources, kill_tree, stop


def command(kind: str, args: argparse.Namespace, queue: str) -> list[str]:
    if kind == "celery":
        return [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", args.pool,
                "-c", str(args.concurrency), "-Q", queue, "-l", "WARNING", "--without-gossip",
                "--without-mingle", "--without-heartbeat"]
    return [sys.executable, "-m", "worker_core", "worker", "-A", "worker_app", "-P", args.pool,
            "-c", str(args.concurrency), "-Q", queue, "-l", "WARNING", "--without-heartbeat"]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Broker:
    """Publishes the tasks (the messages this project's client makes, sent transient: the broker
    does not write 50,000 of them to disk) and reads the queue's ready count, each on a connection
    of its own (one kept idle meanwhile is closed by RabbitMQ)."""

    def __init__(self, url: str) -> None:
        sys.path.insert(0, str(APPS))
        os.environ["BENCH_BROKER"] = url
        from worker_core import App

        self.app = App("bench-driver", broker=url, task_ignore_result=True, result_backend="disabled")
        self.queue = f"bench_eta_{uuid.uuid4().hex[:8]}"

    def _connection(self) -> Any:
        from worker_core.app.broker import connection_for

        return connection_for(self.app.plugins, self.app.broker_urls[0], self.app.settings)

    def _queue(self, connection: Any) -> Any:
        from worker_core.app.broker import task_queue

        return task_queue(self.queue, self.app.settings)(connection.default_channel)

    def send(self, name: str, count: int, countdown: float | None = None) -> None:
        import kombu

        from worker_core.protocol import task_message

        with self._connection() as connection:
            queue = self._queue(connection)
            queue.declare()
            producer = kombu.Producer(connection.default_channel)
            for _ in range(count):
                out = task_message(name, str(uuid.uuid4()), (), countdown=countdown, ignore_result=True)
                producer.publish(json.dumps(list(out.body)), exchange=queue.exchange, routing_key=self.queue,
                                 headers=out.headers, content_type="application/json",
                                 content_encoding="utf-8", delivery_mode=1, **out.properties)

    def ready(self) -> int:
        """Messages in the queue not delivered to a consumer (a declare answers with the count;
        a passive one fails on Redis once the list is empty)."""
        with self._connection() as connection:
            return int(self._queue(connection).queue_declare().message_count)

    def delete(self) -> None:
        """Delete the queue; RabbitMQ may take a while after a worker gave 50,000 messages back."""
        for attempt in range(6):
            try:
                with self._connection() as connection:
                    self._queue(connection).delete()
                return
            except Exception as exc:
                problem = exc
                time.sleep(10 * (attempt + 1))
        print(f"  could not delete queue {self.queue!r} ({problem!r}): delete it by hand", file=sys.stderr)


def settle(pid: int, timeout: float) -> int:
    """The process's RSS once it stopped moving (three readings a second apart within 1%)."""
    deadline = time.time() + timeout
    readings = [rss_bytes(pid)]
    while time.time() < deadline:
        time.sleep(1)
        readings.append(rss_bytes(pid))
        last = readings[-3:]
        if len(last) == 3 and max(last) - min(last) <= max(last) // 100:
            return last[-1]
    raise TimeoutError(f"the RSS of process {pid} kept moving for {timeout}s: {readings[-5:]}")


def measure(kind: str, args: argparse.Namespace, sink: Sink, log: Path) -> dict[str, float]:
    broker = Broker(args.broker)  # a queue of its own
    sink.reset()
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_SINK_PORT=str(sink.port),
               BENCH_COUNT_DIR=sink.count_dir, PYTHONPATH=str(APPS))
    process = subprocess.Popen(command(kind, args, broker.queue), cwd=APPS, env=env, stdout=log.open("ab"),
                               stderr=subprocess.STDOUT)
    try:
        broker.send("bench.noop", 1)
        sink.wait_count(1, 120)
        before = settle(process.pid, 60)
        started = time.time()
        broker.send("bench.noop", args.tasks, countdown=args.countdown)
        published = time.time() - started
        deadline = time.time() + args.timeout
        while broker.ready() > 0 and time.time() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{kind} exited with {process.returncode}; see {log}")
            time.sleep(0.5)
        taken = time.time() - started
        after = settle(process.pid, args.timeout)
        held = args.tasks - broker.ready()  # (a worker that took them slowly is measured on what it holds)
    finally:
        if args.broker.startswith("amqp"):
            # killed: RabbitMQ takes back what it held in one go (a warm shutdown gives 50,000
            # messages back one by one, which keeps RabbitMQ busy for minutes)
            kill_tree(process)
        else:
            stop(process)  # Redis: restored at once (killed, they would come back in an hour)
        broker.delete()
    return {"before": before, "after": after, "held": held, "per_task": (after - before) / max(held, 1),
            "publish_s": published, "taken_s": taken}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--pool", "-P", default="prefork")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=50000)
    parser.add_argument("--countdown", type=float, default=3600.0)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait for a worker to take every task (it is measured on "
                             "what it holds by then)")
    parser.add_argument("--only", choices=("worker", "celery"))
    args = parser.parse_args()

    compile_sources()
    sink = Sink()
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-eta-memory.log"))
    kinds = [args.only] if args.only else ["worker", "celery"]
    results: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        results[kind] = measure(kind, args, sink, log)
        print(f"  {kind}: " + ", ".join(f"{k}={v:.4g}" for k, v in results[kind].items()), file=sys.stderr)

    print(f"\nbroker {args.broker}, pool {args.pool}, concurrency {args.concurrency}, "
          f"{args.tasks} countdown tasks of {args.countdown:g}s held")
    mib = 1024 * 1024
    rows = [("tasks held", lambda r: f"{r['held']}"),
            ("main process RSS, idle (MiB)", lambda r: f"{r['before'] / mib:.1f}"),
            ("main process RSS, tasks held (MiB)", lambda r: f"{r['after'] / mib:.1f}"),
            ("bytes per held task", lambda r: f"{r['per_task']:.0f}"),
            ("seconds to take them (from the first publish)", lambda r: f"{r['taken_s']:.1f}")]
    print(f"{'':48}" + "".join(f"{kind:>12}" for kind in kinds))
    for label, cell in rows:
        print(f"{label:48}" + "".join(f"{cell(results[kind]):>12}" for kind in kinds))


if __name__ == "__main__":
    main()

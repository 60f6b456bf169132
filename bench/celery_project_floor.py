"""How fast a Celery app's tasks can go on RabbitMQ with results on, when each task runs through
Celery's own tracer and stores its result through the app's backend: a stand-in worker that
does nothing else, beside ``workerctl worker`` and ``celery worker``, in one run.

    python bench/celery_project_floor.py --broker amqp://guest:guest@127.0.0.1:5672// \\
        --results redis://127.0.0.1:6379/15 --repeat 3

The stand-in is two processes (as prefork ``-c 2``), each consuming the queue itself with py-amqp
(prefetch 4, acknowledging each message as it arrives, as Celery does by default) and handing
each task straight to worker-celery's executor: Celery's tracer, the task, its result stored in one
round trip (the same store ``workerctl worker`` uses). No main process, no pool, no events, no
logging, no time limits, no redelivery checks: what running the task the way the issue demands
costs, and nothing a worker adds. Tasks, messages, counting and CPU are those of
``celery_project.py`` (the same app, 10,000 no-op tasks queued before each contender starts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from celery_project import ResultsProducer, command, drain
from compare import APPS, QUEUE, Sink, compile_sources

PREFETCH = 4


def serve(broker: str) -> None:
    """One process of the stand-in: consume ``QUEUE`` and run each task through Celery's tracer."""
    import importlib.util

    import amqp
    from worker_celery import execution

    # the app module shares its name with the benchmark script beside this one: loaded by path
    spec = importlib.util.spec_from_file_location("bench_celery_project", APPS / "celery_project.py")
    assert spec is not None and spec.loader is not None
    project = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(project)
    execution.install(project.app, "floor@bench", "prefork")
    execution.prepare_process()
    url = urlsplit(broker)
    connection = amqp.Connection(f"{url.hostname or '127.0.0.1'}:{url.port or 5672}",
                                 userid=unquote(url.username or "guest"),
                                 password=unquote(url.password or "guest"),
                                 virtual_host=unquote(url.path[1:]) or "/")
    connection.connect()
    channel = connection.channel()
    channel.basic_qos(0, PREFETCH, False)

    def run(message: Any) -> None:
        channel.basic_ack(message.delivery_tag)
        args, kwargs, embed = json.loads(message.body)
        headers = message.headers
        request = dict(headers, delivery_info={"exchange": "", "routing_key": QUEUE, "priority": 0,
                                               "redelivered": False},
                       reply_to=message.properties.get("reply_to"),
                       correlation_id=message.properties.get("correlation_id"))
        execution.execute(headers["task"], headers["id"], request, args, kwargs, embed or None, False)

    channel.basic_consume(QUEUE, callback=run)
    while True:
        connection.drain_events()


def run(kind: str, args: argparse.Namespace, sink: Sink, producer: ResultsProducer,
        log: Path) -> dict[str, float]:
    if kind == "floor":
        commands = [[sys.executable, __file__, "--serve", "--broker", args.broker] for _ in range(2)]
    else:
        commands = [command(kind, "prefork", 2)]
    return drain(kind, commands, args, args.results, sink, producer, log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--results", default="redis://127.0.0.1:6379/15",
                        help="the Celery app's result backend (emptied first)")
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(APPS))
    if args.serve:
        serve(args.broker)
        return
    if not args.broker.startswith("amqp"):
        parser.error("--broker must be an amqp:// URL: the stand-in consumes with py-amqp")

    compile_sources()
    os.environ.update(BENCH_BROKER=args.broker, BENCH_RESULTS=args.results)
    sink = Sink()
    producer = ResultsProducer(args.broker, True)
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-celery-project.log"))
    kinds = ["floor", "worker", "celery"]
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeat):
        for kind in kinds if repeat % 2 == 0 else reversed(kinds):
            runs[kind].append(run(kind, args, sink, producer, log))
            print(f"  run {repeat + 1}/{args.repeat} {kind}: "
                  + ", ".join(f"{k}={v:.4g}" for k, v in runs[kind][-1].items()), file=sys.stderr)
    median = {kind: {key: statistics.median(r[key] for r in each) for key in each[0]}
              for kind, each in runs.items()}
    celery = median["celery"]["throughput"]
    print(f"\nthe same Celery app, broker {args.broker}, results {args.results}, {args.tasks} no-op tasks, "
          f"median of {args.repeat} runs")
    print(f"{'':34}{'tasks/s':>10}{'vs celery':>11}{'CPU/task ms':>13}")
    labels = {"floor": "stand-in (Celery's tracer only)", "worker": "workerctl worker -P prefork -c 2",
              "celery": "celery worker -P prefork -c 2"}
    for kind in kinds:
        throughput, cpu_ms = median[kind]["throughput"], median[kind]["cpu_ms"]
        print(f"{labels[kind]:34}{throughput:>10.0f}{throughput / celery:>10.2f}x{cpu_ms:>13.3f}")


if __name__ == "__main__":
    main()

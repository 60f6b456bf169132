"""Where a RabbitMQ drain's time goes: the pauses in which no task completes, and the rate
between them, for this worker and Celery side by side (same messages, pool and concurrency as
``compare.py``).

    python bench/pauses.py --broker amqp://guest:guest@127.0.0.1:5672// -P prefork -c 2 --repeat 2
    python bench/pauses.py -P solo -c 1 --prefetch-multiplier 16 --settle 5 --schedstat

The queue is filled with ``--tasks`` no-op tasks while no worker runs, then a worker drains it;
the driver reads the tasks' counters every half millisecond. A pause is a stretch of more than
``--gap`` milliseconds (5) without a completed task. When RabbitMQ runs on this machine (a
``beam.smp`` process), the last column is its CPU inside the pauses, in cores: about one when
the broker is busy with itself and every consumer waits alike, about none when the consumer
holds messages it has not handed on. ``--settle`` waits that many seconds between filling the
queue and starting the worker; ``--prefetch-multiplier`` gives both workers another window;
``--schedstat`` prints, for each of the worker's processes, the share of the drain it ran and
the share it waited for a CPU (``/proc/<pid>/schedstat``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import compare
from compare import Producer, Sink, broker_pids, compile_sources, processes_cpu, spawn, stop, tree


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Nanoseconds each process of ``pid``'s tree has run and has waited for a CPU."""
    found = {}
    for each in tree(pid):
        try:
            ran, waited = Path(f"/proc/{each}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        found[each] = (int(ran), int(waited))
    return found


def drain(kind: str, args: argparse.Namespace, sink: Sink, producer: Producer, log: Path) -> dict[str, float]:
    producer.purge()
    for _ in range(args.tasks):
        producer.send("bench.noop")
    time.sleep(args.settle)
    sink.reset()
    process = spawn(kind, args, sink, log)
    points: list[tuple[float, int, float]] = []
    broker = broker_pids()
    try:
        sink.wait_count(1, 120)
        before = schedstat(process.pid)
        deadline = time.time() + 600
        cpu, polls = processes_cpu(broker), 0
        while True:
            count = sink.count()
            polls += 1
            if polls % 4 == 0:  # every 2 ms: the CPU clock ticks every 10 ms anyway
                cpu = processes_cpu(broker)
            points.append((time.time(), count, cpu))
            if count >= args.tasks or time.time() > deadline:
                break
            time.sleep(0.0005)
        after = schedstat(process.pid)
    finally:
        stop(process)
    paused, broker_paused = 0.0, 0.0
    last_time, last_count, last_cpu = points[0]
    for moment, count, cpu in points[1:]:
        if count != last_count:
            if moment - last_time > args.gap / 1000:
                paused += moment - last_time
                broker_paused += cpu - last_cpu
            last_time, last_count, last_cpu = moment, count, cpu
    total = points[-1][0] - points[0][0]
    done = points[-1][1] - points[0][1]
    if args.schedstat:
        for pid, (ran, waited) in sorted(after.items()):
            if pid in before:
                print(f"  {kind} pid {pid}{' (main)' if pid == process.pid else ''}: ran "
                      f"{(ran - before[pid][0]) / 1e9 / total:.0%}, waited for a CPU "
                      f"{(waited - before[pid][1]) / 1e9 / total:.0%} of the drain", file=sys.stderr)
    return {"rate": done / total, "paused": paused, "share": paused / total,
            "between": done / (total - paused) if total > paused else float("nan"),
            "broker": broker_paused / paused if broker and paused else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--pool", "-P", default="prefork")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--settle", type=float, default=0.0, help="seconds between filling and draining")
    parser.add_argument("--prefetch-multiplier", type=int,
                        help="the window of both workers (default: theirs, 4)")
    parser.add_argument("--schedstat", action="store_true", help="the worker processes' CPU and CPU waits")
    parser.add_argument("--gap", type=float, default=5.0,
                        help="milliseconds without a completed task that count as a pause")
    args = parser.parse_args()
    args.scheduling = "fair"
    if args.prefetch_multiplier:
        base = compare.command

        def command(*given: object, **options: object) -> list[str]:
            return [*base(*given, **options), "--prefetch-multiplier", str(args.prefetch_multiplier)]

        compare.command = command  # type: ignore[assignment]
    compile_sources()
    sink, producer, log = Sink(), Producer(args.broker), Path("/tmp/bench-pauses.log")
    runs: dict[str, list[dict[str, float]]] = {"worker": [], "celery": []}
    for repeat in range(args.repeat):
        for kind in ("worker", "celery") if repeat % 2 == 0 else ("celery", "worker"):
            runs[kind].append(drain(kind, args, sink, producer, log))
            print(f"  run {repeat + 1}/{args.repeat} {kind}: "
                  + ", ".join(f"{k}={v:.4g}" for k, v in runs[kind][-1].items()), file=sys.stderr)
    window = f"prefetch multiplier {args.prefetch_multiplier or 'default'}, settle {args.settle:g} s"
    print(f"\nbroker {args.broker}, pool {args.pool}, concurrency {args.concurrency}, {args.tasks} no-op "
          f"tasks, {window}, pauses over {args.gap:g} ms, median of {args.repeat} runs")
    print(f"{'':34}{'tasks/s':>10}{'paused s':>10}{'paused':>8}{'tasks/s between pauses':>24}"
          f"{'broker CPU in pauses':>22}")
    for kind, results in runs.items():
        m = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{kind:34}{m['rate']:>10.0f}{m['paused']:>10.2f}{m['share']:>8.0%}{m['between']:>24.0f}"
              f"{m['broker']:>22.2f}")


if __name__ == "__main__":
    main()

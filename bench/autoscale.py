"""The autoscaler against Celery's: how fast a burst is absorbed and processes are given back.

    python bench/autoscale.py [--broker redis://127.0.0.1:6379/15] [--autoscale 4,1] [--keepalive 2]

Both workers run prefork with ``--autoscale MAX,MIN`` and ``AUTOSCALE_KEEPALIVE`` set alike. A
burst of ``--burst`` tasks sleeping ``--seconds`` each is sent to the idle worker; reported are
the time from the burst to MAX processes (absorb), the time the burst took to run, and the time
from the last task's end to MIN processes (give back). Processes are counted from /proc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from compare import APPS, QUEUE, Producer, Sink, stop, tree


def processes(pid: int) -> int:
    return len(tree(pid)) - 1


def command(kind: str, autoscale: str) -> list[str]:
    if kind == "celery":
        return [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", "prefork", "--autoscale",
                autoscale, "-Q", QUEUE, "-l", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat"]
    return [sys.executable, "-m", "worker_core", "worker", "-A", "worker_app", "-P", "prefork", "--autoscale",
            autoscale, "-Q", QUEUE, "-l", "WARNING"]


def wait_until(condition, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError("timed out")
        time.sleep(0.02)
    return time.monotonic() - started


def run(kind: str, args: argparse.Namespace, sink: Sink, producer: Producer) -> dict[str, float]:
    high, low = (int(x) for x in args.autoscale.split(","))
    producer.purge()
    env = dict(os.environ, BENCH_BROKER=args.broker, BENCH_SINK_PORT=str(sink.port), PYTHONPATH=str(APPS),
               AUTOSCALE_KEEPALIVE=str(args.keepalive))
    with Path("/tmp/bench-autoscale.log").open("ab") as log:
        process = subprocess.Popen(command(kind, args.autoscale), cwd=APPS, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: processes(process.pid) >= max(low, 1), 30)
            time.sleep(3)  # idle, settled
            sink.reset()
            sent = time.monotonic()
            for _ in range(args.burst):
                producer.send("bench.sleep", (args.seconds,))
            wait_until(lambda: processes(process.pid) >= high, 60)
            absorb = time.monotonic() - sent
            sink.wait(lambda: len(sink.noops) >= args.burst, 300)
            done = time.monotonic()
            give_back = wait_until(lambda: processes(process.pid) <= max(low, 1), 120)
            return {"absorb": absorb, "burst": done - sent, "give_back": give_back}
        finally:
            stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--autoscale", default="4,1")
    parser.add_argument("--keepalive", type=float, default=2.0)
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sink, producer = Sink(), Producer(args.broker)
    results: dict[str, list[dict[str, float]]] = {"worker": [], "celery": []}
    for repeat in range(args.repeat):
        for kind in ("worker", "celery") if repeat % 2 == 0 else ("celery", "worker"):
            results[kind].append(run(kind, args, sink, producer))
            print(f"  {kind}: {results[kind][-1]}", file=sys.stderr)
    print(f"\nprefork --autoscale {args.autoscale}, AUTOSCALE_KEEPALIVE={args.keepalive:g}, "
          f"burst of {args.burst} tasks of {args.seconds:g}s, {args.broker}, median of {args.repeat} runs")
    print(f"{'':34}{'worker':>10}{'celery':>10}")
    for key, label in (("absorb", "burst to MAX processes (s)"), ("burst", "burst completed in (s)"),
                       ("give_back", "last task to MIN processes (s)")):
        ours = statistics.median(r[key] for r in results["worker"])
        theirs = statistics.median(r[key] for r in results["celery"])
        print(f"{label:34}{ours:>10.2f}{theirs:>10.2f}")


if __name__ == "__main__":
    main()

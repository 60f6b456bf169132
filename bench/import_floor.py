"""The start-up floor set by the libraries a worker is built on: how long a fresh interpreter
takes to import them, before any of the worker's own code runs.

    python bench/import_floor.py --repeat 10

For this worker: kombu with its py-amqp transport, event loop and mailbox, click, attrs,
stevedore and pluggy (the libraries its design names; kombu brings billiard along when it is
installed, as it is with the prefork pool). For Dramatiq: its CLI, its RabbitMQ broker and pika.
Each row is the median over ``--repeat`` fresh processes of the import itself (the collector off,
as ``workerctl`` has it while it starts) and of the whole process, from spawning it to its exit.
Compare with the start-up column of ``compare.py``, which goes on to the first task run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STACKS = {
    "worker": "click, attrs, stevedore, pluggy, kombu.messaging, kombu.pidbox, kombu.asynchronous, "
              "kombu.transport.pyamqp",
    "dramatiq": "dramatiq, dramatiq.cli, dramatiq.brokers.rabbitmq, pika",
}

TIMED = """
import gc, time
gc.disable()
started = time.perf_counter()
import {modules}
print(time.perf_counter() - started)
"""


def measure(modules: str, repeat: int) -> tuple[float, float]:
    imports, processes = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", TIMED.format(modules=modules)], check=True,
                             capture_output=True, text=True).stdout
        processes.append(time.perf_counter() - started)
        imports.append(float(out))
    return statistics.median(imports), statistics.median(processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"{'stack':10} {'import ms':>10} {'process ms':>11}  modules")
    for name, modules in STACKS.items():
        try:
            imported, process = measure(modules, args.repeat)
        except subprocess.CalledProcessError as exc:
            print(f"{name:10} not installed ({exc.stderr.strip().splitlines()[-1]})")
            continue
        print(f"{name:10} {imported * 1000:>10.1f} {process * 1000:>11.1f}  {modules}")


if __name__ == "__main__":
    main()

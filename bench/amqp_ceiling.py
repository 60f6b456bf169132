"""How fast RabbitMQ hands out the benchmark's messages to a consumer that does nothing with them:
the ceiling under any worker's no-op throughput on this machine.

    python bench/amqp_ceiling.py --broker amqp://guest:guest@127.0.0.1:5672// --tasks 30000

The same Celery protocol v2 messages as ``compare.py`` (persistent, on a durable queue) are queued
while nothing consumes, then one bare py-amqp consumer drains them: without acknowledgements,
acknowledging each message, and acknowledging every N with ``multiple``. For each mode it prints
messages per second, the broker's CPU per message (``beam.smp`` from ``/proc``), the consumer's,
and the time the consumer sat waiting on gaps of more than 10 ms between two deliveries (the
broker busy with itself, for example writing its queue index).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import amqp
from compare import QUEUE, Producer, broker_pids, cpu_seconds

#: (name, prefetch count, acknowledge every N): a prefetch of 4 is a solo worker's window at the
#: default multiplier, 8 a worker's with two processes
MODES = (("no acks", 8, 0), ("ack each", 8, 1), ("ack every 4", 8, 4), ("ack every 2", 4, 2),
         ("ack every 4", 4, 4), ("ack every 32", 64, 32))


def drain(url: str, count: int, prefetch: int, every: int) -> dict[str, float]:
    parts = urlsplit(url)
    vhost = parts.path[1:] or "/"
    connection = amqp.Connection(f"{parts.hostname}:{parts.port or 5672}", userid=parts.username or "guest",
                                 password=parts.password or "guest", virtual_host=vhost)
    connection.connect()
    try:
        channel = connection.channel()
        channel.basic_qos(0, prefetch, False)
        arrivals: list[float] = []

        def on_message(message: Any) -> None:
            arrivals.append(time.perf_counter())
            if every and len(arrivals) % every == 0:
                channel.basic_ack(message.delivery_tag, multiple=every > 1)

        broker = broker_pids()
        broker_before, own_before = sum(map(cpu_seconds, broker)), time.process_time()
        channel.basic_consume(QUEUE, callback=on_message, no_ack=not every)
        while len(arrivals) < count:
            connection.drain_events(timeout=10)
        broker_after, own_after = sum(map(cpu_seconds, broker)), time.process_time()
    finally:
        connection.close()
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    return {
        "rate": (count - 1) / (arrivals[-1] - arrivals[0]),
        "broker_us": (broker_after - broker_before) / count * 1e6,
        "consumer_us": (own_after - own_before) / count * 1e6,
        "stalled": sum(gap for gap in gaps if gap > 0.01) / (arrivals[-1] - arrivals[0]),
        "longest_ms": max(gaps) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--tasks", type=int, default=30000)
    args = parser.parse_args()
    if not broker_pids():
        sys.exit("no beam.smp process on this machine: run this next to the RabbitMQ it measures")
    producer = Producer(args.broker)
    print(f"{'mode':14} {'prefetch':>8} {'msgs/s':>8} {'broker us/msg':>14} {'consumer us/msg':>16} "
          f"{'stalled':>8} {'longest gap':>12}")
    for name, prefetch, every in MODES:
        producer.purge()
        for _ in range(args.tasks):
            producer.send("bench.noop")
        time.sleep(1)
        row = drain(args.broker, args.tasks, prefetch, every)
        print(f"{name:14} {prefetch:>8} {row['rate']:>8.0f} {row['broker_us']:>14.1f} "
              f"{row['consumer_us']:>16.1f} {row['stalled']:>7.0%} {row['longest_ms']:>9.1f} ms", flush=True)
    producer.purge()


if __name__ == "__main__":
    main()

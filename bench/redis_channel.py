"""Consume-and-ack throughput of the Redis transport against stock kombu, at the kombu level.

    python bench/redis_channel.py --url redis://127.0.0.1:6379/15 --messages 50000 --prefetch 40

For each transport: publish ``--messages`` small messages while nobody consumes, then consume and
acknowledge them all with a ``kombu.Consumer`` (QoS ``--prefetch``, ``apply_global=True``), driven
by ``drain_events`` (``--loop sync``) or by a kombu Hub (``--loop hub``); prints messages per second
of the consume phase, and checks that nothing is left in the queue or in ``unacked``.
Then, on the idle consumer (a thread), ``--samples`` times: publish one message and wait for its
callback; prints the median and 99th percentile of publish-to-callback.
Uses one queue with a unique name in the given database and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from typing import Any

import kombu
import redis
from kombu.asynchronous import Hub

from worker_core.app.settings import Settings
from worker_transport_redis.transport import RedisTransport


def publish(connection: kombu.Connection, queue: kombu.Queue, count: int) -> None:
    channel = connection.channel()
    queue(channel).declare()
    producer = kombu.Producer(channel)
    body = {"task": "noop", "args": [], "kwargs": {}}
    for _ in range(count):
        producer.publish(body, exchange="", routing_key=queue.name, delivery_mode=2)
    channel.close()


def consume(connection: kombu.Connection, queue: kombu.Queue, count: int, prefetch: int, loop: str) -> float:
    done = [0]

    def on_message(message: Any) -> None:
        message.ack()
        done[0] += 1

    consumer = kombu.Consumer(connection.default_channel, [queue], on_message=on_message, no_ack=False)
    consumer.qos(prefetch_count=prefetch, apply_global=True)
    consumer.consume()
    start = time.perf_counter()
    if loop == "hub":
        hub = Hub()
        connection.transport.register_with_event_loop(connection.connection, hub)
        turns = hub.create_loop()
        while done[0] < count:
            next(turns)
        next(turns)  # one more turn writes the last acknowledgements
        hub.close()
    else:
        while done[0] < count:
            try:
                connection.drain_events(timeout=1)
            except TimeoutError:
                break
    elapsed = time.perf_counter() - start
    consumer.cancel()
    return elapsed


def latency(connection: kombu.Connection, queue: kombu.Queue, samples: int, prefetch: int,
            loop: str) -> list[float]:
    """Publish-to-callback seconds on an idle consumer driven in a thread."""
    arrived = threading.Event()
    stop = threading.Event()

    def on_message(message: Any) -> None:
        message.ack()
        arrived.set()

    consumer = kombu.Consumer(connection.default_channel, [queue], on_message=on_message, no_ack=False)
    consumer.qos(prefetch_count=prefetch, apply_global=True)
    consumer.consume()

    def drive() -> None:
        if loop == "hub":
            hub = Hub()
            connection.transport.register_with_event_loop(connection.connection, hub)
            turns = hub.create_loop()
            while not stop.is_set():
                next(turns)
            hub.close()
        else:
            while not stop.is_set():
                try:
                    connection.drain_events(timeout=0.2)
                except TimeoutError:
                    pass

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    producer = kombu.Producer(connection.channel())
    times = []
    time.sleep(0.3)
    for _ in range(samples):
        arrived.clear()
        start = time.perf_counter()
        producer.publish({"task": "latency"}, exchange="", routing_key=queue.name)
        if not arrived.wait(10):
            raise TimeoutError("a message did not arrive within 10 s")
        times.append(time.perf_counter() - start)
        time.sleep(0.002)
    stop.set()
    thread.join()
    return sorted(times)


def run(name: str, url: str, transport: Any, options: dict[str, Any], args: argparse.Namespace) -> None:
    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    queue = kombu.Queue(queue_name, kombu.Exchange(queue_name, type="direct"), routing_key=queue_name)
    connection = kombu.Connection(url, transport=transport, **options)
    publish(connection, queue, args.messages)
    elapsed = consume(connection, queue, args.messages, args.prefetch, args.loop)
    times = latency(connection, queue, args.samples, args.prefetch, args.loop) if args.samples else [0.0]
    connection.release()
    client = redis.Redis.from_url(url)
    left = client.llen(queue_name)
    unacked = client.hlen("unacked")
    client.delete(queue_name, f"_kombu.binding.{queue_name}", f"_kombu.binding_permanent.{queue_name}")
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"{name:>8}: {args.messages / elapsed:9.0f} msg/s  ({args.messages} in {elapsed:.2f}s, "
          f"left in queue {left}, unacked {unacked}); publish-to-callback p50 "
          f"{statistics.median(times) * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--prefetch", type=int, default=40)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--loop", choices=("sync", "hub"), default="sync")
    parser.add_argument("--only", choices=("ours", "kombu"))
    args = parser.parse_args()
    print(f"{args.messages} messages, prefetch {args.prefetch}, {args.loop} loop, {args.url}")
    if args.only != "ours":
        run("kombu", args.url, "redis", {}, args)
    if args.only != "kombu":
        ours = RedisTransport(args.url, Settings())
        run("ours", args.url, ours.kombu_transport(), ours.connection_options(), args)


if __name__ == "__main__":
    main()

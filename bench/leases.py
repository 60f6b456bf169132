"""Leases on Redis: tasks that outlast the visibility timeout, counted.

    python bench/leases.py [--stock] [--visibility-timeout 5] [--only long|countdown|renewal]

On a private redis-server: two prefork workers (-c 4) run 40 ``acks_late`` tasks of twice the
visibility timeout; then one worker holds 2,000 countdown tasks of 1.2 to 2.4 times the timeout.
Every execution is counted in Redis; the run prints the runs, the most runs of one task and the
tasks that ran, for each. ``--stock`` turns the fast paths off (``WORKER_STOCK_KOMBU=1``).
Exit status 0 when every task ran exactly once. Last, the time of one renewal round trip (the
script that moves each lease this worker still holds to Redis's time and names those it lost)
for 2,000 and 50,000 held messages, the best of five.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path[:0] = [str(TESTS)]  # faults.py, workers.py and the task app

from faults import RedisServer  # noqa: E402
from workers import WorkerProcess, wait_for  # noqa: E402


def _settle(client: redis.Redis, key: str, total: int, limit: float) -> tuple[dict[int, int], float]:
    """Wait until ``total`` tasks ran and nothing is held or queued; the counts and the time taken."""
    started = time.monotonic()

    def done() -> bool:
        return client.hlen(key) >= total and not client.hlen("unacked") and not client.llen("celery")

    try:
        wait_for(done, timeout=limit, interval=0.5, message=f"{total} tasks to run once")
    except AssertionError as exc:
        print(f"  ({exc})")
    counts = {int(field): int(times) for field, times in client.hgetall(key).items()}
    return counts, time.monotonic() - started


def _line(what: str, counts: dict[int, int], seconds: float, total: int) -> bool:
    runs = sum(counts.values())
    most = max(counts.values(), default=0)
    print(f"{what}: {runs} runs, at most {most} of one task, {len(counts)} of {total} tasks ran, "
          f"{seconds:.0f} s")
    return runs == total and len(counts) == total


def _renewals(url: str) -> None:
    """Time one renewal of ``held`` leases (all still this worker's), the best of five."""
    from worker_transport_redis.scripts import RENEW, run

    client = redis.Redis.from_url(url, socket_timeout=300)
    for held in (2000, 50_000):
        stamp = f"{time.time():.6f}"
        tags = [f"bench-{uuid.uuid4().hex}" for _ in range(held)]
        for start in range(0, held, 1000):
            client.zadd("bench_index", dict.fromkeys(tags[start:start + 1000], float(stamp)))
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            reply = run(client, RENEW, ["bench_index", "bench_mutex"], [stamp, held, *tags])
            best = min(best, time.perf_counter() - began)
            stamp = reply[1].decode()
        assert int(reply[2]) == 0, "a lease was taken for lost"
        client.delete("bench_index")
        print(f"one renewal of {held:,} held leases: {best * 1000:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stock", action="store_true", help="kombu's own paths (WORKER_STOCK_KOMBU=1)")
    parser.add_argument("--visibility-timeout", type=float, default=5.0)
    parser.add_argument("--only", choices=("long", "countdown", "renewal"), help="run one of the parts")
    args = parser.parse_args()
    timeout = args.visibility_timeout
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory)).start()
        options = {"visibility_timeout": timeout, "unacked_restore_interval": 1}
        env = dict(os.environ, PYTHONPATH=str(TESTS), PYTHONUNBUFFERED="1", WORKER_BROKER_URL=server.url,
                   WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps(options))
        if args.stock:
            env["WORKER_STOCK_KOMBU"] = "1"
        from apps import basic

        basic.app.conf.update(broker_url=server.url, broker_transport_options=options)
        client = redis.Redis.from_url(server.url)
        workers = []
        try:
            for n in range(2):
                workers.append(WorkerProcess(
                    ["-A", "apps.basic", "-P", "prefork", "-c", "4", "-l", "INFO", "-n",
                     f"leases{n}-{uuid.uuid4().hex[:6]}@localhost"],
                    env, Path(directory) / f"worker-{n}.log").wait_ready())
            ok = True
            if args.only in (None, "long"):
                for n in range(40):
                    basic.count_slowly.delay(server.url, "long", n, 2 * timeout)
                counts, seconds = _settle(client, "long", 40, 40 * timeout)
                ok &= _line(f"40 acks_late tasks of {2 * timeout:g} s on 2 workers (-c 4), "
                            f"visibility_timeout {timeout:g} s", counts, seconds, 40)
            if args.only in (None, "renewal"):
                _renewals(server.url)
            workers.pop().stop()
            if args.only not in ("long", "renewal"):
                for n in range(2000):
                    basic.count.apply_async((server.url, "countdown", n),
                                            countdown=random.uniform(1.2 * timeout, 2.4 * timeout))
                counts, seconds = _settle(client, "countdown", 2000, 40 * timeout)
                ok &= _line(f"2,000 countdowns of {1.2 * timeout:g}-{2.4 * timeout:g} s on 1 worker, "
                            f"visibility_timeout {timeout:g} s", counts, seconds, 2000)
        finally:
            for worker in workers:
                worker.stop()
                worker.kill()
            basic.app.close()
            server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

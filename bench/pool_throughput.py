"""How many no-op jobs per second each pool runs, without a broker: solo, threads and prefork at
``-c 2`` and ``-c 4``, driven by the pool's own thread (sync loop) and by a kombu hub (async loop).

    python bench/pool_throughput.py [--jobs 20000] [--concurrency 2,4] [--window 0] [--repeat 3]
                                    [--pools solo,threads,prefork,billiard]

Timing runs from the first ``apply_async`` to the last result callback; pool start and stop are
not counted. ``--window N`` keeps at most N jobs in flight (the worker's prefetch window; each
result submits the next job; solo runs inline and ignores it); 0 submits every job at once.
``billiard`` is billiard's own ``Pool`` (Celery's pool under its sync loop), as a same-machine
baseline. Prints the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from worker_core.pools.solo import SoloPool
from worker_core.slots import PoolOptions
from worker_core.testing.jobs import noop


class Counter:
    """Counts results; submits the next job from each callback when a window is set."""

    def __init__(self, total: int, submit: Callable[[], None] | None) -> None:
        self.total = total
        self.seen = 0
        self.submit = submit
        self.finished = threading.Event()
        self.lock = threading.Lock()
        #: Wakes the hub's poller when the last result came from another thread.
        self.wake: Callable[[], None] | None = None

    def __call__(self, _value: Any) -> None:
        with self.lock:
            self.seen += 1
            seen = self.seen
        if seen == self.total:
            self.finished.set()
            if self.wake is not None:
                self.wake()
        elif self.submit is not None:
            self.submit()


def run_pool(pool_cls: Any, concurrency: int, driver: str, jobs: int, window: int) -> float:
    """Seconds to run ``jobs`` no-op jobs through a started pool."""
    pool = pool_cls(PoolOptions(concurrency=concurrency))
    pool.start()
    hub: Any = None
    idle: tuple[int, int] | None = None
    if driver == "hub":
        from kombu.asynchronous import Hub

        hub = Hub()  # type: ignore[no-untyped-call]
        # The worker's hub always watches the broker connection; an idle pipe stands in for it,
        # so the hub polls (and wakes on call_soon) instead of napping when a pool has no fds.
        idle = os.pipe()
        hub.add_reader(idle[0], lambda: None)
        pool.register_with_event_loop(hub)
    sent = [0]
    counter: Counter

    def submit() -> None:
        if sent[0] < jobs:
            sent[0] += 1
            pool.apply_async(noop, (), callback=counter)

    counter = Counter(jobs, submit if window else None)
    if hub is not None:
        counter.wake = lambda: hub.call_soon(lambda: None)
    try:
        began = time.perf_counter()
        for _ in range(window or jobs):
            submit()
        if hub is None:
            counter.finished.wait(300)
        else:
            while not counter.finished.is_set():
                hub.run_once()
        elapsed = time.perf_counter() - began
    finally:
        pool.stop()
        if hub is not None:
            hub.close()
        for fd in idle or ():
            os.close(fd)
    if counter.seen != jobs:
        raise SystemExit(f"{pool_cls.__name__}: only {counter.seen} of {jobs} jobs reported")
    return elapsed


def run_billiard(concurrency: int, jobs: int, window: int) -> float:
    import billiard

    pool = billiard.Pool(processes=concurrency)
    sent = [0]

    def submit() -> None:
        if sent[0] < jobs:
            sent[0] += 1
            pool.apply_async(noop, (), callback=counter)

    counter = Counter(jobs, submit if window else None)
    try:
        began = time.perf_counter()
        for _ in range(window or jobs):
            submit()
        counter.finished.wait(300)
        elapsed = time.perf_counter() - began
    finally:
        pool.terminate()
        pool.join()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--concurrency", default="2,4")
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pools", default="solo,threads,prefork,billiard")
    args = parser.parse_args()
    pools = args.pools.split(",")
    levels = [int(level) for level in args.concurrency.split(",")]
    rows: list[tuple[str, int, str, Callable[[], float]]] = []
    if "solo" in pools:
        for driver in ("thread", "hub"):
            # Solo runs each job inline, inside apply_async: there is no window to keep.
            rows.append(("solo", 1, driver, functools.partial(run_pool, SoloPool, 1, driver, args.jobs, 0)))
    classes: dict[str, Any] = {}
    if "threads" in pools:
        from worker_pool_threads import ThreadPool

        classes["threads"] = ThreadPool
    if "prefork" in pools:
        from worker_pool_prefork import PreforkPool

        classes["prefork"] = PreforkPool
    for name, cls in classes.items():
        for level in levels:
            for driver in ("thread", "hub"):
                rows.append((name, level, driver,
                             functools.partial(run_pool, cls, level, driver, args.jobs, args.window)))
    if "billiard" in pools:
        for level in levels:
            rows.append(("billiard.Pool", level, "thread",
                         functools.partial(run_billiard, level, args.jobs, args.window)))
    print(f"{args.jobs} no-op jobs, window {args.window or 'all'}, best of {args.repeat}")
    print(f"{'pool':<14} {'-c':>3} {'driver':<7} {'jobs/s':>10}")
    for name, level, driver, run in rows:
        best = min(run() for _ in range(args.repeat))
        print(f"{name:<14} {level:>3} {driver:<7} {args.jobs / best:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()

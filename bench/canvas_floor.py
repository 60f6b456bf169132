"""The least time the workflows of ``canvas.py`` can take on this machine, whatever the worker:
what the 5x target there is measured against.

    python bench/canvas_floor.py --broker redis://127.0.0.1:6379/15 --repeat 5

- **Chain of 100 tasks.** The same Celery client sends the same chain (``add.s(0, 1)`` then
  ``add.s(1)`` 99 times) and waits on its result with ``get()``, as in ``canvas.py``; instead of a
  worker, one process does only what a step cannot do without, and nothing a worker adds: take
  the message with BRPOP, decode it (the broker's envelope, the base64 body, the JSON body), add,
  then in one round trip store the result with Celery's key, publish it to the waiting client,
  push the next step (the rest of the chain carried on, as Celery's worker does) and take the
  next message with BRPOP: one round trip to Redis per step. No
  acknowledgement, no record of the message while it runs, no pool, no events, no logging: a
  worker doing the task itself (the result stored and the next step sent) can only be slower.
- **Chord of 1,000 header tasks.** The same Celery client sends the same chord while nothing
  consumes the queue: the time ``apply_async()`` takes. No worker can give the chord's result
  before its client has sent the last header task.

The table puts these beside the Celery worker's times from ``canvas.py`` (``--celery-chain`` and
``--celery-chord``, in seconds; without them it runs ``celery worker`` as ``canvas.py`` does, prefork
``-c 2``): the last column is the most any worker could be faster than Celery's here.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from canvas import APPS, CHAIN_LENGTH, CHORD_SIZE, SHAPES, chain_of, chord_of, empty_results, measure

QUEUE = "bench-canvas-floor"


def serve(broker: str) -> None:
    """The floor's stand-in for a worker: runs the chain's steps on ``QUEUE`` until killed, each
    in one round trip (the result stored and published, the next step pushed, and the next
    message taken with BRPOP, all in one pipeline)."""
    import redis

    client = redis.Redis.from_url(broker)
    _, raw = client.brpop([QUEUE])
    while True:
        envelope = json.loads(raw)
        args, _kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
        headers = envelope["headers"]
        value = sum(args)
        task_id = headers["id"]
        meta = json.dumps({"status": "SUCCESS", "result": value, "traceback": None, "children": [],
                           "date_done": time.strftime("%Y-%m-%dT%H:%M:%S"), "task_id": task_id})
        key = f"celery-task-meta-{task_id}"
        with client.pipeline(transaction=False) as pipe:
            pipe.set(key, meta, ex=3600)
            pipe.publish(key, meta)
            chain = embed.get("chain")
            if chain:
                step = chain.pop()
                options = step["options"]
                headers = dict(headers, id=options["task_id"], task=step["task"], parent_id=task_id,
                               root_id=headers.get("root_id") or task_id)
                body = json.dumps([[value, *step["args"]], step["kwargs"], dict(embed, chain=chain)])
                envelope = dict(envelope, headers=headers,
                                body=base64.b64encode(body.encode()).decode())
                envelope["properties"] = dict(envelope["properties"], correlation_id=options["task_id"])
                pipe.lpush(QUEUE, json.dumps(envelope))
            pipe.brpop([QUEUE])
            _, raw = pipe.execute()[-1]


def client_app(broker: str) -> tuple[Any, Any, Any]:
    """A new Celery client sending to the floor's queue (results in the broker's Redis)."""
    os.environ.update(BENCH_BROKER=broker, BENCH_BACKEND=broker, BENCH_QUEUE=QUEUE)
    import canvas_celery_app

    app, add, tsum = canvas_celery_app.client()
    return app, add, tsum


def chain_floor(broker: str) -> float:
    app, *tasks = client_app(broker)
    try:
        sig, expected = chain_of(tasks, CHAIN_LENGTH)
        began = time.perf_counter()
        value = sig.apply_async().get(timeout=60)
        elapsed = time.perf_counter() - began
    finally:
        app.close()
    if value != expected:
        raise AssertionError(f"the chain gave {value!r}, not {expected!r}")
    return elapsed


def chord_floor(broker: str) -> float:
    import redis

    app, *tasks = client_app(broker)
    try:
        sig, _ = chord_of(tasks, CHORD_SIZE)
        began = time.perf_counter()
        sig.apply_async()
        elapsed = time.perf_counter() - began
    finally:
        app.close()
    sent = redis.Redis.from_url(broker).llen(QUEUE)
    if sent != CHORD_SIZE:
        raise AssertionError(f"the client left {sent} header tasks in the queue, not {CHORD_SIZE}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/15",
                        help="a Redis broker (results there too)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--celery-chain", type=float, help="the Celery worker's chain time from canvas.py")
    parser.add_argument("--celery-chord", type=float, help="the Celery worker's chord time from canvas.py")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(APPS))
    if args.serve:
        serve(args.broker)
        return
    if not args.broker.startswith("redis"):
        parser.error("--broker must be a Redis URL: the floor's chain is run with Redis commands")

    import redis

    client = redis.Redis.from_url(args.broker)
    empty_results(args.broker)
    floors: dict[str, list[float]] = {"chain": [], "chord": []}
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--broker", args.broker], cwd=APPS)
    try:
        chain_floor(args.broker)  # warm up: imports, connections
        for _ in range(args.repeat):
            floors["chain"].append(chain_floor(args.broker))
    finally:
        server.kill()
        server.wait()
    for _ in range(args.repeat):
        client.delete(QUEUE)
        floors["chord"].append(chord_floor(args.broker))
    client.delete(QUEUE)
    empty_results(args.broker)
    floor = {name: statistics.median(times) for name, times in floors.items()}

    celery = {"chain": args.celery_chain, "chord": args.celery_chord}
    if None in celery.values():
        measured = measure_celery(args.broker, args.repeat)
        celery = {name: celery[name] or measured[name] for name in celery}
    print(f"\nbroker and results {args.broker}, sent by a Celery client, median of {args.repeat} runs")
    print(f"{'':40}{'floor':>10}{'celery':>10}{'most any worker can gain':>27}")
    labels = {"chain": f"chain of {CHAIN_LENGTH} tasks (s)",
              "chord": f"chord of {CHORD_SIZE:,} header tasks (s)"}
    for name, label in labels.items():
        print(f"{label:40}{floor[name]:>10.3f}{celery[name]:>10.3f}{celery[name] / floor[name]:>26.2f}x")


def measure_celery(broker: str, repeat: int) -> dict[str, float]:
    """The Celery worker's times, measured as ``canvas.py`` measures them (prefork -c 2)."""
    import canvas_celery_app

    options = argparse.Namespace(broker=broker, backend=broker, pool="prefork", concurrency=2, timeout=300.0)
    os.environ.update(BENCH_BROKER=broker, BENCH_BACKEND=broker, BENCH_QUEUE="bench-canvas")
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-canvas.log"))
    runs = [measure("celery", options, canvas_celery_app.app, log) for _ in range(repeat)]
    return {name: statistics.median(run[name] for run in runs) for name in SHAPES}


if __name__ == "__main__":
    main()

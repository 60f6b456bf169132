"""The same Django tasks (``apps/djtasks``: a no-op, and a small ORM write) through four
``django.tasks`` backends and their workers, side by side: throughput and send-to-start latency.

    make .venv-django6/bin/.installed
    .venv-django6/bin/pip install django-tasks-db 'django-tasks-celery[celery]' 'celery[redis]'
    .venv-django6/bin/python bench/django_tasks.py --repeat 3

(the peers are benchmark-only: none is a dependency of worker-django), on Django 6 (Python 3.12):

- ``worker-redis``: worker_django's ``WorkerBackend`` on this worker's Redis transport,
  ``workerctl worker -A djtasks.settings -P prefork -c 2``, results in the same Redis;
- ``worker-postgres``: the same on this worker's PostgreSQL transport, results in PostgreSQL;
- ``db_worker``: django-tasks-db's ``DatabaseBackend`` (tasks are rows of the project's
  database), ``manage.py db_worker`` started ``-c`` times (it runs one task at a time), with its
  default ``--interval`` of 1 s (how long it sleeps when it found nothing to run) unless
  ``--db-interval`` says otherwise;
- ``celery``: django-tasks-celery's ``CeleryBackend`` with Celery on the same Redis (results
  there), ``celery worker -P prefork -c 2`` (without gossip, mingle, heartbeat).

Every worker but db_worker runs without heartbeat events, at ``-l WARNING``. The project's
database is the PostgreSQL on 127.0.0.1:5432 (a fresh schema per run, dropped after), which the
ORM task writes a row to and django-tasks-db keeps its tasks in.

How it measures, the same way for every contender (each run is a process of its own with Django
set up for that backend; the contenders take turns):

- throughput: ``--tasks`` tasks are enqueued (``task.enqueue()``, as a view does) while no worker
  runs, then the worker starts; tasks per second from the first task seen done to the last (the
  tasks count themselves in shared memory, which the driver polls every millisecond; see
  ``apps/sink.py``); once for the no-op task, once for the ORM task (its rows are counted after);
- send-to-start latency: on the idle worker, one task at a time, from just before
  ``enqueue()`` is called to the task's first line (p50 and p95 of ``--samples`` tasks);
- enqueue: what ``enqueue()`` costs the caller, per task (ms), over the no-op throughput run's
  enqueues.

The median of ``--repeat`` runs; the machine's load average (1 min) before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from compare import APPS, Sink, compile_sources, stop

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
CONTENDERS = ["worker-redis", "worker-postgres", "db_worker", "celery"]
BACKENDS = {"worker-redis": "worker-redis", "worker-postgres": "worker-postgres", "db_worker": "db",
            "celery": "celery"}


def commands(contender: str, args: argparse.Namespace) -> list[list[str]]:
    c = str(args.concurrency)
    python = sys.executable
    if contender == "db_worker":
        return [[python, "-m", "django", "db_worker", "--settings", "djtasks.settings",
                 "--queue-name", "default", "--interval", str(args.db_interval), "--no-startup-delay",
                 "--no-reload", "--worker-id", f"bench-{n}"] for n in range(args.concurrency)]
    if contender == "celery":
        return [[python, "-m", "celery", "-A", "djtasks.celery_app", "worker", "-P", "prefork", "-c", c,
                 "-Q", "default", "-l", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"]]
    return [[python, "-m", "worker_core", "worker", "-A", "djtasks.settings", "-P", "prefork", "-c", c,
             "-Q", "default", "-l", "WARNING", "--without-heartbeat"]]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# -- one run: a process with Django set up for one backend -------------------------------------


def child(contender: str, args: argparse.Namespace) -> dict[str, float]:
    import psycopg

    schema = f"bench_django_{uuid.uuid4().hex[:8]}"
    os.environ.update(BENCH_DJ_BACKEND=BACKENDS[contender], BENCH_DJ_SCHEMA=schema,
                      BENCH_DJ_BROKER_SCHEMA=f"{schema}_broker", BENCH_REDIS=args.redis,
                      DJANGO_SETTINGS_MODULE="djtasks.settings")
    sys.path.insert(0, str(APPS))
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)
        if contender in ("worker-redis", "celery"):
            import redis

            redis.Redis.from_url(args.redis).flushdb()
        return measure(contender, args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(POSTGRES, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}_broker" CASCADE')


def measure(contender: str, args: argparse.Namespace) -> dict[str, float]:
    from djtasks.models import Note
    from djtasks.tasks import noop, started, write_note

    sink = Sink()
    env = dict(os.environ, BENCH_SINK_PORT=str(sink.port), BENCH_COUNT_DIR=sink.count_dir,
               PYTHONPATH=str(APPS))
    log = Path(os.environ.get("BENCH_LOG", "/tmp/bench-django-tasks.log"))
    result: dict[str, float] = {}
    for kind, task in (("noop", noop), ("orm", write_note)):
        begun = time.perf_counter()
        for n in range(args.tasks):
            if kind == "noop":
                task.enqueue()
            else:
                task.enqueue(f"note {n}")
        if kind == "noop":
            result["enqueue_ms"] = (time.perf_counter() - begun) / args.tasks * 1000
        sink.reset()
        processes = [subprocess.Popen(each, cwd=APPS, env=env, stdout=log.open("ab"),
                                      stderr=subprocess.STDOUT) for each in commands(contender, args)]
        try:
            first, first_count = sink.wait_count(1, 120)
            last, last_count = sink.wait_count(args.tasks, 900)
            result[f"{kind}_per_s"] = (last_count - first_count) / (last - first)
            if kind == "noop":
                latencies = []
                time.sleep(0.5)  # (idle: every process has gone back to waiting for work)
                for _ in range(args.samples):
                    sink.reset()
                    sent_at = time.time()
                    started.enqueue(sent_at)
                    sink.wait(lambda: sink.latencies, 30)
                    latencies.append(sink.latencies[0])
                latencies.sort()
                result["p50_ms"] = statistics.median(latencies) * 1000
                result["p95_ms"] = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))] * 1000
        finally:
            for process in processes:
                stop(process)
    rows = Note.objects.count()
    if rows != args.tasks:
        raise RuntimeError(f"{contender}: {rows} rows written by {args.tasks} ORM tasks")
    return result


# -- the driver ------------------------------------------------------------------------------------


ROWS = [
    ("noop_per_s", "no-op throughput (tasks/s)", "{:.0f}"),
    ("orm_per_s", "ORM-write throughput (tasks/s)", "{:.0f}"),
    ("p50_ms", "send-to-start p50 (ms)", "{:.2f}"),
    ("p95_ms", "send-to-start p95 (ms)", "{:.2f}"),
    ("enqueue_ms", "enqueue() per task (ms)", "{:.3f}"),
]


def available(contender: str) -> bool:
    needs = {"db_worker": "django_tasks_db", "celery": "django_tasks_celery"}.get(contender)
    return needs is None or importlib.util.find_spec(needs) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15",
                        help="the Redis database of the Redis transport and of Celery (emptied first)")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db-interval", type=float, default=1.0,
                        help="db_worker's --interval (its default: 1 s)")
    parser.add_argument("--contenders", nargs="*", default=CONTENDERS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return

    import django

    contenders = [c for c in args.contenders if available(c)]
    for missing in sorted(set(args.contenders) - set(contenders)):
        print(f"{missing}: not installed, left out (see the docstring)", file=sys.stderr)
    compile_sources()
    loads = [loadavg()]
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in contenders}
    for repeat in range(args.repeat):
        for contender in contenders if repeat % 2 == 0 else reversed(contenders):
            done = subprocess.run([sys.executable, __file__, "--child", contender, *sys.argv[1:]],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{contender}: run failed\n{done.stdout}{done.stderr}")
            runs[contender].append(json.loads(done.stdout.strip().splitlines()[-1]))
            loads.append(loadavg())
            print(f"  run {repeat + 1}/{args.repeat} {contender}: "
                  + ", ".join(f"{k}={v:.4g}" for k, v in runs[contender][-1].items())
                  + f" (load {loads[-1]:.2f})", file=sys.stderr)
    median = {c: {key: statistics.median(r[key] for r in runs[c]) for key in runs[c][0]} for c in contenders}
    print(f"\nDjango {django.get_version()}, Python {sys.version.split()[0]}, -c {args.concurrency}, "
          f"{args.tasks} tasks per throughput run, {args.samples} latency samples, median of "
          f"{args.repeat} runs; load average (1 min) {min(loads):.2f} to {max(loads):.2f}")
    print(f"{'':32}" + "".join(f"{c:>17}" for c in contenders))
    for key, label, form in ROWS:
        print(f"{label:32}" + "".join(f"{form.format(median[c][key]):>17}" for c in contenders))


if __name__ == "__main__":
    main()

"""The benchmark tasks for pgqueuer's worker (its own PostgreSQL tables, BENCH_POSTGRES):
``pgq run pgqueuer_app:main``."""

import os

import psycopg
import sink
from pgqueuer import PgQueuer
from pgqueuer.db import PsycopgDriver
from pgqueuer.models import Job


async def main() -> PgQueuer:
    connection = await psycopg.AsyncConnection.connect(os.environ["BENCH_POSTGRES"], autocommit=True)
    queuer = PgQueuer(PsycopgDriver(connection))

    # (its entry points must be coroutines: the bodies run on its event loop, as a pgqueuer user
    # writes a task that does not block)
    @queuer.entrypoint("bench.noop")
    async def noop(job: Job) -> None:
        sink.noop()

    @queuer.entrypoint("bench.work")
    async def work(job: Job) -> None:
        sink.work()

    @queuer.entrypoint("bench.latency")
    async def latency(job: Job) -> None:
        sink.latency(float(job.payload or b"0"))

    return queuer


if __name__ == "__main__":
    # pgqueuer's own command line (pgq run) fails at start with the typer installed beside it (its
    # default log level reaches its logger set-up as a string): run its supervisor as pgq run does
    import asyncio
    import sys
    from contextlib import asynccontextmanager
    from datetime import timedelta

    from pgqueuer import types
    from pgqueuer.adapters.cli import supervisor

    @asynccontextmanager
    async def factory():  # what pgqueuer's supervisor takes
        yield await main()

    # argv[1]: tasks at once (pgqueuer takes at most half of them per fetch); 0: pgqueuer's own
    # defaults (fetches of 10, no bound)
    concurrency = int(sys.argv[1])
    asyncio.run(supervisor.run(
        factory, dequeue_timeout=timedelta(seconds=30),
        batch_size=max(1, concurrency // 2) if concurrency else 10, restart_delay=timedelta(seconds=5),
        restart_on_failure=False, mode=types.QueueExecutionMode.continuous,
        max_concurrent_tasks=concurrency or None, shutdown_on_listener_failure=False,
        heartbeat_timeout=timedelta(seconds=30)))

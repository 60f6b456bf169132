"""The PostgreSQL transport and result backend through a PgBouncer of the test's own in transaction
mode, in front of the shared server: the transport finds the pooler (it refuses the ``options``
startup parameter), turns prepared statements off, keeps no session settings, and polls every
``polling_interval`` instead of listening through it, or listens on a direct ``listen_url``;
every task runs once, through at most the pool's few server connections."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from conftest import require_server
from postgres import POSTGRES_URL, PgBouncer, drop_schema, schema_name
from workers import TESTS, children_of

POOL_SIZE = 3
TASKS = 40


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    require_server(5432, "PostgreSQL")
    own = PgBouncer(pool_mode="transaction", pool_size=POOL_SIZE).start()
    yield own
    own.stop()


@pytest.fixture
def schema() -> Iterator[str]:
    name = schema_name("pgbouncer")
    yield name
    drop_schema(POSTGRES_URL, name)


def start(workers, url: str, broker_options: dict, backend_options: dict, *args: str):
    basic.app.conf.update(broker_url=url, result_backend=url, broker_transport_options=broker_options,
                          result_backend_transport_options=backend_options)
    return workers.start(*args, pool="prefork", broker=url, backend=url, env={
        "PYTHONPATH": str(TESTS),
        "WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps(broker_options),
        "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": json.dumps(backend_options)})


def test_a_worker_through_pgbouncer_in_transaction_mode_polls_and_runs_every_task_once(
        workers, bouncer: PgBouncer, schema: str, tmp_path: Path) -> None:
    url, proof = bouncer.url(), tmp_path / "ran"
    try:
        worker = start(workers, url, {"schema": schema, "polling_interval": 0.5}, {"schema": schema},
                       "-c", "2")
        worker.wait_log("is behind a connection pooler")
        worker.wait_log("Not listening through the pooler")
        assert "looking at the queues every 0.5s (polling_interval)" in worker.log()
        # (many statements of each kind: prepared statements would be missing on other servers)
        results = [basic.record_slowly.delay(str(proof), n, 0.05) for n in range(TASKS)]
        assert sorted(result.get(timeout=60) for result in results) == list(range(TASKS))
        assert sorted(map(int, basic.lines(proof))) == list(range(TASKS))

        pids = {worker.pid, *children_of(worker.pid)}
        clients = [row for row in bouncer.show("CLIENTS") if row["database"] == "test"
                   and str(row["application_name"]).startswith("worker ")
                   and int(str(row["application_name"]).rpartition(":")[2]) in pids]
        servers = [row for row in bouncer.show("SERVERS") if row["database"] == "test"]
        roles = sorted(str(row["application_name"]).split()[1] for row in clients)
        # consumer, leases, results in the children (and publisher, results in the main process);
        # no LISTEN connection
        assert "listen" not in roles and "broker" in roles, roles
        assert 3 <= len(clients) <= 3 + 2, roles
        assert len(servers) <= POOL_SIZE, servers
        assert worker.stop() == 0
        assert "does not exist" not in worker.log()  # (no prepared statement missing on a server)
        print(f"worker clients of PgBouncer: {len(clients)} {roles}; server connections: {len(servers)}")
    finally:
        basic.app.close()


def test_a_direct_listen_url_past_pgbouncer_wakes_the_worker_at_once(
        workers, bouncer: PgBouncer, schema: str) -> None:
    url = bouncer.url()
    # a poll twice a minute: a task run within seconds was woken by its notification
    broker_options = {"schema": schema, "polling_interval": 30, "listen_url": POSTGRES_URL}
    backend_options = {"schema": schema, "listen_url": POSTGRES_URL}
    try:
        worker = start(workers, url, broker_options, backend_options, "-c", "1")
        started = time.monotonic()
        # (one after the other: each but the first sent long after the worker's first look)
        assert [basic.add.delay(n, n).get(timeout=30) for n in range(5)] == [0, 2, 4, 6, 8]
        assert time.monotonic() - started < 10
        assert "is behind a connection pooler" in worker.log()
        assert "Not listening through the pooler" not in worker.log()
        assert worker.stop() == 0
    finally:
        basic.app.close()

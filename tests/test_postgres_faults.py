"""PostgreSQL faults, counted per message: a cluster of the test's own restarted (or crashed)
mid-flight, a connection cut by a proxy, and a standby promoted behind the same address; every task sent
runs, and runs once (each writes its number to a file, which must hold each number once)."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from conftest import require_server
from faults import TcpProxy
from postgres import POSTGRES_URL, Cluster, drop_schema, schema_name
from workers import TESTS, wait_for

#: the worker reconnects at once, then every half second
FAST_RETRY = {"interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}
TASKS = 40


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    own = Cluster().init().start()
    yield own
    own.remove()


def environment(schema: str, **extra: object) -> dict[str, str]:
    options = {"schema": schema, **FAST_RETRY, **extra}
    return {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps(options),
            "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": json.dumps({"schema": schema})}


def configure_client(broker: str, backend: str, schema: str) -> None:
    basic.app.conf.update(broker_url=broker, result_backend=backend,
                          broker_transport_options={"schema": schema, **FAST_RETRY},
                          result_backend_transport_options={"schema": schema})


def send(proof: Path) -> list:
    """Half acknowledged when they start, half once they finished."""
    return [(basic.pause_then_record if n % 2 else basic.record_slowly).delay(str(proof), n, 0.05)
            for n in range(TASKS)]


def each_ran_once(results: list, proof: Path) -> None:
    assert sorted(result.get(timeout=90) for result in results) == list(range(TASKS))
    time.sleep(1.0)  # room for a second run, if there were one
    assert sorted(map(int, basic.lines(proof))) == list(range(TASKS))


@pytest.mark.parametrize("stop, consumer_commits", [("fast", "off"), ("immediate", "on")],
                         ids=["restarted", "crashed"])
def test_a_database_restarted_mid_flight_loses_no_task_and_runs_none_twice(
        workers, cluster: Cluster, tmp_path: Path, stop: str, consumer_commits: str) -> None:
    """A clean restart flushes every commit; a crash (``pg_ctl -m immediate``) keeps only what was
    flushed, so there the takes and acknowledgements are synchronous too."""
    schema, proof = schema_name("faults"), tmp_path / "ran"
    configure_client(cluster.url, cluster.url, schema)
    try:
        worker = workers.start("-c", "2", pool="prefork", broker=cluster.url, backend=cluster.url,
                               env=environment(schema, consumer_synchronous_commit=consumer_commits))
        results = send(proof)
        wait_for(lambda: len(basic.lines(proof)) >= TASKS // 4, timeout=60, message="a quarter of the tasks")
        cluster.stop(stop)
        cluster.start()
        worker.wait_log("Connection to broker lost", timeout=30)
        each_ran_once(results, proof)
        assert basic.add.delay(1, 2).get(timeout=30) == 3  # and it goes on
        assert "lost their lease" not in worker.log()
    finally:
        basic.app.close()


LEASE = 2.0


def test_a_database_crashed_mid_flight_under_fast_takes_loses_no_task_and_says_why_one_runs_twice(
        workers, cluster: Cluster, tmp_path: Path) -> None:
    """With ``consumer_synchronous_commit: off`` (the default) a crash can take back the last
    takes and acknowledgements: a take lost is taken again and dropped as a copy of what the worker
    holds; an acknowledgement lost brings the message back once its lease lapses. None is lost,
    and each second run is one a log line counts."""
    schema, proof = schema_name("faults"), tmp_path / "ran"
    configure_client(cluster.url, cluster.url, schema)
    try:
        worker = workers.start("-c", "2", pool="prefork", broker=cluster.url, backend=cluster.url,
                               env=environment(schema, visibility_timeout=LEASE))
        results = send(proof)
        wait_for(lambda: len(basic.lines(proof)) >= TASKS // 4, timeout=60, message="a quarter of the tasks")
        cluster.stop("immediate")
        cluster.start()
        worker.wait_log("Connection to broker lost", timeout=30)
        assert sorted(result.get(timeout=90) for result in results) == list(range(TASKS))
        time.sleep(LEASE + 2.0)  # room for a lost acknowledgement's lease to lapse and its second run
        runs = Counter(map(int, basic.lines(proof)))
        assert sorted(runs) == list(range(TASKS))  # none lost
        log = worker.log()
        twice = sorted(n for n, count in runs.items() if count > 1)
        explained = sum(int(n) for n in re.findall(r"Restored (\d+) message\(s\) whose lease lapsed", log))
        explained += sum(int(n) for n in re.findall(r"(\d+) message\(s\) \w+ here had lost their lease", log))
        assert sum(runs[n] - 1 for n in twice) <= explained, (twice, explained)
        print(f"crash under fast takes: {len(twice)} of {TASKS} ran twice {twice}, {explained} explained; "
              f"{log.count('again while this worker holds it')} copies of held messages dropped")
    finally:
        basic.app.close()


def test_a_cut_connection_loses_no_task_and_runs_none_twice(workers, tmp_path: Path) -> None:
    require_server(5432, "PostgreSQL")
    schema, proof = schema_name("faults"), tmp_path / "ran"
    proxy = TcpProxy("127.0.0.1", 5432)
    through = POSTGRES_URL.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    configure_client(POSTGRES_URL, POSTGRES_URL, schema)
    try:
        worker = workers.start("-c", "2", pool="prefork", broker=through, backend=POSTGRES_URL,
                               env=environment(schema))
        results = send(proof)
        wait_for(lambda: len(basic.lines(proof)) >= TASKS // 4, timeout=60, message="a quarter of the tasks")
        proxy.cut()
        worker.wait_log("Connection to broker lost", timeout=30)
        time.sleep(0.5)  # a cut, not a blink: the behaviour under test
        proxy.restore()
        each_ran_once(results, proof)
        assert "lost their lease" not in worker.log()
    finally:
        basic.app.close()
        proxy.close()
        drop_schema(POSTGRES_URL, schema)


def test_a_standby_promoted_behind_the_same_address_loses_no_task(workers, cluster: Cluster,
                                                                  tmp_path: Path) -> None:
    """Synchronous replication: a commit is on the standby before the client hears of it."""
    import psycopg

    standby = Cluster().init(primary=cluster).start()
    with psycopg.connect(cluster.url, autocommit=True) as db:  # (after the copy: not the standby's)
        db.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        db.execute("SELECT pg_reload_conf()")
    proxy = TcpProxy("127.0.0.1", cluster.port)
    address = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
    schema, proof = schema_name("failover"), tmp_path / "ran"
    configure_client(address, address, schema)
    try:
        # (takes and acknowledgements wait for the standby too: none is delivered again)
        worker = workers.start("-c", "2", pool="prefork", broker=address, backend=address,
                               env=environment(schema, consumer_synchronous_commit="on"))
        results = send(proof)
        wait_for(lambda: len(basic.lines(proof)) >= TASKS // 4, timeout=60, message="a quarter of the tasks")
        cluster.stop("immediate")  # the primary is gone at once
        standby.promote()
        proxy.target = ("127.0.0.1", standby.port)  # the same address now leads to the new primary
        proxy.cut()
        proxy.restore()
        worker.wait_log("Connection to broker lost", timeout=30)
        each_ran_once(results, proof)
    finally:
        basic.app.close()
        proxy.close()
        standby.remove()
        cluster.remove()
